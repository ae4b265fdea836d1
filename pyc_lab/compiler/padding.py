"""Padding as concatenations of views: what ``np.pad`` and ONNX's ``Pad`` compute.

:func:`pad_axes` pads one axis after another (so corners take the values the earlier
axes' padding put there, as NumPy's ``np.pad`` does) by concatenating, along the axis,
the pieces the mode asks for with the array: a constant block, the edge element
repeated, the elements mirrored about the edge (``reflect``: the edge not repeated;
``symmetric``: repeated), or the other end's elements (``wrap``). Every piece is a
(possibly reversed) slice of the array or a constant, so in a compiled function the
padding fuses into the kernel that writes the result, reading the array in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MODES", "pad_axes"]

#: Modes :func:`pad_axes` takes.
MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad_axes(x: Any, widths: Sequence[tuple[int, int]], mode: str = "constant",
             value: Any = 0) -> Any:
    """``x`` padded by ``widths[axis] = (before, after)`` elements on each axis.

    Parameters
    ----------
    x
        A NumPy array, or a traced one.
    widths
        Non-negative ``(before, after)`` per axis.
    mode
        One of :data:`MODES`.
    value
        The constant of ``"constant"`` mode (cast to ``x``'s dtype).

    Raises
    ------
    ValueError
        For a mode not in :data:`MODES`, a negative width, reflecting (``reflect``:
        ``width >= n``; ``symmetric``: ``width > n``) further than the axis reaches, or
        padding an empty axis by anything but a constant.
    """
    if mode not in MODES:
        raise ValueError(f"pad mode must be one of {MODES}, got {mode!r}")
    if len(widths) != x.ndim:
        raise ValueError(f"{len(widths)} pad widths for {x.ndim} axes")
    for axis, (before, after) in enumerate(widths):
        before, after = int(before), int(after)
        if before < 0 or after < 0:
            raise ValueError(f"negative pad width ({before}, {after}) on axis {axis}")
        if not before and not after:
            continue
        n = int(x.shape[axis])
        reach = {"reflect": n - 1, "symmetric": n}.get(mode)
        if reach is not None and max(before, after) > reach:
            raise ValueError(f"{mode} padding of {max(before, after)} reaches past the "
                             f"{n} elements of axis {axis}")
        if mode != "constant" and n == 0:
            raise ValueError(f"{mode} padding of the empty axis {axis}")
        parts = [_side(x, axis, n, k, mode, value, first)
                 for first, k in ((True, before), (False, after))]
        x = np.concatenate([*parts[0], x, *parts[1]], axis=axis)
    return x


def _side(x: Any, axis: int, n: int, k: int, mode: str, value: Any,
          before: bool) -> list[Any]:
    """The pieces that go ``before`` (or after) ``x`` along ``axis``, ``k`` elements."""
    if not k:
        return []

    def part(start: int | None, stop: int | None, step: int = 1) -> Any:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop, step)
        return x[tuple(index)]

    if mode == "constant":
        shape = list(x.shape)
        shape[axis] = k
        return [np.full(tuple(shape), value, dtype=np.dtype(x.dtype))]
    if mode == "edge":
        return [part(0, 1) if before else part(n - 1, n)] * k
    if mode == "reflect":  # the edge element not repeated: x[k], ..., x[1]
        return [part(k, 0, -1) if before else part(-2, -2 - k, -1)]
    if mode == "symmetric":  # the edge element repeated: x[k-1], ..., x[0]
        return [part(k - 1, None, -1) if before else part(-1, -1 - k, -1)]
    full, rest = divmod(k, n)  # wrap: whole copies, then the rest
    if before:
        return ([part(n - rest, n)] if rest else []) + [x] * full
    return [x] * full + ([part(0, rest)] if rest else [])
