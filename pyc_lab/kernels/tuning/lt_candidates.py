"""cuBLASLt's heuristic picks for one GEMM, measured: the tuner's library candidates.

cuBLASLt's heuristic ranks the algorithms it thinks fastest; ``pl.matmul``'s first call
runs its first pick (for large problems the fastest of a few, raced once). On a given GPU
and problem a lower-ranked pick can be faster — on an H100 the best of the first eight
of each description beat the first by 2-4 % on several decode layers
(``benchmarks/results/h100/issue14-7ec7fe4/``). :func:`search` asks the heuristic for
:data:`PER_FORM` picks for each of :class:`~..blas_direct.LtGemm`'s two descriptions of
the product and a few more with a wide workspace (:meth:`~..blas_direct.LtGemm.picks`,
what ``pl.matmul``'s first-call race draws from), times each coarsely on the tuner's
operands (:func:`~..blas_direct.race`: L2 flushed, GPU time only) and returns the fastest
few as :class:`~..lt_algos.LtPick`. The runner then checks each against the reference
into a poisoned output and times it as it times every candidate, and the libraries beside
the best of them in interleaved rounds (:class:`~.gemm_runner.GemmRunner`): a pick is
kept only by the never-slower rule, as any tuned kernel is.
"""

from __future__ import annotations

import logging
from typing import Any

from ..lt_algos import LtPick

__all__ = ["LT_TOP", "PER_FORM", "search"]

log = logging.getLogger(__name__)

#: Heuristic picks asked for per description.
PER_FORM = 8
#: Picks returned for the runner's fine timing.
LT_TOP = 4
#: Workspace the picks may need (the stream's shared workspace grows to a winner's);
#: the wide-workspace picks :meth:`~..blas_direct.LtGemm.picks` adds are kept within it.
MAX_WORKSPACE = 256 << 20


def search(a: Any, b: Any, out: Any, dtype: str, top: int = LT_TOP) -> list[LtPick]:
    """The ``top`` fastest of cuBLASLt's heuristic picks for ``out = a @ b`` on these
    CuPy operands, fastest first (coarse times); empty where cuBLASLt has none.

    Parameters
    ----------
    a, b, out
        The tuner's operands (``out`` is overwritten).
    dtype
        The operands' dtype name (``"float16"``, ``"bfloat16"``).
    top
        How many to return.
    """
    import cupy as cp

    from ..blas_direct import LtGemm, _device, _lt_handle, alignment
    from ..blas_layout import describe

    size = a.dtype.itemsize
    strides = [tuple(s // size for s in x.strides) for x in (a, b, out)]
    desc = describe(tuple(a.shape), strides[0], tuple(b.shape), strides[1], strides[2])
    if isinstance(desc, str):
        log.info("no cuBLASLt picks: %s", desc)
        return []
    gemm = LtGemm(desc, dtype)
    handle = _lt_handle(_device())
    stream = cp.cuda.get_current_stream().ptr
    ptrs = (a.data.ptr, b.data.ptr, out.data.ptr)
    key = tuple(alignment(p) for p in ptrs)
    picks = [(form, rec) for form, rec in gemm.picks(key, handle, PER_FORM, MAX_WORKSPACE)
             if int(rec["workspace_size"][0]) <= MAX_WORKSPACE]
    if not picks:
        return []
    scratch = cp.empty(MAX_WORKSPACE, dtype=cp.uint8)  # the search's own workspace
    times = gemm._race(picks, ptrs, scratch.data.ptr, MAX_WORKSPACE, handle, stream, rounds=2)
    order = sorted((t, i) for i, t in enumerate(times) if t != float("inf"))
    log.info("cuBLASLt picks: %d timed, fastest %.4f ms", len(order),
             order[0][0] if order else float("nan"))
    return [LtPick.of(gemm.lt, gemm._forms.index(picks[i][0]), picks[i][1]["algo"])
            for _t, i in order[:top]]
