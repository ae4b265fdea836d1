"""The small-GEMM candidate of a matmul step: compiled, raced once, launched.

A small matmul (:mod:`~pyc_lab.compiler.codegen.small_gemm`) may run as one generated
kernel — product, bias and activation — instead of the library GEMM followed by the
generated epilogue. Which is faster, and which of the kernel's forms, depends on the
layer and the GPU, so :class:`SmallGemm` measures them all on the first call's operands
(CUDA events, interleaved rounds with the L2 cache flushed:
:func:`pyc_lab.kernels.blas_direct.race`) and keeps the fastest form only where it took at
least :data:`MARGIN` less time than the library path: never slower than what it
replaces. The choice holds for the executable's life; a CUDA graph captured afterwards
records whichever won (the kernel needs no cuBLAS workspace).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...kernels.blas_layout import merged_stride
from ..codegen.cache import compile_kernel
from ..codegen.cuda_types import KernelSource
from ..codegen.small_gemm import entries_for, launch_shape

__all__ = ["ENABLED", "MARGIN", "ROUNDS", "SmallGemm"]

log = logging.getLogger(__name__)

#: Whether lowering offers the small GEMM at all (programs lowered while it is False run
#: the library path only: ``bench_inference``'s ``pyc_lab_io_binding_no_small_gemm`` row).
ENABLED = True
#: How much less time the kernel must take than the library GEMM and epilogue to be kept.
MARGIN = 0.02
#: Interleaved rounds of the first call's race.
ROUNDS = 9


class SmallGemm:
    """The generated small GEMM of one matmul node and the first call's verdict on it.

    Attributes
    ----------
    src
        The generated source (:func:`~pyc_lab.compiler.codegen.small_gemm.generate_small_gemm`).
    use
        ``None`` until the race has run, then whether the kernel runs.
    choice
        The entry that runs (the race's fastest form), once ``use`` is True.
    measured
        ``{"library_ms", <entry>: ms, ...}`` of that race.
    note
        The verdict in words (for ``explain()``), empty before the race.
    """

    def __init__(self, src: KernelSource) -> None:
        self.src = src
        self.kernels: dict[str, Any] = {}
        self.use: bool | None = None
        self.choice: str | None = None
        self.measured: dict[str, float] = {}
        self.note = ""

    def prepare(self) -> None:
        """Compile the entries; a kernel that cannot be built is never used."""
        if self.kernels or self.use is False:
            return
        try:
            self.kernels = {e: compile_kernel(self.src, e) for e in self.src.entries}
        except Exception as exc:  # the library path runs, as without the candidate
            log.warning("%s: not built (%s); the library GEMM runs", self.src.name, exc)
            self.use = False
            self.note = f"small GEMM not built: {exc}"

    def plans(self, a: Any, b: Any) -> list[tuple[str, int, int, int, int, int]]:
        """``(entry, sam, sbk, sbn, sab, sbb)`` of every form that takes these operands
        (CuPy arrays, as multiplied); after the race, only the chosen one. None take them
        where the leading dimensions cannot be walked with one stride (a view that
        would need a copy)."""
        item = a.itemsize
        batched = self.src.launch.get("batch", 1) > 1
        # a: its rows (every leading dimension with them, or the batch's apart)
        sa = merged_stride(a.shape[:-1] if not batched else a.shape[:-2],
                           a.strides[:-1] if not batched else a.strides[:-2])
        sb = merged_stride(b.shape[:-2], b.strides[:-2]) if batched else 0
        if sa is None or sb is None:
            return []
        sam, sab = (a.strides[-2], sa) if batched else (sa, 0)
        plans = entries_for(self.src, (sam // item, a.strides[-1] // item),
                            (b.strides[-2] // item, b.strides[-1] // item), a.data.ptr,
                            b.data.ptr, (sab // item, sb // item))
        if self.choice is not None:
            plans = [p for p in plans if p[0] == self.choice]
        return plans

    def launch(self, plan: tuple[str, int, int, int, int, int], a: Any, b: Any, bias: Any,
               out: Any) -> None:
        """Issue one form on the current stream (nothing is synchronised)."""
        entry, *strides = plan
        grid, block = launch_shape(self.src, entry)
        args = (a, b, *((bias,) if bias is not None else ()), out,
                *(np.int64(v) for v in strides))
        self.kernels[entry](grid, block, args)

    def decide(self, cp: Any, library: Callable[[], Any],
               forms: list[tuple[str, Callable[[], Any]]]) -> bool:
        """Race ``library`` (the GEMM and epilogue as the step runs them) against each of
        ``forms`` (``(entry, run into scratch)``) on the current stream, once; the verdict,
        with :attr:`choice` the fastest form. Inside a CUDA-graph capture nothing is timed
        and the library path runs."""
        from ...kernels import blas_direct

        if self.use is not None:
            return self.use
        stream = cp.cuda.get_current_stream().ptr
        if blas_direct._capturing(stream):
            return False
        times = blas_direct.race([library, *(run for _, run in forms)], stream, ROUNDS)
        library_ms = times[0]
        best_ms, best = min(zip(times[1:], (e for e, _ in forms), strict=True))
        self.use = math.isfinite(best_ms) and best_ms <= library_ms * (1.0 - MARGIN)
        self.choice = best if self.use else None
        self.measured = {"library_ms": library_ms,
                         **{e: t for (e, _), t in zip(forms, times[1:], strict=True)}}
        self.note = (f"small GEMM {'ran' if self.use else 'not used'}: {best} "
                     f"{best_ms:.4f} ms against {library_ms:.4f} ms for the library GEMM "
                     f"and epilogue (first call, L2 flushed; kept when {MARGIN:.0%} faster)")
        log.info("%s: %s", self.src.name, self.note)
        return self.use

