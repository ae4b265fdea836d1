"""Random ONNX programs, imported both ways round, against onnxruntime.

Hypothesis writes chains of the ops a model is made of — activations, constants added or
multiplied at every broadcast a model uses (a scalar, the last axis, a channel, the whole
sample), residual sums and concatenations of a value with a function of itself, softmax
and layer norms over any axis, reductions, transposes that keep the batch axis, flattens,
Gemm/MatMul in either weight order, convolutions (strides, pads, dilations, groups),
batch and instance norms, pooling — over 2-D to 4-D inputs of odd sizes, and checks what
``pl.inference.load`` computes (the NumPy backend, imported channels first and channels
last: the layout rewrite is where a silent error would hide) against onnxruntime's CPU
provider (or ``onnx.reference`` where onnxruntime rounds worse) on fresh random inputs.

``HYPOTHESIS_PROFILE=nightly`` draws many more random programs (derandomized, few, by
default: a red CI is a change's doing).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from pyc_lab.inference.model import load  # noqa: E402

OPSET = 20
_NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
_SETTINGS = settings(max_examples=1500 if _NIGHTLY else 150, derandomize=not _NIGHTLY,
                     deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                           HealthCheck.data_too_large])
_UNARY = ["Relu", "Sigmoid", "Tanh", "Gelu", "LeakyRelu", "Abs", "Neg", "Softplus", "Elu",
          "HardSigmoid", "HardSwish", "Erf"]


class _Program:
    """A graph under construction: its nodes, constants and the current value's shape."""

    def __init__(self, shape: tuple[int, ...], seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: dict[str, np.ndarray] = {}
        self.value, self.shape = "x", shape
        self.shapes: dict[str, tuple[int, ...]] = {}  # every value a node made
        self.inputs: dict[str, tuple[int, ...]] = {"x": shape}  # the graph's inputs
        self.extra: list[str] = []  # intermediates returned beside the result

    def const(self, array: Any, dtype: Any = np.float32) -> str:
        name = f"c{len(self.inits)}"
        self.inits[name] = np.asarray(array, dtype)
        return name

    def weights(self, *shape: int, fan_in: int) -> str:
        return self.const(self.rng.standard_normal(shape) / np.sqrt(max(fan_in, 1)))

    def add(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs: Any) -> str:
        out = f"v{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n{len(self.nodes)}",
                                           **attrs))
        self.value, self.shape = out, shape
        self.shapes[out] = shape
        return out

    @property
    def outputs(self) -> list[str]:
        """The graph's outputs: the result, then the intermediates returned beside it."""
        return [self.value, *(e for e in self.extra if e != self.value)]

    def model(self) -> Any:
        graph = helper.make_graph(
            self.nodes, "fuzz",
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, ["N", *v[1:]])
             for k, v in self.inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N", *self.shapes[o][1:]])
             for o in self.outputs],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 9
        return m


def _out(size: int, k: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


def _step(draw: Any, p: _Program) -> None:
    """One more op on the current value, chosen among those its shape takes."""
    s, r = p.shape, len(p.shape)
    kinds = ["unary", "binary", "residual", "concat", "softmax", "layernorm", "reduce",
             "transpose", "flatten", "slice", "pad", "split", "where", "clip", "pow",
             "input"]
    if r <= 3 and s[-1] % 2 == 0:
        kinds.append("reshape")
    if r == 2:
        kinds += ["gemm", "matmul", "batchnorm"]
    else:
        # convolutions and pools weigh more: the channels-last rewrite is about them
        kinds += ["conv"] * 4 + ["pool"] * 2 + ["batchnorm", "global_pool", "instancenorm"]
    kind = kinds[int(p.rng.integers(len(kinds)))]  # uniform: hypothesis favours the first
    v = p.value
    if kind == "unary":
        op = draw(st.sampled_from(_UNARY))
        attrs = {"alpha": draw(st.sampled_from([0.01, 0.2]))} if op == "LeakyRelu" else {}
        if op == "Gelu" and draw(st.booleans()):
            attrs = {"approximate": "tanh"}
        p.add(op, [v], s, **attrs)
    elif kind in ("binary", "residual"):
        ops = ["Add", "Sub", "Mul", "Max", "Min"] + (["Div"] if kind == "binary" else [])
        op = draw(st.sampled_from(ops))
        if kind == "residual":  # (no division by a relu: 0 / 0 is NaN, and a max pool
            # of NaN is NaN here, as NumPy and torch have it, where onnxruntime skips it)
            other = p.add(draw(st.sampled_from(_UNARY[:4])), [v], s)
        else:
            form = draw(st.sampled_from(["scalar", "last", "channel", "sample"]))
            shape = {"scalar": (), "last": (s[-1],), "sample": s[1:],
                     "channel": (s[1],) + (1,) * (r - 2)}[form]
            c = p.rng.standard_normal(shape)
            if op == "Div":  # away from zero: a quotient of a few units
                c = np.sign(c + 1e-3) * (np.abs(c) + 0.5)
            other = p.const(c)
        ins = [v, other] if draw(st.booleans()) or op == "Div" else [other, v]
        p.add(op, ins, s)
    elif kind == "concat":
        axis = draw(st.integers(1, r - 1))
        other = p.add(draw(st.sampled_from(_UNARY[:4])), [v], s)
        p.add("Concat", [v, other], (*s[:axis], 2 * s[axis], *s[axis + 1:]), axis=axis)
    elif kind == "softmax":
        op = draw(st.sampled_from(["Softmax", "LogSoftmax"]))
        p.add(op, [v], s, axis=draw(st.sampled_from([-1, *range(1, r)])))
    elif kind == "layernorm":
        axis = draw(st.integers(1, r - 1))
        if int(np.prod(s[axis:])) == 1:  # as an instance norm of one value
            return
        ins = [v, p.const(1 + 0.1 * p.rng.standard_normal(s[axis:]))]
        if draw(st.booleans()):
            ins.append(p.const(0.1 * p.rng.standard_normal(s[axis:])))
        p.add("LayerNormalization", ins, s, axis=axis, epsilon=1e-5)
    elif kind == "reduce":
        op = draw(st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                                   "ReduceL2", "ReduceSumSquare"]))
        axes = sorted(draw(st.sets(st.integers(1, r - 1), min_size=1, max_size=r - 1)))
        keep = 1 if r - len(axes) < 2 else draw(st.sampled_from([0, 1]))
        shape = tuple(1 if i in axes else d for i, d in enumerate(s)) if keep else \
            tuple(d for i, d in enumerate(s) if i not in axes)
        p.add(op, [v, p.const(axes, np.int64)], shape, keepdims=keep)
    elif kind == "transpose":
        rest = list(draw(st.permutations(list(range(1, r)))))
        p.add("Transpose", [v], (s[0], *(s[i] for i in rest)), perm=[0, *rest])
    elif kind == "flatten":
        p.add("Flatten", [v], (s[0], int(np.prod(s[1:]))), axis=1)
    elif kind in ("gemm", "matmul"):
        k, n = s[1], draw(st.integers(1, 9))
        if kind == "matmul":
            p.add("MatMul", [v, p.weights(k, n, fan_in=k)], (s[0], n))
        else:
            trans = draw(st.booleans())
            w = p.weights(*((n, k) if trans else (k, n)), fan_in=k)
            ins = [v, w] + ([p.const(p.rng.standard_normal(n))] if draw(st.booleans()) else [])
            p.add("Gemm", ins, (s[0], n), transB=int(trans),
                  alpha=draw(st.sampled_from([1.0, 0.5])))
    elif kind == "batchnorm":
        c = s[1]
        p.add("BatchNormalization",
              [v, p.const(1 + 0.2 * p.rng.standard_normal(c)),
               p.const(0.1 * p.rng.standard_normal(c)), p.const(0.1 * p.rng.standard_normal(c)),
               p.const(0.5 + p.rng.uniform(0, 1, c))], s, epsilon=1e-5)
    elif kind == "instancenorm":
        c = s[1]
        if int(np.prod(s[2:])) == 1:  # a norm of one value: x - mean is 0, and any
            return  # rounding of the mean is scaled up by 1 / sqrt(eps) (onnxruntime's is)
        p.add("InstanceNormalization", [v, p.const(1 + 0.1 * p.rng.standard_normal(c)),
                                        p.const(0.1 * p.rng.standard_normal(c))], s,
              epsilon=1e-5)
    elif kind == "conv":
        c, spatial = s[1], s[2:]
        group = draw(st.sampled_from([g for g in (1, 2, 3) if c % g == 0]))
        out_c = group * draw(st.integers(1, 4))
        ks = [draw(st.integers(1, min(3, d))) for d in spatial]
        strides = [draw(st.integers(1, 2)) for _ in spatial]
        dil = [draw(st.integers(1, 2)) if d >= 2 * k - 1 else 1 for d, k in zip(spatial, ks,
                                                                               strict=True)]
        pads = [draw(st.integers(0, k - 1)) for k in ks]
        out = tuple(_out(d, k, st_, pd, dl) for d, k, st_, pd, dl in
                    zip(spatial, ks, strides, pads, dil, strict=True))
        if min(out) < 1:
            return
        ins = [v, p.weights(out_c, c // group, *ks, fan_in=c // group * int(np.prod(ks)))]
        if draw(st.booleans()):
            ins.append(p.const(0.1 * p.rng.standard_normal(out_c)))
        p.add("Conv", ins, (s[0], out_c, *out), kernel_shape=ks, strides=strides,
              dilations=dil, pads=pads + pads, group=group)
    elif kind == "pool":
        spatial = s[2:]
        op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
        ks = [draw(st.integers(1, min(3, d))) for d in spatial]
        strides = [draw(st.integers(1, 2)) for _ in spatial]
        pads = [draw(st.integers(0, k - 1)) for k in ks]
        out = tuple(_out(d, k, st_, pd, 1) for d, k, st_, pd in
                    zip(spatial, ks, strides, pads, strict=True))
        attrs: dict[str, Any] = {}
        if op == "AveragePool":
            attrs["count_include_pad"] = int(draw(st.booleans()))
        p.add(op, [v], (*s[:2], *out), kernel_shape=ks, strides=strides, pads=pads + pads,
              **attrs)
    elif kind == "global_pool":
        p.add("GlobalAveragePool", [v], (*s[:2], *(1,) * (r - 2)))
    elif kind == "slice":
        axis = draw(st.integers(1, r - 1))
        d = s[axis]
        start = draw(st.integers(0, d - 1))
        end = draw(st.integers(start + 1, d))
        step = draw(st.integers(1, 2))
        i64 = np.int64
        p.add("Slice", [v, p.const([start], i64), p.const([end], i64), p.const([axis], i64),
                        p.const([step], i64)],
              (*s[:axis], -(-(end - start) // step), *s[axis + 1:]))
    elif kind == "pad":
        mode = draw(st.sampled_from(["constant", "edge", "reflect"]))
        before = [0] + [draw(st.integers(0, 2 if mode != "reflect" else min(2, d - 1)))
                        for d in s[1:]]
        after = [0] + [draw(st.integers(0, 2 if mode != "reflect" else min(2, d - 1)))
                       for d in s[1:]]
        ins = [v, p.const(before + after, np.int64)]
        if mode == "constant":
            ins.append(p.const(np.float32(draw(st.sampled_from([0.0, -1.5])))))
        p.add("Pad", ins, tuple(d + b + a for d, b, a in zip(s, before, after, strict=True)),
              mode=mode)
    elif kind == "split":  # two pieces along an axis, put back the other way round
        axis = draw(st.integers(1, r - 1))
        d = s[axis]
        if d < 2:
            return
        k = draw(st.integers(1, d - 1))
        first, second = f"v{len(p.nodes)}a", f"v{len(p.nodes)}b"
        p.nodes.append(helper.make_node("Split", [v, p.const([k, d - k], np.int64)],
                                        [first, second], name=f"n{len(p.nodes)}", axis=axis))
        p.add("Concat", [second, first], s, axis=axis)
    elif kind == "where":
        mask = p.add("Greater", [v, p.const(0.1 * p.rng.standard_normal(s[-1]))], s)
        p.add("Where", [mask, v, p.const(np.float32(-0.5))], s)
    elif kind == "input":  # another input of the model, of this shape or broadcast to it
        form = draw(st.sampled_from(["full", "channel", "last"]))
        shape = {"full": s, "channel": (s[0], s[1], *(1,) * (r - 2)),
                 "last": (s[0], *(1,) * (r - 2), s[-1])}[form]
        name = f"in{len(p.inputs)}"
        p.inputs[name] = shape
        op = draw(st.sampled_from(["Add", "Mul", "Sub"]))
        p.add(op, [v, name] if draw(st.booleans()) else [name, v], s)
    elif kind == "clip":
        lo = float(draw(st.sampled_from([-1.0, -0.25])))
        p.add("Clip", [v, p.const(np.float32(lo)), p.const(np.float32(lo + 1.5))], s)
    elif kind == "pow":
        p.add("Pow", [v, p.const(np.float32(draw(st.sampled_from([2.0, 3.0]))))], s)
    elif kind == "reshape":  # the last axis as two
        p.add("Reshape", [v, p.const([0] * (r - 1) + [2, -1], np.int64)],
              (*s[:-1], 2, s[-1] // 2))


@st.composite
def programs(draw: Any) -> _Program:
    rank = draw(st.sampled_from([2, 3, 4]))
    n = draw(st.integers(1, 3))
    dims = {2: [(1, 11)], 3: [(1, 6), (2, 13)], 4: [(1, 5), (2, 9), (2, 9)]}[rank]
    shape = (n, *(draw(st.integers(lo, hi)) for lo, hi in dims))
    p = _Program(shape, draw(st.integers(0, 2**16)))
    for _ in range(draw(st.integers(1, 6))):
        if int(np.prod(p.shape)) > 20000:  # concatenations double it: keep programs small
            break
        _step(draw, p)
    masks = {n.output[0] for n in p.nodes if n.op_type == "Greater"}  # bool, not float
    made = [v for v in p.shapes if v not in masks]
    if len(made) > 1 and draw(st.booleans()):  # an intermediate or two returned as well
        p.extra = sorted(draw(st.sets(st.sampled_from(made), min_size=1, max_size=2)))
    return p


def _off(got: np.ndarray, want: np.ndarray, atol: float) -> np.ndarray:
    """Where ``got`` is neither equal to ``want`` (infinities, NaN where NaN) nor within
    ``atol`` of it."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):
        return ~(same | (np.abs(got.astype(np.float64) - want) <= atol))


def _reference(m: Any, feeds: dict[str, np.ndarray], index: int) -> np.ndarray | None:
    """``onnx.reference``'s output ``index``, or None where it cannot compute one (its
    pooling fails on some padded windows that onnxruntime takes)."""
    try:
        return ReferenceEvaluator(m).run(None, feeds)[index]
    except (ValueError, IndexError):
        return None


def _run(m: Any, backend: str, layout: str,
         feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of ``m`` loaded on ``backend``, by name; on the GPU the second call's
    (the first traces and races; later ones replay the program's CUDA graphs)."""
    model = load(m, backend=backend, layout=layout)
    if backend == "numpy":
        return model(feeds)
    import cupy as cp

    dev = {k: cp.asarray(v) for k, v in feeds.items()}
    model(dev)
    return {k: cp.asnumpy(v) for k, v in model(dev).items()}


def _check(p: _Program, backend: str, rtol: float) -> None:
    """``p`` imported both ways round on ``backend`` against onnxruntime's CPU provider,
    within ``rtol`` of the output's largest finite magnitude."""
    m = p.model()
    onnx.checker.check_model(m)
    rng = np.random.default_rng(len(p.nodes))
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in p.inputs.items()}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    wants = dict(zip(p.outputs, sess.run(None, feeds), strict=True))
    for layout in ("channels_first", "channels_last"):
        gots = _run(m, backend, layout, feeds)
        for name, want in wants.items():
            assert want.shape == p.shapes[name], "the test's own shape bookkeeping"
            got = gots[name]
            assert got.shape == want.shape and got.dtype == want.dtype, (layout, name)
            finite = np.abs(want[np.isfinite(want)])
            scale = max(float(finite.max()) if finite.size else 0.0, 1e-3)
            # close to onnxruntime, or to onnx.reference where onnxruntime rounds worse
            bad = _off(got, want, rtol * scale)
            if bad.any():
                ref = _reference(m, feeds, p.outputs.index(name))
                bad &= _off(got, ref, rtol * scale) if ref is not None else bad
            assert not bad.any(), (
                f"{layout}, output {name} of {p.outputs}: "
                f"{[(n.op_type, n.output[0]) for n in m.graph.node]}: {int(bad.sum())} of "
                f"{bad.size} values off; e.g. {got[bad][:3]} against {want[bad][:3]}")


@_SETTINGS
@given(programs())
def test_random_programs_match_onnxruntime_both_layouts(p):
    if p.nodes:
        _check(p, "numpy", 5e-5)


@pytest.mark.gpu
@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_random_programs_match_onnxruntime_on_the_gpu(p):
    """The same programs on the CuPy backend (generated kernels, the library and direct
    convolutions, CUDA graphs replayed), both layouts, against onnxruntime's CPU."""
    if p.nodes:
        _check(p, "cupy", 1e-4)  # sums in another order than the CPU's
