"""``signature=`` of :func:`pyc_lab.compile`: expected argument types, parsed and checked.

A spec is ``"<dtype>[<sizes>]"``: a NumPy dtype name or a short one (``f32``, ``i64``,
``u8``, ``bool``; ``any`` or ``*`` for any dtype), then the size of every axis, ``*``
for any size (``"f32[*,512]"``; ``"f64[]"`` is a 0-d array). A call whose argument does
not match raises a :class:`~pyc_lab.errors.PycLabError` naming the argument, what was
expected and what came.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import PycLabError
from .ir import dtype_short

__all__ = ["Spec", "check_argument", "check_signature_type", "parse_spec"]

#: A parsed spec: the dtype (None: any) and the sizes (None: any).
Spec = tuple[np.dtype | None, tuple[int | None, ...]]

_SPEC = re.compile(r"^\s*([a-z0-9*]+)\s*\[([^\]]*)\]\s*$")
_SHORT_DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "i64": "int64",
                 "i32": "int32", "i16": "int16", "i8": "int8", "u64": "uint64",
                 "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool"}


def check_signature_type(signature: Any) -> None:
    """Raise a :class:`PycLabError` unless ``signature`` is None or a dict of name ->
    spec string."""
    if signature is None:
        return
    if not isinstance(signature, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in signature.items()):
        raise PycLabError(
            f"signature= must be a dict of argument name -> spec string, e.g. "
            f"{{'x': 'f32[*,512]'}}; got {signature!r}")


def parse_spec(name: str, text: str) -> Spec:
    """The spec ``text`` of argument ``name``; a :class:`PycLabError` saying what is
    wrong with it otherwise."""
    m = _SPEC.match(text)
    hint = "like 'f32[*,128]' (a dtype, then sizes or * in brackets)"
    if not m:
        raise PycLabError(f"signature for {name!r}: {text!r} is not {hint}")
    dt = m.group(1)
    if dt in ("any", "*"):
        dtype = None
    else:
        try:
            dtype = np.dtype(_SHORT_DTYPES.get(dt, dt))
        except TypeError:
            raise PycLabError(f"signature for {name!r}: {dt!r} in {text!r} is not a dtype; "
                              f"use one of {', '.join(_SHORT_DTYPES)} or a NumPy name") \
                from None
    dims: list[int | None] = []
    body = m.group(2).strip()
    for part in body.split(",") if body else []:
        part = part.strip()
        if part in ("*", "?"):
            dims.append(None)
        elif part.isdigit():
            dims.append(int(part))
        else:
            raise PycLabError(f"signature for {name!r}: size {part!r} in {text!r} is not a "
                              f"non-negative integer or *; write it {hint}")
    return dtype, tuple(dims)


def check_argument(name: str, value: Any, spec: Spec) -> None:
    """Raise a :class:`PycLabError` if ``value`` (an array) does not match ``spec``."""
    dtype, dims = spec
    got = f"{dtype_short(value.dtype)}[{','.join(map(str, value.shape))}]"
    want = f"{dtype_short(dtype) if dtype is not None else 'any'}[" + ",".join(
        "*" if d is None else str(d) for d in dims) + "]"
    if len(value.shape) != len(dims):
        raise PycLabError(f"argument {name!r}: expected rank {len(dims)} ({want}), got "
                          f"rank {len(value.shape)} ({got})")
    for axis, (d, v) in enumerate(zip(dims, value.shape, strict=True)):
        if d is not None and d != v:
            raise PycLabError(f"argument {name!r}: expected size {d} on axis {axis} "
                              f"({want}), got {v} ({got})")
    if dtype is not None and value.dtype != dtype:
        raise PycLabError(f"argument {name!r}: expected dtype {dtype.name} ({want}), got "
                          f"{value.dtype.name} ({got})")
