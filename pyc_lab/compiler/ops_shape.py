"""The shape ops of the compiler's registry: reshape, transpose, broadcast_to,
expand_dims, squeeze, concatenate, basic slicing, writes through an index (traced
functionally) and ``gather`` (reads at integer indices: ``np.take``,
``np.take_along_axis``, ``x[idx]``), with their shape inference and NumPy references;
none computes data but ``concatenate``, ``setitem`` and ``gather``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .op_registry import (
    DTypeError,
    OpDef,
    ShapeError,
    normalize_axis,
    register,
)

__all__ = ["VIEW_RESULT_OPS", "basic_index"]

# -- shape ops -----------------------------------------------------------------------------
def _reshape_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = tuple(inputs[0].shape)
    want = tuple(int(d) for d in attrs["shape"])
    size = int(np.prod(src, dtype=np.int64))
    if want.count(-1) > 1:
        raise ShapeError(f"reshape {want}: at most one -1")
    known = int(np.prod([d for d in want if d != -1], dtype=np.int64))
    if -1 in want:
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape {src} into {want}")
        want = tuple(size // known if d == -1 else d for d in want)
    if int(np.prod(want, dtype=np.int64)) != size:
        raise ShapeError(f"cannot reshape an array of shape {src} (size {size}) into {want}")
    return want


def _transpose_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = tuple(inputs[0].shape)
    axes = tuple(attrs["axes"])
    if sorted(axes) != list(range(len(src))):
        raise ShapeError(f"transpose axes {axes} are not a permutation of {len(src)} axes")
    return tuple(src[a] for a in axes)


def _broadcast_to_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src, want = tuple(inputs[0].shape), tuple(attrs["shape"])
    try:
        if np.broadcast_shapes(src, want) != want:
            raise ValueError
    except ValueError:
        raise ShapeError(f"cannot broadcast {src} to {want}") from None
    return want


def _expand_dims_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = list(inputs[0].shape)
    axes = normalize_axis(attrs["axis"], len(src) + len(tuple(np.atleast_1d(attrs["axis"]))))
    for a in axes:
        src.insert(a, 1)
    return tuple(src)


def _squeeze_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src = tuple(inputs[0].shape)
    axes = normalize_axis(attrs["axis"], len(src))
    for a in axes:
        if src[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of size {src[a]}")
    return tuple(d for i, d in enumerate(src) if i not in axes)


def _concat_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    shapes = [tuple(n.shape) for n in inputs]
    if not shapes:
        raise ShapeError("concatenate needs at least one array")
    rank = len(shapes[0])
    if rank == 0 or any(len(s) != rank for s in shapes):
        raise ShapeError(f"concatenate needs arrays of one rank >= 1, got {shapes}")
    (axis,) = normalize_axis(attrs["axis"], rank)
    for s in shapes[1:]:
        if any(s[i] != shapes[0][i] for i in range(rank) if i != axis):
            raise ShapeError(f"concatenate along axis {axis}: shapes {shapes} differ "
                             "elsewhere")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return tuple(out)


def _concat_dtype(inputs: Sequence[Any], attrs: dict[str, Any]) -> np.dtype:
    return np.result_type(*[n.dtype for n in inputs])


def _slice_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    return tuple(np.empty(tuple(inputs[0].shape), dtype=np.uint8)[basic_index(attrs)].shape) \
        if int(np.prod(inputs[0].shape, dtype=np.int64)) < 2**20 else \
        _slice_shape_big(tuple(inputs[0].shape), attrs)


def _slice_shape_big(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape, (0,) * len(shape))
    return tuple(probe[basic_index(attrs)].shape)


def basic_index(attrs: dict[str, Any]) -> tuple:
    """The NumPy index of a ``slice``/``setitem`` node (its ``index`` attribute)."""
    out: list[Any] = []
    for part in attrs["index"]:
        kind = part[0]
        if kind == "s":
            out.append(slice(part[1], part[2], part[3]))
        elif kind == "i":
            out.append(int(part[1]))
        elif kind == "n":
            out.append(None)
        elif kind == "e":
            out.append(Ellipsis)
    return tuple(out)


def _setitem_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    base = tuple(inputs[0].shape)
    region = _slice_shape([inputs[0]], attrs)
    value = list(inputs[1].shape)
    while len(value) > len(region) and value and value[0] == 1:
        value.pop(0)  # NumPy drops leading size-1 dims of the value
    try:
        if tuple(np.broadcast_shapes(tuple(value), region)) != region:
            raise ValueError
    except ValueError:
        raise ShapeError(f"could not broadcast a value of shape {tuple(inputs[1].shape)} "
                         f"into the region {region} of an array of shape {base}") from None
    return base


def _setitem_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    out = xp.array(args[0], copy=True)
    out[basic_index(attrs)] = args[1]
    return out


register(OpDef("reshape", "shape", 1, _reshape_shape,
                lambda xp, args, attrs: xp.reshape(args[0], tuple(attrs["shape"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
register(OpDef("transpose", "shape", 1, _transpose_shape,
                lambda xp, args, attrs: xp.transpose(args[0], tuple(attrs["axes"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
register(OpDef("broadcast_to", "shape", 1, _broadcast_to_shape,
                lambda xp, args, attrs: xp.broadcast_to(args[0], tuple(attrs["shape"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
register(OpDef("expand_dims", "shape", 1, _expand_dims_shape,
                lambda xp, args, attrs: xp.expand_dims(args[0], attrs["axis"]),
                dtype=lambda inputs, attrs: inputs[0].dtype))
register(OpDef("squeeze", "shape", 1, _squeeze_shape,
                lambda xp, args, attrs: xp.squeeze(args[0], tuple(attrs["axis"])),
                dtype=lambda inputs, attrs: inputs[0].dtype))
register(OpDef("concatenate", "shape", None, _concat_shape,
                lambda xp, args, attrs: xp.concatenate(list(args), axis=attrs["axis"]),
                dtype=_concat_dtype))
register(OpDef("slice", "shape", 1, _slice_shape,
                lambda xp, args, attrs: args[0][basic_index(attrs)],
                dtype=lambda inputs, attrs: inputs[0].dtype))
# ``base[index] = value`` as a new array (in-place writes are traced functionally: the
# written array's later readers read this node); ``value`` is cast to the base's dtype
register(OpDef("setitem", "shape", 2, _setitem_shape, _setitem_reference,
                dtype=lambda inputs, attrs: inputs[0].dtype))



def _gather_shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    src, idx = tuple(inputs[0].shape), tuple(inputs[1].shape)
    if np.dtype(inputs[1].dtype).kind not in "iu":
        raise DTypeError(f"indices of {np.dtype(inputs[1].dtype).name} dtype: arrays used "
                         "as indices must be of integer type")
    if not src:
        raise ShapeError("cannot index a 0-d array with an array of indices")
    axis = int(attrs["axis"])
    if not 0 <= axis < len(src):
        raise ShapeError(f"axis {axis} is out of range for an array of rank {len(src)}")
    if not attrs.get("along"):
        out = src[:axis] + idx + src[axis + 1:]
    else:
        picked = len(idx) == len(src) - 1  # one index per row: the axis is dropped
        if len(idx) != len(src) and not picked:
            raise ShapeError(f"take_along_axis: indices of rank {len(idx)} for an array of "
                             f"rank {len(src)}; they must have the same rank")
        if picked:
            idx = (*idx[:axis], 1, *idx[axis:])
        dims = []
        for d, (s, i) in enumerate(zip(src, idx, strict=True)):
            if d == axis:
                dims.append(i)
            elif s == i or 1 in (s, i):
                dims.append(i if s == 1 else s)
            else:
                raise ShapeError(f"take_along_axis: shapes {src} and {idx} do not broadcast "
                                 f"outside axis {axis}")
        out = tuple(dims[:axis] + dims[axis + 1:]) if picked else tuple(dims)
    if src[axis] == 0 and int(np.prod(out, dtype=np.int64)):
        raise ShapeError("cannot do a non-empty take from an empty axis")
    return tuple(int(d) for d in out)


def _gather_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    src, idx = args
    axis = int(attrs["axis"])
    if attrs.get("along") and idx.ndim == src.ndim - 1:  # one index per row
        return xp.take_along_axis(src, xp.expand_dims(idx, axis), axis=axis).squeeze(axis)
    if attrs.get("along"):
        return xp.take_along_axis(src, idx, axis=axis)
    return xp.take(src, idx, axis=axis)


# ``src`` read at integer indices along ``axis``: ``np.take(src, idx, axis)`` (the index
# dims replace ``axis``) or, with ``along``, ``np.take_along_axis(src, idx, axis)`` (one
# index per output element; an ``idx`` of one rank less is one index per row, the axis
# dropped: ``x[np.arange(n), y]``). NumPy raises on an index out of range; CuPy (and the
# generated kernels) wrap it modulo the axis length.
register(OpDef("gather", "gather", 2, _gather_shape, _gather_reference,
                dtype=lambda inputs, attrs: inputs[0].dtype))

#: Ops whose NumPy result is a view of their operand (no data is computed).
VIEW_RESULT_OPS = frozenset({"slice", "transpose", "reshape", "expand_dims", "squeeze",
                             "broadcast_to"})
