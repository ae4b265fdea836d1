"""torch's own convolution and activations: what ``pl.conv`` runs where nothing of
pyc_lab's is faster, and what a pyc_lab kernel hands a call it must not take.

:func:`cudnn_conv` is ``torch.nn.functional.conv{1,2,3}d`` with cuDNN in its benchmark
mode (the user's setting restored after the call); :func:`torch_activation` applies
``relu``/``gelu`` (tanh form)/``silu`` to a torch tensor; :func:`tf32_allowed` sets
whether torch may compute float32 convolutions and matrix products in TF32 for a block
of calls (``torch.backends.cudnn.allow_tf32``, on by default: a float32 convolution then
carries about 5e-4 relative error; ``torch.backends.cuda.matmul.allow_tf32``, off by
default), and :func:`tf32_now` reads them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["cudnn_conv", "tf32_allowed", "tf32_now", "torch_activation"]


def cudnn_conv(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
           dilation: tuple[int, ...], groups: int, benchmark: bool = True) -> Any:
    """torch's convolution, with cuDNN in its benchmark mode unless told otherwise (the
    user's setting restored after the call; their other cuDNN settings kept)."""
    fn = _torch_conv(x.ndim - 2)
    if not benchmark:
        return fn(x, w, b, stride, pads, dilation, groups)
    get, put = _benchmark_flag()
    was = get()
    if was:
        return fn(x, w, b, stride, pads, dilation, groups)
    put(True)
    try:
        return fn(x, w, b, stride, pads, dilation, groups)
    finally:
        put(was)


@functools.cache
def _torch_conv(nd: int) -> Callable[..., Any]:
    import torch.nn.functional as F

    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]


#: torch's process-wide flags pyc_lab sets around its calls: (C getter, C setter, the
#: ``torch.backends`` module and attribute holding the same flag).
_FLAGS = {"benchmark": ("_get_cudnn_benchmark", "_set_cudnn_benchmark", "cudnn", "benchmark"),
          "cudnn_tf32": ("_get_cudnn_allow_tf32", "_set_cudnn_allow_tf32", "cudnn",
                         "allow_tf32"),
          "matmul_tf32": ("_get_cublas_allow_tf32", "_set_cublas_allow_tf32", "cuda.matmul",
                          "allow_tf32")}


@functools.cache
def _flag(name: str) -> tuple[Callable[[], bool], Callable[[bool], None]]:
    """Reading and setting one of torch's flags (:data:`_FLAGS`) through torch's own two
    C functions where it has them (the module attribute costs microseconds a call);
    without torch, never set (nothing of torch's runs)."""
    try:
        import torch
    except ImportError:
        return (lambda: False), (lambda value: None)
    c_get, c_set, module, attr = _FLAGS[name]
    get = getattr(torch._C, c_get, None)
    put = getattr(torch._C, c_set, None)
    if get is None or put is None:  # pragma: no cover - older or newer torch
        holder = functools.reduce(getattr, module.split("."), torch.backends)

        def get() -> bool:
            return bool(getattr(holder, attr))

        def put(value: bool) -> None:
            setattr(holder, attr, value)
    return get, put


def _benchmark_flag() -> tuple[Callable[[], bool], Callable[[bool], None]]:
    """``torch.backends.cudnn.benchmark``'s getter and setter."""
    return _flag("benchmark")


def tf32_now() -> tuple[bool, bool]:
    """Whether torch may compute float32 convolutions (cuDNN) and float32 matrix
    products (cuBLAS: the GEMM form of a convolution) in TF32 now — torch's settings,
    or those :func:`tf32_allowed` holds."""
    return _flag("cudnn_tf32")[0](), _flag("matmul_tf32")[0]()


@contextlib.contextmanager
def tf32_allowed(allowed: bool | None) -> Iterator[None]:
    """torch's TF32 for float32 convolutions and matrix products (``torch.backends.
    cudnn.allow_tf32``, ``torch.backends.cuda.matmul.allow_tf32``) set to ``allowed``
    inside the block and the user's settings restored after it; ``None`` leaves them.
    Like torch's ``torch.backends.cudnn.flags``, the settings are the process's: what
    torch runs on another thread meanwhile sees them too."""
    if allowed is None:
        yield
        return
    changed = []
    try:
        for name in ("cudnn_tf32", "matmul_tf32"):
            get, put = _flag(name)
            was = get()
            if was != allowed:
                put(allowed)
                changed.append((put, was))
        yield
    finally:
        for put, was in reversed(changed):
            put(was)


def torch_activation(y: Any, activation: str | None, inplace: bool = True) -> Any:
    """``activation`` applied to a torch tensor: in place where torch can (a fresh
    result), or out of place (``inplace=False``: a result autograd keeps)."""
    if activation is None:
        return y
    import torch.nn.functional as F

    if activation == "relu":
        return y.relu_() if inplace else F.relu(y)
    if activation == "silu":
        return F.silu(y, inplace=inplace)
    return F.gelu(y, approximate="tanh")
