"""NumPy dtypes as CUDA C types: storage, compute, conversions, literals and helpers.

Every supported dtype has a *storage* type (how an element sits in memory) and a
*compute* type (the C type its values are held in while a kernel works on them):

======== ================ ============
dtype    storage          compute
======== ================ ============
float16  ``pyc_f16``      ``float``
float32  ``float``        ``float``
float64  ``double``       ``double``
int32    ``int``          ``int``
int64    ``long long``    ``long long``
bool     ``bool``         ``bool``
======== ================ ============

``pyc_f16`` is ``unsigned short`` holding the IEEE binary16 bits; conversions use the
PTX ``cvt`` instructions directly, so generated sources need no header at all (NVRTC
compiles them as they are). Every float16 *result* is rounded to float16 and back
(:func:`convert`), so a chain of float16 ops rounds after each op exactly as NumPy does,
overflow to ``inf`` included, while the arithmetic itself runs in float.

The fixed C++ that kernels need (the float16 conversions, aligned vectors, integer
power, absolute value, warp/block reductions) lives in files under ``native/``;
:func:`helper` returns one, to be spliced into a generated source as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...paths import native_source

__all__ = [
    "ELEMENTWISE_DTYPES",
    "HELPER_FILES",
    "SUPPORTED_DTYPES",
    "KernelSource",
    "compute_type",
    "convert",
    "from_storage",
    "helper",
    "highest",
    "is_supported",
    "literal",
    "lowest",
    "storage_type",
    "to_storage",
]

SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(d) for d in ("float16", "float32", "float64", "int32", "int64", "bool")
)


def _bfloat16() -> tuple[np.dtype, ...]:
    try:
        import ml_dtypes
    except ImportError:  # NumPy has no bfloat16 without it: nothing to generate
        return ()
    return (np.dtype(ml_dtypes.bfloat16),)


#: What the elementwise generator takes besides :data:`SUPPORTED_DTYPES`: bfloat16
#: (ml_dtypes' NumPy dtype, CuPy's bfloat16), computed in float and rounded after every
#: op as ml_dtypes rounds (``native/bf16.cuh``). Row and column kernels do not take it yet.
ELEMENTWISE_DTYPES: tuple[np.dtype, ...] = SUPPORTED_DTYPES + _bfloat16()


@dataclass
class KernelSource:
    """One generated CUDA source and what the host needs to launch it.

    Attributes
    ----------
    name
        The kernel's base name; ``source`` always defines an ``extern "C"`` kernel of
        this name, the one that is correct for any pointer alignment.
    kind
        ``"elementwise"``, ``"epilogue"`` or ``"rows"`` (softmax, layer norm, last-axis
        reductions).
    source
        The CUDA C++ text (compiles with NVRTC or ``nvcc`` as it is; no headers).
    ops
        The ops it computes.
    notes
        One line for people: layout, vector width, threads per row.
    entries
        Every kernel defined in ``source`` (``name`` first; ``name + "_vec"`` is the
        vectorised variant where there is one).
    launch
        Static launch facts for the host: element or row counts, block size, vector
        width and the alignment each vector-accessed pointer needs.
    """

    name: str
    kind: str
    source: str
    ops: tuple[str, ...]
    notes: str
    entries: tuple[str, ...] = ()
    launch: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.entries:
            self.entries = (self.name,)


_STORAGE = {
    "float16": "pyc_f16", "float32": "float", "float64": "double",
    "int32": "int", "int64": "long long", "bool": "bool", "bfloat16": "pyc_bf16",
}
_COMPUTE = {
    "float16": "float", "float32": "float", "float64": "double",
    "int32": "int", "int64": "long long", "bool": "bool", "bfloat16": "float",
}

#: The fixed CUDA C++ spliced into generated kernels, by section: files under ``native/``
#: (text that never changes lives there; the generators write only what varies).
#: ``f16``: float16 storage and rounding, emitted only when a kernel touches float16
#: data; ``vec``: an aligned vector of N elements (one 16-byte or narrower load/store);
#: ``ipow``/``abs``/``divmod``: NumPy's integer power, absolute value, floor division and
#: remainder; ``reduce``: the combining
#: operators and the warp/block reductions of the row kernels; ``small_gemm``: the
#: product loops of the small GEMM (:mod:`.small_gemm`).
HELPER_FILES: dict[str, str] = {
    "f16": "f16.cuh",
    "bf16": "bf16.cuh",
    "vec": "vector.cuh",
    "ipow": "ipow.cuh",
    "abs": "abs.cuh",
    "divmod": "divmod.cuh",
    "reduce": "reduce.cuh",
    "small_gemm": "small_gemm.cuh",
}


def helper(section: str) -> str:
    """The text of the fixed helper ``section`` (a key of :data:`HELPER_FILES`).

    It is spliced into a kernel's source as it is, so sources still compile without
    headers and the helper's text is part of every cache key of what uses it.
    """
    return native_source(HELPER_FILES[section])


def is_supported(dtype: Any, elementwise: bool = False) -> bool:
    """Whether the code generator handles arrays of ``dtype`` (in every kernel; with
    ``elementwise``, in elementwise kernels, which also take bfloat16)."""
    try:
        return np.dtype(dtype) in (ELEMENTWISE_DTYPES if elementwise else SUPPORTED_DTYPES)
    except TypeError:
        return False


def _name(dtype: Any) -> str:
    dt = np.dtype(dtype)
    if dt not in ELEMENTWISE_DTYPES:
        raise TypeError(f"dtype {dt.name} has no CUDA type in pyc_lab's code generator")
    return dt.name


def storage_type(dtype: Any) -> str:
    """The C type of one element of an array of ``dtype`` in memory."""
    return _STORAGE[_name(dtype)]


def compute_type(dtype: Any) -> str:
    """The C type that values of ``dtype`` are computed in."""
    return _COMPUTE[_name(dtype)]


def from_storage(dtype: Any, expr: str) -> str:
    """C expression: a stored element ``expr`` as its compute type."""
    if _name(dtype) == "float16":
        return f"pyc_f16_to_float({expr})"
    if _name(dtype) == "bfloat16":
        return f"pyc_bf16_to_float({expr})"
    return expr


def to_storage(dtype: Any, expr: str) -> str:
    """C expression: a compute-typed value ``expr`` (already of ``dtype``) as stored."""
    if _name(dtype) == "float16":
        return f"pyc_float_to_f16({expr})"
    if _name(dtype) == "bfloat16":
        return f"pyc_float_to_bf16({expr})"
    return expr


def convert(expr: str, src: Any, dst: Any) -> str:
    """C expression: a value of dtype ``src`` (in its compute type) as a ``dst`` value.

    Casts follow NumPy's ``astype``: float to int truncates, anything to bool is
    ``!= 0`` (NaN is true), and a float16 result is rounded to float16 (from a double
    directly, so there is no double rounding).
    """
    s, d = _name(src), _name(dst)
    if s == d:
        return expr
    if d == "bfloat16":  # every compute type has an overload; doubles and ints via float
        return f"pyc_round_bf16({expr})"
    if d == "float16":
        if s in ("float64", "int32", "int64"):
            return f"pyc_round_f16(static_cast<double>({expr}))"
        return f"pyc_round_f16(static_cast<float>({expr}))"
    if _COMPUTE[s] == _COMPUTE[d]:
        return expr  # float16 -> float32: the float already holds the value exactly
    return f"static_cast<{_COMPUTE[d]}>({expr})"


def _float_literal(value: float, dtype_name: str) -> str:
    if math.isnan(value):
        return "__int_as_float(0x7fc00000)" if dtype_name != "float64" \
            else "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(value):
        inf = "__longlong_as_double(0x7ff0000000000000LL)" if dtype_name == "float64" \
            else "__int_as_float(0x7f800000)"
        return inf if value > 0 else f"(-{inf})"
    text = repr(float(value))  # shortest repr that round-trips the exact value
    if "e" not in text and "." not in text:
        text += ".0"
    return text if dtype_name == "float64" else f"{text}f"


def literal(value: Any, dtype: Any | None = None) -> str:
    """A C literal of the compute type of ``dtype`` holding ``value`` exactly.

    ``value`` is usually a 0-d NumPy array (a ``constant`` node's value); its own dtype
    is used unless ``dtype`` is given. A float16 or float32 value is written as the
    float literal of its exact value, NaN and infinities through their bit patterns.
    """
    arr = np.asarray(value)
    dt = np.dtype(dtype) if dtype is not None else arr.dtype
    name = _name(dt)
    v = arr.astype(dt).item() if arr.dtype != dt else arr.item()
    if name == "bool":
        return "true" if v else "false"
    if name == "int32":
        v = int(v)
        return str(v) if v != -(2**31) else "(-2147483647 - 1)"
    if name == "int64":
        v = int(v)
        return f"{v}LL" if v != -(2**63) else "(-9223372036854775807LL - 1)"
    return _float_literal(float(v), name)


def lowest(dtype: Any) -> str:
    """C literal of the identity of ``max`` for ``dtype``: -inf, the smallest int, false."""
    name = _name(dtype)
    if name in ("float16", "float32", "float64", "bfloat16"):
        return literal(np.asarray(-np.inf, dtype=np.float64), "float64" if name == "float64"
                       else "float32")
    if name == "bool":
        return "false"
    return literal(np.iinfo(name).min, name)


def highest(dtype: Any) -> str:
    """C literal of the identity of ``min`` for ``dtype``: +inf, the largest int, true."""
    name = _name(dtype)
    if name in ("float16", "float32", "float64", "bfloat16"):
        return literal(np.asarray(np.inf, dtype=np.float64), "float64" if name == "float64"
                       else "float32")
    if name == "bool":
        return "true"
    return literal(np.iinfo(name).max, name)


#: Result dtypes whose ``exp`` is CUDA's ``__expf`` (see :func:`exp_function`).
FAST_EXP_RESULTS = frozenset({"float16", "bfloat16"})


def divide(a: str, b: str, dtype: Any) -> str:
    """The C expression of ``a / b`` for operands and a result of ``dtype``, as float
    values that are rounded to ``dtype`` next.

    float16 takes ``pyc_div_f16`` (``native/f16.cuh``): an approximate reciprocal and one
    Markstein correction, whose float16 rounding is that of IEEE division bit for bit
    (the argument is in its comment; tests/compiler/test_f16_division.py checks every
    float16 dividend against hundreds of divisors, with the reciprocal's error pushed
    both ways), in about half the instructions. float16 ranges are what make it exact
    without a range check, so other dtypes keep C's division.
    """
    if _name(dtype) == "float16":
        return f"pyc_div_f16({a}, {b})"
    return f"({a} / {b})"


def exp_function(result_dtype: Any) -> str:
    """The C function computing ``exp`` for a result of ``result_dtype``.

    A float16 or bfloat16 result takes ``__expf`` (``ex2.approx.ftz`` after one
    multiply), whose error is at most ``2 + floor(1.173 |x|)`` float32 ulps (CUDA
    Programming Guide, intrinsic functions). Wherever ``exp(x)`` is a normal float32
    (``-87.3 < x < 88.7``) that is below ``2**-17`` relative, a 64th of bfloat16's
    rounding step (``2**-8``) and far less of float16's (``2**-11``): after rounding,
    the answer is NumPy's or one ulp from it, and only where the exact value lies that
    close to a rounding boundary. Results below ``2**-126`` become zero, as they do
    through CUDA's accurate ``expf`` too (on the H200 ``expf(-87.5)`` is 0 where NumPy
    gives 9.98e-39): float16 cannot hold them anyway, bfloat16's subnormals are lost
    either way. float32 and float64 keep ``exp``: the fast form's error at large
    arguments is well outside float32's tolerance. ``exp`` costs several times the
    instructions; it made the float16 row kernels issue-bound
    (``benchmarks/exp_row_alu.py``).
    """
    return "__expf" if _name(result_dtype) in FAST_EXP_RESULTS else "exp"
