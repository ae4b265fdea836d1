"""Property test: ``pl.compile(f)(*args)`` is ``f(*args)`` for random NumPy programs.

Hypothesis writes random programs over two array arguments and a Python scalar — every
supported dtype (bool, int8..int64, uint8, float16/32/64, ml_dtypes' bfloat16),
broadcasting shapes, special
values (NaN, ±Inf, -0.0, huge and tiny floats, integer extremes), scalars of every
Python type (ints out of the dtype's range included), ufuncs with ``dtype=``/``out=``,
reductions with ``axis``/``keepdims``/``dtype``/``initial``/``where``/``ddof``, scans and
sorts (``cumsum``, ``cumprod`` with ``dtype=``, ``sort``, a stable ``argsort``), views,
in-place operators and item assignment on arguments and intermediates — and runs each
both as NumPy and compiled (numpy backend), on the inputs it was traced with and on
fresh random ones, for two different scalars. The compiled call must give the same
values (NaN-aware; float tolerance by dtype), dtypes and shapes, leave the arguments as
NumPy leaves them, share memory with the arguments and between results exactly where
NumPy's results do, and raise where NumPy raises (the same kind of exception, or a
:class:`~pyc_lab.PycLabError`).

Two documented differences from NumPy are the reference's for bfloat16 (the README's
compiler section): an accumulating reduction (sum, mean, var, std, prod) computes in
float32 and rounds once, where ml_dtypes' loops accumulate in bfloat16; a matmul whose
operands promote to bfloat16 gives bfloat16, as torch and CuPy do, where ml_dtypes'
gives float32. NumPy runs the program with those steps written that way; the compiled
function is traced from the program as a user writes it.

Profiles (``tests/compiler/conftest.py``): ``ci`` by default, ``nightly`` with many more
examples (``HYPOTHESIS_PROFILE=nightly``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import pyc_lab as pl

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(d) for d in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                "float16", "float32", "float64")] + [BF16]
#: Relative, absolute tolerance of a float result by dtype (rewrites such as 1/sqrt ->
#: rsqrt or a fused layer norm may round differently; integers must match exactly).
TOL = {"bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3), "float32": (2e-5, 1e-6),
       "float64": (1e-12, 1e-14)}
SCALARS = st.one_of(
    st.booleans(),
    st.sampled_from([0, 1, 2, 3, -1, -7, 127, 128, 255, 256, 300, -129, 2**31, 2**40,
                     -(2**63), 2**63, 2**70]),
    st.integers(-1000, 1000),
    st.sampled_from([0.0, -0.0, 0.5, 2.0, -1.5, 1e-300, 1e300, 7e4, float("nan"),
                     float("inf"), float("-inf")]),
    st.floats(-1e3, 1e3, allow_nan=False),
)


# -- the program interpreter: one function for NumPy arrays and traced arrays ----------------
def _kind(a: Any) -> str:
    dtype = getattr(a, "dtype", None)
    if dtype is None:  # a Python scalar
        return {bool: "b", int: "i", float: "f"}.get(type(a), "O")
    return "f" if np.dtype(dtype) == BF16 else np.dtype(dtype).kind


def _accumulate(a: Any, name: str, reference: bool, **kw: Any) -> Any:
    """``a.name(**kw)``; as NumPy's reference for a bfloat16 ``a``, computed in float32 and
    rounded once (the compiler's documented bfloat16 accumulation)."""
    if not (reference and a.dtype == BF16 and name in ("sum", "mean", "var", "std", "prod")
            and "dtype" not in kw):
        return getattr(a, name)(**kw)
    out = getattr(a.astype(np.float32), name)(**kw)
    return out.astype(BF16) if isinstance(out, np.ndarray) else BF16.type(out)


def _unary(name: str, a: Any, arg: Any, ref: bool) -> Any:
    k = _kind(a)
    if name == "neg":
        return -a if k != "b" else ~a
    if name == "pos":
        return +a if k != "b" else a.copy()
    if name == "abs":
        return abs(a)
    if name == "invert":
        return ~a if k in "biu" else np.logical_not(a)
    if name == "square":
        return np.square(a)
    if name == "pow2":
        return a ** 2
    if name == "pow_half":
        return a ** 0.5
    if name == "pow_m1":
        return a ** -1 if k == "f" else a ** 1
    if name == "reciprocal":
        return np.reciprocal(a)
    if name == "sqrt":
        return np.sqrt(abs(a))
    if name == "exp":
        return np.exp(a)
    if name == "log":
        return np.log(abs(a))
    if name == "tanh":
        return np.tanh(a)
    if name == "astype":
        return a.astype(arg)
    if name == "identities":
        b = a * 1 if k != "b" else a & True
        return np.negative(-b) if k not in "bu" else b + 0
    if name == "astype_same":
        return a.astype(a.dtype)
    if name == "copy":
        return a.copy()
    if name == "transpose":
        return a.T
    if name == "flip":
        return a[::-1] if a.ndim else a
    if name == "tail":
        return a[1:] if a.ndim else a
    if name == "ravel":
        return a.ravel()
    if name == "expand":
        return a[None]
    if name == "logical_not":
        return np.logical_not(a)
    if name == "clip":
        return np.clip(a, arg[0], arg[1])
    if name == "clip_kw":
        return np.clip(a, min=arg[0], max=arg[1]) if arg[0] is not None or \
            arg[1] is not None else a.clip(-1, 1)
    if name == "variance":  # the hand-written pattern reduction fusion rewrites
        if not a.ndim:
            return a
        c = a - _accumulate(a, "mean", ref, axis=-1, keepdims=True)
        return _accumulate(c ** 2, "mean", ref, axis=-1)
    if name == "layer_norm":  # ditto, with np.var or a mean of squares
        c = a - _accumulate(a, "mean", ref, axis=-1, keepdims=True)
        v = _accumulate(a, "var", ref, axis=-1, keepdims=True) if _kind(a) != "f" or \
            a.ndim == 1 else _accumulate(c * c, "mean", ref, axis=-1, keepdims=True)
        return c / np.sqrt(v + 1e-3) if a.ndim else a
    if name == "softmax":
        e = np.exp(a - a.max(-1, keepdims=True)) if a.ndim else a
        return e / _accumulate(e, "sum", ref, axis=-1, keepdims=True) if a.ndim else a
    if name in MATH:  # the math library's ufuncs, where NumPy has a loop for the dtype
        fn = getattr(np, name)
        try:
            fn(np.ones(1, a.dtype))
        except TypeError:
            return a
        return fn(a)
    if name == "round2":
        return np.round(a, 2) if k == "f" else a
    if name == "nan_to_num":
        return np.nan_to_num(a)
    if name == "flip_all":
        return np.flip(a)
    if name == "cumsum":  # the scans and sorts (pyc_lab.compiler.scans)
        return np.cumsum(a, axis=-1) if a.ndim else np.cumsum(a)
    if name == "cumprod_f64":
        return a.cumprod(axis=0, dtype=np.float64) if a.ndim else a
    if name == "sort":
        return np.sort(a, axis=0) if a.ndim else a
    if name == "argsort":
        return np.argsort(a, axis=-1, kind="stable") if a.ndim else a
    raise AssertionError(name)


#: Math-library ufuncs drawn as unary steps.
MATH = ["sin", "cos", "arctan", "sinh", "arcsinh", "log1p", "expm1", "log2", "exp2", "cbrt",
        "floor", "ceil", "trunc", "rint", "sign", "isnan", "isinf", "isfinite", "signbit",
        "fabs", "deg2rad"]


UNARY = ["neg", "pos", "abs", "invert", "square", "pow2", "pow_half", "pow_m1",
         "reciprocal", "sqrt", "exp", "log", "tanh", "astype", "identities",
         "astype_same", "copy", "transpose", "flip", "tail", "ravel", "expand",
         "logical_not", "clip", "clip_kw", "variance", "layer_norm", "softmax",
         *MATH, "round2", "nan_to_num", "flip_all", "cumsum", "cumprod_f64", "sort",
         "argsort"]


def _binary(name: str, a: Any, b: Any, arg: Any, ref: bool) -> Any:
    both_bool = _kind(a) == "b" and _kind(b) == "b"
    if name == "add":
        return a + b
    if name == "sub":
        return a - b if not both_bool else a ^ b
    if name == "mul":
        return a * b
    if name == "div":
        return a / b
    if name == "floordiv":
        return a // b
    if name == "mod":
        return a % b
    if name == "pow":
        return a ** b if _kind(b) == "f" else a ** abs(b)
    if name in ("less", "less_equal", "greater", "equal", "not_equal", "maximum", "minimum",
                "logical_and", "logical_or"):
        return getattr(np, name)(a, b)
    if name in ("and", "or", "xor"):
        if _kind(a) in "biu" and _kind(b) in "biu":
            return {"and": a & b, "or": a | b, "xor": a ^ b}[name]
        return np.logical_xor(a, b)
    if name == "select":
        return np.where(a > b, a, b)
    if name == "add_dtype":
        return np.add(a, b, dtype=arg)
    if name == "divmod":
        q, r = divmod(a, b)
        return q + r
    if name == "matmul":
        out = a @ b.T if getattr(b, "ndim", 0) > 1 else a @ b
        if ref and np.result_type(a, b) == BF16:  # the compiler's documented bfloat16
            return np.asarray(out).astype(BF16)[()] if np.ndim(out) == 0 else \
                out.astype(BF16)
        return out
    if name in BINARY_MATH:  # where NumPy has a loop for the operands' dtypes
        fn = getattr(np, name)
        try:  # (the dtypes' attribute: np.result_type is not traced)
            fn(*(np.ones(1, v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype)
                 for v in (a, b)))
        except TypeError:
            return a
        return fn(a, b)
    raise AssertionError(name)


#: Math-library ufuncs of two operands drawn as binary steps.
BINARY_MATH = ["arctan2", "hypot", "copysign", "fmax", "fmin", "logaddexp", "heaviside"]
BINARY = ["add", "sub", "mul", "div", "floordiv", "mod", "pow", "less", "less_equal",
          "greater", "equal", "not_equal", "maximum", "minimum", "logical_and",
          "logical_or", "and", "or", "xor", *BINARY_MATH, "select", "add_dtype", "divmod",
          "matmul"]
#: Binary steps that also take a Python scalar operand.
SCALAR_BINARY = BINARY[:-3]


def _reduce(name: str, a: Any, axis: Any, keepdims: bool, extra: str, ref: bool) -> Any:
    kw: dict[str, Any] = {"axis": axis, "keepdims": keepdims}
    if a.ndim == 0:
        kw["axis"] = None
    if extra == "dtype" and name in ("sum", "mean", "prod", "var", "std"):
        kw["dtype"] = np.float64
    elif extra == "initial" and name in ("sum", "prod", "max", "min"):
        kw["initial"] = 3
    elif extra == "where" and name not in ("argmax", "argmin"):
        kw["where"] = a > 0 if _kind(a) != "b" else a
        if name in ("max", "min"):
            kw["initial"] = -5 if name == "max" else 5
    elif extra == "ddof" and name in ("var", "std"):
        kw["ddof"] = 1
    if name in ("argmax", "argmin") and isinstance(kw["axis"], tuple):
        kw["axis"] = kw["axis"][0]
    return _accumulate(a, name, ref, **kw)


REDUCTIONS = ["sum", "mean", "max", "min", "var", "std", "prod", "argmax", "argmin", "any",
              "all"]


def _inplace(name: str, t: Any, b: Any, s: Any) -> None:
    if name == "iadd":
        t += b
    elif name == "imul_scalar":
        t *= s
    elif name == "setitem":
        if t.ndim:
            t[0] = s
        else:
            t[...] = s
    elif name == "mask_set":
        t[t > 1] = 2 if _kind(t) != "b" else False
    elif name == "slice_add":
        if t.ndim:
            t[1:] += 1 if _kind(t) != "b" else True
    elif name == "out":
        np.multiply(t, b, out=t)
    elif name == "fill":
        t.fill(s)
    else:
        raise AssertionError(name)


INPLACE = ["iadd", "imul_scalar", "setitem", "mask_set", "slice_add", "out", "fill"]


def _program(steps: list[tuple], outputs: list[int], reference: bool = False) -> Callable:
    """The program; ``reference``: as NumPy runs it for the comparison (bfloat16's
    documented differences written out)."""

    def fn(x, y, s):
        pool = [x, y]
        for step in steps:
            kind, name, i, j, arg = step
            a, b = pool[i % len(pool)], pool[j % len(pool)]
            if kind == "u":
                pool.append(_unary(name, a, arg, reference))
            elif kind == "b":
                pool.append(_binary(name, a, b, arg, reference))
            elif kind == "s":
                pool.append(_binary(name, a, s, arg, reference) if arg else
                            _binary(name, s, a, None, reference))
            elif kind == "r":
                axis, keepdims, extra = arg
                pool.append(_reduce(name, a, axis, keepdims, extra, reference))
            else:
                _inplace(name, a, b, s)
        return tuple(pool[k % len(pool)] for k in [-1, *outputs])

    return fn


# -- strategies ---------------------------------------------------------------------------
def _step() -> st.SearchStrategy:
    idx = st.integers(0, 63)
    unary = st.tuples(st.just("u"), st.sampled_from(UNARY), idx, idx,
                      st.one_of(st.sampled_from(DTYPES),
                                st.tuples(st.one_of(st.none(), SCALARS),
                                          st.one_of(st.none(), SCALARS))))
    binary = st.tuples(st.just("b"), st.sampled_from(BINARY), idx, idx,
                       st.sampled_from([np.dtype("float32"), np.dtype("float64")]))
    scalar = st.tuples(st.just("s"), st.sampled_from(SCALAR_BINARY), idx, idx, st.booleans())
    reduce = st.tuples(st.just("r"), st.sampled_from(REDUCTIONS), idx, idx,
                       st.tuples(st.sampled_from([None, 0, -1, (0, 1), (1,)]), st.booleans(),
                                 st.sampled_from(["", "dtype", "initial", "where", "ddof"])))
    inplace = st.tuples(st.just("i"), st.sampled_from(INPLACE), idx, idx, st.none())
    return st.one_of(unary, binary, scalar, reduce, inplace)


def _fix_steps(steps: list[tuple]) -> list[tuple]:
    """Unary args that must be dtypes or bound pairs get the right kind."""
    out = []
    for kind, name, i, j, arg in steps:
        if kind == "u" and name == "astype" and not isinstance(arg, np.dtype):
            arg = np.dtype("float32")
        if kind == "u" and name in ("clip", "clip_kw") and not isinstance(arg, tuple):
            arg = (None, 1)
        out.append((kind, name, i, j, arg))
    return out


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
            specials: bool) -> np.ndarray:
    if dtype.kind == "b":
        out = rng.random(shape) > 0.5
        if out.size and not out.any():
            out.reshape(-1)[0] = True
        return np.asarray(out)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = (info.min, info.max) if specials else (max(info.min, -9), min(info.max, 9))
        out = rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64 if
                           dtype != np.uint64 else np.uint64).astype(dtype)
        if out.size and not out.any():
            out.reshape(-1)[0] = 1
        return np.asarray(out)
    out = (rng.standard_normal(shape) * 3).astype(dtype)
    if specials and out.size:
        info = ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)
        big, tiny = info.max, info.smallest_subnormal
        pool = np.array([np.nan, np.inf, -np.inf, -0.0, big, -big, tiny, big / 3], dtype)
        flat = out.reshape(-1)
        idx = rng.choice(flat.size, size=min(3, flat.size), replace=False)
        flat[idx] = rng.choice(pool, size=idx.size)
    return np.asarray(out)


SHAPES = [(3, 4), (4,), (1, 4), (3, 1), (), (2, 3, 4)]


# -- comparison ---------------------------------------------------------------------------
def _call(fn: Callable, args: list[Any]) -> tuple[Any, BaseException | None]:
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args), None
    except Exception as exc:  # compared below
        return None, exc


def _same_error(got: BaseException | None, want: BaseException | None, where: str) -> None:
    if want is None:
        assert got is None, f"{where}: compiled raised {type(got).__name__}: {got}"
        return
    assert got is not None, f"{where}: NumPy raised {type(want).__name__}: {want}; " \
                            "the compiled function did not"
    kinds = [k for k in type(want).__mro__ if k.__module__ == "builtins"
             and k not in (Exception, BaseException, object)]
    assert isinstance(got, pl.PycLabError) or any(isinstance(got, k) for k in kinds), \
        f"{where}: NumPy raised {type(want).__name__} ({want}), compiled " \
        f"{type(got).__name__} ({got})"


def _close(got: Any, want: Any, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != NumPy's {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != NumPy's {want.shape}"
    if want.dtype.kind == "f" or want.dtype == BF16:
        rtol, atol = TOL[want.dtype.name]
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        # huge values: compare relative to the float's range (float16 rounds at 2**-11)
        np.testing.assert_allclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=what)
        same_inf = np.isinf(w64) == np.isinf(g64)
        assert same_inf.all(), f"{what}: inf where NumPy has none (or the reverse)"
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _leaves(out: Any) -> list[Any]:
    if isinstance(out, tuple):
        return [v for o in out for v in _leaves(o)]
    return [out]


def _check(fn: Callable, compiled: Callable, args: list[Any], label: str) -> None:
    np_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    pl_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    want, want_err = _call(fn, np_args)
    got, got_err = _call(compiled, pl_args)
    _same_error(got_err, want_err, label)
    if want_err is not None:
        return
    g_leaves, w_leaves = _leaves(got), _leaves(want)
    assert len(g_leaves) == len(w_leaves), label
    for k, (g, w) in enumerate(zip(g_leaves, w_leaves, strict=True)):
        _close(g, w, f"{label}: result {k}")
    for k, (g, w) in enumerate(zip(pl_args[:2], np_args[:2], strict=True)):
        _close(g, w, f"{label}: argument {k} after the call (in-place writes)")
    # memory sharing: with the arguments, and between results
    for k, (g, w) in enumerate(zip(g_leaves, w_leaves, strict=True)):
        for m in range(2):
            assert np.shares_memory(g, pl_args[m]) == np.shares_memory(w, np_args[m]), \
                f"{label}: result {k} shares memory with argument {m}: " \
                f"{np.shares_memory(g, pl_args[m])}, NumPy's: {np.shares_memory(w, np_args[m])}"
        for m in range(k):
            if w_leaves[m] is w:
                continue
            assert np.shares_memory(g, g_leaves[m]) == np.shares_memory(w, w_leaves[m]), \
                f"{label}: results {m} and {k} share memory unlike NumPy's"


@given(
    steps=st.lists(_step(), min_size=1, max_size=6),
    outputs=st.lists(st.integers(0, 63), max_size=2),
    dtypes=st.tuples(st.sampled_from(DTYPES), st.sampled_from(DTYPES)),
    shapes=st.tuples(st.sampled_from(SHAPES[:1] + SHAPES[-1:]), st.sampled_from(SHAPES)),
    scalars=st.tuples(SCALARS, SCALARS),
    specials=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_compiled_programs_are_numpy(steps, outputs, dtypes, shapes, scalars, specials, seed):
    steps = _fix_steps(steps)
    xs, ys = shapes
    if len(xs) == 3 and ys in ((3, 4), (3, 1)):
        ys = (1, 4)
    fn = _program(steps, outputs)
    compiled = pl.compile(fn, backend="numpy")
    reference = _program(steps, outputs, reference=True)
    rng = np.random.default_rng(seed)
    first = [_values(rng, xs, dtypes[0], specials), _values(rng, ys, dtypes[1], specials)]
    fresh = [_values(rng, xs, dtypes[0], specials), _values(rng, ys, dtypes[1], False)]
    for s in scalars:  # each scalar is a static argument: its own trace when types differ
        _check(reference, compiled, [*first, s], f"steps={steps} s={s!r} (traced inputs)")
        _check(reference, compiled, [*fresh, s], f"steps={steps} s={s!r} (fresh inputs)")
