"""Convolution as im2col: strided slices of the padded input, then one matrix product.

Written against an array module ``xp`` (NumPy by default) and only with operations the
compiler can trace (``concatenate``, ``reshape``, ``transpose``, basic slicing,
``matmul``), so the same code serves three callers: :func:`pyc_lab.conv` on NumPy
arrays (and on CuPy arrays where no convolution library is installed), and the ONNX
importer's ``Conv`` and pooling, which ``pl.compile`` traces into one graph.

Shapes are channels first: ``x (N, C, *spatial)``, ``w (O, C // groups, *kernel)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["conv_im2col", "filled", "out_size", "pad_spatial", "window_slices", "windows"]


def filled(x: Any, shape: Sequence[int], value: float = 0.0, xp: Any = np) -> Any:
    """A constant array of ``shape`` in ``x``'s dtype (NumPy's also while tracing)."""
    return xp.full(tuple(shape), value, dtype=np.dtype(x.dtype))


def pad_spatial(x: Any, pads: Sequence[int], value: float = 0.0, xp: Any = np) -> Any:
    """Pad the spatial axes (2..) of an ``(N, C, *spatial)`` array.

    ``pads`` is ONNX's ``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``; the padding
    is a constant ``value``, added by concatenation (an op the compiler has).
    """
    nd = x.ndim - 2
    if not any(pads):
        return x
    for i in range(nd):
        before, after = int(pads[i]), int(pads[i + nd])
        parts = []
        if before:
            shape = list(x.shape)
            shape[2 + i] = before
            parts.append(filled(x, shape, value, xp))
        parts.append(x)
        if after:
            shape = list(x.shape)
            shape[2 + i] = after
            parts.append(filled(x, shape, value, xp))
        if len(parts) > 1:
            x = xp.concatenate(parts, axis=2 + i)
    return x


def out_size(size: int, k: int, stride: int, dilation: int) -> int:
    """Output length of a window ``k`` (dilated) moved by ``stride`` over ``size``."""
    return (size - dilation * (k - 1) - 1) // stride + 1


def windows(x: Any, kernel: Sequence[int], strides: Sequence[int],
            dilations: Sequence[int]) -> tuple[list[Any], tuple[int, ...]]:
    """The strided slices of ``x`` (already padded), one per kernel offset, and the
    output's spatial shape."""
    spatial = x.shape[2:]
    out = tuple(out_size(n, k, s, d)
                for n, k, s, d in zip(spatial, kernel, strides, dilations, strict=True))
    if any(o <= 0 for o in out):
        raise ValueError(f"the window {tuple(kernel)} does not fit the input's spatial "
                         f"shape {tuple(spatial)}")
    return [x[index] for index in window_slices(kernel, strides, dilations, out)], out


def window_slices(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                  out: Sequence[int]) -> list[tuple[slice, ...]]:
    """The index of each kernel offset's strided slice of a padded ``(N, C, *spatial)``
    array, in the kernel's row-major order (what :func:`windows` reads, and what a
    convolution's input gradient adds back into)."""
    return [(slice(None), slice(None),
             *(slice(o * d, o * d + s * (n - 1) + 1, s)
               for o, d, s, n in zip(offs, dilations, strides, out, strict=True)))
            for offs in itertools.product(*[range(k) for k in kernel])]


def conv_im2col(x: Any, w: Any, b: Any = None, *, strides: Sequence[int] | None = None,
                pads: Sequence[int] | None = None, dilations: Sequence[int] | None = None,
                group: int = 1, xp: Any = np) -> Any:
    """Convolution (1-D, 2-D, any N-D; ONNX ``Conv``'s semantics) as im2col.

    Parameters
    ----------
    x
        ``(N, C, *spatial)``.
    w
        ``(O, C // group, *kernel)``.
    b
        ``(O,)`` or ``None``.
    strides, pads, dilations, group
        ONNX's attributes (``pads`` as ``[begins..., ends...]``).
    xp
        The array module of ``x`` and ``w`` (NumPy also for the compiler's tracing).

    Returns
    -------
    array
        ``(N, O, *out_spatial)``: one matrix product per group.
    """
    nd = w.ndim - 2
    kernel = tuple(int(k) for k in w.shape[2:])
    strides = tuple(strides or (1,) * nd)
    dilations = tuple(dilations or (1,) * nd)
    x = pad_spatial(x, tuple(pads or (0,) * (2 * nd)), xp=xp)
    n, c = int(x.shape[0]), int(x.shape[1])
    o = int(w.shape[0])
    cg, og = c // group, o // group
    kk = math.prod(kernel)
    outs = []
    for g in range(group):
        xg = x if group == 1 else x[:, g * cg:(g + 1) * cg]
        views, out = windows(xg, kernel, strides, dilations)
        p = math.prod(out)
        # (N, cg, K, P): the column order matches w.reshape(O, cg * K)
        cols = xp.concatenate([xp.expand_dims(xp.reshape(v, (n, cg, p)), 2) for v in views],
                              axis=2)
        cols = xp.transpose(xp.reshape(cols, (n, cg * kk, p)), (0, 2, 1))  # (N, P, cg*K)
        wg = w if group == 1 else w[g * og:(g + 1) * og]
        wmat = xp.transpose(xp.reshape(wg, (og, cg * kk)))  # (cg*K, og)
        y = cols @ wmat  # (N, P, og)
        if b is not None:
            y = y + (b if group == 1 else b[g * og:(g + 1) * og])
        outs.append(xp.reshape(xp.transpose(y, (0, 2, 1)), (n, og, *out)))
    return outs[0] if group == 1 else xp.concatenate(outs, axis=1)
