"""The geometry of a row program's space, apart from the kernel it becomes.

A row program (:mod:`.row_program`) computes over a space ``X`` reduced over ``axes``:
its values are *full* (``X``), *row* values (``X`` with the axes set to 1, or without
them) or scalars (:func:`kind_in`). Its rows lie along memory when the last axis is
reduced, else across it (a column program, :func:`column_config`). An array's element
``col`` of row ``row`` is found by the C expressions of :func:`row_offset` (over the row
dims) and :func:`col_offset` (along the row, by :data:`Terms`), so reduced axes need not
be adjacent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Terms", "across_memory", "along", "check_axes", "col_offset", "column_config",
           "contiguous", "inner_extent", "kept_dims", "kind_in", "last_axes", "reduced_ones",
           "row_offset", "strides_over", "trailing"]


def last_axes(space: tuple[int, ...]) -> tuple[int, ...]:
    """The reduced axes of a row program over the last axis of ``space``."""
    return (len(space) - 1,)


def across_memory(space: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """Whether rows over ``axes`` run across memory (the last axis is not reduced): a
    column program."""
    return axes[-1] != len(space) - 1


def trailing(space: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """Whether ``axes`` are the last axes of ``space``: rows lie one after another."""
    return tuple(axes) == tuple(range(len(space) - len(axes), len(space)))


def inner_extent(space: tuple[int, ...], axes: tuple[int, ...]) -> int:
    """The extent after the last reduced axis: how many neighbouring rows lie next to
    each other in memory (1 when the rows lie along memory)."""
    return int(np.prod(space[axes[-1] + 1:], dtype=np.int64))


def reduced_ones(space: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a row value with ``keepdims``: ``space`` with ``axes`` set to 1."""
    return tuple(1 if j in axes else d for j, d in enumerate(space))


def kept_dims(space: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a row value without ``keepdims``: ``space`` without ``axes``."""
    return tuple(d for j, d in enumerate(space) if j not in axes)


def kind_in(shape: tuple[int, ...], space: tuple[int, ...],
            axes: tuple[int, ...] | None = None) -> str | None:
    """The kind of a value of ``shape`` in row space ``space`` reduced over ``axes``
    (default: the last): ``"full"``, ``"row1"`` (a row value that broadcasts against a
    full one: with ``keepdims``, or without it when a column program reduces leading
    axes), ``"row"`` (without), ``"scalar"`` or None."""
    shape, space = tuple(shape), tuple(space)
    axes = last_axes(space) if axes is None else tuple(axes)
    if shape == space:
        return "full"
    if shape == reduced_ones(space, axes):
        return "row1"
    if shape == kept_dims(space, axes):
        # x - x.mean(axis=0) broadcasts as NumPy aligns trailing axes, and so does the
        # 0-d result of a reduction over every axis (x - x.mean())
        leading = axes == tuple(range(len(axes))) and across_memory(space, axes)
        return "row1" if leading or shape == () else "row"
    if shape == ():
        return "scalar"
    return None


def contiguous(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def strides_over(shape: tuple[int, ...], target: tuple[int, ...]) -> list[int] | None:
    """Element strides of a C-contiguous ``shape`` broadcast to ``target`` (0 =
    broadcast), or None when it does not broadcast."""
    try:
        if tuple(np.broadcast_shapes(shape, target)) != target:
            return None
    except ValueError:
        return None
    own = contiguous(shape)
    pad = len(target) - len(shape)
    return [0 if j < pad or (shape[j - pad] == 1 and target[j] != 1) else own[j - pad]
            for j in range(len(target))]


#: How an array's elements along a row are found: ``(divisor, extent, stride)`` terms,
#: element ``col`` of the row at ``sum(((col / divisor) % extent) * stride)``; one term
#: ``(1, cols, s)`` when the reduced axes step through memory by one stride, none for a
#: value constant along the row.
Terms = tuple[tuple[int, int, int], ...]


def along(strides: list[int], space: tuple[int, ...], axes: tuple[int, ...]) -> Terms:
    """The terms stepping through the reduced ``axes`` of ``space`` (in C order, any
    axes) for an array of element ``strides`` over ``space``; neighbouring axes whose
    strides combine make one term."""
    terms: list[tuple[int, int, int]] = []
    divisor = 1
    for j in reversed(axes):
        extent = space[j]
        if extent != 1 and strides[j]:
            last = terms[-1] if terms else None
            if last and last[0] * last[1] == divisor and strides[j] == last[2] * last[1]:
                terms[-1] = (last[0], last[1] * extent, last[2])
            else:
                terms.append((divisor, extent, strides[j]))
        divisor *= extent
    return tuple(reversed(terms))


def col_offset(var: str, terms: Terms, cols: int) -> str:
    """C expression of the element offset of ``var`` (an index along a row of ``cols``)."""
    parts = []
    for divisor, extent, stride in terms:
        idx = var if divisor == 1 else f"({var} / {divisor})"
        if divisor * extent != cols:
            idx = f"({idx} % {extent})"
        parts.append(idx if stride == 1 else f"{idx} * {stride}LL")
    return " + ".join(parts) or "0"


def check_axes(space: tuple[int, ...], axes: tuple[int, ...]) -> str:
    """Why a row program cannot reduce ``space`` over ``axes``, or ``""``: any sorted
    axes of the space. With the last axis among them the rows lie along memory (a row
    kernel); without it they run across memory (a column program)."""
    if not axes or list(axes) != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= len(space):
        return f"axes {tuple(axes)} are not sorted axes of a rank-{len(space)} space"
    return ""


def column_config(rows: int, inner: int, cols: int, acc_itemsize: int = 4) -> dict[str, Any]:
    """Launch shape of a column program: ``tx`` lanes take consecutive rows (``inner``:
    the extent after the reduced axes, so neighbouring lanes read neighbouring
    addresses), ``threads`` = ``ty`` threads share each row, stepping down it together.
    ``ty`` is the fewest (a power of two) whose share of a row fits a thread's register
    budget — a short row is a thread's alone, with no shared-memory combining — and the
    block is about 256 threads (``tx`` at least a warp where ``inner`` allows), up to
    1024 for long rows."""
    limit = 16 * 4 // max(acc_itemsize, 4)
    ty = 1
    while -(-cols // ty) > limit and ty < 1024:
        ty *= 2
    if inner >= 32:
        tx = max(32, 256 // ty)
    else:
        tx = 1 << max(0, (inner - 1).bit_length())
        ty = max(ty, 256 // tx)
    ty = min(ty, 1024 // tx)
    per = -(-cols // ty)
    return {"threads": ty, "block": tx * ty, "mode": "column", "per_thread": per,
            "cached": per <= limit, "rows_per_block": tx, "tx": tx, "unroll": 4}


def row_offset(strides: list[int], dims: tuple[int, ...]) -> str:
    """C expression of an input's element offset for row ``row`` (row dims ``dims``)."""
    live = [j for j in range(len(dims)) if dims[j] != 1]
    if not any(strides[j] for j in live):
        return "0"
    cont = contiguous(dims)
    last = live[-1]
    f = strides[last] // cont[last]
    if f and all(strides[j] == cont[j] * f for j in live):
        return "row" if f == 1 else f"row * {f}LL"
    terms = []
    for j in live:
        if not strides[j]:
            continue
        coord = "row" if cont[j] == 1 else f"(row / {cont[j]}LL)"
        if j != live[0]:
            coord = f"({coord} % {dims[j]}LL)"
        terms.append(coord if strides[j] == 1 else f"{coord} * {strides[j]}LL")
    return " + ".join(terms)
