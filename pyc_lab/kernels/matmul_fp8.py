"""FP8 GEMMs on Hopper: torch float8 tensors through cuBLASLt with per-tensor scales.

Hopper's tensor cores multiply float8 (``e4m3``: more precision, ``e5m2``: more range)
at twice the bfloat16 rate. A float8 tensor is a quantised copy of a real one,
``x ~ scale_x * x8``; cuBLASLt takes the two scales as device pointers and computes
``out = (scale_a * a8) @ (scale_b * b8)`` in float32, rounded once to ``out_dtype``.
That is the call ``torch._scaled_mm`` makes, and the baseline a user would compare with:
the first call of a problem times the direct cuBLASLt call (:class:`~.blas_direct.LtGemm`)
against ``torch._scaled_mm`` on its operands and keeps the faster (never slower than the
call a user would make instead; :func:`fp8_choices` says which).

cuBLASLt's FP8 kernels take one layout: ``a`` row-major (M x K) and ``b`` a transposed
view of a row-major (N x K) weight, as a linear layer holds it, with K a multiple of 16;
``e5m2 @ e5m2`` has no kernel. :func:`matmul_fp8` checks all of that and says what to
change; the problem's cuBLASLt descriptors and algorithm are made once per signature
and the call passes only pointers (:class:`~.blas_direct.LtGemm`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..errors import PycLabError
from .arrays import torch_raw_stream

__all__ = ["FP8", "OUT_DTYPES", "fp8_choices", "is_fp8", "matmul_fp8"]

log = logging.getLogger(__name__)

#: torch's float8 dtype names taken here.
FP8 = ("float8_e4m3fn", "float8_e5m2")
#: Result dtypes.
OUT_DTYPES = ("bfloat16", "float16", "float32")

_GEMMS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def _name(x: Any) -> str:
    return str(getattr(x, "dtype", "")).removeprefix("torch.")


def is_fp8(x: Any) -> bool:
    """Whether ``x`` is a torch float8 tensor."""
    return type(x).__module__.startswith("torch") and _name(x) in FP8


def _scale(torch: Any, s: Any, name: str, device: Any) -> Any:
    if s is None:
        raise PycLabError(f"matmul: float8 operands need {name}= (the float32 scale x = "
                          f"{name} * x8 they were quantised with; 1.0 if none)")
    if isinstance(s, (int, float)):
        return torch.tensor([float(s)], dtype=torch.float32, device=device)
    if not type(s).__module__.startswith("torch") or s.numel() != 1 \
            or s.dtype != torch.float32 or s.device != device:
        raise PycLabError(f"matmul: {name} must be a float, or a one-element float32 torch "
                          f"tensor on {device} (per-tensor scaling)")
    return s


def _check(a: Any, b: Any, out: Any, out_dtype: str) -> None:
    if not (is_fp8(a) and is_fp8(b)):
        raise PycLabError(f"matmul: float8 GEMMs take two torch float8 tensors; got "
                          f"{type(a).__name__} {_name(a)} and {type(b).__name__} {_name(b)} "
                          "(quantise both, e.g. x.to(torch.float8_e4m3fn))")
    if not (a.is_cuda and b.is_cuda) or a.device != b.device:
        raise PycLabError("matmul: float8 operands must be CUDA tensors on one device "
                          "(cuBLASLt's FP8 kernels need a Hopper-class GPU)")
    if _name(a) == _name(b) == "float8_e5m2":
        raise PycLabError("matmul: cuBLASLt has no e5m2 @ e5m2 kernel; make one operand "
                          "float8_e4m3fn")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise PycLabError(f"matmul: float8 operands must be 2-D and multiply; got "
                          f"{tuple(a.shape)} @ {tuple(b.shape)}")
    k = a.shape[1]
    if a.stride(1) != 1 or b.stride(0) != 1 or k % 16 or a.stride(0) % 16 or b.stride(1) % 16:
        raise PycLabError("matmul: cuBLASLt's float8 kernels take a row-major a (M x K), b "
                          "as the transpose of a row-major (N x K) weight (b = w.T), and K a "
                          f"multiple of 16; got a strides {a.stride()}, b strides "
                          f"{b.stride()}, K = {k} (use .contiguous() on a, w.T for b, pad K)")
    if out_dtype not in OUT_DTYPES:
        raise PycLabError(f"matmul: out_dtype {out_dtype!r} is not one of {OUT_DTYPES}")
    shape = (a.shape[0], b.shape[1])
    if out is not None and (not type(out).__module__.startswith("torch")
                            or _name(out) != out_dtype or tuple(out.shape) != shape
                            or not out.is_contiguous() or out.device != a.device):
        raise PycLabError(f"matmul: out must be a contiguous {out_dtype} torch tensor of "
                          f"shape {shape} on {a.device}")


def _scaled_mm(torch: Any, a: Any, b: Any, sa: Any, sb: Any, out: Any, out_dtype: str) -> Any:
    y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=getattr(torch, out_dtype))
    if out is None:
        return y
    out.copy_(y)
    return out


def _choose(torch: Any, a: Any, b: Any, sa: Any, sb: Any, out: Any, out_dtype: str) -> Any:
    """The faster of the direct cuBLASLt call and ``torch._scaled_mm`` for this problem,
    measured on the call's own operands (the never-slower rule): an ``LtGemm``, or the
    string ``"torch._scaled_mm"``."""
    from .blas_direct import LtGemm, race
    from .blas_layout import describe

    shape = (a.shape[0], b.shape[1])
    gemm = describe(tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), (shape[1], 1))
    if isinstance(gemm, str):
        raise PycLabError(f"matmul: float8 operands: {gemm}")
    g = LtGemm(gemm, out_dtype, operand_dtypes=(_name(a), _name(b)), row_orders=False)
    target = out if out is not None else torch.empty(shape, dtype=getattr(torch, out_dtype),
                                                     device=a.device)
    stream = torch_raw_stream(a.device)

    def direct() -> None:
        g.set_scales(sa.data_ptr(), sb.data_ptr())
        g(a.data_ptr(), b.data_ptr(), target.data_ptr(), stream)

    if not hasattr(torch, "_scaled_mm"):
        return g
    def theirs_fn() -> None:
        _scaled_mm(torch, a, b, sa, sb, None, out_dtype)

    try:
        theirs_fn()
    except Exception as exc:  # torch cannot run it: nothing to compare with
        log.info("torch._scaled_mm cannot run this FP8 GEMM: %s", exc)
        return g
    ours, theirs = race([direct, theirs_fn], stream)
    log.info("FP8 %s x %s x %s: cuBLASLt direct %.4f ms, torch._scaled_mm %.4f ms",
             a.shape[0], b.shape[1], a.shape[1], ours, theirs)
    return g if ours <= theirs else "torch._scaled_mm"


def _gemm(torch: Any, a: Any, b: Any, sa: Any, sb: Any, out: Any, out_dtype: str) -> Any:
    key = (tuple(a.shape), a.stride(), _name(a), tuple(b.shape), b.stride(), _name(b),
           out_dtype, a.device.index)
    g = _GEMMS.get(key)
    if g is None:
        g = _choose(torch, a, b, sa, sb, out, out_dtype)
        with _LOCK:
            if len(_GEMMS) > 1024:
                _GEMMS.clear()
            _GEMMS[key] = g
    return g


def fp8_choices() -> dict[tuple, str]:
    """What runs per FP8 problem signature seen so far: ``"cublaslt"`` (the direct call)
    or ``"torch._scaled_mm"`` (measured faster on the first call)."""
    return {k: v if isinstance(v, str) else v.impl for k, v in _GEMMS.items()}


def matmul_fp8(a: Any, b: Any, *, scale_a: Any, scale_b: Any, out: Any = None,
               out_dtype: str = "bfloat16") -> Any:
    """``out = (scale_a * a) @ (scale_b * b)`` for float8 torch tensors, on torch's stream.

    Parameters
    ----------
    a, b
        CUDA torch tensors of ``float8_e4m3fn`` or ``float8_e5m2`` (not both e5m2):
        ``a`` row-major (M x K), ``b`` the transpose of a row-major (N x K) weight;
        K a multiple of 16.
    scale_a, scale_b
        Per-tensor dequantisation scales: floats, or one-element float32 tensors on the
        operands' device (read by the kernel, so they may change between calls).
    out
        Optional contiguous ``out_dtype`` tensor of shape (M, N).
    out_dtype
        ``"bfloat16"`` (default), ``"float16"`` or ``"float32"``.

    Returns
    -------
    torch.Tensor
        ``out``, or a new tensor.

    Raises
    ------
    PycLabError
        For operands, scales or an ``out`` cuBLASLt's FP8 kernels do not take, or a GPU
        without them: what was wrong and what to do.
    """
    _check(a, b, out, out_dtype)
    import torch

    if a.requires_grad or b.requires_grad:
        raise PycLabError("pl.matmul does not record gradients; pass tensor.detach()")
    sa = _scale(torch, scale_a, "scale_a", a.device)
    sb = _scale(torch, scale_b, "scale_b", a.device)
    with torch.cuda.device(a.device):
        g = _gemm(torch, a, b, sa, sb, out, out_dtype)
    if isinstance(g, str):
        return _scaled_mm(torch, a, b, sa, sb, out, out_dtype)
    if out is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=getattr(torch, out_dtype),
                          device=a.device)
    with torch.cuda.device(a.device):
        g.set_scales(sa.data_ptr(), sb.data_ptr())
        g(a.data_ptr(), b.data_ptr(), out.data_ptr(),
          torch_raw_stream(a.device))
    return out
