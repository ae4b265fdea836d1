"""The guard that keeps a CUTLASS 2 few- or fixed-channels convolution exact on every input.

Those kernels read the pixels of filter taps past the window (CUTLASS masks the taps'
filter values, not their pixels; :attr:`~.cutlass.conv_2x.Conv2xConfig.reads_outside_window`),
so a NaN or an infinity turns outputs NaN whose window does not hold it. Finite inputs
are exact. ``native/conv_guard.cuh`` keeps every answer exact without the host waiting
for the GPU — so a guarded call stays asynchronous and can be captured in a CUDA graph:

1. :func:`pad_check` zeroes a one-word flag, copies the input into the zero-padded
   channels a ``pad_to`` configuration reads (or only checks it, for one that reads the
   channels as given) and sets the flag on any NaN or infinity;
2. the CUTLASS kernel runs;
3. :func:`fixup` returns at once while the flag is clear (one tiny launch) and otherwise
   recomputes every output directly in float32 from the same operands, with the bias and
   the activation, as IEEE arithmetic answers.

Tensors are torch's, on the GPU; the kernels are compiled once per device and dtype with
NVRTC (:mod:`pyc_lab.kernels.nvrtc`, subnormals kept) and run on torch's current stream.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import PycLabError
from .nvrtc import compile_module

__all__ = ["fixup", "pad_check"]

#: The kernels' element kinds by torch dtype name, and their C++ words.
_KINDS = {"torch.float16": 0, "torch.bfloat16": 1, "torch.float32": 2}
_WORDS = {0: "unsigned short", 1: "unsigned short", 2: "unsigned int"}
#: Activation codes of ``pyc_conv_fixup``.
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "silu": 3}
_THREADS = 256
#: The fix-up's grid: it reads the flag and returns in the common case, so its blocks are
#: what it costs then (a grid sized to the output, half a million blocks for a stem at
#: batch 128, took longer than the convolution's padding copy); grid-stride covers the
#: rest when it recomputes.
FIXUP_BLOCKS = 1024
_FUNCTIONS: dict[tuple[int, int, str], Any] = {}
_LOCK = threading.Lock()


def _function(device: int, kind: int, name: str) -> Any:
    import cupy as cp

    from ..paths import native_source

    fn = _FUNCTIONS.get((device, kind, name))
    if fn is not None:
        return fn
    with _LOCK:
        if (device, kind, name) not in _FUNCTIONS:
            code = "".join(native_source(f) for f in ("f16.cuh", "bf16.cuh", "conv_guard.cuh"))
            names = ("pyc_conv_pad_check", "pyc_conv_fixup")
            with cp.cuda.Device(device):
                module = compile_module(code, ("-std=c++17",),
                                        [f"{n}<{kind}>" for n in names],
                                        "the convolution guards")
                for n in names:
                    _FUNCTIONS[(device, kind, n)] = module.get_function(f"{n}<{kind}>")
    return _FUNCTIONS[(device, kind, name)]


def _launch(fn: Any, device: int, total: int, args: tuple, most: int = 65535 * 8,
            stream: Any = None) -> None:
    """``fn`` over ``total`` items (grid-stride, at most ``most`` blocks) on ``stream``
    (a CuPy stream; torch's current stream of ``device`` when not given)."""
    import cupy as cp

    from .arrays import torch_stream

    blocks = max(1, min(-(-total // _THREADS), most))
    stream = stream if stream is not None else torch_stream(device)
    if cp.cuda.runtime.getDevice() == device:  # the usual case: no device switch
        fn((blocks,), (_THREADS,), args, stream=stream)
        return
    with cp.cuda.Device(device):
        fn((blocks,), (_THREADS,), args, stream=stream)


def pad_check(xl: Any, channels: int, stream: Any = None) -> tuple[Any, Any]:
    """Start the guard of one call: ``(flag, padded)``.

    Parameters
    ----------
    xl
        The input as ``(N, *spatial, C)`` (channels last; any strides with the channel
        stride 1), one or two spatial axes, float16, bfloat16 or float32.
    channels
        The channels the kernel reads: more than ``C`` to get a zero-padded copy, ``C``
        for the check alone.
    stream
        The CuPy stream to run on (:func:`~.arrays.torch_stream`, which a caller issuing
        several launches looks up once); torch's current stream when not given.

    Returns
    -------
    tuple
        A zeroed ``int32`` flag tensor that the check sets on a NaN or infinity, and the
        contiguous ``(N, *spatial, channels)`` copy (``None`` for the check alone).
    """
    import cupy as cp
    import numpy as np
    import torch

    from .arrays import torch_stream

    kind = _KINDS[str(xl.dtype)]
    n, *spatial, c = (int(v) for v in xl.shape)
    h, w = (1, spatial[0]) if len(spatial) == 1 else spatial
    strides = [int(v) for v in xl.stride()]
    xs_n, xs_h, xs_w = (strides[0], 0, strides[1]) if len(spatial) == 1 else strides[:3]
    device = xl.device.index
    stream = stream if stream is not None else torch_stream(device)
    if cp.cuda.runtime.getDevice() == device:  # a memset, not a fill kernel's launch
        flag = torch.empty(1, dtype=torch.int32, device=xl.device)
        cp.cuda.runtime.memsetAsync(flag.data_ptr(), 0, 4, stream.ptr)
    else:  # torch's fill, on torch's current stream of that device
        flag = torch.zeros(1, dtype=torch.int32, device=xl.device)
    out = torch.empty((n, *spatial, channels), dtype=xl.dtype, device=xl.device) \
        if channels > c else None
    if channels * xl.element_size() > 16:
        raise PycLabError(f"pad_check pads to at most 16 bytes a pixel, not {channels} "
                          f"{xl.dtype} channels")
    total = n * h * w
    fn = _function(device, kind, "pyc_conv_pad_check")
    _launch(fn, device, total,
            (np.uint64(xl.data_ptr()), np.uint64(0 if out is None else out.data_ptr()),
             np.uint64(flag.data_ptr()), np.int32(n), np.int32(h), np.int32(w), np.int32(c),
             np.int32(channels), np.int64(xs_n), np.int64(xs_h), np.int64(xs_w)),
            stream=stream)
    return flag, out


def fixup(flag: Any, x: Any, wt: Any, bias: Any, y: Any, geometry: Any,
          activation: str | None, stream: Any = None) -> None:
    """Finish the guard: if ``flag`` is set, recompute ``y`` directly.

    Parameters
    ----------
    flag
        :func:`pad_check`'s flag.
    x, wt
        What the kernel read: ``(N, *spatial, C')`` and ``(K, *kernel, C')``, contiguous.
    bias
        ``(K,)`` or ``None``.
    y
        The kernel's output, ``(N, *out, K)`` contiguous; rewritten in place.
    geometry
        The :class:`~.cutlass.conv.ConvGeometry` the kernel ran (``C'`` channels).
    activation
        ``None``, ``"relu"``, ``"gelu"`` (tanh form) or ``"silu"``.
    stream
        As for :func:`pad_check`.
    """
    import numpy as np

    kind = _KINDS[str(x.dtype)]
    one_d = geometry.spatial == 1
    n, *spatial, c = geometry.act
    k, *kernel, _ = geometry.flt
    h, w = (1, spatial[0]) if one_d else spatial
    r, s = (1, kernel[0]) if one_d else kernel
    p, q = (1, geometry.out[0]) if one_d else geometry.out
    if one_d:  # a 1-D problem is a 2-D one of height 1
        (sh, sw), (ph, pw), (dh, dw) = ((1, geometry.stride[0]), (0, geometry.pad[0]),
                                        (1, geometry.dilation[0]))
    else:
        (sh, sw), (ph, pw), (dh, dw) = geometry.stride, geometry.pad, geometry.dilation
    device = x.device.index
    fn = _function(device, kind, "pyc_conv_fixup")
    args = (np.uint64(flag.data_ptr()), np.uint64(x.data_ptr()), np.uint64(wt.data_ptr()),
            np.uint64(0 if bias is None else bias.data_ptr()), np.uint64(y.data_ptr()),
            *(np.int32(v) for v in (n, h, w, c, k, r, s, p, q, sh, sw, ph, pw, dh, dw,
                                    ACTIVATION_CODES[activation])))
    _launch(fn, device, n * p * q * k, args, FIXUP_BLOCKS, stream)
