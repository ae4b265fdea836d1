"""The tracer: operators, ufuncs, array functions, methods, graph breaks, golden IR text."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab.compiler as plc
from pyc_lab.compiler import ShapeError, TraceError, trace
from pyc_lab.compiler.ops import run_graph


@pytest.fixture
def rng():
    return np.random.default_rng()


def check(fn, *args, rtol=1e-12):
    graph, breaks = trace(fn, args)
    graph.verify()
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    outs = run_graph(graph, arrays, np)
    ref = fn(*args)
    refs = ref if isinstance(ref, tuple) else (ref,)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs, strict=True):
        assert o.shape == np.shape(r) and o.dtype == np.asarray(r).dtype
        np.testing.assert_allclose(o, r, rtol=rtol)
    return graph, breaks


def test_golden_text_of_a_small_mlp():
    def mlp(x, w, b):
        return np.tanh(x @ w + b) * 0.5

    x = np.ones((4, 8), np.float32)
    w = np.ones((8, 16), np.float32)
    b = np.ones(16, np.float32)
    graph, breaks = trace(mlp, (x, w, b))
    assert breaks == []
    assert graph.text() == (
        "graph mlp(%0: f32[4,8] x, %1: f32[8,16] w, %2: f32[16] b) {\n"
        "  %3 = matmul(%0, %1) : f32[4,16]\n"
        "  %4 = add(%3, %2) : f32[4,16]\n"
        "  %5 = tanh(%4) : f32[4,16]\n"
        "  %6 = constant(value=0.5) : f32[]\n"
        "  %7 = multiply(%5, %6) : f32[4,16]\n"
        "  return %7\n"
        "}"
    )
    assert len(graph.fingerprint()) == 64
    again, _ = trace(mlp, (x + 1, w, b))  # same signature, other values: same graph
    assert again.fingerprint() == graph.fingerprint()


def test_operators_and_reverse_operators(rng):
    a, b = rng.uniform(1, 2, (3, 4)), rng.uniform(1, 2, (4,))
    check(lambda a, b: (a + b, 1 - a, a * 2.5, 3 / a, a ** 2, 2 ** b, -a, abs(a - 1.5),
                        a / b, a @ b), a, b)
    check(lambda a, b: (a < b, a >= 1.5, a == a, a != b), a, b)


def test_ufuncs_and_array_functions(rng):
    x = rng.uniform(0.5, 2.0, (5, 6))
    check(lambda x: (np.exp(x), np.log(x), np.sqrt(x), np.tanh(x), np.maximum(x, 1.0),
                     np.minimum(1.0, x), np.abs(x), np.square(x), np.clip(x, 0.7, 1.5)), x)
    check(lambda x: (np.sum(x), np.mean(x, axis=0), np.max(x, axis=1, keepdims=True),
                     np.min(x), np.var(x, axis=-1), np.amax(x)), x)
    check(lambda x: (np.where(x > 1, x, 0.0), np.reshape(x, (3, 10)), np.transpose(x),
                     np.swapaxes(x, 0, 1), np.expand_dims(x, 0), np.concatenate([x, x], 1),
                     np.broadcast_to(x[0], (2, 6)), np.dot(x, x.T)), x)


def test_methods_and_slicing(rng):
    x = rng.standard_normal((4, 6, 2))
    check(lambda x: (x.sum(axis=1), x.mean(), x.max(axis=(0, 2)), x.min(keepdims=True),
                     x.reshape(8, 6), x.reshape((-1,)), x.transpose(2, 0, 1), x.T,
                     x.astype(np.float32), x[1:3, ::2], x[..., 0], x[None, 0],
                     x[:, 1:2].squeeze(1)), x)


def test_static_arguments_are_baked_in(rng):
    x = rng.standard_normal((3, 4))
    graph, _ = check(lambda x, axis, scale: x.sum(axis=axis) * scale, x, 1, 2.0)
    assert "axis=(1,)" in graph.text()
    assert len(graph.inputs) == 1


def test_python_scalars_follow_nep50(rng):
    x32 = rng.standard_normal(8).astype(np.float32)
    xi = rng.integers(0, 9, 8).astype(np.int32)
    graph, _ = check(lambda x: x * 0.5 + 1, x32)
    assert all(n.dtype == np.float32 for n in graph)
    graph, _ = check(lambda x: x * 2, xi)
    assert graph.nodes[graph.outputs[0]].dtype == np.int32
    check(lambda x: x * 0.5, xi)  # int32 * python float -> float64


def test_captured_numpy_arrays_become_constants(rng):
    w = rng.standard_normal((4, 4))
    x = rng.standard_normal((2, 4))
    graph, _ = check(lambda x: x @ w, x)
    assert "constant(value=array<f64[4, 4]" in graph.text()


def test_pyc_lab_functions_are_single_nodes(rng):
    x = rng.standard_normal((3, 7))
    g, b = rng.standard_normal(7), rng.standard_normal(7)
    graph, _ = check(lambda x, g, b: (plc.softmax(x), plc.layer_norm(x, g, b),
                                      plc.gelu(x), plc.relu(x), plc.silu(x), plc.sigmoid(x)),
                     x, g, b)
    assert [n.op for n in graph if n.op != "input"] == [
        "softmax", "layer_norm", "gelu", "relu", "silu", "sigmoid"]


def test_unsupported_functions_are_graph_breaks_and_stay_correct(rng):
    x = rng.standard_normal((4, 5))
    graph, breaks = check(lambda x: np.unwrap(np.tanh(x), axis=1) + np.partition(x, 2, 0), x)
    assert [b["op"] for b in breaks] == ["np.unwrap", "np.partition"]
    assert all("no op in pyc_lab's registry" in b["reason"] for b in breaks)
    assert graph.ops().count("eager") == 2


def test_advanced_indexing_is_a_gather_or_a_graph_break(rng):
    x = rng.standard_normal((6, 3))
    idx, jdx = np.array([4, 0, 2]), np.array([1, 1, 0])
    graph, breaks = check(lambda x: x[idx] * 2, x)  # one integer array: a gather op
    assert not breaks and [n.op for n in graph if n.op == "gather"] == ["gather"]
    graph, breaks = check(lambda x: x[idx, jdx] * 2, x)  # constant positions: a gather
    assert not breaks and [n.op for n in graph if n.op == "gather"] == ["gather"]
    _, breaks = check(lambda x: x[x > 0] * 2, x)  # a shape only the values tell
    assert breaks[0]["reason"] == "advanced (array) indexing"


def test_data_dependent_control_flow_is_refused(rng):
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(TraceError, match="control flow depends on array values"):
        trace(f, (rng.standard_normal(3),))
    with pytest.raises(TraceError, match="float"):
        trace(lambda x: float(x.sum()), (rng.standard_normal(3),))


def test_shape_mismatch_is_a_shape_error(rng):
    with pytest.raises(ShapeError, match=r"matmul: .*inner dimensions differ"):
        trace(lambda a, b: a @ b, (rng.standard_normal((3, 4)), rng.standard_normal((5, 6))))


def test_returning_none_is_refused(rng):
    with pytest.raises(TraceError, match="returned None"):
        trace(lambda x: None, (rng.standard_normal(3),))
