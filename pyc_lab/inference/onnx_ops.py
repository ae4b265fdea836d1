"""ONNX operators as NumPy-style functions that ``pl.compile`` traces.

Every function here takes arrays (NumPy arrays, CuPy arrays, or the compiler's traced
proxies) plus Python attributes, and uses only what pyc_lab's compiler has ops for
(``matmul``, elementwise ufuncs, reductions, ``reshape``/``transpose``/``concatenate``,
basic slicing, and the compiler's ``softmax``/``layer_norm``/``relu``/``gelu``/
``sigmoid``), so an imported model compiles into one graph with no graph break.

Pooling is written as strided slices and an elementwise max/sum. A convolution is either
*im2col* over strided slices and one matrix product (:mod:`pyc_lab.kernels.conv_im2col`),
which stays inside the compiled program (its CUDA graph included), or a call of
``pl.conv`` (one ``conv`` node: on a GPU cuDNN, the GEMM form or pyc_lab's direct
kernel, whichever its first call measured fastest; the same im2col on NumPy arrays):
the direct kernel is recorded into the program's CUDA graphs, a library call runs
between them. :func:`conv` chooses per convolution by its size at the traced batch
(:data:`CONV_LIBRARY_FLOPS`) and whether the direct kernel takes it
(:func:`direct_candidate`). Shapes are
static: a shape-like input
(``Reshape``'s target, ``ReduceMean``'s axes ...) must be known when the model is
imported or traced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..compiler import functions as F
from ..compiler.padding import pad_axes
from ..compiler.views import contiguous_strides
from ..kernels.conv_im2col import conv_im2col, filled, out_size, pad_spatial

__all__ = [
    "AUTO_DIRECT_TAPS",
    "CONV_LIBRARY_FLOPS",
    "CONV_ROUTES",
    "average_pool",
    "batch_norm",
    "conv",
    "conv_channels_last",
    "conv_flops",
    "direct_candidate",
    "erf",
    "flatten",
    "gelu",
    "gemm",
    "global_average_pool",
    "global_average_pool_last",
    "layer_norm",
    "log_softmax",
    "max_pool",
    "pad",
    "pad_spatial",
    "reduce_mean",
    "reshape",
    "softmax",
    "softplus",
]


#: How an imported ``Conv`` runs: chosen by size, always ``pl.conv``, or always im2col.
CONV_ROUTES = ("auto", "library", "im2col")
#: ``route="auto"``: a convolution of at least this many floating-point operations (at
#: the traced batch) calls ``pl.conv``; smaller ones stay im2col inside the program. A
#: ``pl.conv`` node between CUDA graphs costs about 60 us a convolution on the H200 on
#: top of its GPU time (a bound call, its torch views made once), which an im2col of a
#: few hundred megaflops costs too: the light ResNet-50 ran in 2.05 ms at batch 1 all
#: im2col against 5.1 ms all through ``pl.conv`` (0.1-0.2 Gflop a convolution), 6.0
#: against 4.4 ms at batch 8 (0.8-1.9 Gflop) and 17.3 against 6.0 ms at batch 32, and the
#: 1-D particle CNN at batch 4096 (0.8 Gflop) 0.28 against 0.53 ms
#: (benchmarks/results/h200/issue15-fe42720/onnx-conv.json).
CONV_LIBRARY_FLOPS = 1 << 30
#: ``route="auto"``: a smaller convolution goes to ``pl.conv`` for pyc_lab's direct kernel
#: only with at most this many values summed per output (``C / groups * R * S``): short
#: reductions, where a GEMM's tiles sit mostly idle and the direct kernel's race against
#: cuDNN is won on the GPU; a longer one that cuDNN won would run between the program's
#: CUDA graphs, each call paying the host time that im2col inside the graph does not.
AUTO_DIRECT_TAPS = 256


def conv_flops(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
               pads: Sequence[int], dilations: Sequence[int]) -> int:
    """Multiply-adds x 2 of a convolution of ``x (N, C, *spatial)`` with
    ``w (O, C // group, *kernel)``."""
    nd = len(w_shape) - 2
    outs = [out_size(int(x_shape[2 + i]) + int(pads[i]) + int(pads[i + nd]), int(w_shape[2 + i]),
                     int(strides[i]), int(dilations[i])) for i in range(nd)]
    return 2 * int(x_shape[0]) * math.prod(int(v) for v in w_shape) * math.prod(max(o, 0)
                                                                               for o in outs)


def direct_candidate(x: Any, w: Any, strides: Sequence[int], pads: Sequence[int],
                     dilations: Sequence[int], group: int = 1, has_bias: bool = True) -> bool:
    """Whether ``route="auto"`` gives a small convolution to ``pl.conv`` because pyc_lab's
    direct kernel may run it (:mod:`pyc_lab.kernels.conv_direct`: few channels, short
    filters; raced against cuDNN at the first call, recorded into the program's CUDA
    graphs where it wins): torch is installed (the race runs through it), the reduction
    per output is short (:data:`AUTO_DIRECT_TAPS`), the kernel takes the problem at the
    traced batch, with symmetric pads, and the problem's race — run now on the GPU if it
    was not before (:func:`pyc_lab.kernels.conv.direct_in_graph`) — measured the direct
    kernel faster than the library that won it. Without a GPU: ``False``."""
    from ..kernels import arrays, conv_direct

    nd = len(w.shape) - 2
    if list(pads[:nd]) != list(pads[nd:]) or not arrays.torch_installed():
        return False
    taps = math.prod(int(v) for v in w.shape[1:])
    if taps > AUTO_DIRECT_TAPS:
        return False
    shape = tuple(int(v) for v in x.shape)
    contiguous = tuple(contiguous_strides(shape))
    w_shape = tuple(int(v) for v in w.shape)
    dtype = np.dtype(x.dtype).name
    if not conv_direct.eligible(dtype, shape, contiguous, w_shape, tuple(strides),
                                tuple(pads[:nd]), tuple(dilations), int(group)):
        return False
    from ..kernels.conv import direct_in_graph

    return direct_in_graph(shape, w_shape, dtype, stride=strides, padding=pads[:nd],
                           dilation=dilations, groups=int(group), bias=has_bias,
                           tf32=False)  # as the compiled node runs: exact float32


def conv(x: Any, w: Any, b: Any = None, *, strides: Sequence[int] | None = None,
         pads: Sequence[int] | None = None, dilations: Sequence[int] | None = None,
         group: int = 1, route: str = "im2col") -> Any:
    """ONNX ``Conv`` on NumPy (or the compiler's traced) arrays; ``x (N, C, *spatial)``,
    ``w (O, C // group, *kernel)``.

    ``route`` (:data:`CONV_ROUTES`): ``"im2col"`` runs
    :func:`~pyc_lab.kernels.conv_im2col.conv_im2col`; ``"library"`` calls ``pl.conv``
    (unequal pads are added first, as zeros); ``"auto"`` takes ``pl.conv`` for a
    convolution of at least :data:`CONV_LIBRARY_FLOPS` and for one pyc_lab's direct
    kernel may run (:func:`direct_candidate`), im2col for the rest.
    """
    if route not in CONV_ROUTES:
        raise ValueError(f"conv route must be one of {CONV_ROUTES}, got {route!r}")
    nd = w.ndim - 2
    strides = list(strides or [1] * nd)
    pads = list(pads or [0] * 2 * nd)
    dilations = list(dilations or [1] * nd)
    if route == "auto":
        big = conv_flops(x.shape, w.shape, strides, pads, dilations) >= CONV_LIBRARY_FLOPS
        route = "library" if big or direct_candidate(x, w, strides, pads, dilations, group,
                                                      b is not None) else "im2col"
    if route == "im2col":
        return conv_im2col(x, w, b, strides=strides, pads=pads, dilations=dilations,
                           group=group)
    from ..kernels.conv import conv as pl_conv

    if pads[:nd] != pads[nd:]:
        x = pad_spatial(x, pads)
        pads = [0] * 2 * nd
    return pl_conv(x, w, b, stride=tuple(strides), padding=tuple(pads[:nd]),
                   dilation=tuple(dilations), groups=int(group))


def conv_channels_last(x: Any, w: Any, b: Any = None, *,
                       strides: Sequence[int] | None = None,
                       pads: Sequence[int] | None = None,
                       dilations: Sequence[int] | None = None, group: int = 1) -> Any:
    """ONNX ``Conv`` of a channels-last 2-D input ``x (N, H, W, C)``, the weights as the
    graph holds them (``w (O, C // group, KH, KW)``): ``(N, P, Q, O)``, by ``pl.conv(...,
    layout="channels_last")`` (unequal pads are added first, as zeros)."""
    from ..kernels.conv import conv as pl_conv

    strides = list(strides or [1, 1])
    pads = list(pads or [0] * 4)
    dilations = list(dilations or [1, 1])
    if pads[:2] != pads[2:]:
        x = pad(x, [0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0])
        pads = [0] * 4
    return pl_conv(x, w, b, stride=tuple(strides), padding=tuple(pads[:2]),
                   dilation=tuple(dilations), groups=int(group), layout="channels_last")


def conv_transpose(x: Any, w: Any, b: Any = None, *, strides: Sequence[int] | None = None,
                   pads: Sequence[int] | None = None, dilations: Sequence[int] | None = None,
                   output_padding: Sequence[int] | None = None, group: int = 1,
                   route: str = "im2col") -> Any:
    """ONNX ``ConvTranspose`` (``w (C, O // group, *kernel)``) as the convolution it is
    the gradient of: the input with ``stride - 1`` zeros between its elements, padded by
    ``dilation * (k - 1)`` less the pads on each side (plus ``output_padding`` after; a
    negative amount crops), convolved at unit stride with the kernel flipped and each
    group's input and output channels swapped. The output extent is ONNX's
    ``stride * (in - 1) + output_padding + dilation * (k - 1) + 1 - pads``."""
    nd = w.ndim - 2
    strides = [int(v) for v in (strides or [1] * nd)]
    pads = [int(v) for v in (pads or [0] * 2 * nd)]
    dilations = [int(v) for v in (dilations or [1] * nd)]
    extra = [int(v) for v in (output_padding or [0] * nd)]
    c_in = int(w.shape[0])
    if c_in % group or x.shape[1] != c_in:
        raise ValueError(f"ConvTranspose: input channels {x.shape[1]} and weights "
                         f"{tuple(w.shape)} do not fit group={group}")
    # each group's (C/g, O/g, k) filters as (O/g, C/g, k), flipped in space
    flip = (slice(None), slice(None)) + (slice(None, None, -1),) * nd
    parts = [np.swapaxes(w[g * (c_in // group):(g + 1) * (c_in // group)], 0, 1)[flip]
             for g in range(group)]
    kernel = parts[0] if group == 1 else np.concatenate(parts, axis=0)
    for axis, s in enumerate(strides):
        if s > 1:  # s - 1 zeros after every element, none after the last
            a = 2 + axis
            length = int(x.shape[a])
            shape = list(x.shape)
            shape.insert(a + 1, s - 1)
            spread = np.concatenate([np.expand_dims(x, a + 1), filled(x, shape, 0)], axis=a + 1)
            merged = list(x.shape)
            merged[a] = length * s
            x = np.reshape(spread, merged)
            index = [slice(None)] * x.ndim
            index[a] = slice(0, (length - 1) * s + 1)
            x = x[tuple(index)]
    reach = [dilations[i] * (int(w.shape[2 + i]) - 1) for i in range(nd)]
    x = pad(x, [0, 0] + [reach[i] - pads[i] for i in range(nd)]
            + [0, 0] + [reach[i] - pads[nd + i] + extra[i] for i in range(nd)])
    return conv(x, kernel, b, strides=[1] * nd, pads=[0] * 2 * nd, dilations=dilations,
                group=group, route=route)


def _pool_separably(x: Any, kernel: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int], combine: Any, first: int) -> Any:
    """Reduce each window with ``combine`` (max or add), one spatial axis at a time.

    The spatial axes are ``first, first + 1, ...``. Max and sum over a box window are
    separable, so an N-D window of ``k1 x k2`` costs ``k1 + k2`` strided slices rather
    than ``k1 * k2``.
    """
    spatial = tuple(int(n) for n in x.shape[first:first + len(kernel)])
    for axis, (k, s, d) in enumerate(zip(kernel, strides, dilations, strict=True)):
        k, s, d = int(k), int(s), int(d)
        out = out_size(spatial[axis], k, s, d)
        if out <= 0:
            raise ValueError(f"the window {tuple(kernel)} does not fit the input's spatial "
                             f"shape {spatial}")
        index = [slice(None)] * x.ndim
        views = []
        for o in range(k):
            index[first + axis] = slice(o * d, o * d + s * (out - 1) + 1, s)
            views.append(x[tuple(index)])
        x = views[0]
        for v in views[1:]:
            x = combine(x, v)
    return x


def _pad_window(x: Any, pads: Sequence[int], nd: int, first: int, value: Any = 0.0) -> Any:
    """``x`` with ONNX's ``pads`` (``[x1_begin, ..., x1_end, ...]``) added as ``value``
    on the spatial axes ``first, first + 1, ...``."""
    if not any(pads):
        return x
    widths = [(0, 0)] * x.ndim
    for i in range(nd):
        widths[first + i] = (int(pads[i]), int(pads[nd + i]))
    return pad_axes(x, widths, "constant", value)


def _first_spatial(x: Any, nd: int, channels_last: bool) -> int:
    """The first spatial axis: 1 for a channels-last ``(N, *spatial, C)`` array, 2 for
    ``(N, C, *spatial)``."""
    if x.ndim != nd + 2:
        raise ValueError(f"a {nd}-D pooling window needs a {nd + 2}-D input, got "
                         f"{x.ndim}-D")
    return 1 if channels_last else 2


def max_pool(x: Any, kernel: Sequence[int], *, strides: Sequence[int] | None = None,
             pads: Sequence[int] | None = None, dilations: Sequence[int] | None = None,
             channels_last: bool = False) -> Any:
    """ONNX ``MaxPool`` (floor mode): the elementwise maximum of the window's slices.

    ``channels_last``: ``x`` is ``(N, *spatial, C)`` and so is the result (the graph's
    ``(N, C, *spatial)`` transposed), as :mod:`.onnx_layout` holds activations.
    """
    nd = len(kernel)
    first = _first_spatial(x, nd, channels_last)
    dt = np.dtype(x.dtype)  # padding that never wins: -inf, or an integer type's least
    least = np.iinfo(dt).min if dt.kind in "iu" else -np.inf
    padded = _pad_window(x, tuple(pads or (0,) * (2 * nd)), nd, first, least)
    return _pool_separably(padded, kernel, tuple(strides or (1,) * nd),
                           tuple(dilations or (1,) * nd), np.maximum, first)


def average_pool(x: Any, kernel: Sequence[int], *, strides: Sequence[int] | None = None,
                 pads: Sequence[int] | None = None, count_include_pad: bool = False,
                 dilations: Sequence[int] | None = None, channels_last: bool = False) -> Any:
    """ONNX ``AveragePool`` (floor mode): the window's slices summed, divided by the
    number of (real, unless ``count_include_pad``) elements under each window.
    ``channels_last`` as :func:`max_pool`'s."""
    nd = len(kernel)
    first = _first_spatial(x, nd, channels_last)
    pads = tuple(pads or (0,) * (2 * nd))
    strides = tuple(strides or (1,) * nd)
    dilations = tuple(dilations or (1,) * nd)
    total = _pool_separably(_pad_window(x, pads, nd, first), kernel, strides, dilations,
                            np.add, first)
    if count_include_pad or not any(pads):
        return total / np.asarray(math.prod(kernel), dtype=np.dtype(x.dtype))
    spatial = tuple(x.shape[first:first + nd])
    ones = np.ones((1, *spatial, 1) if channels_last else (1, 1, *spatial), dtype=np.float64)
    counts = _pool_separably(_pad_window(ones, pads, nd, first), kernel, strides, dilations,
                             np.add, first)
    return total / counts.astype(np.dtype(x.dtype))


def global_average_pool(x: Any) -> Any:
    """ONNX ``GlobalAveragePool``: the mean over the spatial axes, kept as size 1."""
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


def global_average_pool_last(x: Any) -> Any:
    """:func:`global_average_pool` of a channels-last 2-D input: the mean over its
    spatial axes, kept as size 1 (``N, 1, 1, C``)."""
    return np.mean(x, axis=(1, 2), keepdims=True)


def gemm(a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 1.0,
         trans_a: bool = False, trans_b: bool = False) -> Any:
    """ONNX ``Gemm``: ``alpha * a' @ b' + beta * c`` (``'`` = transposed when asked)."""
    if trans_a:
        a = np.transpose(a)
    if trans_b:
        b = np.transpose(b)
    y = a @ b
    if alpha != 1.0:
        y = y * np.asarray(alpha, dtype=np.dtype(y.dtype))
    if c is not None:
        y = y + (c if beta == 1.0 else c * np.asarray(beta, dtype=np.dtype(c.dtype)))
    return y


def batch_norm(x: Any, scale: Any, shift: Any) -> Any:
    """Inference ``BatchNormalization`` as a per-channel affine map (axis 1).

    ``scale = gamma / sqrt(var + eps)`` and ``shift = beta - mean * scale`` are computed
    once at import (see :func:`pyc_lab.inference.onnx_handlers.bn_scale_shift`).
    """
    shape = (-1,) + (1,) * (x.ndim - 2)
    return x * np.reshape(scale, shape) + np.reshape(shift, shape)


def erf(x: Any) -> Any:
    """ONNX ``Erf``: the compiler's ``erf`` op (CUDA's ``erff``/``erf`` on the GPU, one
    fusable op), in the input's dtype."""
    y = F.erf(x)
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def gelu(x: Any, approximate: str = "none") -> Any:
    """ONNX ``Gelu``: ``x * Phi(x)`` exactly (``erf``) or with the tanh approximation."""
    if approximate == "tanh":
        return F.gelu(x)
    dt = np.dtype(x.dtype)
    return dt.type(0.5) * x * (1 + erf(x * dt.type(1.0 / math.sqrt(2.0))))


def softmax(x: Any, axis: int = -1, opset: int = 13) -> Any:
    """ONNX ``Softmax``; before opset 13 the input is coerced to 2-D at ``axis``."""
    if opset >= 13:
        return F.softmax(x, axis=axis)
    axis = axis % x.ndim
    shape = tuple(x.shape)
    flat = np.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return np.reshape(F.softmax(flat, axis=-1), shape)


def layer_norm(x: Any, gamma: Any = None, beta: Any = None, *, axis: int = -1,
               eps: float = 1e-5) -> Any:
    """ONNX ``LayerNormalization`` over the axes from ``axis`` to the last."""
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        return F.layer_norm(x, gamma, beta, eps=eps)
    axes = tuple(range(axis, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + np.asarray(eps, dtype=np.dtype(x.dtype)))
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def instance_norm(x: Any, scale: Any, bias: Any, eps: float = 1e-5) -> Any:
    """ONNX ``InstanceNormalization``: each (sample, channel) normalised over its spatial
    axes, then ``scale * y + bias`` per channel."""
    if x.ndim < 3:
        raise ValueError(f"InstanceNormalization takes (N, C, D1, ...) inputs; got {x.ndim}-D")
    axes = tuple(range(2, x.ndim))
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + np.asarray(eps, dtype=np.dtype(x.dtype)))
    return y * np.reshape(scale, per_channel) + np.reshape(bias, per_channel)


def tile(x: Any, repeats: Sequence[int]) -> Any:
    """ONNX ``Tile`` (one repeat count per axis): copies concatenated along each axis."""
    if len(repeats) != x.ndim or any(int(r) < 0 for r in repeats):
        raise ValueError(f"Tile takes one non-negative repeat count per axis of a "
                         f"{x.ndim}-D input; got {list(repeats)}")
    for axis, r in enumerate(int(r) for r in repeats):
        if r != 1:
            x = np.concatenate([x] * r, axis=axis) if r else \
                filled(x, [0 if a == axis else n for a, n in enumerate(x.shape)], 0)
    return x


def log_softmax(x: Any, axis: int = -1) -> Any:
    """``x - max - log(sum(exp(x - max)))`` along ``axis`` (numerically stable)."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def softplus(x: Any) -> Any:
    """``log(1 + exp(x))`` without overflow: ``max(x, 0) + log1p(exp(-|x|))``."""
    return np.maximum(x, np.dtype(x.dtype).type(0)) + np.log1p(np.exp(-np.abs(x)))


def hard_sigmoid(x: Any, alpha: float = 0.2, beta: float = 0.5) -> Any:
    """ONNX ``HardSigmoid``: ``max(0, min(1, alpha * x + beta))``."""
    t = np.dtype(x.dtype).type
    return np.clip(t(alpha) * x + t(beta), t(0), t(1))


def mish(x: Any) -> Any:
    """ONNX ``Mish``: ``x * tanh(softplus(x))``."""
    return x * np.tanh(softplus(x))


def lrn(x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75,
        bias: float = 1.0) -> Any:
    """ONNX ``LRN`` over the channels (axis 1): ``x / (bias + alpha / size *
    sum(x[c - (size-1)//2 .. c + ceil((size-1)/2)]**2)) ** beta``, the window's squares
    summed as shifted views of the zero-padded squares (one fused elementwise kernel)."""
    if x.ndim < 3 or size < 1:
        raise ValueError(f"LRN takes (N, C, D1, ...) inputs and a positive size; got "
                         f"{x.ndim}-D and size {size}")
    t = np.dtype(x.dtype).type
    lo = (size - 1) // 2
    hi = size - 1 - lo
    channels = x.shape[1]
    sq = pad(x * x, [0, lo] + [0] * (x.ndim - 2) + [0, hi] + [0] * (x.ndim - 2))
    window = sq[:, 0:channels]
    for i in range(1, size):
        window = window + sq[:, i:i + channels]
    return x / (t(bias) + t(alpha / size) * window) ** t(beta)


#: ONNX ``Pad`` modes :func:`pad` takes.
PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad(x: Any, pads: Sequence[int], value: float = 0.0, mode: str = "constant") -> Any:
    """ONNX ``Pad`` over any axes: negative pads crop first, then
    :func:`~pyc_lab.compiler.padding.pad_axes` pads (``constant``, ``reflect``,
    ``edge`` and ``wrap`` are NumPy's modes of the same names)."""
    if mode not in PAD_MODES:
        raise ValueError(f"pad mode must be one of {PAD_MODES}, got {mode!r}")
    nd = x.ndim
    widths = []
    for axis in range(nd):
        before, after = int(pads[axis]), int(pads[axis + nd])
        if before < 0 or after < 0:
            index = [slice(None)] * nd
            index[axis] = slice(max(-before, 0), x.shape[axis] - max(-after, 0))
            x = x[tuple(index)]
        widths.append((max(before, 0), max(after, 0)))
    return pad_axes(x, widths, mode, value)


def reduce_mean(x: Any, axes: Sequence[int] | None, keepdims: bool = True,
                noop_with_empty_axes: bool = False) -> Any:
    """ONNX ``ReduceMean``."""
    if not axes:
        if noop_with_empty_axes:
            return x
        axes = tuple(range(x.ndim))
    return np.mean(x, axis=tuple(int(a) % x.ndim for a in axes), keepdims=bool(keepdims))


def reshape(x: Any, shape: Sequence[int], allowzero: bool = False) -> Any:
    """ONNX ``Reshape``: ``0`` copies the input's dimension (unless ``allowzero``)."""
    target = [int(s) for s in shape]
    if not allowzero:
        target = [int(x.shape[i]) if s == 0 else s for i, s in enumerate(target)]
    return np.reshape(x, tuple(target))


def flatten(x: Any, axis: int = 1) -> Any:
    """ONNX ``Flatten``: a 2-D array, the axes before ``axis`` then the rest."""
    axis = axis % x.ndim if axis else 0
    return np.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
