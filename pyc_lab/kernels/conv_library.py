"""torch's own convolution and activations: what ``pl.conv`` runs where nothing of
pyc_lab's is faster, and what a pyc_lab kernel hands a call it must not take.

:func:`cudnn_conv` is ``torch.nn.functional.conv{1,2,3}d`` with cuDNN in its benchmark
mode (the user's setting restored after the call); :func:`torch_activation` applies
``relu``/``gelu`` (tanh form)/``silu`` to a torch tensor; :func:`cudnn_tf32` sets whether
cuDNN may compute float32 convolutions in TF32 for a block of calls (torch's
``torch.backends.cudnn.allow_tf32``, on by default: a float32 convolution then carries
about 5e-4 relative error), and :func:`tf32_now` reads it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["cudnn_conv", "cudnn_tf32", "tf32_now", "torch_activation"]


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


@functools.cache
def _benchmark_flag() -> tuple[Callable[[], bool], Callable[[bool], None]]:
    """Reading and setting ``torch.backends.cudnn.benchmark`` (torch's own two C
    functions where it has them: the module attribute costs microseconds a call)."""
    import torch

    get = getattr(torch._C, "_get_cudnn_benchmark", None)
    put = getattr(torch._C, "_set_cudnn_benchmark", None)
    if get is None or put is None:  # pragma: no cover - older or newer torch
        def get() -> bool:
            return bool(torch.backends.cudnn.benchmark)

        def put(value: bool) -> None:
            torch.backends.cudnn.benchmark = value
    return get, put


@functools.cache
def _tf32_flag() -> tuple[Callable[[], bool], Callable[[bool], None]]:
    """Reading and setting ``torch.backends.cudnn.allow_tf32`` (torch's own two C
    functions where it has them); without torch, never (nothing runs cuDNN)."""
    try:
        import torch
    except ImportError:
        return (lambda: False), (lambda value: None)
    get = getattr(torch._C, "_get_cudnn_allow_tf32", None)
    put = getattr(torch._C, "_set_cudnn_allow_tf32", None)
    if get is None or put is None:  # pragma: no cover - older or newer torch
        def get() -> bool:
            return bool(torch.backends.cudnn.allow_tf32)

        def put(value: bool) -> None:
            torch.backends.cudnn.allow_tf32 = value
    return get, put


def tf32_now() -> bool:
    """Whether cuDNN may compute float32 convolutions in TF32 now (torch's setting, or
    the one :func:`cudnn_tf32` holds)."""
    return _tf32_flag()[0]()


@contextlib.contextmanager
def cudnn_tf32(allowed: bool | None) -> Iterator[None]:
    """cuDNN's TF32 for float32 convolutions set to ``allowed`` inside the block and the
    user's setting restored after it; ``None`` leaves the user's setting. Like torch's
    ``torch.backends.cudnn.flags``, the setting is the process's: a convolution torch
    runs on another thread meanwhile sees it too."""
    if allowed is None:
        yield
        return
    get, put = _tf32_flag()
    was = get()
    if was == allowed:
        yield
        return
    put(allowed)
    try:
        yield
    finally:
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
