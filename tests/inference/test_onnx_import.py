"""Every supported ONNX op, imported and compiled, against onnxruntime and onnx.reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from pyc_lab.inference.errors import ModelImportError, UnsupportedOpError  # noqa: E402
from pyc_lab.inference.model import load  # noqa: E402
from pyc_lab.inference.onnx_import import SUPPORTED_OPS, import_onnx  # noqa: E402

OPSET = 20
RNG = np.random.default_rng(1234)


def _w(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes: list[Any], inputs: dict[str, tuple[int, ...]], outputs: list[str],
           inits: dict[str, np.ndarray] | None = None, opset: int = OPSET) -> Any:
    def make(out_shapes: list[Any]) -> Any:
        graph = helper.make_graph(
            nodes, "case",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", *s[1:]])
             for n, s in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, s)
             for o, s in zip(outputs, out_shapes, strict=True)],
            [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 9
        return m

    # the outputs' shapes (axis 0 free) from the reference evaluator
    probe = ReferenceEvaluator(make([None] * len(outputs))).run(None, _inputs(inputs))
    return make([["N", *np.shape(p)[1:]] for p in probe])


def node(op: str, ins: list[str], out: str = "y", **attrs: Any) -> Any:
    return helper.make_node(op, ins, [out], name=f"{op.lower()}_node", **attrs)


# (id, nodes, input shapes, initializers)
CASES: list[tuple[str, list[Any], dict[str, tuple[int, ...]], dict[str, np.ndarray]]] = [
    ("Gemm", [node("Gemm", ["x", "W", "C"], transB=1, alpha=0.5, beta=2.0)], {"x": (5, 7)},
     {"W": _w(3, 7), "C": _w(3)}),
    ("Gemm-transA", [node("Gemm", ["x", "W"], transA=1)], {"x": (5, 7)}, {"W": _w(5, 4)}),
    ("MatMul", [node("MatMul", ["x", "W"])], {"x": (5, 7)}, {"W": _w(7, 3)}),
    ("MatMul-batched", [node("MatMul", ["x", "W"])], {"x": (2, 5, 7)}, {"W": _w(7, 3)}),
    ("Conv1d", [node("Conv", ["x", "W", "B"], kernel_shape=[3], pads=[1, 1])],
     {"x": (3, 4, 10)}, {"W": _w(6, 4, 3), "B": _w(6)}),
    ("Conv1d-stride-dilation", [node("Conv", ["x", "W"], strides=[2], dilations=[2],
                                     pads=[2, 1])], {"x": (2, 3, 11)}, {"W": _w(5, 3, 3)}),
    ("Conv2d", [node("Conv", ["x", "W", "B"], pads=[1, 0, 1, 2], strides=[2, 1])],
     {"x": (2, 3, 7, 6)}, {"W": _w(4, 3, 3, 2), "B": _w(4)}),
    ("Conv2d-group", [node("Conv", ["x", "W", "B"], group=2, pads=[1, 1, 1, 1])],
     {"x": (2, 4, 5, 5)}, {"W": _w(6, 2, 3, 3), "B": _w(6)}),
    ("BatchNormalization", [node("Relu", ["x"], "r"),
                            node("BatchNormalization", ["r", "g", "b", "m", "v"])],
     {"x": (3, 4, 5, 2)},
     {"g": _w(4), "b": _w(4), "m": _w(4), "v": np.abs(_w(4)) + 0.5}),
    ("Relu", [node("Relu", ["x"])], {"x": (4, 9)}, {}),
    ("Gelu", [node("Gelu", ["x"])], {"x": (4, 9)}, {}),
    ("Gelu-tanh", [node("Gelu", ["x"], approximate="tanh")], {"x": (4, 9)}, {}),
    ("Sigmoid", [node("Sigmoid", ["x"])], {"x": (4, 9)}, {}),
    ("Tanh", [node("Tanh", ["x"])], {"x": (4, 9)}, {}),
    ("Softmax", [node("Softmax", ["x"])], {"x": (4, 9)}, {}),
    ("Softmax-axis1", [node("Softmax", ["x"], axis=1)], {"x": (2, 5, 3)}, {}),
    ("LayerNormalization", [node("LayerNormalization", ["x", "g", "b"], epsilon=1e-5)],
     {"x": (4, 16)}, {"g": _w(16), "b": _w(16)}),
    ("LayerNormalization-axis1", [node("LayerNormalization", ["x", "g"], axis=1)],
     {"x": (2, 3, 5)}, {"g": _w(3, 5)}),
    ("Add", [node("Add", ["x", "c"])], {"x": (4, 6)}, {"c": _w(6)}),
    ("Sub", [node("Sub", ["c", "x"])], {"x": (4, 6)}, {"c": _w(1, 6)}),
    ("Mul", [node("Mul", ["x", "x"])], {"x": (4, 6)}, {}),
    ("Div", [node("Div", ["x", "c"])], {"x": (4, 6)}, {"c": np.abs(_w(6)) + 1}),
    ("Reshape", [node("Reshape", ["x", "s"])], {"x": (3, 4, 6)},
     {"s": np.array([0, -1, 3], np.int64)}),
    ("Flatten", [node("Flatten", ["x"], axis=2)], {"x": (2, 3, 4, 5)}, {}),
    ("Transpose", [node("Transpose", ["x"], perm=[0, 2, 1])], {"x": (2, 3, 4)}, {}),
    ("Concat", [node("Concat", ["x", "x2"], axis=1), ], {"x": (3, 2), "x2": (3, 5)}, {}),
    ("MaxPool2d", [node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2])],
     {"x": (2, 3, 6, 7)}, {}),
    ("MaxPool2d-pads", [node("MaxPool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
     {"x": (2, 3, 6, 5)}, {}),
    ("MaxPool1d-stride", [node("MaxPool", ["x"], kernel_shape=[3], strides=[2])],
     {"x": (2, 3, 9)}, {}),
    ("AveragePool-pads", [node("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
     {"x": (2, 3, 5, 6)}, {}),
    ("AveragePool-include-pad", [node("AveragePool", ["x"], kernel_shape=[3], pads=[1, 1],
                                      strides=[2], count_include_pad=1)],
     {"x": (2, 3, 9)}, {}),
    ("GlobalAveragePool", [node("GlobalAveragePool", ["x"])], {"x": (2, 3, 4, 5)}, {}),
    ("ReduceMean", [node("ReduceMean", ["x", "a"], keepdims=0)], {"x": (3, 4, 5)},
     {"a": np.array([1], np.int64)}),
    ("ReduceSum", [node("ReduceSum", ["x", "a"])], {"x": (3, 4, 5)},
     {"a": np.array([-1], np.int64)}),
    ("Identity", [node("Identity", ["x"])], {"x": (3, 4)}, {}),
    ("Constant", [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        _w(4), "c")), node("Add", ["x", "c"])], {"x": (3, 4)}, {}),
    ("ConstantOfShape", [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                                          value=numpy_helper.from_array(
                                              np.array([0.75], np.float32))),
                         node("Mul", ["x", "c"])], {"x": (3, 4)},
     {"shape": np.array([4], np.int64)}),
    ("PRelu", [node("PRelu", ["x", "s"])], {"x": (2, 4, 3, 5)}, {"s": _w(4, 1, 1)}),
    ("Elu-Selu", [node("Elu", ["x"], "e", alpha=0.7), node("Selu", ["e"])], {"x": (3, 5)}, {}),
    ("Softplus", [node("Mul", ["x", "k"], "b"), node("Softplus", ["b"])], {"x": (3, 5)},
     {"k": np.array(30.0, np.float32)}),
    ("LogSoftmax", [node("LogSoftmax", ["x"], axis=1)], {"x": (3, 5, 2)}, {}),
    ("Pad", [node("Pad", ["x", "p", "v"])], {"x": (2, 3, 4)},
     {"p": np.array([0, 1, 0, 0, 2, 1], np.int64), "v": np.array(0.5, np.float32)}),
    ("Pad-reflect", [node("Pad", ["x", "p"], mode="reflect")], {"x": (2, 4, 5)},
     {"p": np.array([0, 3, 1, 0, 2, 4], np.int64)}),
    ("Pad-edge", [node("Pad", ["x", "p"], mode="edge")], {"x": (2, 4, 5)},
     {"p": np.array([0, 3, 1, 0, 2, 4], np.int64)}),
    ("Pad-wrap", [node("Pad", ["x", "p"], mode="wrap")], {"x": (2, 4, 5)},
     {"p": np.array([0, 6, 1, 0, 2, 7], np.int64)}),
    ("Slice", [node("Slice", ["x", "st", "en", "ax", "sp"])], {"x": (2, 6, 7)},
     {"st": np.array([1, -1], np.int64), "en": np.array([5, -8], np.int64),
      "ax": np.array([1, 2], np.int64), "sp": np.array([2, -2], np.int64)}),
    ("Split", [helper.make_node("Split", ["x", "sz"], ["a", "b"], axis=1, name="split_node"),
               node("Sub", ["a", "b"])], {"x": (3, 6)}, {"sz": np.array([3, 3], np.int64)}),
    ("Exp-Sqrt-Abs", [node("Exp", ["x"], "e"), node("Abs", ["x"], "a"),
                      node("Sqrt", ["a"], "s"), node("Add", ["e", "s"])], {"x": (3, 4)}, {}),
    ("Erf", [node("Erf", ["x"])], {"x": (5, 7)}, {}),
    ("LeakyRelu", [node("LeakyRelu", ["x"], alpha=0.2)], {"x": (5, 7)}, {}),
    ("Clip", [node("Clip", ["x", "lo", "hi"])], {"x": (5, 7)},
     {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}),
    ("Squeeze-Unsqueeze", [node("Unsqueeze", ["x", "a"], "u"), node("Squeeze", ["u", "a"])],
     {"x": (3, 4)}, {"a": np.array([1], np.int64)}),
    ("Pow", [node("Abs", ["x"], "a"), node("Pow", ["a", "p"])], {"x": (3, 4)},
     {"p": np.array(1.5, np.float32)}),
    ("Softsign-HardSigmoid-HardSwish-Mish",
     [node("Softsign", ["x"], "a"), node("HardSigmoid", ["x"], "b", alpha=0.3, beta=0.4),
      node("HardSwish", ["x"], "c"), node("Mish", ["x"], "d"), node("Sum", ["a", "b", "c", "d"])],
     {"x": (5, 7)}, {}),
    ("Trigonometric", [node("Sin", ["x"], "a"), node("Cos", ["x"], "b"), node("Tan", ["x"], "c"),
                       node("Tanh", ["x"], "t"), node("Asin", ["t"], "d"),
                       node("Acos", ["t"], "e"), node("Atan", ["x"], "f"),
                       node("Sum", ["a", "b", "c", "d", "e", "f"])], {"x": (5, 7)}, {}),
    ("Hyperbolic", [node("Sinh", ["x"], "a"), node("Cosh", ["x"], "b"),
                    node("Asinh", ["x"], "c"), node("Abs", ["x"], "m"),
                    node("Add", ["m", "one"], "n"), node("Acosh", ["n"], "d"),
                    node("Tanh", ["x"], "t"), node("Mul", ["t", "k"], "u"),
                    node("Atanh", ["u"], "e"), node("Sum", ["a", "b", "c", "d", "e"])],
     {"x": (5, 7)}, {"one": np.array(1.0, np.float32), "k": np.array(0.9, np.float32)}),
    # (onnx.reference's LRN loops over the batch axis where it means the channels: a
    # batch as large as the channel count keeps it right)
    ("LRN", [node("LRN", ["x"], size=3)], {"x": (5, 5, 3, 4)}, {}),
    ("LRN-attributes", [node("LRN", ["x"], size=5, alpha=0.01, beta=0.5, bias=2.0)],
     {"x": (7, 7, 3, 2)}, {}),
    ("InstanceNormalization", [node("InstanceNormalization", ["x", "g", "b"], epsilon=1e-3)],
     {"x": (2, 3, 4, 5)}, {"g": _w(3), "b": _w(3)}),
    ("InstanceNormalization-1d", [node("InstanceNormalization", ["x", "g", "b"])],
     {"x": (2, 4, 7)}, {"g": _w(4), "b": _w(4)}),
    ("Tile", [node("Tile", ["x", "r"])], {"x": (2, 3, 4)}, {"r": np.array([1, 3, 2], np.int64)}),
    ("ConvTranspose2d", [node("ConvTranspose", ["x", "W", "B"], strides=[2, 3],
                              pads=[1, 0, 0, 2], output_padding=[1, 0])],
     {"x": (2, 3, 4, 5)}, {"W": _w(3, 4, 3, 3), "B": _w(4)}),
    ("ConvTranspose1d-dilation", [node("ConvTranspose", ["x", "W"], dilations=[2],
                                       strides=[2], pads=[2, 1])],
     {"x": (2, 4, 6)}, {"W": _w(4, 3, 3)}),
    ("Reductions", [node("ReduceMax", ["x", "a1"], "m"), node("ReduceMin", ["x", "a1"], "n"),
                    node("ReduceL2", ["x", "a1"], "l"), node("ReduceL1", ["x", "a1"], "o"),
                    node("ReduceSumSquare", ["x", "a1"], "q"),
                    node("ReduceLogSumExp", ["x", "a1"], "e"),
                    node("ReduceProd", ["x", "a2"], "p", keepdims=1),
                    node("Sum", ["m", "n", "l", "o", "q", "e"], "t"), node("Mul", ["t", "p"])],
     {"x": (3, 4, 5)}, {"a1": np.array([-1], np.int64), "a2": np.array([1, 2], np.int64)}),
    ("ArgMax-ArgMin", [node("ArgMax", ["x"], "i", axis=1), node("ArgMin", ["x"], "j", axis=1,
                                                                   keepdims=0),
                       node("Cast", ["i"], "fi", to=TensorProto.FLOAT),
                       helper.make_node("Cast", ["j"], ["fj"], name="cast_j",
                                        to=TensorProto.FLOAT),
                       node("Unsqueeze", ["fj", "ax"], "uj"), node("Add", ["fi", "uj"])],
     {"x": (3, 6, 4)}, {"ax": np.array([1], np.int64)}),
    ("Where-comparisons-logic",
     [node("Greater", ["x", "z"], "g"), node("Less", ["x", "h"], "l"),
      node("Equal", ["x", "x"], "e"), node("GreaterOrEqual", ["x", "z"], "ge"),
      node("LessOrEqual", ["x", "h"], "le"), node("And", ["g", "l"], "a"),
      node("Or", ["a", "e"], "o"), node("Xor", ["ge", "le"], "xo"), node("Not", ["xo"], "n"),
      helper.make_node("And", ["o", "n"], ["c"], name="and_2"), node("Where", ["c", "x", "z"])],
     {"x": (4, 5)}, {"z": np.array(0.0, np.float32), "h": np.array(0.5, np.float32)}),
    ("Mean-Expand-Trilu", [node("Mean", ["x", "y2", "x"], "m"), node("Expand", ["m", "s"], "b"),
                           node("Trilu", ["b", "k"], "t", upper=0),
                           helper.make_node("Trilu", ["b"], ["u"], name="trilu_upper"),
                           node("Sub", ["t", "u"])],
     {"x": (1, 5), "y2": (1, 5)}, {"s": np.array([4, 1], np.int64),
                                   "k": np.array(1, np.int64)}),
    ("Einsum", [node("Einsum", ["x", "W"], equation="bij,jk->bik")], {"x": (2, 3, 4)},
     {"W": _w(4, 5)}),
    ("Rounding", [node("Mul", ["x", "k"], "s"), node("Floor", ["s"], "a"),
                  node("Ceil", ["s"], "b"), node("Round", ["s"], "c"), node("Sign", ["s"], "d"),
                  node("Sum", ["a", "b", "c", "d"])], {"x": (5, 7)},
     {"k": np.array(4.0, np.float32)}),
]


def _inputs(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _close(a: np.ndarray, b: np.ndarray, rtol: float = 2e-5) -> None:
    scale = max(float(np.max(np.abs(b))), 1e-6)
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_onnxruntime_and_reference(case):
    ort = pytest.importorskip("onnxruntime")
    _, nodes, shapes, inits = case
    m = _model(nodes, shapes, ["y"], inits)
    model = load(m)
    assert not model.imported.breaks
    feeds = _inputs(shapes)
    got = model(feeds)["y"]
    ref = ReferenceEvaluator(m).run(None, feeds)[0]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    _close(got, want)
    _close(got, ref)


@pytest.mark.parametrize("dtype", [(TensorProto.INT32, np.int32), (TensorProto.INT64, np.int64),
                                   (TensorProto.FLOAT16, np.float16)],
                         ids=["int32", "int64", "float16"])
def test_reduce_sum_keeps_the_input_dtype(dtype):
    """ONNX's ReduceSum returns its input's type (NumPy would sum int32 into int64)."""
    ort = pytest.importorskip("onnxruntime")
    proto, np_dtype = dtype
    graph = helper.make_graph(
        [node("ReduceSum", ["x", "a"], keepdims=0)], "sum",
        [helper.make_tensor_value_info("x", proto, ["N", 6, 5])],
        [helper.make_tensor_value_info("y", proto, ["N", 5])],
        [numpy_helper.from_array(np.array([1], np.int64), "a")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 9
    rng = np.random.default_rng()
    x = (rng.integers(-1000, 1000, (3, 6, 5)) if np_dtype != np.float16
         else rng.standard_normal((3, 6, 5))).astype(np_dtype)
    got = load(m)({"x": x})["y"]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    assert got.dtype == want.dtype == np_dtype
    if np_dtype == np.float16:  # summed in float16 here, maybe in float32 there
        _close(got.astype(np.float64), want.astype(np.float64), rtol=4e-3)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op, axis, idx_shape", [("Gather", 0, (3, 5)), ("Gather", 1, (4,)),
                                                 ("GatherElements", 1, (6, 3))])
def test_gathers_with_indices_from_the_inputs_match_onnxruntime(op, axis, idx_shape):
    """An embedding lookup (Gather) and GatherElements whose indices are a model input:
    a gather op fused with the work after it, not a graph break."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng()
    table = rng.standard_normal((6, 7)).astype(np.float32)
    idx = rng.integers(-table.shape[axis], table.shape[axis], idx_shape).astype(np.int64)
    want_shape = np.take(table, idx, axis=axis).shape if op == "Gather" \
        else np.take_along_axis(table, idx, axis=axis).shape
    graph = helper.make_graph(
        [node(op, ["w", "i"], "g", axis=axis), node("Mul", ["g", "k"], "y")], "gather",
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, list(table.shape)),
         helper.make_tensor_value_info("i", TensorProto.INT64, list(idx_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(want_shape))],
        [numpy_helper.from_array(np.array(1.5, np.float32), "k")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 9
    model = load(m)
    assert not model.imported.breaks
    feeds = {"w": table, "i": idx}
    got = model(feeds)["y"]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_every_supported_op_is_tested():
    tested = {n.op_type for _, nodes, _, _ in CASES for n in nodes}
    untested = set(SUPPORTED_OPS) - tested - {"Dropout", "Cast", "Shape", "Gather", "Max",
                                              "Min", "Sum", "Log", "Neg", "Reciprocal",
                                              "GatherElements"}
    assert not untested


def test_shape_arithmetic_is_folded_at_trace_time():
    # Flatten written the exporter's way: Shape -> Gather -> Concat -> Reshape
    nodes = [node("Shape", ["x"], "s"), node("Gather", ["s", "i0"], "n", axis=0),
             node("Unsqueeze", ["n", "ax"], "n1"), node("Concat", ["n1", "m1"], "t", axis=0),
             node("Reshape", ["x", "t"], "r"), node("Neg", ["r"], "q"),
             node("Max", ["q", "r"], "mx"), node("Min", ["mx", "r"], "mn"),
             node("Sum", ["mn", "r"], "y")]
    inits = {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64),
             "m1": np.array([-1], np.int64)}
    m = _model(nodes, {"x": (3, 4, 5)}, ["y"], inits)
    feeds = _inputs({"x": (3, 4, 5)})
    _close(load(m)(feeds)["y"], ReferenceEvaluator(m).run(None, feeds)[0])


def test_batch_norm_is_folded_exactly():
    """Folded weights are the float64 products rounded once to float32."""
    W, C = _w(8, 5), _w(8)
    g, b, mu = _w(8), _w(8), _w(8)
    var = np.abs(_w(8)) + 0.3
    nodes = [node("Gemm", ["x", "W", "C"], "h", transB=1),
             node("BatchNormalization", ["h", "g", "b", "m", "v"], epsilon=1e-3)]
    m = _model(nodes, {"x": (6, 5)}, ["y"], {"W": W, "C": C, "g": g, "b": b, "m": mu,
                                            "v": var})
    m.graph.node[1].output[0] = "y"
    imported = import_onnx(m)
    assert any("folded" in n for n in imported.notes)
    assert "BatchNormalization" not in imported.op_counts
    scale = g.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-3)
    shift = b - mu.astype(np.float64) * scale
    w_fold, b_fold = imported.weights[0], imported.weights[1]
    np.testing.assert_array_equal(w_fold, (W.astype(np.float64) * scale[:, None])
                                  .astype(np.float32))
    np.testing.assert_array_equal(b_fold, (C * scale + shift).astype(np.float32))
    # and the output equals the unfolded float64 computation to float32 rounding
    x = _inputs({"x": (6, 5)})["x"]
    exact = (x.astype(np.float64) @ W.T.astype(np.float64) + C) * scale + shift
    got = load(m)(x)
    np.testing.assert_allclose(got, exact, rtol=0,
                               atol=8 * np.finfo(np.float32).eps * np.abs(exact).max())


def test_conv_batch_norm_is_folded():
    ort = pytest.importorskip("onnxruntime")
    nodes = [node("Conv", ["x", "W"], "h", pads=[1, 1]),
             node("BatchNormalization", ["h", "g", "b", "m", "v"])]
    inits = {"W": _w(4, 3, 3), "g": _w(4), "b": _w(4), "m": _w(4), "v": np.abs(_w(4)) + 0.2}
    m = _model(nodes, {"x": (2, 3, 7)}, ["y"], inits)
    m.graph.node[1].output[0] = "y"
    model = load(m)
    assert model.imported.op_counts == {"Conv": 1}
    feeds = _inputs({"x": (2, 3, 7)})
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    _close(model(feeds)["y"], sess.run(None, feeds)[0])


def test_unsupported_op_names_op_and_node():
    m = _model([node("ThresholdedRelu", ["x"])], {"x": (2, 3)}, ["y"])
    with pytest.raises(UnsupportedOpError,
                       match=r"'ThresholdedRelu' \(node 'thresholdedrelu_node'"):
        import_onnx(m, onnxruntime_fallback=False)


def test_unsupported_op_runs_through_onnxruntime_as_a_graph_break():
    pytest.importorskip("onnxruntime")
    m = _model([node("Relu", ["x"], "r"), node("ThresholdedRelu", ["r"], "c", alpha=0.5),
                node("Tanh", ["c"])], {"x": (2, 3)}, ["y"])
    model = load(m)
    assert model.imported.breaks == [("ThresholdedRelu", "thresholdedrelu_node")]
    feeds = _inputs({"x": (2, 3)})
    r = np.maximum(feeds["x"], 0)
    _close(model(feeds)["y"], np.tanh(np.where(r > 0.5, r, 0)))
    text = str(model.explain(batch=2))
    assert "ThresholdedRelu (node 'thresholdedrelu_node')" in text and "onnxruntime" in text
    assert model.explain().compiled.graph_breaks


def test_unsupported_attribute_is_a_clear_error():
    m = _model([node("MaxPool", ["x"], kernel_shape=[2], ceil_mode=1)], {"x": (2, 3, 7)},
               ["y"])
    with pytest.raises(UnsupportedOpError, match="ceil_mode"):
        load(m)(_inputs({"x": (2, 3, 7)}))


def test_bad_model_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ModelImportError, match="no ONNX model"):
        import_onnx(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelImportError):
        import_onnx(tmp_path / "junk.onnx")
    with pytest.raises(ModelImportError, match="cannot import"):
        import_onnx(42)


def test_model_from_path_and_metadata(tmp_path):
    m = _model([node("Gemm", ["x", "W"], transB=1)], {"x": (2, 5)}, ["y"], {"W": _w(3, 5)})
    onnx.save(m, str(tmp_path / "m.onnx"))
    model = load(tmp_path / "m.onnx", name="lin")
    assert model.name == "lin"
    assert [s.describe() for s in model.inputs] == ["x: float32[N, 5]"]
    assert model.inputs[0].to_v2() == {"name": "x", "datatype": "FP32", "shape": [-1, 5]}
    x = _inputs({"x": (2, 5)})["x"]
    _close(model(x), x @ numpy_helper.to_array(m.graph.initializer[0]).T)


def test_function_models_load_with_inputs():
    w = _w(5, 3)

    def mlp(x):
        return np.tanh(x @ w)

    model = load(mlp, inputs={"x": ("float32", (None, 5))})
    x = _inputs({"x": (4, 5)})["x"]
    _close(model(x), np.tanh(x @ w))
    assert model.outputs[0].shape == (None, 3)
    assert "mlp" in str(model.explain())
    with pytest.raises(Exception, match="inputs="):
        load(mlp)
    import pyc_lab as pl

    compiled = pl.compile(mlp)
    again = load(compiled, inputs={"x": ("float32", (None, 5))}, outputs=["h"], name="m2")
    assert again.compiled is compiled and again.output_names == ["h"]
    _close(again(x), np.tanh(x @ w))


CONV_CASES = [c for c in CASES if c[0].startswith("Conv")]


def _conv_ops(model: Any, batch: int = 1) -> list[str]:
    return [op for op in model.explain(batch).compiled.decisions["op"] if op == "conv"]


@pytest.mark.parametrize("route", ["library", "im2col"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_routes_match_onnxruntime(case, route):
    ort = pytest.importorskip("onnxruntime")
    _, nodes, shapes, inits = case
    m = _model(nodes, shapes, ["y"], inits)
    model = load(m, conv=route)
    # "library" is one pl.conv node per Conv; "im2col" leaves none
    assert len(_conv_ops(model)) == (len(nodes) if route == "library" else 0)
    feeds = _inputs(shapes, seed=7)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    _close(model(feeds)["y"], sess.run(None, feeds)[0])
    _close(model(feeds)["y"], ReferenceEvaluator(m).run(None, feeds)[0])


@pytest.mark.parametrize("route", ["library", "im2col"])
def test_grouped_conv_transpose_matches_onnxruntime(route):
    # (onnx.reference's ConvTranspose does not take groups: onnxruntime alone here)
    ort = pytest.importorskip("onnxruntime")
    nodes = [node("ConvTranspose", ["x", "W", "B"], group=2, dilations=[2], strides=[2],
                  pads=[2, 1], output_padding=[1])]
    m = _model_ort(nodes, {"x": (2, 4, 6)}, {"W": _w(4, 3, 3), "B": _w(6)}, ["N", 6, 13])
    feeds = _inputs({"x": (2, 4, 6)}, seed=3)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    got = load(m, conv=route)(feeds)["y"]
    assert got.shape == want.shape == (2, 6, 13)
    _close(got, want)


def _model_ort(nodes: list[Any], inputs: dict[str, tuple[int, ...]],
               inits: dict[str, np.ndarray], out_shape: list[Any]) -> Any:
    """A one-output model of a given output shape (no reference run to find it)."""
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", *s[1:]])
         for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 9
    return m


def test_conv_auto_route_goes_by_size(monkeypatch):
    from pyc_lab.inference import onnx_ops

    nodes = [node("Conv", ["x", "W", "B"], pads=[1, 2], strides=[1])]
    m = _model(nodes, {"x": (2, 4, 9)}, ["y"], {"W": _w(5, 4, 3), "B": _w(5)})
    flops = onnx_ops.conv_flops((2, 4, 9), (5, 4, 3), [1], [1, 2], [1])
    out = (9 + 3 - 3) + 1
    assert flops == 2 * 2 * 5 * 4 * 3 * out
    assert not _conv_ops(load(m), batch=2)  # far below the default threshold: im2col
    monkeypatch.setattr(onnx_ops, "CONV_LIBRARY_FLOPS", flops)
    model = load(m)
    # the size is the traced batch's: batch 2 reaches the threshold, batch 1 does not
    assert _conv_ops(model, batch=2) == ["conv"]
    assert _conv_ops(model, batch=1) == []
    assert any("pl.conv" in n for n in model.explain().notes)
    for batch in (1, 2, 3):
        feeds = _inputs({"x": (batch, 4, 9)}, seed=batch)
        _close(model(feeds)["y"], ReferenceEvaluator(m).run(None, feeds)[0])


def test_conv_auto_route_takes_small_convolutions_the_direct_kernel_may_run(monkeypatch):
    """Where torch is installed (the race runs through it) and the problem's race says a
    CUDA graph would record the direct kernel, ``auto`` gives a small convolution with
    symmetric pads to pl.conv — one conv node — and keeps im2col otherwise (a long
    reduction, unequal pads, float64, no torch, a race the libraries won, no GPU); the
    answers stay the reference's."""
    from pyc_lab.inference import onnx_ops
    from pyc_lab.kernels import arrays
    from pyc_lab.kernels import conv as kconv

    assert not kconv.direct_in_graph((1, 4, 32), (32, 4, 3), "float32", stride=(1,),
                                     padding=(0,), dilation=(1,))  # no GPU here
    raced = []

    def race(x_shape, w_shape, dtype, **kw):
        raced.append((tuple(x_shape), tuple(w_shape), dtype, kw["bias"]))
        return True

    monkeypatch.setattr(kconv, "direct_in_graph", race)
    x = np.zeros((64, 4, 32), np.float32)
    monkeypatch.setattr(arrays, "torch_installed", lambda: False)
    assert not onnx_ops.direct_candidate(x, _w(32, 4, 3), [1], [0, 0], [1])
    monkeypatch.setattr(arrays, "torch_installed", lambda: True)
    assert onnx_ops.direct_candidate(x, _w(32, 4, 3), [1], [1, 1], [1], has_bias=False)
    assert raced == [((64, 4, 32), (32, 4, 3), "float32", False)]
    assert not onnx_ops.direct_candidate(x, _w(32, 4, 3), [1], [0, 1], [1])  # unequal pads
    assert not onnx_ops.direct_candidate(x.astype(np.float64), _w(32, 4, 3), [1], [0, 0], [1])
    wide = np.zeros((1, 64, 8, 8), np.float32)  # a 3x3 over 64 channels: 576 taps
    assert not onnx_ops.direct_candidate(wide, np.zeros((64, 64, 3, 3), np.float32), [1, 1],
                                         [1, 1, 1, 1], [1, 1])
    assert onnx_ops.direct_candidate(wide, np.zeros((64, 16, 3, 3), np.float32), [1, 1],
                                     [1, 1, 1, 1], [1, 1], 4)  # four groups: 144 taps
    assert len(raced) == 2  # the refused ones were not raced
    nodes = [node("Conv", ["x", "W", "B"], "c", pads=[1, 1], strides=[1]),
             node("Relu", ["c"])]
    m = _model(nodes, {"x": (2, 4, 9)}, ["y"], {"W": _w(5, 4, 3), "B": _w(5)})
    model = load(m)
    assert _conv_ops(model, batch=2) == ["conv"]
    for batch in (1, 3):
        feeds = _inputs({"x": (batch, 4, 9)}, seed=batch)
        _close(model(feeds)["y"], ReferenceEvaluator(m).run(None, feeds)[0])
    monkeypatch.setattr(kconv, "direct_in_graph", lambda *a, **k: False)  # a library won
    assert _conv_ops(load(m), batch=2) == []


def test_conv_route_must_be_known():
    m = _model([node("Conv", ["x", "W"])], {"x": (1, 2, 5)}, ["y"], {"W": _w(3, 2, 3)})
    with pytest.raises(ModelImportError, match="conv must be one of"):
        load(m, conv="cudnn")


def _layout_model() -> tuple[Any, dict[str, tuple[int, ...]]]:
    """A small residual CNN whose ops meet every rule of the channels-last import: 2-D
    convolutions (unequal pads, stride, groups, one taking the graph's input, one whose
    output is a graph output), elementwise ops between them (relu, a residual add of two
    channels-last tensors, a scalar multiply, a per-channel bias add), max pooling and a
    global average pool, and ops that need the graph's layout (flatten, the head)."""
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv1", pads=[1, 0, 2, 1],
                         strides=[2, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], name="conv2", pads=[1, 1, 1, 1],
                         group=2),
        helper.make_node("Add", ["c2", "r1"], ["a1"], name="residual"),
        helper.make_node("Mul", ["a1", "half"], ["m1"], name="scale"),
        helper.make_node("Add", ["m1", "chan"], ["b1"], name="channel_bias"),
        helper.make_node("MaxPool", ["b1"], ["p1"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["p1", "W3", "B3"], ["side"], name="conv3"),
        helper.make_node("Sigmoid", ["side"], ["s1"], name="sigmoid"),
        helper.make_node("GlobalAveragePool", ["s1"], ["g1"], name="gap"),
        helper.make_node("Flatten", ["g1"], ["f1"], name="flatten"),
        helper.make_node("Gemm", ["f1", "W4"], ["y"], name="head", transB=1),
    ]
    inits = {"W1": _w(8, 3, 3, 3) / 5, "B1": _w(8), "W2": _w(8, 4, 3, 3) / 6,
             "half": np.array(0.5, np.float32), "chan": _w(1, 8, 1, 1),
             "W3": _w(6, 8, 1, 1) / 3, "B3": _w(6), "W4": _w(5, 6)}
    shapes = {"x": (3, 3, 13, 11)}
    return _model(nodes, shapes, ["y", "side"], inits), shapes


def test_channels_last_import_matches_the_graph_and_onnxruntime():
    """``layout="channels_last"``: every 2-D convolution is a channels-last ``pl.conv``,
    the answers (a graph output taken straight from a convolution included) are the
    graph's, in its layout, as onnxruntime and the reference evaluator compute them."""
    m, shapes = _layout_model()
    last = load(m, layout="channels_last")
    first = load(m)
    assert "layout channels_last" in last.imported.notes[-1]
    _same_answers(m, last, first, _inputs(shapes, seed=11), ("y", "side"))


def _same_answers(m: Any, last: Any, first: Any, feeds: dict[str, np.ndarray],
                  names: tuple[str, ...]) -> None:
    """The channels-last import's outputs are the graph's: the reference evaluator's,
    the channels-first import's and onnxruntime's (where installed)."""
    got, plain = last(feeds), first(feeds)
    ref = ReferenceEvaluator(m).run(None, feeds)
    for name, want in zip(names, ref, strict=True):
        assert got[name].shape == want.shape == plain[name].shape
        _close(got[name], want)
        _close(got[name], plain[name])
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, want in zip(names, sess.run(None, feeds), strict=True):
        _close(got[name], want)


def test_channels_last_import_keeps_the_layout_across_elementwise_ops(monkeypatch):
    """The decisions, op by op: convolutions take channels-last inputs (the graph's
    input transposed once), relu, the residual add of two channels-last tensors, the
    scalar multiply and the per-channel bias add (its ``1, C, 1, 1`` bias transposed)
    stay channels last; the pooling window and the global average pool slide over a
    channels-last input's spatial axes; flatten gets the graph's layout back."""
    from pyc_lab.inference import onnx_layout

    seen: dict[str, str] = {}
    real = onnx_layout.ChannelsLast.arguments

    def spy(self, op, names, env):
        args, how = real(self, op, names, env)
        seen.setdefault(op + ":" + (names[0] if names else ""), how)
        return args, how

    monkeypatch.setattr(onnx_layout.ChannelsLast, "arguments", spy)
    m, shapes = _layout_model()
    load(m, layout="channels_last")(_inputs(shapes))
    assert seen == {"Conv:x": "conv", "Relu:c1": "same", "Conv:r1": "conv", "Add:c2": "same",
                    "Mul:a1": "same", "Add:m1": "same", "MaxPool:b1": "pool",
                    "Conv:p1": "conv", "Sigmoid:side": "same", "GlobalAveragePool:s1": "pool",
                    "Flatten:g1": "first", "Gemm:f1": "first"}


def _pool_model() -> tuple[Any, dict[str, tuple[int, ...]]]:
    """Pooling windows and elementwise ops with graph-layout operands, all on
    channels-last activations: max pooling with unequal pads, stride and dilation,
    average pooling with pads counted and not, a stride unequal per axis and no pads;
    adds of the graph's input (a 4-D activation that never met a convolution), a
    ``C, H, W`` constant, an ``H, W`` constant and a ``1, C, 1, 1`` bias."""
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "x4"], ["a1"], name="add_input"),
        helper.make_node("MaxPool", ["a1"], ["p1"], name="maxpool", kernel_shape=[3, 2],
                         pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2]),
        helper.make_node("Add", ["p1", "chw"], ["a2"], name="add_chw"),
        helper.make_node("AveragePool", ["a2"], ["p2"], name="avg_excl", kernel_shape=[3, 3],
                         pads=[1, 2, 1, 0]),
        helper.make_node("Mul", ["hw", "p2"], ["a3"], name="mul_hw"),
        helper.make_node("AveragePool", ["a3"], ["p3"], name="avg_incl", kernel_shape=[2, 3],
                         pads=[1, 1, 0, 1], count_include_pad=1, strides=[1, 2]),
        helper.make_node("Sub", ["p3", "bias"], ["a4"], name="sub_bias"),
        helper.make_node("AveragePool", ["a4"], ["p4"], name="avg_plain", kernel_shape=[2, 2],
                         strides=[2, 1]),
        helper.make_node("Conv", ["p4", "W2"], ["y"], name="conv2"),
    ]
    # shapes: x, c1 2x4x11x9 -> p1, p2 2x4x6x8 -> p3 2x4x6x4 -> p4 2x4x3x3
    inits = {"W1": _w(4, 4, 3, 3) / 6, "chw": _w(4, 6, 8), "hw": _w(6, 8),
             "bias": _w(1, 4, 1, 1), "W2": _w(3, 4, 1, 1) / 2}
    shapes = {"x": (2, 4, 11, 9), "x4": (2, 4, 11, 9)}
    return _model(nodes, shapes, ["y", "p1"], inits), shapes


def test_channels_last_pooling_and_graph_layout_operands(monkeypatch):
    """Pooling windows run on channels-last activations and elementwise ops take
    graph-layout operands of two to four axes transposed to channels last: the answers
    are the graph's (the reference evaluator's, onnxruntime's, the channels-first
    import's), with no value transposed back to the graph's layout but the outputs."""
    from pyc_lab.inference import onnx_layout

    seen: dict[str, str] = {}
    real = onnx_layout.ChannelsLast.arguments

    def spy(self, op, names, env):
        args, how = real(self, op, names, env)
        seen[op + ":" + names[0]] = how
        return args, how

    monkeypatch.setattr(onnx_layout.ChannelsLast, "arguments", spy)
    m, shapes = _pool_model()
    last, first = load(m, layout="channels_last"), load(m)
    feeds = _inputs(shapes, seed=17)
    last(feeds)
    assert seen == {"Conv:x": "conv", "Add:c1": "same", "MaxPool:a1": "pool",
                    "Add:p1": "same", "AveragePool:a2": "pool", "Mul:hw": "same",
                    "AveragePool:a3": "pool", "Sub:p3": "same", "AveragePool:a4": "pool",
                    "Conv:p4": "conv"}
    _same_answers(m, last, first, feeds, ("y", "p1"))


def test_channels_last_max_pool_keeps_nan_and_infinity():
    """A channels-last max pool's padding never wins a window (``-inf``), and NaN and
    ``±inf`` in the input come out where the graph's layout puts them."""
    m = _model([node("Conv", ["x", "W"], "c"), node("Add", ["c", "s"], "a"),
                node("MaxPool", ["a"], "y", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                     strides=[2, 2])],
               {"x": (2, 3, 7, 6), "s": (2, 3, 7, 6)}, ["y"], {"W": _w(3, 3, 1, 1)})
    feeds = _inputs({"x": (2, 3, 7, 6), "s": (2, 3, 7, 6)}, seed=4)
    s = feeds["s"]
    s -= 50.0  # every window's maximum negative: a zero of padding would win
    s[0, 1, 2, 3] = np.nan
    s[1, 0, 0, 0] = np.inf
    s[1, 2, 6, 5] = -np.inf
    s[0, 2] = -np.inf  # a whole channel: its windows are -inf
    got = load(m, layout="channels_last")(feeds)["y"]
    plain = load(m)(feeds)["y"]  # NaN wins a window, as np.maximum and torch have it
    np.testing.assert_array_equal(np.isnan(got), np.isnan(plain))
    # (the reference evaluator's maximum skips a NaN: compared where none is)
    ref = ReferenceEvaluator(m).run(None, feeds)[0]
    for want in (ref, plain):
        kept = ~np.isnan(got)
        for kind in (np.isposinf, np.isneginf):
            np.testing.assert_array_equal(kind(got[kept]), kind(want[kept]))
        finite = np.isfinite(got)
        _close(got[finite], want[finite])
    assert np.isnan(got[0, 1, 1, 1]) and np.isposinf(got[1, 0, 0, 0])
    assert np.isneginf(got[0, 2]).all() and (got[~np.isnan(got) & (got < np.inf)] < 0).all()


@pytest.mark.parametrize(("elem", "dtype"), [(TensorProto.INT8, np.int8),
                                             (TensorProto.UINT8, np.uint8)])
def test_max_pool_pads_integers_with_their_least_value(elem, dtype):
    """A padded max pool of 8-bit integers (which ONNX allows) pads with the type's
    least value, which never wins a window, as the reference evaluator computes it;
    the extremes of the type included."""
    node_ = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3],
                             pads=[1, 1, 1, 1], strides=[2, 2])
    graph = helper.make_graph([node_], "ints",
                              [helper.make_tensor_value_info("x", elem, ["N", 2, 7, 6])],
                              [helper.make_tensor_value_info("y", elem, ["N", 2, 4, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 9
    info = np.iinfo(dtype)
    x = np.random.default_rng(6).integers(info.min, info.max, (3, 2, 7, 6), endpoint=True)
    x = x.astype(dtype)
    x[0, 0] = info.min  # a whole channel at the least value: padding must not win
    x[1, 1, 0, 0] = info.max
    got = load(m)({"x": x})["y"]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, ReferenceEvaluator(m).run(None, {"x": x})[0])
    assert (got[0, 0] == info.min).all()


def test_channels_last_import_holds_conv_filters_as_the_kernels_read_them():
    """A filter read by 2-D convolutions alone is held ``(O, KH, KW, C)`` by the
    channels-last import (the channels-first import keeps the graph's ``(O, C, KH, KW)``);
    a filter another op reads too keeps the graph's order; the answers are the graph's."""
    m, _ = _layout_model()
    w2 = next(numpy_helper.to_array(t) for t in m.graph.initializer if t.name == "W2")
    last, first = load(m, layout="channels_last"), load(m)
    assert any(w.shape == (8, 3, 3, 4) and w.flags.c_contiguous
               and np.array_equal(w, w2.transpose(0, 2, 3, 1)) for w in last.imported.weights)
    assert any(w.shape == w2.shape and np.array_equal(w, w2) for w in first.imported.weights)
    assert not any(w.shape == (8, 3, 3, 4) for w in first.imported.weights)
    # W read by a Conv and by a Mul: held as the graph has it
    shared = _w(2, 2, 1, 1)
    m2 = _model([node("Conv", ["x", "W"], "y"), node("Mul", ["x", "W"], "z")],
                {"x": (2, 2, 5, 4)}, ["y", "z"], {"W": shared})
    feeds = _inputs({"x": (2, 2, 5, 4)}, seed=3)
    got = load(m2, layout="channels_last")
    assert [w.shape for w in got.imported.weights] == [shared.shape]
    for name, want in zip(("y", "z"), ReferenceEvaluator(m2).run(None, feeds), strict=True):
        _close(got(feeds)[name], want)


def test_load_chooses_channels_last_where_the_model_runs_on_a_gpu(monkeypatch):
    """``load(layout="auto")`` (the default): channels last for the cupy backend and for
    ``backend="auto"`` with a usable GPU, the graph's layout for NumPy and without a
    GPU; ``imported.layout`` says which."""
    from pyc_lab.hardware import device
    from pyc_lab.inference.model import _layout

    assert _layout("auto", "cupy") == "channels_last"
    assert _layout("auto", "numpy") == "channels_first"
    assert _layout("channels_first", "cupy") == "channels_first"
    assert _layout("auto", "cupy", "im2col") == "channels_first"  # asked for in the program
    monkeypatch.setattr(device, "no_gpu_reason", lambda **k: None)
    assert _layout("auto", "auto") == "channels_last"
    monkeypatch.setattr(device, "no_gpu_reason", lambda **k: "no driver")
    assert _layout("auto", "auto") == "channels_first"
    m, shapes = _layout_model()
    model = load(m)
    assert model.imported.layout == "channels_first"
    assert not any("layout" in n for n in model.imported.notes)  # the graph's own
    assert load(m, backend="numpy", layout="channels_last").imported.layout == "channels_last"
    feeds = _inputs(shapes, seed=5)
    _close(model(feeds)["y"], ReferenceEvaluator(m).run(None, feeds)[0])


def test_layout_must_be_known():
    m = _model([node("Conv", ["x", "W"])], {"x": (1, 2, 5, 5)}, ["y"], {"W": _w(3, 2, 3, 3)})
    with pytest.raises(ModelImportError, match="layout must be one of"):
        load(m, layout="nhwc")
    with pytest.raises(ModelImportError, match="layout must be one of"):
        import_onnx(m, layout="auto")  # the import takes a layout, not a choice
    # a 1-D convolution keeps the graph's layout under channels_last
    m1 = _model([node("Conv", ["x", "W"])], {"x": (2, 2, 9)}, ["y"], {"W": _w(3, 2, 3)})
    feeds = _inputs({"x": (2, 2, 9)})
    _close(load(m1, layout="channels_last")(feeds)["y"], ReferenceEvaluator(m1).run(None, feeds)[0])
