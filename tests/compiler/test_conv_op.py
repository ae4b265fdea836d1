"""``pl.conv`` inside ``pl.compile``: one ``conv`` node (compiler/conv_op.py) whose shape
comes from pl.conv's own checks and whose reference is pl.conv, against the eager calls
and the float64 loops of tests/kernels/test_conv.py, on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import Graph, ShapeError, gelu, policy, relu, sigmoid, silu
from pyc_lab.compiler.codegen import supports
from pyc_lab.errors import PycLabError
from tests.kernels.test_conv import _act64, reference


def _conv_nodes(f):
    graph = f._cache[next(iter(f._cache))][0].graph
    return [n for n in graph if n.op == "conv"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("xs", "ws", "kw"), [
    ((2, 3, 17, 15), (8, 3, 3, 3), {"padding": 1}),
    ((2, 4, 19, 14), (6, 2, 3, 2), {"stride": (2, 1), "dilation": (1, 2), "groups": 2}),
    ((3, 4, 33), (5, 4, 3), {"padding": "same"}),
])
def test_a_compiled_conv_block_is_the_eager_one(dtype, xs, ws, kw):
    rng = np.random.default_rng()
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    x.flat[3] = np.nan  # spreads to the outputs whose windows hold it

    def block(x, w, b):
        return np.maximum(pl.conv(x, w, b, **kw), 0) * dtype(2) + dtype(1)

    f = pl.compile(block)
    got = f(x, w, b)
    eager = block(x, w, b)
    assert got.dtype == eager.dtype == dtype and got.shape == eager.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
    np.testing.assert_allclose(got, eager, rtol=1e-6, atol=1e-6)
    pad = kw.get("padding", 0)
    if pad == "same":
        pad = (ws[-1] - 1) // 2
    want = np.maximum(reference(x, w, b, kw.get("stride", 1), pad, kw.get("dilation", 1),
                                kw.get("groups", 1)), 0) * 2 + 1
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    (node,) = _conv_nodes(f)
    nd = len(ws) - 2
    assert len(node.attrs["padding"]) == len(node.attrs["stride"]) == nd  # resolved


def test_channels_last_and_weights_from_the_closure():
    rng = np.random.default_rng()
    w = (rng.standard_normal((6, 3, 5, 5)) / 9).astype(np.float32)  # a constant of f

    def f(x):
        return pl.conv2d(x, w, stride=2, padding=2, layout="channels_last")

    x = rng.standard_normal((2, 20, 18, 3)).astype(np.float32)    # (N, H, W, C)
    got = pl.compile(f)(x)
    want = reference(x.transpose(0, 3, 1, 2), w, stride=2, padding=2).transpose(0, 2, 3, 1)
    assert got.shape == (2, 10, 9, 6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_call_that_does_not_fit_fails_while_tracing_in_pl_convs_words():
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    with pytest.raises(PycLabError, match="groups=3 do not fit"):
        pl.compile(lambda x: pl.conv2d(x, np.ones((4, 1, 3, 3), np.float32), groups=3))(x)
    with pytest.raises(ShapeError, match="share one dtype"):
        pl.compile(lambda x: pl.conv2d(x, np.ones((4, 4, 3, 3), np.float64)))(x)
    with pytest.raises(PycLabError, match="does not fit the input"):
        pl.compile(lambda x: pl.conv2d(x, np.ones((2, 4, 9, 9), np.float32)))(x)


def test_on_the_gpu_backend_it_runs_as_pl_convs_library_call():
    g = Graph(name="g")
    x = g.add("input", shape=(2, 3, 16, 16), dtype=np.float16)
    w = g.add("input", shape=(8, 3, 3, 3), dtype=np.float16)
    node = g.add("conv", [x.id, w.id], {"stride": (1, 1), "padding": (1, 1),
                                        "dilation": (1, 1), "groups": 1,
                                        "layout": "channels_first"})
    g.outputs = [node.id]
    g.verify()
    assert node.shape == (2, 8, 16, 16) and node.dtype == np.float16
    (d,) = [d for d in policy.choose(g, "cupy", "balanced", supports) if d.node == node.id]
    assert (d.choice, d.reason) == ("conv", "CONV")
    assert "cuDNN, the GEMM form or pyc_lab's direct kernel" in policy.REASONS["CONV"]
    assert "recorded into the CUDA graphs" in policy.REASONS["CONV"]


@pytest.mark.parametrize(("tail", "folded"), [
    (lambda y: np.maximum(y, np.float32(0)), "relu"),
    (lambda y: relu(y), "relu"),
    (lambda y: gelu(y), "gelu"),
    (lambda y: silu(y), "silu"),
])
def test_an_activation_after_a_conv_folds_into_it(tail, folded):
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 15, 13)).astype(np.float32)
    w = (rng.standard_normal((6, 3, 3, 3)) / 5).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    x.flat[7] = np.nan

    def block(x, w, b):
        return tail(pl.conv2d(x, w, b, padding=1)) * np.float32(3)

    f = pl.compile(block)
    got = f(x, w, b)
    (node,) = _conv_nodes(f)
    assert node.attrs["activation"] == folded
    assert not [n for n in f._cache[next(iter(f._cache))][0].graph if n.op == folded]
    eager = block(x, w, b)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
    np.testing.assert_allclose(got, eager, rtol=1e-6, atol=1e-6)
    want = _act64(folded, reference(x, w, b, 1, 1)) * 3
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert any(f"folded {folded}" in note for note in f.explain(x, w, b).notes)


def test_a_conv_read_twice_or_by_another_op_keeps_its_tail():
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)

    def twice(x, w):
        y = pl.conv2d(x, w)
        return np.maximum(y, 0) + y  # the conv's result is read by the add too

    def sigmoid_tail(x, w):
        return sigmoid(pl.conv2d(x, w))  # not an activation a conv takes

    for fn in (twice, sigmoid_tail):
        f = pl.compile(fn)
        got = f(x, w)
        (node,) = _conv_nodes(f)
        assert "activation" not in node.attrs
        np.testing.assert_allclose(got, fn(x, w), rtol=1e-6, atol=1e-6)


def test_the_traced_activation_argument_is_the_eager_one():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 4, 17)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3)).astype(np.float32)

    def f(x, w):
        return pl.conv1d(x, w, padding=1, activation="silu")

    g = pl.compile(f)
    got = g(x, w)
    (node,) = _conv_nodes(g)
    assert node.attrs["activation"] == "silu"
    np.testing.assert_allclose(got, f(x, w), rtol=1e-6, atol=1e-6)
    with pytest.raises(PycLabError, match="activation 'elu'"):
        pl.compile(lambda x, w: pl.conv1d(x, w, activation="elu"))(x, w)


def test_a_compiled_conv_asks_for_exact_float32_unless_traced_with_tf32(monkeypatch):
    """The node's call into ``pl.conv`` passes ``tf32=False`` (cuDNN's TF32 off: float32
    semantics, as the compiler's GEMMs) unless the traced call said ``tf32=True``, which
    the node keeps as an attribute (and keeps through the activation fold)."""
    from pyc_lab.compiler import conv_op
    from pyc_lab.kernels import conv as kconv

    seen = []
    real = kconv.conv

    def spy(*args, **kwargs):
        if not any(getattr(type(a), "__pyc_traced__", False) for a in args[:3]):
            seen.append(kwargs.get("tf32"))
        return real(*args, **kwargs)

    monkeypatch.setattr(conv_op._conv, "conv", spy)
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    for given, want in ((None, False), (False, False), (True, True)):
        seen.clear()
        f = pl.compile(lambda x, w, t=given: np.maximum(pl.conv2d(x, w, padding=1, tf32=t), 0))
        got = f(x, w)
        np.testing.assert_allclose(got, np.maximum(reference(x, w, None, 1, 1), 0),
                                   rtol=1e-5, atol=1e-5)
        assert seen and set(seen) == {want}
        convs = [n for n in f.explain(x, w).graph.nodes.values() if n.op == "conv"]
        assert convs and all(n.attrs.get("tf32", False) is want for n in convs)
        assert all(n.attrs.get("activation") == "relu" for n in convs)  # folded, kept
    assert conv_op._arguments([], {"stride": (1,), "padding": (0,), "dilation": (1,),
                                   "groups": 1, "layout": "channels_first"})["tf32"] is False


def test_the_tf32_settings_are_restored_and_none_leaves_them(monkeypatch):
    from pyc_lab.kernels import conv_library

    state = {"cudnn_tf32": True, "matmul_tf32": False}

    def flag(name):
        return (lambda: state[name]), (lambda v: state.__setitem__(name, v))

    monkeypatch.setattr(conv_library, "_flag", flag)
    with conv_library.tf32_allowed(False):
        assert conv_library.tf32_now() == (False, False)
    assert state == {"cudnn_tf32": True, "matmul_tf32": False}  # the user's, restored
    with conv_library.tf32_allowed(True):
        assert conv_library.tf32_now() == (True, True)
    assert state == {"cudnn_tf32": True, "matmul_tf32": False}
    with conv_library.tf32_allowed(None):
        assert conv_library.tf32_now() == (True, False)
    with pytest.raises(RuntimeError), conv_library.tf32_allowed(False):
        raise RuntimeError("a failing convolution")
    assert state == {"cudnn_tf32": True, "matmul_tf32": False}
    # pl.conv on NumPy arrays takes the argument and is exact float32 either way
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    for t in (None, False, True):
        np.testing.assert_allclose(pl.conv2d(x, w, tf32=t), reference(x, w), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_a_residual_add_and_relu_fold_into_the_conv(side, layout):
    """``relu(conv(x) + r)`` (the add either way round) becomes one conv node with the
    residual as its last input and relu as its activation, computing the eager numbers;
    ``explain()`` says so."""
    rng = np.random.default_rng()
    last = layout == "channels_last"
    x = rng.standard_normal((2, 9, 11, 4) if last else (2, 4, 9, 11)).astype(np.float32)
    w = (rng.standard_normal((6, 4, 3, 3)) / 6).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    r = rng.standard_normal((2, 9, 11, 6) if last else (2, 6, 9, 11)).astype(np.float32)
    r.flat[[1, 30]] = [np.nan, -np.inf]

    def block(x, w, b, r):
        y = pl.conv2d(x, w, b, padding=1, layout=layout)
        return np.maximum((y + r) if side == "left" else (r + y), np.float32(0))

    f = pl.compile(block)
    got = f(x, w, b, r)
    (node,) = _conv_nodes(f)
    assert node.attrs["residual"] is True and node.attrs["activation"] == "relu"
    assert node.inputs[-1] == f._cache[next(iter(f._cache))][0].graph.inputs[3]
    assert [n.op for n in f.explain(x, w, b, r).graph.nodes.values()
            if n.op not in ("input", "constant")] == ["conv"]
    notes = f.explain(x, w, b, r).notes
    assert any("folded the residual add" in n for n in notes)
    assert any("folded relu" in n for n in notes)
    eager = block(x, w, b, r)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
    np.testing.assert_allclose(got, eager, rtol=1e-6, atol=1e-6)
    xf = x.transpose(0, 3, 1, 2) if last else x
    rf = r.transpose(0, 3, 1, 2) if last else r
    want = _act64("relu", reference(xf, w, b, 1, 1) + rf)
    want = want.transpose(0, 2, 3, 1) if last else want
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_residual_that_broadcasts_promotes_or_follows_an_activation_does_not_fold():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    per_channel = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    wide = rng.standard_normal((2, 4, 6, 6))  # float64: the sum promotes
    same = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    programs = {
        "broadcast": lambda x, w: pl.conv2d(x, w) + per_channel,
        "promotes": lambda x, w: pl.conv2d(x, w) + wide,
        "after relu": lambda x, w: np.maximum(pl.conv2d(x, w), 0) + same,  # pre-activation
        "read twice": lambda x, w: (lambda y: (y + same) * y)(pl.conv2d(x, w)),
        "itself": lambda x, w: (lambda y: y + y)(pl.conv2d(x, w)),
    }
    for name, fn in programs.items():
        f = pl.compile(fn)
        got = f(x, w)
        (node,) = _conv_nodes(f)
        assert "residual" not in node.attrs, name
        np.testing.assert_allclose(got, fn(x, w), rtol=1e-6, atol=1e-6, err_msg=name)


def test_a_traced_residual_argument_is_the_eager_one():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 4, 17)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    r = rng.standard_normal((2, 3, 17)).astype(np.float32)

    def f(x, w, b, r):
        return pl.conv1d(x, w, b, padding=1, residual=r, activation="silu")

    g = pl.compile(f)
    got = g(x, w, b, r)
    (node,) = _conv_nodes(g)
    assert node.attrs["residual"] is True and len(node.inputs) == 4
    np.testing.assert_allclose(got, f(x, w, b, r), rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError, match="residual of shape"):
        pl.compile(lambda x, w: pl.conv1d(x, w, residual=np.ones((2, 3, 5), np.float32)))(x, w)
