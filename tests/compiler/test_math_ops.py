"""The math-library ufuncs as compiler ops: traced as ops (no graph break), generated as
CUDA expressions that give NumPy's answers — special values included — and fused with
the work around them.

Each op's generated kernel runs on the CPU (``tests/compiler/emulate.py``) against
NumPy on NaN, both infinities, both zeros, domain edges and random values, in every
dtype the code generator takes and NumPy has a loop for; the results must agree in NaN
positions, infinities and signed zeros exactly and in finite values to within an ulp or
so (the CPU's libm stands in for CUDA's, which is documented within 1-2 ulp for these
functions). The same kernels compile with ``nvcc`` for sm_90, where CUDA's overloads (not
libm's) decide which function each call is.
"""

from __future__ import annotations

import itertools
import warnings

import ml_dtypes
import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import emulate, needs_gxx
from tests.compiler.graphs import fused_graph
from tests.compiler.test_codegen import compile_ptx, needs_nvcc

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16)
INTS = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_))

UNARY = ("sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh",
         "arccosh", "arctanh", "log1p", "expm1", "log2", "log10", "exp2", "cbrt", "fabs",
         "floor", "ceil", "trunc", "rint", "sign", "isnan", "isinf", "isfinite", "signbit",
         "deg2rad", "rad2deg")
BINARY = ("arctan2", "hypot", "copysign", "fmod", "fmax", "fmin", "logaddexp", "heaviside",
          "float_power", "floor_divide", "remainder")
#: Ops whose result for two booleans is int8 (a dtype the kernels do not store).
_INT8_OF_BOOL = ("floor_divide", "remainder")
#: Ops whose result is exact (no rounding error allowed), signed zeros included.
EXACT = {"fabs", "floor", "ceil", "trunc", "rint", "sign", "isnan", "isinf", "isfinite",
         "signbit", "copysign", "fmax", "fmin", "fmod", "deg2rad", "rad2deg", "heaviside",
         "floor_divide", "remainder"}
#: Relative error allowed on finite results: float32/float64 a few ulp of libm against
#: NumPy's own loops; float16/bfloat16 one ulp of the result.
TOL = {"float32": 4e-7, "float64": 1e-15, "float16": 1e-3, "bfloat16": 8e-3}

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5,
                    1.5, 3.0, -7.25, 0.999, -0.999, 1.001, 1e-3, 100.0, -88.0, 5e-39])


def _values(dtype: np.dtype, rng: np.random.Generator, n: int = 131) -> np.ndarray:
    """Special values, then random ones (an odd count: no whole vectors)."""
    if dtype.kind in "iub":
        vals = np.concatenate([[0, 1, -1, 7, -7, 2**20, -(2**20)], rng.integers(-50, 50, n)])
        return (vals != 0) if dtype.kind == "b" else vals.astype(dtype)
    rand = rng.uniform(-4, 4, n) * 10.0 ** rng.integers(-3, 3, n)
    with np.errstate(over="ignore"):
        return np.concatenate([SPECIAL, rand]).astype(dtype)


def _f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def _agree(got: np.ndarray, want: np.ndarray, exact: bool, skip_zero_sign=None) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind not in "f" and got.dtype != BF16:
        np.testing.assert_array_equal(got, want)
        return
    g, w = _f64(got), _f64(want)
    assert np.array_equal(np.isnan(g), np.isnan(w)), \
        f"NaN positions differ: got {g[np.isnan(g) != np.isnan(w)]}, " \
        f"want {w[np.isnan(g) != np.isnan(w)]}"
    inf = np.isinf(w)
    np.testing.assert_array_equal(g[inf], w[inf])
    zero = w == 0
    if skip_zero_sign is not None:
        zero &= ~skip_zero_sign
    assert np.array_equal(np.signbit(g[zero]), np.signbit(w[zero])), "signed zeros differ"
    fin = np.isfinite(w)
    if exact:
        np.testing.assert_array_equal(g[fin], w[fin])
    else:
        np.testing.assert_allclose(g[fin], w[fin], rtol=TOL[got.dtype.name],
                                   atol=np.finfo(np.float32).tiny if got.dtype.itemsize <= 4
                                   else 0.0)


def _has_loop(op: str, *dtypes: np.dtype) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            getattr(np, op)(*[np.ones(1, d) for d in dtypes])
    except TypeError:
        return False
    return True


def _run(fn, arrays):
    graph, node = fused_graph(fn, [(a.shape, a.dtype) for a in arrays])
    src = generate(node, graph)
    body = node.attrs["body"]
    out_dtype = body.node(body.outputs[0]).dtype
    out = np.full(arrays[0].shape, np.nan if out_dtype.kind == "f" else 1, out_dtype)
    if out_dtype == BF16:
        out[...] = np.nan
    emulate(src, src.name, [a.copy() for a in arrays] + [out])
    return out


@pytest.mark.parametrize("op", UNARY + BINARY)
def test_each_ufunc_is_traced_as_its_op(op):
    x = np.linspace(0.1, 0.9, 12, dtype=np.float32).reshape(3, 4)
    if op in UNARY:
        graph, breaks = trace(lambda a: getattr(np, op)(a), (x,))
    else:
        graph, breaks = trace(lambda a, b: getattr(np, op)(a, b), (x, x[::-1]))
    assert not breaks
    assert op in [n.op for n in graph], [n.op for n in graph]


@needs_gxx
@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=lambda d: d.name)
def test_unary_kernels_give_numpys_answers(op, dtype):
    if not _has_loop(op, dtype):
        pytest.skip(f"NumPy has no {op} loop for {dtype.name} (a TypeError there too)")
    x = _values(dtype, np.random.default_rng(len(op)))
    got = _run(lambda a: getattr(np, op)(a), [x])
    with np.errstate(all="ignore"):
        want = getattr(np, op)(x)
    _agree(got, want, op in EXACT)


@needs_gxx
@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=lambda d: d.name)
def test_binary_kernels_give_numpys_answers(op, dtype):
    if not _has_loop(op, dtype, dtype):
        pytest.skip(f"NumPy has no {op} loop for {dtype.name}")
    if (op == "fmod" and dtype.kind in "iub") or (op in _INT8_OF_BOOL and dtype.kind == "b"):
        with pytest.raises(ValueError, match=op):  # int8 for bool: not generated
            _run(lambda a, b: getattr(np, op)(a, b), [np.ones(3, dtype)] * 2)
        return
    v = _values(dtype, np.random.default_rng(3), n=9)
    a, b = (np.array(p, dtype=dtype) for p in zip(*itertools.product(v, v), strict=True))
    got = _run(lambda p, q: getattr(np, op)(p, q), [a, b])
    with np.errstate(all="ignore"):
        want = getattr(np, op)(a, b)
    # NumPy's fmax/fmin of two equal zeros returns either, by loop (SIMD or scalar)
    ties = (a == b) if op in ("fmax", "fmin") else None
    _agree(got, want, op in EXACT, skip_zero_sign=ties)


@needs_nvcc
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=lambda d: d.name)
def test_every_math_op_compiles_for_sm90(tmp_path, dtype):
    """One kernel per dtype with every op NumPy has a loop for: CUDA's overloads must
    accept each call (integer operands included) without ambiguity."""
    unary = [op for op in UNARY if _has_loop(op, dtype)]
    binary = [op for op in BINARY if _has_loop(op, dtype, dtype)
              and not (op == "fmod" and dtype.kind in "iub")
              and not (op in _INT8_OF_BOOL and dtype.kind == "b")]

    def every(x, y):
        outs = [getattr(np, op)(x) for op in unary] + [getattr(np, op)(x, y) for op in binary]
        return tuple(outs)

    graph, breaks = trace(every, (np.ones(33, dtype), np.ones(33, dtype)))
    assert not breaks
    from pyc_lab.compiler.passes import PassManager

    graph = PassManager().run(graph).graph
    fused = [n for n in graph if n.op == "fused"]
    assert fused, [n.op for n in graph]
    for node in fused:
        compile_ptx(tmp_path, generate(node, graph))


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def _bce_with_logits(x, y):
    return (np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))).mean(axis=-1)


def _sinusoidal(t, freqs):
    arg = t[:, None] * freqs[None, :]
    return np.concatenate([np.sin(arg), np.cos(arg)], axis=-1)


def _finite_or_zero(x):
    return np.where(np.isfinite(x), x, 0.0) * np.sign(x)


@pytest.mark.parametrize("fn, make", [
    (_softplus, lambda r: [r.standard_normal((64, 129)).astype(np.float32) * 30]),
    (_bce_with_logits, lambda r: [r.standard_normal((64, 129)).astype(np.float32) * 5,
                                  (r.random((64, 129)) > 0.5).astype(np.float32)]),
    (_sinusoidal, lambda r: [r.uniform(0, 1000, 37).astype(np.float32),
                             np.exp(-np.arange(16, dtype=np.float32))]),
    (_finite_or_zero, lambda r: [np.array([np.nan, np.inf, -np.inf, -0.0, 2.0, -3.0] * 11,
                                          np.float32)]),
], ids=["softplus", "bce_with_logits", "sinusoidal", "finite_or_zero"])
def test_programs_using_them_compile_without_graph_breaks(fn, make):
    args = make(np.random.default_rng(5))
    f = pl.compile(fn)
    got = f(*args)
    with np.errstate(all="ignore"):
        want = fn(*args)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    text = str(f.explain())
    assert "graph breaks: 0" in text, text
    assert "no op in pyc_lab's registry" not in text, text


def _compiled_equals_numpy(fn, *args):
    f = pl.compile(fn)
    got = f(*args)
    with np.errstate(all="ignore"):
        want = fn(*args)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    if want.dtype == BF16:  # NumPy's testing does not see bfloat16 NaNs as equal
        got, want = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(got, want)
    return str(f.explain())


def _special_rows(dtype, rng):
    x = (rng.standard_normal((33, 17)) * 100).astype(np.float64)
    x[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 2.5]
    x[1, :4] = [0.5, -0.5, 1.5, -2.5]  # ties round to even
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, BF16, np.int32])
@pytest.mark.parametrize("decimals", [0, 1, 2, -1, -2])
def test_round_is_numpys_steps(dtype, decimals):
    """Each step in the input's dtype, as NumPy's ``out=`` holds it: bfloat16 times a
    Python float is float32 to ml_dtypes, and NumPy rounds it back to bfloat16 first."""
    x = _special_rows(dtype, np.random.default_rng(decimals + 3)) if dtype != np.int32 \
        else np.random.default_rng(1).integers(-999, 999, (33, 17)).astype(np.int32)
    text = _compiled_equals_numpy(lambda a: np.round(a, decimals), x)
    covered = dtype != np.int32 or decimals >= 0
    assert ("graph breaks: 0" in text) == covered, text
    _compiled_equals_numpy(lambda a: a.round(decimals) * 2, x)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, BF16])
@pytest.mark.parametrize("ord_", [None, 1, 2, np.inf, -np.inf])
@pytest.mark.parametrize("axis, keepdims", [(1, False), (0, True), ((1,), False),
                                            (None, False), (None, True)])
def test_vector_norms_are_reductions(dtype, ord_, axis, keepdims):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((29, 13)) * 3).astype(dtype)
    # without an axis, an ord makes it a matrix norm: the max column/row sums compile, the
    # SVD norm (ord 2) is a graph break, which still gives NumPy's answer; a bfloat16
    # array is float64 first, as an integer one is (NumPy's conversion)
    matrix = axis is None and ord_ == 2
    f = pl.compile(lambda a: np.linalg.norm(a, ord=ord_, axis=axis, keepdims=keepdims))
    try:
        want = np.linalg.norm(x, ord=ord_, axis=axis, keepdims=keepdims)
    except TypeError as exc:  # float16 has no SVD: the graph break raises NumPy's error
        with pytest.raises(TypeError, match=str(exc)):
            f(x)
        return
    got = f(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == np.float16 else 1e-6)
    assert ("graph breaks: 0" in str(f.explain())) != matrix, str(f.explain())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, BF16])
@pytest.mark.parametrize("ord_", [None, "fro", 1, -1, np.inf, -np.inf, 0])
@pytest.mark.parametrize("axis", [(0, 1), (1, 0), (2, 0), (-1, 1), None, 2])
@pytest.mark.parametrize("keepdims", [False, True])
def test_matrix_norms_and_count_norms_are_numpys_steps(dtype, ord_, axis, keepdims):
    """Over two axes (or a 2-d array's every axis): the Frobenius norm and the max/min of
    column or row sums of |x|, bit for bit NumPy's; ``ord=0`` over one axis counts the
    nonzeros in x's dtype."""
    x = (np.random.default_rng(5).standard_normal((3, 4, 5)) * 3).astype(dtype)
    x[0, 0, 0] = 0
    if axis is None:
        x = x[0]
    f = pl.compile(lambda a: np.linalg.norm(a, ord=ord_, axis=axis, keepdims=keepdims))
    try:
        with np.errstate(divide="ignore"):  # the -1 p-norm of a zero
            want = np.linalg.norm(x, ord=ord_, axis=axis, keepdims=keepdims)
    except ValueError as exc:  # an order this many axes do not have: NumPy's own error
        with pytest.raises(ValueError, match=str(exc)[:20]):
            f(x)
        return
    with np.errstate(divide="ignore"):
        got = f(x)
    assert type(got) is type(want)
    assert np.asarray(got).dtype == np.asarray(want).dtype and np.shape(got) == np.shape(want)
    if axis is None and ord_ in (None, "fro"):  # NumPy's BLAS dot: its own summation order
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)
    general_p = isinstance(axis, int) and ord_ == -1  # a p-norm: (sum |x|**p)**(1/p)
    assert bool(f.explain(x).graph_breaks) == general_p


def test_the_norm_of_complex_values_is_numpys():
    """NumPy's ``(x.conj() * x).real``: a complex array's norm runs as written (squaring
    it gave a complex, wrong, answer)."""
    rng = np.random.default_rng(6)
    z = (rng.standard_normal((4, 5)) + 1j * rng.standard_normal((4, 5))).astype(np.complex64)
    for program in (lambda a: np.linalg.norm(a), lambda a: np.linalg.norm(a, axis=-1),
                    lambda a: np.linalg.norm(a, axis=(0, 1))):
        got, want = pl.compile(program)(z), program(z)
        assert np.asarray(got).dtype == np.asarray(want).dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_norm_without_a_reduction_form_is_a_graph_break_that_still_answers():
    x = np.random.default_rng(3).standard_normal((8, 5))
    f = pl.compile(lambda a: np.linalg.norm(a, ord=3, axis=1) + 1)
    np.testing.assert_allclose(f(x), np.linalg.norm(x, ord=3, axis=1) + 1)
    assert "np.norm" in str(f.explain())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, BF16])
def test_nan_to_num_replaces_as_numpy_does(dtype):
    x = _special_rows(np.float64, np.random.default_rng(4))
    if dtype == np.int32:
        x = np.nan_to_num(x, posinf=7, neginf=-7)
    x = x.astype(dtype)
    text = _compiled_equals_numpy(lambda a: np.nan_to_num(a) + 1, x)
    assert "graph breaks: 0" in text, text
    if dtype in (np.float32, np.float64):
        _compiled_equals_numpy(lambda a: np.nan_to_num(a, nan=-1.0, posinf=9.0, neginf=-9.0),
                               x)


@pytest.mark.parametrize("dtype", [np.float64, np.bool_])
def test_nan_to_num_of_a_0d_array_is_a_scalar_as_in_numpy(dtype):
    # NumPy returns x[()]: in-place operators rebind it, item assignment is refused
    def grow(a):
        b = np.nan_to_num(a)
        b *= 5
        return b

    def assign(a):
        b = np.nan_to_num(a)
        b[...] = 1
        return b

    x = np.array(np.nan if dtype == np.float64 else True, dtype=dtype)
    got, want = pl.compile(grow)(x.copy()), grow(x.copy())
    assert got == want and np.asarray(got).dtype == np.asarray(want).dtype
    with pytest.raises(TypeError, match="does not support item assignment"):
        assign(x.copy())
    with pytest.raises(TypeError, match="does not support item assignment"):
        pl.compile(assign)(x.copy())


@needs_gxx
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64),
                                   np.dtype(np.float16), np.dtype(np.int32)],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["erf", "expit"])
def test_scipy_special_kernels_give_scipys_answers(dtype, name):
    special = pytest.importorskip("scipy.special")
    fn = getattr(special, name)
    x = _values(dtype, np.random.default_rng(9))
    got = _run(lambda a: fn(a), [x])
    with np.errstate(all="ignore"):
        want = fn(x)
    _agree(got, want, exact=False)


def test_scipy_erf_in_a_compiled_function_is_the_op():
    special = pytest.importorskip("scipy.special")

    def gelu_exact(x):
        return 0.5 * x * (1 + special.erf(x / np.sqrt(2.0)))

    x = np.linspace(-5, 5, 97).astype(np.float32)
    graph, breaks = trace(gelu_exact, (x,))
    assert not breaks and "erf" in [n.op for n in graph]
    f = pl.compile(gelu_exact)
    np.testing.assert_allclose(f(x), gelu_exact(x), rtol=1e-6, atol=1e-7)
    assert "graph breaks: 0" in str(f.explain())


@needs_nvcc
def test_erf_and_expit_compile_for_sm90(tmp_path):
    special = pytest.importorskip("scipy.special")
    for dtype in (np.float32, np.float64, np.float16):
        graph, node = fused_graph(lambda a: pl.compiler.erf(a) * special.expit(a),
                                  [((33,), dtype)])
        compile_ptx(tmp_path, generate(node, graph))


CHAIN_UNARY = ("sin", "cos", "arctan", "sinh", "log1p", "expm1", "log2", "exp2", "cbrt", "floor",
               "ceil", "trunc", "rint", "sign", "fabs", "deg2rad", "rad2deg", "isnan",
               "isinf", "isfinite", "signbit", "tanh", "exp", "abs", "negative", "sqrt")
CHAIN_BINARY = ("arctan2", "hypot", "copysign", "fmax", "fmin", "logaddexp", "heaviside",
                "add", "multiply", "maximum", "subtract")


def _chain(steps):
    """A random program: each step applies a math ufunc (one or two operands) or a
    select to the last values, skipping a step NumPy has no loop for."""
    def prog(a, b):
        pool = [a, b]
        for kind, u, bn in steps:
            x, y = pool[-1], pool[-2]
            if kind == "u" and _has_loop(u, x.dtype):
                pool.append(getattr(np, u)(x))
            elif kind == "b" and _has_loop(bn, x.dtype, y.dtype):
                pool.append(getattr(np, bn)(x, y))
            elif kind == "w":
                real = x.dtype.kind == "f" or x.dtype == BF16
                pool.append(np.where(np.isfinite(x) if real else x > 0, x, y))
        return pool[-1]

    return prog


@needs_gxx
@pytest.mark.parametrize("dtype", (*FLOATS, np.dtype(np.int32)), ids=lambda d: d.name)
def test_random_chains_of_math_ops_fuse_and_give_numpys_answers(dtype):
    """Random chains of the math ops, with selects and arithmetic, fused into one kernel
    and emulated against NumPy: special values in the inputs, every result rounded as
    the dtype's reference rounds it."""
    from pyc_lab.compiler.passes import PassManager

    rng = np.random.default_rng(2024)
    tol = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-5, "float64": 1e-12}
    emulated = 0
    for _ in range(12):
        steps = [(str(rng.choice(["u", "b", "w"])), str(rng.choice(CHAIN_UNARY)),
                  str(rng.choice(CHAIN_BINARY))) for _ in range(int(rng.integers(2, 6)))]
        prog = _chain(steps)
        a, b = ((rng.standard_normal(37) * 3).astype(dtype) for _ in range(2))
        if dtype.kind == "f" or dtype == BF16:
            a[:4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
        graph, breaks = trace(prog, (a, b))
        assert not breaks, steps
        graph = PassManager().run(graph).graph
        (node,) = [n for n in graph if n.op == "fused"] or [None]
        if node is None:  # a chain the passes folded away (x - x...): nothing generated
            continue
        src = generate(node, graph)
        ins = [dict(zip(graph.inputs, (a, b), strict=True))[i] for i in node.inputs]
        body = node.attrs["body"]
        out_dtype = body.node(body.outputs[0]).dtype
        out = np.zeros(37, out_dtype)
        if out_dtype.kind == "f" or out_dtype == BF16:
            out[...] = np.nan
        emulate(src, src.name, [i.copy() for i in ins] + [out])
        with np.errstate(all="ignore"):
            want = np.asarray(prog(a, b))
        g, w = out.astype(np.float64), want.astype(np.float64)
        assert out.dtype == want.dtype, steps
        assert np.array_equal(np.isnan(g), np.isnan(w)), steps
        np.testing.assert_array_equal(g[np.isinf(w)], w[np.isinf(w)], err_msg=str(steps))
        fin = np.isfinite(w)
        t = tol.get(want.dtype.name, 0.0)
        np.testing.assert_allclose(g[fin], w[fin], rtol=t, atol=t, err_msg=str(steps))
        emulated += 1
    assert emulated >= 8
