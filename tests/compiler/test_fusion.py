"""Epilogue, reduction and elementwise fusion: structure, golden IR and unchanged results."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler import trace
from pyc_lab.compiler.ir import Graph
from pyc_lab.compiler.ops import ACTIVATIONS, REGISTRY, run_graph
from pyc_lab.compiler.passes import PASSES, PassContext, PassManager

RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """Fresh random values, never zeros."""
    return (rng.standard_normal(shape) + 0.1).astype(dtype)


def run_pass(graph: Graph, name: str, mode: str = "balanced") -> tuple[Graph, bool, list[str]]:
    g = graph.copy()
    ctx = PassContext(mode=mode)
    changed = PASSES[name].run(g, ctx)
    g.verify()
    return g, changed, ctx.notes


def assert_same(before: Graph, after: Graph, args, exact: bool = False, rtol=None) -> None:
    with np.errstate(all="ignore"):
        want = run_graph(before, args, np)
        got = run_graph(after, args, np)
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol or RTOL[w.dtype], atol=1e-6,
                                       equal_nan=True)


def traced(fn, *shapes, dtype=np.float32):
    rng = np.random.default_rng()
    args = [rand(rng, s, dtype) for s in shapes]
    graph, _ = trace(fn, args)
    return graph, args


def _inp(g: Graph, name: str, shape, dtype=np.float32) -> int:
    return g.add("input", (), {"index": len(g.inputs)}, name=name, shape=shape,
                 dtype=dtype).id


def _mm_graph(act: str | None, bias_shape, bias_left=False, dtype=np.float32,
              batch=()) -> Graph:
    g = Graph("mm")
    a = _inp(g, "a", (*batch, 5, 7), dtype)
    b = _inp(g, "b", (7, 6), dtype)
    out = g.add("matmul", (a, b)).id
    if bias_shape is not None:
        c = _inp(g, "bias", bias_shape, dtype)
        out = g.add("add", (c, out) if bias_left else (out, c)).id
    if act is not None:
        out = g.add(act, (out,)).id
    g.outputs = [out]
    return g


# -- epilogue fusion -----------------------------------------------------------------------------
EPILOGUES = [(act, bias) for act in [None, *sorted(ACTIVATIONS)]
             for bias in [None, (6,), (1, 6), "left"] if act is not None or bias is not None]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("act", "bias"), EPILOGUES, ids=[f"{a}-{b}" for a, b in EPILOGUES])
def test_epilogue_fusion_never_changes_the_result(act, bias, dtype):
    left = bias == "left"
    shape = (6,) if left else bias
    graph = _mm_graph(act, shape, left, dtype)
    g, changed, notes = run_pass(graph, "epilogue_fusion")
    assert changed and len(notes) == 1
    (mm,) = [n for n in g if n.op == "matmul"]
    assert len(g) == len(g.inputs) + 1
    assert len(mm.inputs) == (2 if shape is None else 3)
    assert mm.attrs.get("activation") == act
    assert g.outputs == [mm.id]
    rng = np.random.default_rng()
    for _ in range(2):
        args = [rand(rng, g.nodes[i].shape, dtype) for i in graph.inputs]
        assert_same(graph, g, args, exact=True)


def test_epilogue_fusion_golden_and_batched():
    graph = _mm_graph("gelu", (1, 1, 6), batch=(3,))
    g, changed, notes = run_pass(graph, "epilogue_fusion")
    assert changed
    assert notes == ["epilogue_fusion: folded bias add %4 and gelu %5 into matmul %2 (now %6)"]
    assert g.text() == """\
graph mm(%0: f32[3,5,7] a, %1: f32[7,6] b, %2: f32[1,1,6] bias) {
  %3 = matmul(%0, %1, %2; activation='gelu') : f32[3,5,6]
  return %3
}"""
    rng = np.random.default_rng()
    assert_same(graph, g, [rand(rng, graph.nodes[i].shape) for i in graph.inputs], exact=True)


def test_epilogue_fusion_traced_relu_as_maximum_and_tanh():
    def fn(x, w, b, w2):
        h = np.maximum(x @ w + b, 0.0)
        return np.tanh(h @ w2)

    graph, args = traced(fn, (4, 8), (8, 8), (8,), (8, 3))
    g, changed, _ = run_pass(graph, "epilogue_fusion")
    assert changed
    mms = [n for n in g if n.op == "matmul"]
    assert [m.attrs.get("activation") for m in mms] == ["relu", "tanh"]
    assert [len(m.inputs) for m in mms] == [3, 2]
    assert "add" not in g.ops() and "maximum" not in g.ops() and "tanh" not in g.ops()
    assert_same(graph, g, args, exact=True)


def test_epilogue_fusion_takes_bfloat16_products():
    """ml_dtypes' bfloat16 (dtype kind ``V``) folds like float16: the bias add and a ReLU
    written as np.maximum(..., 0) into the matmul, a -0.0 maximum not; same values."""
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng()
    args = [rand(rng, s).astype(bf16) for s in [(4, 8), (8, 8), (8,), (8, 3)]]

    def fn(x, w, b, w2):
        return np.maximum(x @ w + b, 0) @ w2

    graph, _ = trace(fn, tuple(args))
    g, changed, _ = run_pass(graph, "epilogue_fusion")
    assert changed and [n.op for n in g if n.op not in ("input", "constant")] == [
        "matmul", "matmul"]
    mm = next(n for n in g if n.op == "matmul")
    assert mm.attrs.get("activation") == "relu" and len(mm.inputs) == 3
    # the fused product takes its bias before rounding to bfloat16 (as cuBLASLt's
    # epilogue does), the unfused one after: one bfloat16 rounding apart (2**-8)
    (want,), (got,) = run_graph(graph, args, np), run_graph(g, args, np)
    assert got.dtype == want.dtype == bf16 and got.shape == want.shape
    w64, g64 = want.astype(np.float64), got.astype(np.float64)
    scale = np.abs(np.maximum(args[0].astype(np.float64) @ args[1].astype(np.float64)
                              + args[2].astype(np.float64), 0)) @ np.abs(
        args[3].astype(np.float64))
    assert np.all(np.abs(g64 - w64) <= 2.0**-7 * (scale + np.abs(w64)))
    graph, _ = trace(lambda x, w, b, w2: np.maximum(x @ w, bf16.type(-0.0)), tuple(args))
    g, _, _ = run_pass(graph, "epilogue_fusion")
    assert "maximum" in g.ops()


NOT_FUSED = {
    "product read twice": lambda x, w, b: (x @ w + b) * (x @ w),
    "product is an output": lambda x, w, b: (x @ w + b, x @ w),
    "full bias": lambda x, w, b: x @ w + np.ones((4, 8), np.float32),
    "column bias": lambda x, w, b: x @ w + np.ones((4, 1), np.float32),
    "scalar bias": lambda x, w, b: x @ w + 1.0,
    "bias that broadcasts up": lambda x, w, b: x @ w + np.ones((2, 1, 8), np.float32),
    "not an activation": lambda x, w, b: np.exp(x @ w),
    "maximum with -0.0": lambda x, w, b: np.maximum(x @ w, -0.0),
    "maximum with zero first": lambda x, w, b: np.maximum(0.0, x @ w),
}


@pytest.mark.parametrize("label", list(NOT_FUSED))
def test_epilogue_fusion_refuses(label):
    graph, args = traced(NOT_FUSED[label], (4, 8), (8, 8), (8,))
    graph = PassManager(["cse"]).run(graph).graph  # one x @ w
    g, changed, _ = run_pass(graph, "epilogue_fusion")
    assert not changed and g.text() == graph.text()
    assert_same(graph, g, args, exact=True)


def test_epilogue_fusion_stops_at_a_value_read_twice():
    graph, args = traced(lambda x, w, b: np.tanh(x @ w + b) + (x @ w + b), (4, 8), (8, 8),
                         (8,))
    graph = PassManager(["cse"]).run(graph).graph
    g, changed, _ = run_pass(graph, "epilogue_fusion")
    assert changed
    (mm,) = [n for n in g if n.op == "matmul"]
    assert len(mm.inputs) == 3 and "activation" not in mm.attrs and "tanh" in g.ops()
    assert_same(graph, g, args, exact=True)


def test_epilogue_fusion_takes_a_bias_that_promotes():
    graph, args = traced(lambda x, w: np.tanh(x @ w + np.ones(8, np.float64)), (4, 8), (8, 8))
    g, changed, _ = run_pass(graph, "epilogue_fusion")
    assert changed
    (mm,) = [n for n in g if n.op == "matmul"]
    assert len(mm.inputs) == 3 and mm.dtype == np.float64 and mm.attrs["activation"] == "tanh"
    assert_same(graph, g, args, exact=True)


def test_epilogue_fusion_leaves_integer_matmuls_alone():
    g = _mm_graph("relu", (6,), dtype=np.int32)
    _out, changed, _ = run_pass(g, "epilogue_fusion")
    assert not changed


def test_epilogue_adds_activation_to_a_biased_matmul():
    g = Graph("mm")
    a, b, c = _inp(g, "a", (2, 3)), _inp(g, "b", (3, 4)), _inp(g, "c", (4,))
    mm = g.add("matmul", (a, b, c))
    s = g.add("sigmoid", (mm.id,))
    g.outputs = [s.id]
    out, changed, _ = run_pass(g, "epilogue_fusion")
    assert changed
    (m,) = [n for n in out if n.op == "matmul"]
    assert m.inputs == (a, b, c) and m.attrs["activation"] == "sigmoid"
    rng = np.random.default_rng()
    assert_same(g, out, [rand(rng, (2, 3)), rand(rng, (3, 4)), rand(rng, (4,))], exact=True)


# -- reduction fusion ----------------------------------------------------------------------------
def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_golden_and_exact():
    graph, args = traced(lambda x: _softmax(x, -1), (3, 5))
    g, changed, notes = run_pass(graph, "reduction_fusion")
    assert changed
    assert g.text() == """\
graph <lambda>(%0: f32[3,5] x) {
  %1 = softmax(%0; axis=1) : f32[3,5]
  return %1
}"""
    assert "softmax over axis 1" in notes[0]
    assert_same(graph, g, args, exact=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_any_single_axis(axis, dtype):
    graph, args = traced(lambda x: _softmax(x, axis) * 2.0, (4, 3, 5), dtype=dtype)
    g, changed, _ = run_pass(graph, "reduction_fusion")
    assert changed
    (sm,) = [n for n in g if n.op == "softmax"]
    assert sm.attrs["axis"] == axis % 3
    assert_same(graph, g, args, exact=True)


def test_softmax_with_an_intermediate_read_elsewhere_is_kept():
    def fn(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True), e

    graph, _args = traced(fn, (3, 5))
    _g, changed, _ = run_pass(graph, "reduction_fusion")
    assert not changed


def _ln_var(x, g, b):
    m = x.mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5) * g + b


def _ln_sq(x, g, b):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) * (x - m)).mean(axis=-1, keepdims=True)
    return g * ((x - m) / np.sqrt(1e-5 + v)) + b


def _ln_pow(x, g, b):
    m = np.mean(x, axis=-1, keepdims=True)
    c = x - m
    return c / np.sqrt(np.mean(c ** 2, axis=-1, keepdims=True) + 1e-6)


def _ln_gamma_only(x, g, b):
    m = np.mean(x, axis=-1, keepdims=True)
    c = x - m
    return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + 1e-5) * g


LN = {"var": (_ln_var, 3), "square": (_ln_sq, 3), "power": (_ln_pow, 1),
      "gamma only": (_ln_gamma_only, 2)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("label", list(LN))
def test_layer_norm_patterns(label, dtype):
    fn, n_inputs = LN[label]
    graph, args = traced(fn, (2, 3, 16), (16,), (16,), dtype=dtype)
    for passes in (["reduction_fusion"], ["canonicalize", "simplify", "cse", "dce",
                                          "reduction_fusion"]):
        g = PassManager(passes).run(graph).graph
        (ln,) = [n for n in g if n.op == "layer_norm"]
        assert len(ln.inputs) == n_inputs, (passes, g.text())
        assert ln.attrs["axis"] == -1
        assert ln.attrs["eps"] == pytest.approx(1e-6 if label == "power" else 1e-5)
        assert g.ops().count("mean") == 0
        assert_same(graph, g, args)


def test_layer_norm_golden():
    graph, args = traced(_ln_sq, (4, 8), (8,), (8,))
    g = PassManager(["cse", "reduction_fusion"]).run(graph).graph
    assert g.text() == """\
graph _ln_sq(%0: f32[4,8] x, %1: f32[8] g, %2: f32[8] b) {
  %3 = layer_norm(%0, %1, %2; axis=-1, eps=9.999999747378752e-06, variance='mean_square') : f32[4,8]
  return %3
}"""
    assert_same(graph, g, args)


def test_layer_norm_not_over_the_last_axis_or_with_a_leak_is_kept():
    def first_axis(x):
        m = x.mean(axis=0, keepdims=True)
        return (x - m) / np.sqrt(x.var(axis=0, keepdims=True) + 1e-5)

    def leak(x):
        m = x.mean(axis=-1, keepdims=True)
        return (x - m) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5), m

    for fn in (first_axis, leak):
        graph, _ = traced(fn, (4, 8))
        g, _, _ = run_pass(graph, "reduction_fusion")
        assert "layer_norm" not in g.ops()


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [0, (0, 2), None])
def test_variance_pattern(axis, keepdims):
    def fn(x):
        return ((x - x.mean(axis=axis, keepdims=True)) ** 2).mean(axis=axis,
                                                                  keepdims=keepdims)

    graph, args = traced(fn, (3, 4, 5), dtype=np.float64)
    g = PassManager(["canonicalize", "reduction_fusion"]).run(graph).graph
    assert [n.op for n in g if n.op != "input"] == ["var"]
    assert_same(graph, g, args)


# -- elementwise fusion --------------------------------------------------------------------------
def test_elementwise_fusion_golden():
    def fn(x, y):
        a = np.tanh(x * 0.5 + y) * np.ones(4, np.float32)
        s = a.sum(axis=-1, keepdims=True)
        return np.exp(a - s)

    graph, args = traced(fn, (3, 4), (4,))
    g, changed, notes = run_pass(graph, "elementwise_fusion")
    assert changed
    assert g.text() == """\
graph fn(%0: f32[3,4] x, %1: f32[4] y) {
  %2 = constant(value=array<f32[4] #f6bb1294>) : f32[4]
  %3 = fused(%0, %1, %2; body=<body c93e57e3>, name='fused_0', ops=('multiply', 'add', \
'tanh', 'multiply')) : f32[3,4]
    | graph fused_0(%0: f32[3,4] in0, %1: f32[4] in1, %2: f32[4] in2) {
    |   %3 = constant(value=0.5) : f32[]
    |   %4 = multiply(%0, %3) : f32[3,4]
    |   %5 = add(%4, %1) : f32[3,4]
    |   %6 = tanh(%5) : f32[3,4]
    |   %7 = multiply(%6, %2) : f32[3,4]
    |   return %7
    | }
  %4 = sum(%3; axis=(1,), keepdims=True) : f32[3,1]
  %5 = fused(%3, %4; body=<body 6ec9f306>, name='fused_1', ops=('subtract', 'exp')) : f32[3,4]
    | graph fused_1(%0: f32[3,4] in0, %1: f32[3,1] in1) {
    |   %2 = subtract(%0, %1) : f32[3,4]
    |   %3 = exp(%2) : f32[3,4]
    |   return %3
    | }
  return %5
}"""
    assert len(notes) == 2
    assert_same(graph, g, args, exact=True)


def test_fused_nodes_are_well_formed():
    def fn(x, y, z):
        a = np.where(x > y, x * 2.0, y) - z
        b = np.abs(a) + 1.0
        return b * a, np.sqrt(b) + 3.0

    graph, args = traced(fn, (4, 5), (4, 5), (5,))
    g, _, _ = run_pass(graph, "elementwise_fusion")
    fused = [n for n in g if n.op == "fused"]
    assert [n.attrs["name"] for n in fused] == [f"fused_{k}" for k in range(len(fused))]
    for n in fused:
        body = n.attrs["body"]
        body.verify()
        assert len(body.outputs) == 1
        assert len(body.inputs) == len(n.inputs) == len(set(n.inputs))
        for k, (outer, inner) in enumerate(zip(n.inputs, body.inputs, strict=True)):
            b = body.nodes[inner]
            assert b.name == f"in{k}" and b.shape == g.nodes[outer].shape
            assert b.dtype == g.nodes[outer].dtype
        for b in body:
            assert b.op in ("input", "constant") or REGISTRY[b.op].kind == "elementwise"
            if b.op == "constant":
                assert b.shape == ()
        assert n.attrs["ops"] == tuple(b.op for b in body if b.op not in ("input",
                                                                           "constant"))
        out = body.nodes[body.outputs[0]]
        assert (out.shape, out.dtype) == (n.shape, n.dtype)
    # a and b are read by two groups each: three fused nodes (a, b, and each output)
    assert len(fused) == 4
    assert not any(REGISTRY[op].kind == "elementwise" for op in g.ops())
    assert_same(graph, g, args, exact=True)


def test_graph_outputs_and_shared_values_end_groups():
    def fn(x):
        a = np.exp(x)
        return a, np.tanh(a) + 1.0

    graph, args = traced(fn, (3,))
    g, _, _ = run_pass(graph, "elementwise_fusion")
    fused = [n for n in g if n.op == "fused"]
    assert [n.attrs["ops"] for n in fused] == [("exp",), ("tanh", "add")]
    assert_same(graph, g, args, exact=True)


def test_lone_ops_fuse_and_numbering_continues():
    graph, _args = traced(lambda x: np.unwrap(np.negative(x)), (6,))
    g, changed, _ = run_pass(graph, "elementwise_fusion")
    assert changed and g.ops().count("fused") == 1
    # add an op after the fused node: a second run numbers it fused_1
    out = g.add("abs", (g.outputs[0],))
    g.outputs = [out.id]
    g2, changed, _ = run_pass(g, "elementwise_fusion")
    names = [n.attrs["name"] for n in g2 if n.op == "fused"]
    assert changed and names == ["fused_0", "fused_1"]
    assert not run_pass(g2, "elementwise_fusion")[1]


def test_memory_first_fuses_alike_and_says_so():
    graph, _args = traced(lambda x: np.tanh(x) * 2.0, (3,))
    a, _, _ = run_pass(graph, "elementwise_fusion")
    b, _, notes = run_pass(graph, "elementwise_fusion", mode="memory_first")
    assert a.text() == b.text()
    assert any("memory_first" in n for n in notes)


def test_non_elementwise_ops_are_not_fused():
    graph, _args = traced(lambda x, w: (x @ w).sum(axis=0).reshape(1, 4), (2, 3), (3, 4))
    g, changed, _ = run_pass(graph, "elementwise_fusion")
    assert not changed and g.text() == graph.text()


def test_explain_says_why_a_reduction_stays_its_own_kernel():
    """Reductions left between elementwise work are named in the notes with the reason
    (what does fuse is row fusion's, tests/compiler/test_row_fusion.py)."""
    import pyc_lab as pl

    x = np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32) + 0.1

    def int_rows(v):
        return (v * 2).sum(axis=-1) + 1

    def products(x):
        return (x * 2).prod(axis=-1) + 1

    xi = (x * 10).astype(np.int32)
    g = pl.compile(int_rows)
    g(xi)
    (note,) = [n for n in g.explain(xi).notes if "stays its own kernel" in n]
    assert "integer reductions" in note
    h = pl.compile(products)
    h(x)
    (note,) = [n for n in h.explain(x).notes if "stays its own kernel" in n]
    assert "prod is not one of a row program's reductions" in note
    plain = pl.compile(lambda v: v.sum(axis=-1))
    plain(x)
    assert not any("stays its own kernel" in n for n in plain.explain(x).notes)
