"""The small-GEMM candidate of a matmul step: compiled, raced once, launched.

A matmul with few rows (:mod:`~pyc_lab.compiler.codegen.small_gemm`) may run as one
generated kernel — product, bias and activation — instead of the library GEMM followed
by the generated epilogue. Which is faster depends on the layer and the GPU, so
:class:`SmallGemm` measures both on the first call's operands (CUDA events, interleaved
rounds with the L2 cache flushed: :func:`pyc_lab.kernels.blas_direct.race`) and keeps
the kernel only where it took at least :data:`MARGIN` less time: never slower than the
library path it replaces. The choice holds for the executable's life; a CUDA graph
captured afterwards records whichever won (the kernel needs no cuBLAS workspace).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ..codegen.cache import compile_kernel
from ..codegen.cuda_types import KernelSource
from ..codegen.small_gemm import entry_for, launch_shape

__all__ = ["ENABLED", "MARGIN", "ROUNDS", "SmallGemm"]

log = logging.getLogger(__name__)

#: Whether lowering offers the small GEMM at all (programs compiled while it is False
#: run the library path only: what ``bench_inference --no-small-gemm`` measures).
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
    measured
        ``{"library_ms", "small_ms"}`` of that race.
    note
        The verdict in words (for ``explain()``), empty before the race.
    """

    def __init__(self, src: KernelSource) -> None:
        self.src = src
        self.kernels: dict[str, Any] = {}
        self.use: bool | None = None
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

    def plan(self, a: Any, b: Any) -> tuple[str, int, int] | None:
        """``(entry, sam, sb)`` for these operands (CuPy arrays), or None where their
        layout fits neither kernel."""
        item = a.itemsize
        return entry_for(self.src, (a.strides[0] // item, a.strides[1] // item),
                         (b.strides[0] // item, b.strides[1] // item), a.data.ptr,
                         b.data.ptr)

    def launch(self, plan: tuple[str, int, int], a: Any, b: Any, bias: Any, out: Any) -> None:
        """Issue the kernel on the current stream (nothing is synchronised)."""
        entry, sam, sb = plan
        grid, block = launch_shape(self.src, entry)
        args = (a, b, *((bias,) if bias is not None else ()), out, np.int64(sam), np.int64(sb))
        self.kernels[entry](grid, block, args)

    def decide(self, cp: Any, library: Callable[[], Any], kernel: Callable[[], Any]) -> bool:
        """Race ``library`` (the GEMM and epilogue as the step runs them) against
        ``kernel`` (this kernel into scratch) on the current stream, once; the verdict.
        Inside a CUDA-graph capture nothing is timed and the library path runs."""
        from ...kernels import blas_direct

        if self.use is not None:
            return self.use
        stream = cp.cuda.get_current_stream().ptr
        if blas_direct._capturing(stream):
            return False
        library_ms, small_ms = blas_direct.race([library, kernel], stream, ROUNDS)
        self.use = small_ms <= library_ms * (1.0 - MARGIN)
        self.measured = {"library_ms": library_ms, "small_ms": small_ms}
        self.note = (f"small GEMM {'ran' if self.use else 'not used'}: {small_ms:.4f} ms "
                     f"against {library_ms:.4f} ms for the library GEMM and epilogue "
                     f"(first call, L2 flushed; kept when {MARGIN:.0%} faster)")
        log.info("%s: %s", self.src.name, self.note)
        return self.use
