"""Two ways to run one GEMM problem, chosen by racing them on the problem's first call.

``pl.matmul`` holds one library call per problem signature (:mod:`.blas_direct`). Where a
second way may be faster, :class:`RacedGemm` holds both and is called like either
(``(a_ptr, b_ptr, out_ptr, stream)``):

- unaligned operands: the direct call, or the same GEMM on aligned, zero-padded copies
  (:class:`~.padded.PaddedGemm`);
- a large aligned float16/bfloat16 problem: the library ``pl.matmul`` takes for the
  dtype (:func:`~.matmul_route.library_path`), or the other one — cuBLAS's
  ``cublasGemmEx`` (what ``cupy.matmul`` issues) beside cuBLASLt's measured algorithm
  (:class:`~.blas_direct.LtGemm`). The two libraries choose their kernels by separate
  heuristics, and on the H200 either was the faster by a few per cent, shape by shape
  (``benchmarks/results/h200/issue14-*/matmul-sweep.json``).

The first call outside a CUDA-graph capture times both on the caller's operands
(:func:`~.blas_direct.race`: interleaved rounds after a warm-up round, the L2 cache
flushed before every run) and keeps the challenger only when it is at least ``margin``
faster and the default takes at least ``min_ms``; the default wins ties. This is
``torch.backends.cudnn.benchmark``'s idea: one choice per problem signature, measured
once, where it runs. A challenger that may not be recorded into a graph
(``capturable = False``) gives way to the default during a capture.
"""

from __future__ import annotations

import logging
from typing import Any

from . import blas_direct

__all__ = ["ROUNDS", "RacedGemm"]

log = logging.getLogger(__name__)

#: Interleaved rounds of the first call's race (two candidates: more rounds than a race
#: of many, whose medians each take fewer samples).
ROUNDS = 9


class RacedGemm:
    """A default and a challenger GEMM for one problem; the first call keeps one.

    Parameters
    ----------
    default, challenger
        Callables ``(a_ptr, b_ptr, out_ptr, stream)`` computing the same product, each
        with an ``impl`` attribute (the library that runs it).
    name
        What the challenger is (``"padded"``, ``"library"``): the key of the note in
        :attr:`choice`.
    margin
        How much faster the challenger must measure to be kept.
    min_ms
        The default's GPU milliseconds below which the challenger is never kept.
    detail
        Words on the challenger for the note (what it runs).

    Attributes
    ----------
    use_challenger
        ``None`` until the first call decides, then whether the challenger runs.
    measured
        ``{"default_ms", "challenger_ms"}`` of that race.
    choice
        A mapping to note the decision in (``pl.matmul``'s :data:`last_choice`), or
        ``None``; its ``"impl"`` follows the library that runs.
    """

    def __init__(self, default: Any, challenger: Any, *, name: str, margin: float,
                 min_ms: float = 0.0, detail: str = "") -> None:
        self.default = default
        self.challenger = challenger
        self.name = name
        self.margin = margin
        self.min_ms = min_ms
        self.detail = detail
        self.gemm = getattr(default, "gemm", None)
        self.use_challenger: bool | None = None
        self.measured: dict[str, float] = {}
        self.choice: dict[str, Any] | None = None
        self._graph_safe = getattr(challenger, "capturable", True)

    @property
    def impl(self) -> str:
        """The library of what runs (the default's until the first call decides)."""
        return (self.challenger if self.use_challenger else self.default).impl

    def __call__(self, a_ptr: int, b_ptr: int, out_ptr: int, stream: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t``) of the current device; no sync."""
        use = self.use_challenger
        if use is None:
            if blas_direct._capturing(stream):
                self.default(a_ptr, b_ptr, out_ptr, stream)
                return
            use = self._decide(a_ptr, b_ptr, out_ptr, stream)
        if use and (self._graph_safe or not blas_direct._capturing(stream)):
            self.challenger(a_ptr, b_ptr, out_ptr, stream)
        else:
            self.default(a_ptr, b_ptr, out_ptr, stream)

    def _decide(self, a_ptr: int, b_ptr: int, out_ptr: int, stream: int) -> bool:
        default_ms, challenger_ms = blas_direct.race(
            [lambda: self.default(a_ptr, b_ptr, out_ptr, stream),
             lambda: self.challenger(a_ptr, b_ptr, out_ptr, stream)], stream, ROUNDS)
        use = challenger_ms <= default_ms * (1.0 - self.margin) and default_ms >= self.min_ms
        self.measured = {"default_ms": default_ms, "challenger_ms": challenger_ms}
        self.use_challenger = use
        if self.choice is not None:
            self.choice[self.name] = (
                f"{'ran' if use else 'not used'}: {self.detail + ' ' if self.detail else ''}"
                f"{challenger_ms:.4f} ms against {default_ms:.4f} ms for "
                f"{self.default.impl} as chosen (first call, L2 flushed; kept when "
                f"{self.margin:.0%} faster)")
            self.choice["impl"] = self.impl
        log.info("%s: %.4f ms against %.4f ms -> %s", self.name, challenger_ms, default_ms,
                 "kept" if use else "not used")
        return use
