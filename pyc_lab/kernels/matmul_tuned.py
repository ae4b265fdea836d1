"""The kernel a tuning-database entry names, loaded for :func:`pyc_lab.matmul`.

An entry's configuration is a CUTLASS kernel (loaded from the kernel cache, where the
tuner put it; never built on a call), pyc_lab's skinny GEMM (compiled by NVRTC at its
first use) or a cuBLASLt heuristic pick (:class:`~.lt_tuned.TunedLt`). Each must
accept the actual shape: a bucketed skinny entry only for the same token tiles, a
cuBLASLt pick only for the exact shape it was measured on.
"""

from __future__ import annotations

from typing import Any

from ..errors import PycLabError
from . import cutlass as cg
from .lt_algos import LtPick, is_lt_algo
from .lt_tuned import TunedLt
from .skinny import SkinnyConfig, SkinnyGemm, is_skinny
from .tuning.keys import device_key

__all__ = ["load_tuned"]


def _kept(kernels: dict, lock: Any, key: tuple, make: Any) -> Any:
    """``kernels[key]``, made by ``make()`` the first time (under ``lock``)."""
    with lock:
        kernel = kernels.get(key)
        if kernel is None:
            kernel = kernels[key] = make()
    return kernel


def _load_skinny(found: Any, dtype: str, layout: str, epilogue: cg.Epilogue, why: str,
                 shape: tuple[int, int, int], kernels: dict, lock: Any) -> tuple[Any, str]:
    """The skinny GEMM of a tuned entry, if it takes the actual shape. A bucketed entry
    must have been tuned for the same kernel instantiation (token tiles, or the GEMV
    form's rows computed) as the actual row count."""
    try:
        cfg = SkinnyConfig.from_dict(found.measurement.config)
    except PycLabError as exc:
        return None, f"tuned entry unusable: {exc}"
    m = shape[0]
    if epilogue.fused or layout != "tn":
        return None, f"tuned skinny GEMM {cfg.id} takes plain 'tn' GEMMs only"
    if found.match == "bucket" and cfg.expression(dtype, found.problem_matched.shape[0]) \
            != cfg.expression(dtype, m):
        return None, (f"tuned skinny GEMM {cfg.id} was tuned for "
                      f"{found.problem_matched.shape[0]} rows, a different kernel than "
                      f"{m} rows need")
    kernel = _kept(kernels, lock, ("skinny", cfg, dtype), lambda: SkinnyGemm(cfg, dtype))
    if not kernel.can_implement(*shape):
        return None, f"tuned skinny GEMM {cfg.id} cannot take {'x'.join(map(str, shape))}"
    return kernel, why


def _load_lt(found: Any, dtype: str, epilogue: cg.Epilogue, why: str,
             kernels: dict, lock: Any) -> tuple[Any, str]:
    """The cuBLASLt pick of a tuned entry, for an exact match of a plain GEMM only (a
    pick's speed belongs to the shape it was measured on)."""
    try:
        cfg = LtPick.from_dict(found.measurement.config)
    except PycLabError as exc:
        return None, f"tuned entry unusable: {exc}"
    if epilogue.fused:
        return None, f"tuned cuBLASLt pick {cfg.id} takes plain GEMMs only"
    if found.match != "exact":
        return None, (f"tuned cuBLASLt pick {cfg.id} was measured on "
                      f"{'x'.join(map(str, found.problem_matched.shape))}, not this shape")
    return _kept(kernels, lock, ("cublaslt", cfg, dtype), lambda: TunedLt(cfg, dtype)), why


def load_tuned(found: Any, dtype: str, layout: str, epilogue: cg.Epilogue, why: str,
               shape: tuple[int, int, int], kernels: dict, lock: Any) -> tuple[Any, str]:
    """The kernel of a tuning-database entry for the actual ``shape``: a CUTLASS kernel
    from the kernel cache, a skinny GEMM, or a cuBLASLt pick; or ``None`` and why it
    cannot serve. Loaded kernels are kept in ``kernels`` (under ``lock``).

    Parameters
    ----------
    found
        The :class:`~.tuning.keys.LookupResult`.
    dtype, layout, epilogue
        The problem's kernel dtype, layout and epilogue.
    why
        The lookup's words (returned with a kernel).
    shape
        The actual ``(m, n, k)``.
    kernels, lock
        The caller's cache of loaded kernels and its lock.
    """
    if is_skinny(found.measurement.config):
        return _load_skinny(found, dtype, layout, epilogue, why, shape, kernels, lock)
    if is_lt_algo(found.measurement.config):
        return _load_lt(found, dtype, epilogue, why, kernels, lock)
    try:
        cfg = cg.GemmConfig.from_dict(found.measurement.config)
        _device, cc, sm_count = device_key()
    except Exception as exc:
        return None, f"tuned entry unusable: {exc}"
    key = (cfg, dtype, layout, epilogue, cc)
    with lock:
        kernel = kernels.get(key)
        if kernel is None:
            res = cg.cached(cfg, dtype, layout, cc, epilogue=epilogue)
            if res is None:
                return None, (f"tuned kernel {cfg.id} is not built on this machine; "
                              "pyc_lab.kernels.prepare() builds it")
            kernel = kernels[key] = cg.CutlassGemm(res.library, cfg, dtype, layout, sm_count,
                                                    epilogue)
    if not kernel.can_implement(*shape):
        return None, f"tuned kernel {cfg.id} cannot take {'x'.join(map(str, shape))}"
    return kernel, why
