"""cuBLASLt algorithm settings worth measuring for one GEMM: the tuner's library search.

cuBLASLt's heuristic picks from a model; on a given GPU and problem another of its own
settings can be faster (another tile, split-K for a problem of few output tiles, another
swizzle). :func:`search` lists the settings the problem takes (:mod:`..lt_algos`), times
them coarsely on the tuner's operands (:func:`~..blas_direct.race`: one timed round each,
L2 flushed, GPU time only), expands the fastest base settings (custom options, swizzles,
split-K where the output has few tiles), times those, and returns the fastest few. The
runner then checks each against the reference into a poisoned output and times it as it
times every candidate, and the libraries beside the best of them in interleaved rounds
(:class:`~.gemm_runner.GemmRunner`): a setting is kept only by the never-slower rule, as
any tuned kernel is.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..lt_algos import LtAlgo, base_settings, expansions

__all__ = ["EXPAND_TOP", "FEW_OUTPUTS", "LT_TOP", "search"]

log = logging.getLogger(__name__)

#: Settings returned for the runner's fine timing.
LT_TOP = 6
#: Base settings (split-K 1) expanded.
EXPAND_TOP = 8
#: Split-K is tried for problems of at most this many outputs (few output tiles).
FEW_OUTPUTS = 4 << 20
#: Workspace a setting may need (the stream's shared workspace grows to a winner's).
MAX_WORKSPACE = 256 << 20
#: Candidates per coarse race (each holds a pair of CUDA events).
CHUNK = 64


def search(a: Any, b: Any, out: Any, dtype: str, deadline: float | None = None,
           top: int = LT_TOP) -> list[LtAlgo]:
    """The ``top`` fastest cuBLASLt settings for ``out = a @ b`` on these CuPy operands,
    fastest first (coarse times); empty where cuBLASLt lists none.

    Parameters
    ----------
    a, b, out
        The tuner's operands (``out`` is overwritten).
    dtype
        The operands' dtype name (``"float16"``, ``"bfloat16"``).
    deadline
        ``time.perf_counter()`` after which no more algorithms are listed (the tuning
        budget).
    top
        How many to return.
    """
    import cupy as cp
    from nvmath.bindings import cublasLt as lt

    from ..blas_direct import LtGemm, _device, _lt_handle, race
    from ..blas_layout import describe

    size = a.dtype.itemsize
    strides = [tuple(s // size for s in x.strides) for x in (a, b, out)]
    desc = describe(tuple(a.shape), strides[0], tuple(b.shape), strides[1], strides[2])
    if isinstance(desc, str):
        log.info("no cuBLASLt search: %s", desc)
        return []
    gemm = LtGemm(desc, dtype)
    form = gemm._forms[0]
    t_out, t_a, t_b = gemm._types
    types = (t_b, t_a, t_out) if form.b_first else (t_a, t_b, t_out)
    device = _device()
    handle = _lt_handle(device)
    stream = cp.cuda.get_current_stream().ptr
    scratch = cp.empty(MAX_WORKSPACE, dtype=cp.uint8)  # the search's own workspace
    ws, ws_size = scratch.data.ptr, MAX_WORKSPACE
    p_a, p_b = form.pointers(a.data.ptr, b.data.ptr)
    la, lb, lc = form.layouts

    def timed(found: list[tuple[LtAlgo, Any]]) -> list[tuple[float, LtAlgo]]:
        runs = [(lambda rec=rec: lt.matmul(handle, form.desc, gemm._pa, p_a, la, p_b, lb,
                                           gemm._pb, out.data.ptr, lc, out.data.ptr, lc,
                                           rec.ctypes.data, ws, ws_size, stream))
                for _s, rec in found]
        times: list[float] = []
        for i in range(0, len(runs), CHUNK):
            times += race(runs[i:i + CHUNK], stream, rounds=1)
        return sorted(((t, s) for t, (s, _rec) in zip(times, found, strict=True)
                       if t != float("inf")), key=lambda x: x[0])

    t0 = time.perf_counter()
    listed = base_settings(lt, handle, gemm.compute, types, form.desc, form.layouts,
                           MAX_WORKSPACE, deadline)
    ranked = timed(listed)
    split = out.size <= FEW_OUTPUTS
    more = [x for _t, s in ranked[:EXPAND_TOP]
            for x in expansions(lt, handle, gemm.compute, types, form.desc, form.layouts, s,
                                MAX_WORKSPACE, split)]
    ranked = sorted(ranked + timed(more), key=lambda x: x[0])
    log.info("cuBLASLt search: %d base settings, %d expansions, %.1f s", len(listed),
             len(more), time.perf_counter() - t0)
    return [s for _t, s in ranked[:top]]
