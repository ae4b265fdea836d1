"""The launchers behind :func:`pyc_lab.matmul`: one small function per implementation.

Each ``*_runner(...)`` is made once per problem (shapes, strides, dtypes, epilogue,
scales) and returns ``run(a, b, out, bias) -> result``, which only launches: NumPy on the
CPU, cuBLAS (``cupy.matmul``), cuBLASLt plain (:class:`~.cublaslt.LtMatmul`, the bf16
path) or fused (:class:`~.cublaslt.FusedGemm`), or a tuned CUTLASS kernel. With an
``out`` of the product's dtype that is C-contiguous, a run writes straight into it:
nothing is allocated (with ``alpha == 1`` and ``beta == 0`` on the cuBLAS path) and
nothing synchronises, so a run can be captured in a CUDA graph.

A 3-D ``a`` (C-contiguous) times a 2-D ``b`` is "folded": ``(B, M, K) @ (K, N)`` is
the 2-D ``(B*M, K) @ (K, N)`` on views, one GEMM, no copy (``fold=(M_total, K)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import PycLabError
from .arrays import BF16, numpy_dtype

__all__ = ["apply_epilogue", "cublas_runner", "cutlass_runner", "fused_runner",
           "lt_runner", "numpy_runner", "plain_call_stream"]

Run = Callable[[Any, Any, Any, Any], Any]


def plain_call_stream(name: str, out: Any, c: Any, bias: Any, stream: Any) -> Any:
    """The stream a tuned kernel without an epilogue (the skinny GEMM, a tuned cuBLASLt
    pick) runs a call on: ``stream``, or CuPy's current one.

    Raises
    ------
    PycLabError
        For a bias (cuBLASLt's fused epilogue takes those) or a ``c`` other than ``out``
        (``beta``'s term is read from ``out`` itself).
    """
    if bias is not None:
        raise PycLabError(f"{name} has no bias epilogue (a bias goes through "
                          "cuBLASLt's fused epilogue)")
    if c is not None and c is not out:
        raise PycLabError(f"{name} reads beta's term from out itself (c must be out)")
    if stream is not None:
        return stream
    import cupy as cp

    return cp.cuda.get_current_stream()


def apply_epilogue(xp: Any, y: Any, bias: Any, activation: str | None) -> Any:
    """Bias and activation with NumPy or CuPy (``xp``); gelu is the tanh form."""
    if bias is not None:
        y = y + bias
    if activation == "relu":
        y = xp.maximum(y, 0)
    elif activation == "gelu":
        y = 0.5 * y * (1 + xp.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    elif activation == "silu":
        y = y / (1 + xp.exp(-y))
    return y


def numpy_runner(result: str, alpha: float, beta: float, activation: str | None) -> Run:
    """NumPy on the CPU; bfloat16 operands are computed in float32 and rounded once."""
    res = numpy_dtype(result)
    bf16 = result == BF16
    plain = alpha == 1.0 and not beta and activation is None

    def wide(x: Any) -> Any:
        return x.astype(np.float32) if x.dtype.name == BF16 else x

    def run(a: Any, b: Any, out: Any, bias: Any) -> Any:
        if plain and bias is None and not bf16 and a.dtype == b.dtype == res:
            return np.matmul(a, b, out=out)
        y = np.matmul(wide(a), wide(b))
        if alpha != 1.0:
            y = alpha * y
        if beta and out is not None:
            y = y + beta * wide(out)
        y = apply_epilogue(np, y, None if bias is None else wide(bias), activation)
        if out is not None:
            out[...] = y
            return out
        return y.astype(res, copy=False)

    return run


def _target(cp: Any, out: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """``out`` when a kernel can write it directly, else a new C-contiguous array."""
    if out is not None and out.dtype == dtype and out.flags.c_contiguous:
        return out
    return cp.empty(shape, dtype=dtype)


def _finish(out: Any, target: Any) -> Any:
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


def cublas_runner(result: str, shape: tuple[int, ...], alpha: float, beta: float,
                  activation: str | None) -> Run:
    """cuBLAS through ``cupy.matmul`` (strided-batched for 3-D), CuPy for the rest.

    bfloat16 epilogues and scales are applied in float32 and rounded once; batched
    bfloat16 operands are multiplied as float32 copies (CuPy 14's batched matmul fails
    on bfloat16; this is the path only without nvmath-python).
    """
    import cupy as cp

    res = cp.dtype(result)
    plain = alpha == 1.0 and not beta and activation is None
    wide = cp.dtype("float32")
    batched_bf16 = result == BF16 and len(shape) > 2

    def run(a: Any, b: Any, out: Any, bias: Any) -> Any:
        if batched_bf16:
            a, b = a.astype(wide), b.astype(wide)
            y = cp.matmul(a, b)
            if alpha != 1.0:
                y *= alpha
            if beta and out is not None:
                y += beta * out.astype(wide)
            y = apply_epilogue(cp, y, None if bias is None else bias.astype(wide), activation)
            if out is not None:
                out[...] = y
                return out
            return y.astype(res)
        if a.dtype != res:
            a = a.astype(res)
        if b.dtype != res:
            b = b.astype(res)
        if plain and bias is None:
            if out is None:
                return cp.matmul(a, b)  # the call a user would make, nothing around it
            target = _target(cp, out, shape, res)
            cp.matmul(a, b, out=target)
            return _finish(out, target)
        y = cp.matmul(a, b)
        if result == BF16:
            y = y.astype(cp.float32)
        if alpha != 1.0:
            y *= alpha
        if beta and out is not None:
            y += beta * (out.astype(cp.float32) if result == BF16 else out)
        if bias is not None and result == BF16:
            bias = bias.astype(cp.float32)
        y = apply_epilogue(cp, y, bias, activation)
        if out is not None:
            out[...] = y
            return out
        return y.astype(res, copy=False)

    return run


def lt_runner(lt: Any, result: str, shape: tuple[int, ...],
              fold: tuple[int, int] | None) -> Run:
    """A plain cuBLASLt GEMM (:class:`~.cublaslt.LtMatmul`), batched or folded."""
    import cupy as cp

    res = cp.dtype(result)
    m = fold[0] if fold else 0

    def run(a: Any, b: Any, out: Any, bias: Any) -> Any:
        target = _target(cp, out, shape, res)
        if fold:
            lt(a.reshape(fold), b, target.reshape(m, shape[-1]))
        else:
            lt(a, b, target)
        return _finish(out, target)

    return run


def _bias_vector(cp: Any, bias: Any, dtype: Any) -> Any:
    if bias is None or (bias.dtype == dtype and bias.flags.c_contiguous):
        return bias
    return cp.ascontiguousarray(bias, dtype=dtype)


def fused_runner(gemm: Any, result: str, shape: tuple[int, ...],
                 fold: tuple[int, int] | None) -> Run:
    """act(a @ b + bias) as one cuBLASLt GEMM (:class:`~.cublaslt.FusedGemm`)."""
    import cupy as cp

    res = cp.dtype(result)
    n = shape[-1]

    def run(a: Any, b: Any, out: Any, bias: Any) -> Any:
        target = _target(cp, out, shape, res)
        a2 = a.reshape(fold) if fold else a
        gemm(a2, b, target.reshape(a2.shape[0], n), _bias_vector(cp, bias, res))
        return _finish(out, target)

    return run


def cutlass_runner(kernel: Any, result: str, shape: tuple[int, ...],
                   fold: tuple[int, int] | None, alpha: float, beta: float) -> Run:
    """A tuned CUTLASS kernel (bias and activation inside its epilogue when tuned so)."""
    import cupy as cp

    res = cp.dtype(result)
    n = shape[-1]

    def run(a: Any, b: Any, out: Any, bias: Any) -> Any:
        a2 = a.reshape(fold) if fold else a
        direct = out is not None and out.dtype == res and out.flags.c_contiguous
        scale_c = beta if out is not None else 0.0
        target = out if direct else cp.empty(shape, dtype=res)
        if not direct and scale_c:
            target[...] = out
        kernel(a2, b, target.reshape(a2.shape[0], n), alpha=alpha, beta=scale_c,
               bias=_bias_vector(cp, bias, res))
        return _finish(out, target)

    return run
