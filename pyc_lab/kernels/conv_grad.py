"""Gradients of ``pl.conv``: the input's (dgrad), the weights' (wgrad) and the bias'.

Two paths, as for the forward:

- on a GPU, the backward convolutions of the library a user would call: cuDNN's dgrad
  and wgrad through torch's ``aten.convolution_backward`` (CuPy arrays through DLPack);
- elsewhere :func:`conv_backward_im2col`, the transpose of the im2col forward: per
  group, the weights' gradient is ``dy^T @ patches`` and the patches' gradient
  ``dy @ w``, added back into the padded input at every kernel offset (col2im), in
  float32 (float64 for float64).

An activation fused into the forward is differentiated from the pre-activation,
recomputed (:func:`activation_grad`: relu, the tanh form of gelu, silu).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .conv_im2col import out_size, pad_spatial, window_slices, windows

__all__ = ["activation_grad", "conv_backward_im2col", "torch_conv_backward"]

_GELU_C = math.sqrt(2.0 / math.pi)


def activation_grad(xp: Any, z: Any, dy: Any, activation: str | None) -> Any:
    """``dy`` times the derivative of ``activation`` at the pre-activation ``z``."""
    if activation is None:
        return dy
    if activation == "relu":
        return xp.where(z > 0, dy, 0.0)
    if activation == "silu":
        s = 1 / (1 + xp.exp(-z))
        return dy * s * (1 + z * (1 - s))
    t = xp.tanh(_GELU_C * (z + 0.044715 * z ** 3))  # gelu, tanh form
    return dy * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * z * z))


def conv_backward_im2col(x: Any, w: Any, dy: Any, *, stride: Sequence[int],
                         pads: Sequence[int], dilation: Sequence[int], groups: int = 1,
                         bias: bool = False, xp: Any = np) -> tuple[Any, Any, Any]:
    """``(dx, dw, db)`` of the convolution ``y = conv(x, w) (+ b)`` given ``dy``.

    Parameters
    ----------
    x, w, dy
        ``(N, C, *spatial)``, ``(O, C // groups, *kernel)``, ``(N, O, *out)`` in one
        floating dtype (the arithmetic is that dtype's).
    stride, pads, dilation, groups
        The forward's, per spatial axis (``pads``: one symmetric padding per axis).
    bias
        Whether the forward had a bias (``db`` is ``None`` otherwise).
    xp
        The array module (NumPy or CuPy).

    Returns
    -------
    (array, array, array or None)
        ``dx`` of ``x``'s shape, ``dw`` of ``w``'s, ``db`` of shape ``(O,)``.
    """
    nd = w.ndim - 2
    kernel = tuple(int(k) for k in w.shape[2:])
    xp_pad = pad_spatial(x, tuple(pads) + tuple(pads), xp=xp)
    n, c = int(x.shape[0]), int(x.shape[1])
    o = int(w.shape[0])
    cg, og = c // groups, o // groups
    kk = math.prod(kernel)
    out = tuple(out_size(int(s), k, st, d) for s, k, st, d
                in zip(xp_pad.shape[2:], kernel, stride, dilation, strict=True))
    p = math.prod(out)
    dx_pad = xp.zeros(xp_pad.shape, dtype=x.dtype)
    dw = xp.empty(w.shape, dtype=w.dtype)
    slices = window_slices(kernel, stride, dilation, out)
    for g in range(groups):
        ch, oc = slice(g * cg, (g + 1) * cg), slice(g * og, (g + 1) * og)
        views, _ = windows(xp_pad[:, ch], kernel, stride, dilation)
        cols = xp.concatenate([xp.reshape(v, (n, cg, 1, p)) for v in views], axis=2)
        cols = xp.reshape(xp.transpose(xp.reshape(cols, (n, cg * kk, p)), (0, 2, 1)),
                          (n * p, cg * kk))                                # (N*P, cg*K)
        dyg = xp.reshape(xp.transpose(xp.reshape(dy[:, oc], (n, og, p)), (0, 2, 1)),
                         (n * p, og))                                     # (N*P, og)
        dw[oc] = xp.reshape(dyg.T @ cols, (og, cg, *kernel))
        dcols = xp.reshape(dyg @ xp.reshape(w[oc], (og, cg * kk)), (n, p, cg, kk))
        for j, index in enumerate(slices):  # col2im: each offset's patch back into place
            part = xp.reshape(xp.transpose(dcols[:, :, :, j], (0, 2, 1)), (n, cg, *out))
            dx_pad[(index[0], ch, *index[2:])] += part
    crop = (slice(None), slice(None),
            *(slice(pd, pd + int(s)) for pd, s in zip(pads, x.shape[2:], strict=True)))
    db = dy.sum(axis=(0, *range(2, nd + 2))) if bias else None
    return dx_pad[crop], dw, db


def torch_conv_backward(x: Any, w: Any, dy: Any, *, stride: Sequence[int],
                        pads: Sequence[int], dilation: Sequence[int], groups: int,
                        bias: bool, needs: Sequence[bool] = (True, True, True)
                        ) -> tuple[Any, Any, Any]:
    """``(dx, dw, db)`` of CUDA tensors from cuDNN's backward convolutions
    (``aten.convolution_backward``); ``needs`` says which of the three to compute
    (the others are ``None``)."""
    import torch

    nd = w.ndim - 2
    return tuple(torch.ops.aten.convolution_backward(
        dy, x, w, [int(w.shape[0])] if bias else None, list(stride), list(pads),
        list(dilation), False, [0] * nd, groups,
        [bool(needs[0]), bool(needs[1]), bool(needs[2]) and bias]))
