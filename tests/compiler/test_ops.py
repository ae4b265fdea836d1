"""Every op of the registry against NumPy: values (float64 references), dtypes, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import REGISTRY, Graph, ShapeError
from pyc_lab.compiler.ops import DTypeError, infer, normalize_axis, run_graph
from tests.compiler.test_math_ops import BINARY as MATH_BINARY
from tests.compiler.test_math_ops import UNARY as MATH_UNARY


@pytest.fixture
def rng():
    return np.random.default_rng()


def run_op(op, arrays, attrs=None, **kw):
    g = Graph()
    ids = [g.add("input", shape=a.shape, dtype=a.dtype, name=f"in{k}").id
           for k, a in enumerate(arrays)]
    node = g.add(op, ids, attrs or {}, **kw)
    g.outputs = [node.id]
    g.verify()
    (out,) = run_graph(g, list(arrays), np)
    return node, out


def gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


UNARY = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "abs": np.abs, "negative": np.negative,
    "relu": lambda x: np.maximum(x, 0), "gelu": gelu_ref,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "silu": lambda x: x / (1 + np.exp(-x)),
}
BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "power": np.power, "maximum": np.maximum, "minimum": np.minimum, "less": np.less,
    "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "equal": np.equal, "not_equal": np.not_equal,
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_ops_match_numpy_float64(op, dtype, rng):
    x = (rng.uniform(0.1, 3.0, (7, 33)) * rng.choice([-1, 1], (7, 33))).astype(dtype)
    if op in ("log", "sqrt", "rsqrt"):
        x = np.abs(x)
    node, out = run_op(op, [x])
    ref = UNARY[op](x.astype(np.float64))
    assert out.dtype == node.dtype == dtype
    # float32 gelu/sigmoid lose relative precision where 1 + tanh(.) cancels: absolute 1e-6
    np.testing.assert_allclose(out, ref, rtol=2e-6 if dtype == np.float32 else 1e-13,
                               atol=1e-6 if dtype == np.float32 else 0)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_ops_match_numpy_with_broadcasting(op, rng):
    a = rng.uniform(0.5, 2.0, (5, 1, 8))
    b = rng.uniform(0.5, 2.0, (3, 8))
    node, out = run_op(op, [a, b])
    ref = BINARY[op](a, b)
    assert out.shape == node.shape == ref.shape == (5, 3, 8)
    assert out.dtype == node.dtype == ref.dtype
    np.testing.assert_allclose(out, ref, rtol=1e-14)


@pytest.mark.parametrize("a_dt, b_dt", [
    (np.int32, np.int32), (np.int32, np.float32), (np.int64, np.float64),
    (np.float16, np.float32), (np.bool_, np.int32), (np.uint8, np.int8),
])
@pytest.mark.parametrize("op", ["add", "multiply", "divide", "maximum", "less"])
def test_result_dtypes_follow_numpy_promotion(op, a_dt, b_dt, rng):
    a = rng.integers(1, 5, (4,)).astype(a_dt)
    b = rng.integers(1, 5, (4,)).astype(b_dt)
    node, out = run_op(op, [a, b])
    assert node.dtype == BINARY[op](a, b).dtype
    np.testing.assert_array_equal(out, BINARY[op](a, b))


def test_integer_semantics_are_numpy_s(rng):
    a = rng.integers(-50, 50, (64,)).astype(np.int32)
    b = rng.integers(1, 7, (64,)).astype(np.int32)
    _, q = run_op("divide", [a, b])
    assert q.dtype == np.float64  # true division of ints
    np.testing.assert_array_equal(q, a / b)
    _, s = run_op("add", [a, b])
    np.testing.assert_array_equal(s, a + b)


def test_nan_inf_and_signed_zero_semantics():
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.0], dtype=np.float32)
    y = np.array([1.0, np.nan, 3.0, 0.0, -0.0, np.inf, np.nan], dtype=np.float32)
    for op in ("maximum", "minimum", "add", "multiply", "divide"):
        with np.errstate(all="ignore"):
            _, out = run_op(op, [x, y])
            np.testing.assert_array_equal(out, BINARY[op](x, y))
    for op in ("relu", "exp", "tanh", "abs", "negative"):
        with np.errstate(all="ignore"):
            _, out = run_op(op, [x])
            np.testing.assert_array_equal(out, UNARY[op](x).astype(np.float32))


def test_where_and_astype(rng):
    c = rng.random((6, 4)) > 0.5
    a = rng.standard_normal((6, 4))
    b = rng.standard_normal((4,)).astype(np.float32)
    node, out = run_op("where", [c, a, b])
    np.testing.assert_array_equal(out, np.where(c, a, b))
    assert node.dtype == np.float64
    node, out = run_op("astype", [a], {"dtype": np.dtype(np.float16)})
    assert out.dtype == node.dtype == np.float16
    np.testing.assert_array_equal(out, a.astype(np.float16))


@pytest.mark.parametrize("op, fn", [("sum", np.sum), ("mean", np.mean), ("max", np.max),
                                    ("min", np.min), ("var", np.var)])
@pytest.mark.parametrize("axis", [None, (0,), (1, 2), (2,)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(op, fn, axis, keepdims, rng):
    x = rng.standard_normal((3, 5, 7))
    node, out = run_op(op, [x], {"axis": axis, "keepdims": keepdims})
    ref = fn(x, axis=axis, keepdims=keepdims)
    assert node.shape == np.shape(ref)
    np.testing.assert_allclose(out, ref, rtol=1e-12)


def test_integer_sum_widens_like_numpy(rng):
    x = rng.integers(0, 100, (10,)).astype(np.int8)
    node, out = run_op("sum", [x], {"axis": None, "keepdims": False})
    assert node.dtype == np.sum(x).dtype
    assert out == x.astype(np.int64).sum()


@pytest.mark.parametrize("sa, sb, ta, tb", [
    ((4, 8), (8, 16), False, False), ((8, 4), (8, 16), True, False),
    ((4, 8), (16, 8), False, True), ((2, 3, 4, 8), (8, 5), False, False),
    ((3, 4, 8), (3, 8, 5), False, False), ((8,), (8, 5), False, False),
    ((4, 8), (8,), False, False),
])
def test_matmul_shapes_and_values(sa, sb, ta, tb, rng):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    node, out = run_op("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb})
    a2 = np.swapaxes(a, -1, -2) if ta else a
    b2 = np.swapaxes(b, -1, -2) if tb else b
    ref = a2 @ b2
    assert node.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-12)


@pytest.mark.parametrize("act", ["relu", "gelu", "sigmoid", "silu", "tanh"])
def test_matmul_epilogue(act, rng):
    a, b, bias = rng.standard_normal((6, 8)), rng.standard_normal((8, 5)), \
        rng.standard_normal(5)
    _, out = run_op("matmul", [a, b, bias], {"activation": act})
    pre = a @ b + bias
    ref = {"relu": lambda x: np.maximum(x, 0), "gelu": gelu_ref, "tanh": np.tanh,
           "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
           "silu": lambda x: x / (1 + np.exp(-x))}[act](pre)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-15)


def test_softmax_and_layer_norm(rng):
    x = rng.standard_normal((4, 9)) * 10
    _, s = run_op("softmax", [x], {"axis": -1})
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), rtol=1e-13)
    _, s0 = run_op("softmax", [x], {"axis": 0})
    np.testing.assert_allclose(s0.sum(0), np.ones(9), rtol=1e-13)
    g, b = rng.standard_normal(9), rng.standard_normal(9)
    _, y = run_op("layer_norm", [x, g, b], {"eps": 1e-5})
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-12)


def test_shape_ops(rng):
    x = rng.standard_normal((2, 3, 4))
    assert run_op("reshape", [x], {"shape": (6, -1)})[1].shape == (6, 4)
    _, t = run_op("transpose", [x], {"axes": (2, 0, 1)})
    np.testing.assert_array_equal(t, x.transpose(2, 0, 1))
    _, bt = run_op("broadcast_to", [x[0, 0]], {"shape": (5, 4)})
    np.testing.assert_array_equal(bt, np.broadcast_to(x[0, 0], (5, 4)))
    assert run_op("expand_dims", [x], {"axis": 1})[1].shape == (2, 1, 3, 4)
    assert run_op("squeeze", [x[:, :1]], {"axis": (1,)})[1].shape == (2, 4)
    _, c = run_op("concatenate", [x, x[:, :1]], {"axis": 1})
    np.testing.assert_array_equal(c, np.concatenate([x, x[:, :1]], axis=1))
    idx = (("s", None, None, -1), ("i", 1), ("n",), ("s", 1, 3, None))
    _, s = run_op("slice", [x], {"index": idx})
    np.testing.assert_array_equal(s, x[::-1, 1, None, 1:3])


@pytest.mark.parametrize("op, shapes, attrs, message", [
    ("add", [(3, 4), (5,)], {}, "do not broadcast"),
    ("matmul", [(3, 4), (5, 6)], {}, "inner dimensions differ"),
    ("reshape", [(3, 4)], {"shape": (5, -1)}, "cannot reshape"),
    ("transpose", [(3, 4)], {"axes": (0, 0)}, "not a permutation"),
    ("sum", [(3, 4)], {"axis": (2,), "keepdims": False}, "out of range"),
    ("concatenate", [(3, 4), (3, 5)], {"axis": 0}, "differ elsewhere"),
    ("layer_norm", [(3, 4), (5,)], {"eps": 1e-5}, "scale/shift must have shape"),
])
def test_shape_errors_are_readable(op, shapes, attrs, message):
    g = Graph()
    ids = [g.add("input", shape=s, dtype=np.float32).id for s in shapes]
    with pytest.raises(ShapeError, match=message):
        g.add(op, ids, attrs)


#: Ops with NumPy ufunc semantics, checked over every dtype below.
UFUNC_OPS_CHECKED = {
    "square": np.square, "reciprocal": np.reciprocal, "positive": np.positive,
    "invert": np.invert, "logical_not": np.logical_not, "copy": np.copy,
    "floor_divide": np.floor_divide, "remainder": np.remainder,
    "left_shift": np.left_shift, "right_shift": np.right_shift,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor, "logical_and": np.logical_and,
    "logical_or": np.logical_or, "logical_xor": np.logical_xor, "clip": np.clip,
}
DTYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32,
          np.float64]


def _values(rng, dtype, shape):
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(1, 7, shape).astype(dtype)
    return rng.uniform(0.5, 4.0, shape).astype(dtype)


@pytest.mark.parametrize("op", sorted(UFUNC_OPS_CHECKED))
@pytest.mark.parametrize("dtype", DTYPES)
def test_ufunc_ops_match_numpy_for_every_dtype(op, dtype, rng):
    opdef = REGISTRY[op]
    arrays = [_values(rng, dtype, (4, 5)) for _ in range(opdef.arity)]
    fn = UFUNC_OPS_CHECKED[op]
    try:
        with np.errstate(all="ignore"):
            ref = np.asarray(fn(*arrays))
    except TypeError:  # NumPy refuses the dtype: so does the op, with a clear error
        with pytest.raises(DTypeError, match="NumPy says"):
            run_op(op, arrays)
        return
    with np.errstate(all="ignore"):
        node, out = run_op(op, arrays)
    assert out.dtype == node.dtype == ref.dtype, op
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "var", "std", "prod", "argmax",
                                "argmin", "any", "all"])
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.float16, np.float32])
def test_every_reduction_takes_numpys_arguments(op, dtype, rng):
    x = _values(rng, dtype, (3, 4, 5))
    fn = getattr(np, op)
    cases = [{"axis": None}, {"axis": (1,), "keepdims": True}, {"axis": (0, 2)}]
    if op not in ("argmax", "argmin"):
        where = rng.random((4, 5)) > 0.3
        where[:, 0] = True  # every slice keeps a value (a mean of none warns)
        cases.append({"axis": (2,), "where": where,
                      **({"initial": 3} if op in ("max", "min") else {})})
    if op in ("sum", "prod", "max", "min"):
        cases.append({"axis": (1,), "initial": 2})
    if op in ("sum", "mean", "prod", "var", "std"):
        cases.append({"axis": (0,), "dtype": np.dtype(np.float64)})
    if op in ("var", "std"):
        cases.append({"axis": (2,), "ddof": 1})
    for attrs in cases:
        attrs = dict(attrs)
        where = attrs.pop("where", None)
        arrays = [x] if where is None else [x, where]
        kw = dict(attrs)
        if op in ("argmax", "argmin") and kw["axis"] is not None:
            if len(kw["axis"]) > 1:
                continue
            kw["axis"] = kw["axis"][0]
        with np.errstate(all="ignore"):
            ref = np.asarray(fn(x, **kw, **({} if where is None else {"where": where})))
            node, out = run_op(op, arrays, {"keepdims": False, **attrs})
        assert node.shape == ref.shape and out.dtype == node.dtype == ref.dtype, (op, attrs)
        np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64),
                                   rtol=1e-6, equal_nan=True, err_msg=f"{op} {attrs}")


def test_var_forms_differ_only_where_numpy_does():
    x = np.array([[200.0, -200.0, 200.0, -200.0]], np.float16)
    d = x - x.mean(1, keepdims=True)
    with np.errstate(all="ignore"):
        _, written = run_op("var", [x], {"axis": (1,), "keepdims": False,
                                         "form": "mean_square"})
        _, np_var = run_op("var", [x], {"axis": (1,), "keepdims": False})
        np.testing.assert_array_equal(written, (d * d).mean(1))  # float32 sum: 40000
        np.testing.assert_array_equal(np_var, np.var(x, axis=1))  # float16 sum: inf
    assert np.isinf(np_var).all() and np.isfinite(written).all()


def test_setitem_and_clip(rng):
    x = rng.standard_normal((4, 5))
    v = rng.standard_normal((5,))
    idx = (("s", 1, 3, None),)
    _, out = run_op("setitem", [x, v], {"index": idx})
    want = x.copy()
    want[1:3] = v
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ShapeError, match="could not broadcast"):
        run_op("setitem", [x, rng.standard_normal(3)], {"index": idx})
    lo, hi = np.array(-0.0), np.array(0.5)
    _, c = run_op("clip", [np.array([-0.0, 0.0, np.nan, 2.0]), lo, hi])
    ref = np.clip(np.array([-0.0, 0.0, np.nan, 2.0]), lo, hi)
    np.testing.assert_array_equal(c, ref)
    np.testing.assert_array_equal(np.signbit(c), np.signbit(ref))


@pytest.mark.parametrize("op", MATH_UNARY + MATH_BINARY)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.uint8])
def test_math_ops_infer_numpys_dtype_and_compute_its_values(op, dtype, rng):
    # their generated kernels: tests/compiler/test_math_ops.py
    x = (rng.uniform(0.1, 3.0, (5, 7)) * (1 if dtype == np.uint8 else
                                         rng.choice([-1, 1], (5, 7)))).astype(dtype)
    args = [x] if op in MATH_UNARY else [x, x[::-1]]
    fn = getattr(np, op)
    try:
        with np.errstate(all="ignore"):
            want = fn(*args)
    except TypeError:  # no NumPy loop (sign of bool...): the op refuses it as well
        with pytest.raises(Exception, match=op):
            run_op(op, args)
        return
    with np.errstate(all="ignore"):
        node, out = run_op(op, args)
    assert node.dtype == out.dtype == want.dtype
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("attrs, idx_shape, want", [
    ({"axis": 0, "along": False}, (2, 3), lambda x, i: np.take(x, i, axis=0)),
    ({"axis": 2, "along": False}, (4,), lambda x, i: np.take(x, i, axis=2)),
    ({"axis": 1, "along": True}, (5, 2, 1), lambda x, i: np.take_along_axis(x, i, axis=1)),
    ({"axis": 2, "along": True}, (5, 3), lambda x, i: np.take_along_axis(
        x, i[..., None], axis=2)[..., 0]),
])
def test_gather_reads_at_integer_indices(rng, attrs, idx_shape, want):
    x = rng.standard_normal((5, 3, 6)).astype(np.float32)
    bound = x.shape[attrs["axis"]]
    idx = rng.integers(-bound, bound, idx_shape)
    node, out = run_op("gather", [x, idx], attrs)
    expected = want(x, idx)
    assert node.shape == expected.shape and node.dtype == out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


def test_gather_refuses_what_numpy_refuses():
    x = np.ones((4, 3), np.float32)
    for idx, attrs, match in [
        (np.array([0.5]), {"axis": 0}, "integer"),
        (np.zeros((2, 2, 2), np.int64), {"axis": 0, "along": True}, "same rank"),
        (np.zeros((3, 3), np.int64), {"axis": 1, "along": True}, "broadcast"),
        (np.array([0]), {"axis": 2}, "out of range"),
    ]:
        with pytest.raises(ShapeError, match=match):
            run_op("gather", [x, idx], attrs)
    with pytest.raises(ShapeError, match="empty"):
        run_op("gather", [np.ones((0, 3), np.float32), np.array([0])], {"axis": 0})


def test_every_registered_op_is_covered_by_a_test_here():
    covered = set(UNARY) | set(BINARY) | set(UFUNC_OPS_CHECKED) | set(MATH_UNARY) | \
        set(MATH_BINARY) | {"erf", "expit"} | {
        "where", "astype", "sum", "mean", "max", "min", "var", "std", "prod", "argmax",
        "argmin", "any", "all", "matmul", "softmax", "layer_norm", "reshape", "transpose",
        "broadcast_to", "expand_dims", "squeeze", "concatenate", "slice", "setitem",
        "input", "constant", "fused", "fused_rows", "fused_extra", "eager", "attention",
        "conv", "gather", "cumsum", "cumprod", "sort", "argsort", "quantile"}
    assert set(REGISTRY) <= covered, set(REGISTRY) - covered


@pytest.mark.parametrize("attrs", [
    {"q": 0.25, "axis": 1, "keepdims": False, "method": "linear", "percentile": False},
    {"q": (10.0, 90.0), "axis": None, "keepdims": True, "method": "nearest",
     "percentile": True}])
@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32])
def test_the_quantile_op_infers_numpys_shape_and_dtype_and_computes_its_values(rng, dtype,
                                                                               attrs):
    # (every form through pl.compile: tests/compiler/test_scans.py)
    x = _values(rng, dtype, (3, 5))
    node, out = run_op("quantile", [x], attrs)
    fn = np.percentile if attrs["percentile"] else np.quantile
    want = fn(x, attrs["q"], axis=attrs["axis"], keepdims=attrs["keepdims"],
              method=attrs["method"])
    assert node.shape == np.shape(want) and node.dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "sort", "argsort"])
@pytest.mark.parametrize("dtype", [np.int8, np.bool_, np.float16, np.float32])
def test_scan_ops_infer_numpys_dtype_and_compute_its_values(rng, op, dtype):
    # (every form and axis through pl.compile: tests/compiler/test_scans.py)
    x = _values(rng, dtype, (3, 5))
    attrs = {"axis": 1} if op != "cumsum" else {"axis": 1, "dtype": None}
    node, out = run_op(op, [x], attrs)
    want = np.argsort(x, axis=1, kind="stable") if op == "argsort" \
        else getattr(np, op)(x, axis=1)
    assert node.shape == want.shape and node.dtype == want.dtype
    np.testing.assert_array_equal(out, want)


def test_attention_op_broadcasts_its_operands_and_casts_to_its_dtype(rng):
    # (the op's semantics against float64: tests/compiler/test_attention_find.py and
    # tests/kernels/test_attention.py); here the registry's shape, dtype and reference
    import pyc_lab.compiler.attention_op  # noqa: F401  (registers it)

    q = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    k = rng.standard_normal((1, 3, 7, 8)).astype(np.float32)   # broadcast over batch
    v = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
    mask = np.where(rng.random((5, 7)) < 0.2, -np.inf, 0.0).astype(np.float32)
    node, out = run_op("attention", [q, k, v, mask],
                       {"scale": 0.5, "causal": False, "dtype": "float16"})
    assert node.shape == (2, 3, 5, 4) and node.dtype == np.float16
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * 0.5 + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    assert out.dtype == np.float16  # computed in float32, given in the node's dtype
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_conv_op_is_pl_conv_with_its_shape_checked(rng):
    # (against float64 loops and inside pl.compile: tests/compiler/test_conv_op.py)
    x = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    attrs = {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 1), "groups": 1,
             "layout": "channels_first"}
    node, out = run_op("conv", [x, w], attrs)
    assert node.shape == (2, 4, 5, 5) and node.dtype == np.float32
    np.testing.assert_array_equal(out, pl.conv2d(x, w, stride=(2, 1), padding=(1, 0)))
    with pytest.raises(ShapeError, match="groups=2 do not fit"):
        run_op("conv", [x, w], {**attrs, "groups": 2})


def test_fused_rows_runs_its_body_as_written(rng):
    x = rng.standard_normal((3, 7)).astype(np.float32)
    body = Graph()
    b_in = body.add("input", shape=x.shape, dtype=x.dtype, name="in0")
    sq = body.add("multiply", [b_in.id, b_in.id])
    total = body.add("sum", [sq.id], {"axis": (1,), "keepdims": True})
    body.outputs = [body.add("divide", [b_in.id, total.id]).id]
    node, out = run_op("fused_rows", [x], {"body": body, "space": x.shape, "name": "rows_0"})
    assert node.shape == x.shape and node.dtype == np.float32
    np.testing.assert_array_equal(out, x / (x * x).sum(1, keepdims=True))


def test_fused_extra_is_its_output_of_the_shared_body(rng):
    x, y = rng.standard_normal((2, 5)), rng.standard_normal((2, 5))
    body = Graph()
    b0 = body.add("input", shape=x.shape, dtype=x.dtype, name="in0")
    b1 = body.add("input", shape=y.shape, dtype=y.dtype, name="in1")
    s = body.add("add", [b0.id, b1.id])
    m = body.add("greater", [b0.id, b1.id])
    body.outputs = [body.add("multiply", [s.id, b1.id]).id, s.id, m.id]
    fused, out0 = run_op("fused", [x, y], {"body": body, "name": "fused_0"})
    assert fused.shape == x.shape and fused.dtype == x.dtype
    np.testing.assert_array_equal(out0, (x + y) * y)  # a fused node's value: output 0
    for k, want in ((1, x + y), (2, x > y)):
        node, out = run_op("fused_extra", [out0, x, y], {"body": body, "output": k})
        assert node.dtype == want.dtype and node.shape == want.shape
        np.testing.assert_array_equal(out, want)


def test_infer_matches_the_reference_for_every_elementwise_op(rng):
    for name, opdef in REGISTRY.items():
        if opdef.kind != "elementwise" or name == "astype":
            continue
        integer = name in ("invert", "left_shift", "right_shift", "bitwise_and",
                           "bitwise_or", "bitwise_xor")
        arrays = [rng.integers(1, 5, (3, 2)) if integer else rng.uniform(0.5, 1.5, (3, 2))
                  for _ in range(opdef.arity)]
        if name == "where":
            arrays[0] = arrays[0] > 1
        shape, dtype = infer(name, arrays, {})
        with np.errstate(invalid="ignore"):  # arcsin(1.2) and the like: NaN, as NumPy
            out = opdef.reference(np, arrays, {})
        assert (shape, dtype) == (out.shape, out.dtype), name


def test_dtype_errors_say_what_numpy_says():
    g = Graph()
    b = g.add("input", shape=(3,), dtype=np.bool_).id
    with pytest.raises(DTypeError, match=r"negative does not take \(bool\): NumPy says"):
        g.add("negative", [b])
    assert issubclass(DTypeError, TypeError) and issubclass(DTypeError, ShapeError)


def test_normalize_axis():
    assert normalize_axis(-1, 3) == (2,)
    assert normalize_axis((2, 0), 3) == (0, 2)
    assert normalize_axis(None, 2) == (0, 1)
    with pytest.raises(ShapeError, match="repeated"):
        normalize_axis((1, -2), 3)


@pytest.mark.parametrize("op", ["sum", "mean", "var", "std", "prod"])
def test_bfloat16_reductions_accumulate_in_float32_and_stay_bfloat16(rng, op):
    # NumPy's own bfloat16 loops accumulate in bfloat16 (np.ones(1000, bf16).sum() is
    # 256); the compiler's reference accumulates in float32 and rounds once
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = (rng.random((4, 1000)) + 0.5).astype(np.float32)
    if op == "prod":
        x = (1 + (x - 1) / 100).astype(np.float32)  # a product that stays finite
    x = x.astype(bf16)
    node, out = run_op(op, [x], {"axis": (1,), "keepdims": False})
    assert node.dtype == bf16 and out.dtype == bf16
    want = getattr(np, op)(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2**-7)
    if op == "sum":  # what NumPy's bfloat16 loop gives instead
        assert float(np.ones(1000, bf16).sum()) == 256.0
        assert float(run_op("sum", [np.ones(1000, bf16)], {"axis": (0,)})[1]) == 1000.0


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_activations_of_integers_are_the_float64_functions(dtype):
    # the constants must not be cast to the input's dtype (sqrt(2/pi) as an int is 0)
    x = (np.arange(-4, 5) if dtype != np.bool_ else np.array([True, False, True])).astype(dtype)
    f = x.astype(np.float64)
    want = {"gelu": gelu_ref(f), "sigmoid": 1 / (1 + np.exp(-f)),
            "silu": f / (1 + np.exp(-f))}
    for name, fn in (("gelu", pl.compiler.gelu), ("sigmoid", pl.compiler.sigmoid),
                     ("silu", pl.compiler.silu)):
        got = fn(x)
        assert got.dtype == np.float64, name
        np.testing.assert_allclose(got, want[name], rtol=1e-15, atol=1e-16, err_msg=name)
        node, out = run_op(name, [x])
        assert node.dtype == np.float64
        np.testing.assert_allclose(out, want[name], rtol=1e-15, atol=1e-16, err_msg=name)


def test_bfloat16_activations_and_normalisations_stay_bfloat16_rounded_once(rng):
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = (rng.standard_normal((6, 40)) * 3).astype(bf16)
    f = x.astype(np.float32)
    e = np.exp(f - f.max(-1, keepdims=True))
    c = f - f.mean(-1, keepdims=True)
    cases = {
        "gelu": (pl.compiler.gelu(x), gelu_ref(f)),
        "sigmoid": (pl.compiler.sigmoid(x), 1 / (1 + np.exp(-f))),
        "silu": (pl.compiler.silu(x), f / (1 + np.exp(-f))),
        "softmax": (pl.compiler.softmax(x), e / e.sum(-1, keepdims=True)),
        "layer_norm": (pl.compiler.layer_norm(x),
                       c / np.sqrt((c * c).mean(-1, keepdims=True) + np.float32(1e-5))),
    }
    for name, (got, want32) in cases.items():
        assert got.dtype == bf16, name
        # computed in float32, rounded once: within one bfloat16 rounding of float32's
        np.testing.assert_allclose(got.astype(np.float32), want32, rtol=2.0 ** -8,
                                   atol=1e-6, err_msg=name)
