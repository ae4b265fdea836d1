"""What a GEMM candidate is checked and timed against: inputs, references, tolerances.

Every candidate runs on inputs uniform in [-1, 1] (never zeros) into an output poisoned
with NaN, and is compared with cuBLAS — in float32 for tf32/f32, the fused epilogue
applied in float32 — before it is timed. The libraries a user would call instead are
timed the same way in the same run: cuBLAS (``cupy.matmul`` for f16/f32,
``torch.matmul`` for bf16 and tf32), cuBLASLt for fused epilogues, torch for f16.

CuPy has no bfloat16 arrays here: bf16 operands are ``int16`` arrays holding the bf16 bit
patterns (rounded to nearest even from float32); :func:`as_float32` reads them back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...errors import PycLabError
from ..cutlass.config import Epilogue

__all__ = ["TOLERANCE", "apply_epilogue", "as_float32", "bias_input", "cublaslt_baseline",
           "gemm_inputs", "lt_baseline", "reference", "torch_baseline"]

log = logging.getLogger(__name__)

#: Max |cutlass - reference| / max |reference| accepted, per dtype (all accumulate in
#: float32; they differ by the rounding of the output and operands and the summation
#: order; the reference is cuBLAS in float32 for tf32 and f32).
TOLERANCE = {"f16": 5e-3, "bf16": 3e-2, "tf32": 5e-3, "f32": 1e-4}


def _cast(cp: Any, x: Any, dtype: str) -> Any:
    if dtype == "bf16":
        return _to_bf16_bits(cp, x)
    return x.astype(cp.float16) if dtype == "f16" else x


def gemm_inputs(m: int, n: int, k: int, dtype: str, layout: str, seed: int = 0) -> tuple:
    """CuPy ``a`` (M x K), ``b`` (K x N) in ``layout``'s memory order, uniform in
    [-1, 1], and a C-contiguous ``out`` poisoned with NaN.

    CuPy has no bfloat16 arrays: bf16 operands are ``int16`` arrays holding the bf16 bit
    patterns (rounded to nearest even from float32); :func:`as_float32` reads them back.
    ``tf32`` and ``f32`` operands are float32.
    """
    import cupy as cp

    rng = cp.random.default_rng(seed)

    def mat(rows: int, cols: int, order: str) -> Any:
        shape = (rows, cols) if order == "t" else (cols, rows)
        x = _cast(cp, rng.uniform(-1, 1, shape, dtype=cp.float32), dtype)
        return x if order == "t" else x.T

    a = mat(m, k, layout[0])
    b = mat(k, n, layout[1])
    out = _cast(cp, cp.full((m, n), cp.nan, dtype=cp.float32), dtype)
    return a, b, out


def bias_input(n: int, dtype: str, seed: int = 1) -> Any:
    """A bias row of length ``n`` uniform in [-1, 1] in ``dtype`` (bf16 as bits)."""
    import cupy as cp

    return _cast(cp, cp.random.default_rng(seed).uniform(-1, 1, n, dtype=cp.float32), dtype)


def apply_epilogue(y: Any, bias: Any, activation: str | None) -> Any:
    """``act(y + bias)`` in float32 on CuPy arrays: the fused epilogue's reference."""
    import cupy as cp

    if bias is not None:
        y = y + bias
    if activation == "relu":
        y = cp.maximum(y, 0)
    elif activation == "gelu":
        y = 0.5 * y * (1 + cp.tanh(0.7978845608028654 * (y + 0.044715 * y ** 3)))
    elif activation == "silu":
        y = y / (1 + cp.exp(-y))
    return y


def _to_bf16_bits(cp: Any, x: Any) -> Any:
    u = cp.ascontiguousarray(x).view(cp.uint32)
    rounded = (u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16
    rounded = cp.where(cp.isnan(x), cp.uint32(0x7FC0), rounded)  # keep NaN a NaN
    return rounded.astype(cp.uint16).view(cp.int16)


def as_float32(x: Any, dtype: str) -> Any:
    """A CuPy float32 copy of an f16 array or of bf16 bits (see :func:`gemm_inputs`)."""
    import cupy as cp

    if dtype != "bf16":
        return x.astype(cp.float32)
    return (cp.ascontiguousarray(x).view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)


def reference(a: Any, b: Any, dtype: str) -> tuple[Any, Callable[[], Any], str]:
    """cuBLAS's ``a @ b`` as float32, a zero-argument call that runs cuBLAS again (for
    timing) and its name: ``cupy.matmul`` for f16 and f32; ``torch.matmul`` for bf16
    (CuPy has no bfloat16; torch's matmul is cuBLAS too) and for tf32 (cuBLAS's TF32
    mode, ``allow_tf32``; the reference values are still float32 ones from CuPy)."""
    import cupy as cp

    if dtype in ("f16", "f32"):
        out = cp.matmul(a, b)
        return out.astype(cp.float32), lambda: cp.matmul(a, b, out=out), "cublas"
    if dtype == "tf32":
        ref = cp.matmul(a, b)
        try:
            import torch
        except ImportError:
            log.info("torch is not installed: the tf32 baseline is cuBLAS in float32")
            out = ref.copy()
            return ref, lambda: cp.matmul(a, b, out=out), "cublas"
        ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
        tout = torch.empty((a.shape[0], b.shape[1]), device="cuda", dtype=torch.float32)

        def run_tf32() -> Any:
            flag = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return torch.matmul(ta, tb, out=tout)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = flag

        return ref, run_tf32, "cublas"
    try:
        import torch
    except ImportError:
        raise PycLabError("bf16 tuning checks against cuBLAS through torch.matmul (CuPy has "
                          "no bfloat16); install torch or tune f16") from None
    ta = torch.as_tensor(a, device="cuda").view(torch.bfloat16)
    tb = torch.as_tensor(b, device="cuda").view(torch.bfloat16)
    ref = ta @ tb
    return cp.asarray(ref.float()), lambda: torch.matmul(ta, tb, out=ref), "cublas"


def cublaslt_baseline(a: Any, b: Any, bias: Any, epi: Epilogue,
                       dtype: str) -> Callable[[], Any] | None:
    """cuBLASLt running the same fused epilogue (f16/f32 relu/gelu), or None."""
    try:
        from ..cublaslt import FusedGemm, why_not

        if dtype == "bf16" or why_not(tuple(a.shape), tuple(b.shape), a.dtype, b.dtype,
                                      a.dtype, None if bias is None else tuple(bias.shape),
                                      None if bias is None else bias.dtype, epi.activation):
            return None
        import cupy as cp

        gemm = FusedGemm(epi.activation, has_bias=epi.bias)
        out = cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        return lambda: gemm(a, b, out, bias)
    except Exception as exc:  # nvmath missing or refusing: no such baseline
        log.info("no cuBLASLt baseline: %s", exc)
        return None


def torch_baseline(a: Any, b: Any, dtype: str) -> Callable[[], Any] | None:
    """``torch.matmul`` on the same f16 operands (``None`` for other dtypes — bf16's
    cuBLAS baseline is torch.matmul already — or without torch)."""
    if dtype != "f16":
        return None
    try:
        import torch

        ta = torch.as_tensor(a, device="cuda")
        tb = torch.as_tensor(b, device="cuda")
    except Exception as exc:  # torch missing or unable to take the arrays
        log.debug("torch baseline skipped: %s", exc)
        return None
    return lambda: ta @ tb


def lt_baseline(a: Any, b: Any, dtype: str) -> Callable[[], Any] | None:
    """cuBLASLt's plain ``a @ b`` exactly as ``pl.matmul`` issues it
    (:class:`~pyc_lab.kernels.blas_direct.LtGemm`: the heuristic's first algorithm,
    asked once), for f16 and bf16 (operands held as bf16 bit patterns are passed by
    pointer); ``None`` without nvmath-python or for operands cuBLASLt cannot take."""
    if dtype not in ("f16", "bf16"):
        return None
    try:
        import cupy as cp

        from ..blas_direct import LtGemm
        from ..blas_layout import describe

        def elements(x: Any) -> tuple[int, ...]:
            return tuple(st // x.dtype.itemsize for st in x.strides)

        out = cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        gemm = describe(tuple(a.shape), elements(a), tuple(b.shape), elements(b),
                        elements(out))
        if isinstance(gemm, str):
            raise PycLabError(gemm)
        lt = LtGemm(gemm, "float16" if dtype == "f16" else "bfloat16")
        ptrs = (a.data.ptr, b.data.ptr, out.data.ptr)
    except Exception as exc:  # nvmath missing or refusing: no such baseline
        log.info("no cuBLASLt baseline for %s: %s", dtype, exc)
        return None

    def run() -> Any:
        lt(*ptrs, cp.cuda.get_current_stream().ptr)
        return out

    return run
