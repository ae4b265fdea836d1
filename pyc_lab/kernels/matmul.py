"""``pyc_lab.matmul``: the tuned CUTLASS kernel for the shape when there is one, else cuBLAS.

For CuPy arrays: the tuning database is asked for this GPU and problem (exact shape,
then the nearest tuned bucket); a winner whose kernel is in the kernel cache (or builds)
and accepts the problem runs; otherwise cuBLAS (``cupy.matmul``). A bias and/or a
relu/gelu activation go through cuBLASLt's fused epilogue
(:class:`~pyc_lab.kernels.cublaslt.FusedGemm`) — the tuned CUTLASS kernels here have a
plain ``alpha * a @ b + beta * out`` epilogue. NumPy arrays use NumPy. Every call's
choice and reason is kept in :data:`last_choice`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ..errors import PycLabError

__all__ = ["last_choice", "matmul"]

log = logging.getLogger(__name__)

#: The most recent call's choice: ``{"impl", "reason", "config", "match"}``.
last_choice: dict[str, Any] = {}

_KERNELS: dict[tuple, Any] = {}
_LOCK = threading.Lock()
_DTYPE_NAMES = {"float16": "f16", "bfloat16": "bf16"}


def _record(impl: str, reason: str, **extra: Any) -> None:
    last_choice.clear()
    last_choice.update({"impl": impl, "reason": reason, **extra})
    log.debug("matmul: %s (%s)", impl, reason)


def _tuned(a: Any, b: Any) -> tuple[Any, str]:
    """The loaded tuned kernel for ``a @ b`` and why, or ``(None, why not)``."""
    from . import cutlass_gemm as cg
    from .autotune import device_key
    from .tuning_db import ProblemKey, TuningDB

    dtype = _DTYPE_NAMES.get(a.dtype.name)
    if dtype is None or b.dtype != a.dtype:
        return None, f"dtypes {a.dtype.name} @ {b.dtype.name}: tuned kernels are f16/bf16"
    if a.ndim != 2 or b.ndim != 2:
        return None, "batched: tuned kernels are 2-D"
    la = "t" if a.flags.c_contiguous else "n" if a.flags.f_contiguous else ""
    lb = "t" if b.flags.c_contiguous else "n" if b.flags.f_contiguous else ""
    if not la or not lb:
        return None, "a strided operand (neither C- nor F-contiguous)"
    layout = la + lb
    (m, k), n = a.shape, b.shape[1]
    issue = cg.problem_issue(m, n, k, layout)
    if issue:
        return None, issue
    try:
        device, cc, sm_count = device_key()
        found = TuningDB().lookup(device, ProblemKey("gemm", dtype, dtype, dtype, layout,
                                                     m, n, k))
    except Exception as exc:
        return None, f"tuning database: {exc}"
    if found is None:
        return None, f"no tuned kernel for {m}x{n}x{k} {dtype} {layout} on this GPU"
    cfg = cg.GemmConfig.from_dict(found.measurement.config)
    key = (cfg, dtype, layout, cc)
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            res = cg.build(cfg, dtype, layout, cc)  # from the cache when it was tuned here
            if not res.ok:
                return None, f"tuned kernel {cfg.id} did not build: {res.message[:200]}"
            kernel = _KERNELS[key] = cg.CutlassGemm(res.library, cfg, dtype, layout, sm_count)
    if not kernel.can_implement(m, n, k):
        return None, f"tuned kernel {cfg.id} cannot take {m}x{n}x{k}"
    return kernel, f"{found.match} match ({'x'.join(map(str, found.problem_matched.shape))})"


def matmul(a: Any, b: Any, *, out: Any = None, alpha: float = 1.0, beta: float = 0.0,
           bias: Any = None, activation: str | None = None) -> Any:
    """``activation(alpha * a @ b + beta * out + bias)``, with the fastest kernel known.

    Parameters
    ----------
    a, b
        2-D arrays (M x K and K x N); CuPy arrays run on the GPU, NumPy on the CPU.
    out
        Optional output (M x N, C-contiguous); with ``beta != 0`` its old value is added.
    alpha, beta
        Scales of the product and of ``out``'s old value.
    bias
        Optional row vector of length N added after the product.
    activation
        ``None``, ``"relu"`` or ``"gelu"`` (tanh approximation).

    Returns
    -------
    array
        ``out`` (or a new array). :data:`last_choice` says which implementation ran and why.
    """
    if activation not in (None, "relu", "gelu"):
        raise PycLabError(f"matmul activation must be None, 'relu' or 'gelu', got "
                          f"{activation!r}")
    if getattr(a, "ndim", 0) < 1 or getattr(b, "ndim", 0) < 1:
        raise PycLabError("matmul takes arrays with at least one dimension")
    if a.shape[-1] != b.shape[0 if b.ndim == 1 else -2]:
        raise PycLabError(f"matmul: a {tuple(a.shape)} and b {tuple(b.shape)} do not "
                          "multiply (inner dimensions differ)")
    is_cupy = type(a).__module__.startswith("cupy")
    if not is_cupy:
        y = alpha * np.matmul(a, b)
        if beta and out is not None:
            y = y + beta * out
        y = _epilogue(np, y, bias, activation)
        _record("numpy", "NumPy arrays run on the CPU")
        if out is not None:
            out[...] = y
            return out
        return y.astype(np.result_type(a, b), copy=False)
    import cupy as cp

    if bias is not None or activation is not None:
        return _fused(cp, a, b, out, alpha, beta, bias, activation)
    kernel, why = _tuned(a, b)
    if kernel is not None:
        if out is None:
            out = cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
            beta = 0.0
        kernel(a, b, out, alpha=alpha, beta=beta)
        _record("cutlass", why, config=kernel.config.id if kernel.config else None)
        return out
    y = cp.matmul(a, b)
    if alpha != 1.0:
        y *= alpha
    if beta and out is not None:
        y += beta * out
    _record("cublas", why)
    if out is not None:
        out[...] = y
        return out
    return y


def _epilogue(xp: Any, y: Any, bias: Any, activation: str | None) -> Any:
    """Bias and activation with NumPy or CuPy (``xp``)."""
    if bias is not None:
        y = y + bias
    if activation == "relu":
        y = xp.maximum(y, 0)
    elif activation == "gelu":
        y = 0.5 * y * (1 + xp.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    return y


def _fused(cp: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
           activation: str | None) -> Any:
    from . import cublaslt

    why = cublaslt.why_not(tuple(a.shape), tuple(b.shape), a.dtype, b.dtype, a.dtype,
                           tuple(bias.shape) if bias is not None else None,
                           bias.dtype if bias is not None else None, activation)
    if not why and alpha == 1.0 and not (beta and out is not None):
        target = out if out is not None and out.flags.c_contiguous else \
            cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        key = ("lt", bias is not None, activation)
        with _LOCK:
            gemm = _KERNELS.get(key)
            if gemm is None:
                gemm = _KERNELS[key] = cublaslt.FusedGemm(activation, bias is not None)
        gemm(a, b, target, None if bias is None else cp.ascontiguousarray(bias).reshape(-1))
        _record("cublaslt", f"bias/activation in cuBLASLt's epilogue "
                            f"({cublaslt.EPILOGUES[(bias is not None, activation)]})")
        if out is not None and target is not out:
            out[...] = target
            return out
        return target
    y = alpha * cp.matmul(a, b)
    if beta and out is not None:
        y = y + beta * out
    y = _epilogue(cp, y, bias, activation)
    _record("cublas", f"cuBLAS and CuPy for the epilogue ({why or 'alpha/beta given'})")
    if out is not None:
        out[...] = y
        return out
    return y.astype(a.dtype, copy=False)
