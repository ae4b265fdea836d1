"""Serving on the GPU: per-bucket pinned staging and CUDA graphs (run by the GPU lane)."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.hardware.device import no_gpu_reason
from pyc_lab.inference import zoo
from pyc_lab.inference.model import load

pytest.importorskip("onnx")


@pytest.mark.skipif(no_gpu_reason() is None, reason="checks the no-GPU error; a GPU is here")
def test_device_gpu_without_a_gpu_is_a_clear_error(start, affine):
    from pyc_lab.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="needs a CUDA device"):
        start(affine, device="gpu")
    # auto falls back to the host quietly
    server = start(affine, device="auto")
    assert server._batcher(None).executor == affine.run


@pytest.mark.gpu
@pytest.mark.parametrize("name", zoo.names())
def test_zoo_served_on_the_gpu_matches_onnxruntime(start, name):
    ort = pytest.importorskip("onnxruntime")
    from pyc_lab.inference.gpu import BucketExecutor

    m = zoo.build(name)
    server = start(load(m), max_batch=16, max_delay_ms=1, device="gpu")
    assert isinstance(server._batcher(None).executor, BucketExecutor)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 16):
        feeds = zoo.example_inputs(name, batch, seed=batch)
        got = server.predict(feeds)
        for out, want in zip(server.models[name].output_names, sess.run(None, feeds),
                             strict=True):
            np.testing.assert_allclose(got[out], want, rtol=0,
                                       atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.gpu
def test_gpu_buckets_are_staged_once_and_replayed(start):
    from concurrent.futures import ThreadPoolExecutor

    model = load(zoo.build("astro_mlp"))
    server = start(model, max_batch=32, max_delay_ms=1, device="gpu")
    warm = server.warm_up()
    assert sorted(warm) == [1, 2, 4, 8, 16, 32]
    ex = server._batcher(None).executor
    assert len(ex._buckets) == 6
    assert ex.pool.pinned
    xs = [zoo.example_inputs("astro_mlp", 1 + k % 5, seed=k)["x"] for k in range(200)]
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(server.predict, xs))
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, model(x), rtol=1e-4, atol=1e-5)
    assert len(ex._buckets) == 6, "a batch ran at a shape that was not a bucket"
    assert ex.fn.cache_info()["signatures"] == 6


@pytest.mark.gpu
def test_compiled_model_takes_cupy_arrays():
    import cupy as cp

    model = load(zoo.build("materials_vae"), backend="auto")
    x = zoo.example_inputs("materials_vae", 8)["x"]
    got = model(cp.asarray(x))
    assert type(got[0]).__module__.startswith("cupy")
    np.testing.assert_allclose(cp.asnumpy(got[0]), load(zoo.build("materials_vae"),
                                                         backend="numpy")(x)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["library", "im2col", "auto"])
def test_imported_convolutions_on_the_gpu_match_onnxruntime(route):
    """Each conv route on the cupy backend with CUDA graphs (a pl.conv node runs between
    the graphs): the 1-D CNN at batches on both sides of the auto threshold, and a 2-D
    conv with unequal pads and a stride, against onnxruntime (CPU)."""
    import cupy as cp
    from onnx import TensorProto, helper, numpy_helper

    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 3, 3, 2)).astype(np.float32)
    conv2d = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["h"], pads=[1, 0, 1, 2], strides=[2, 1]),
         helper.make_node("Relu", ["h"], ["y"])], "conv2d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 33, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 17, 18])],
        [numpy_helper.from_array(w, "W"),
         numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B")]),
        opset_imports=[helper.make_opsetid("", 20)])
    conv2d.ir_version = 9
    cases = [(zoo.build("particle_cnn"), lambda b: zoo.example_inputs("particle_cnn", b, b),
              (1, 5, 2048)),
             (conv2d, lambda b: {"x": rng.standard_normal((b, 3, 33, 17)).astype(np.float32)},
              (1, 7, 256))]
    for m, inputs, batches in cases:
        model = load(m, backend="cupy", cuda_graph=True, conv=route,
                     layout="channels_first")  # the routes (channels last: below)
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for batch in batches:
            feeds = inputs(batch)
            want = sess.run(None, feeds)
            for _ in range(3):  # launched, captured, replayed
                got = model.run([cp.asarray(feeds[n]) for n in model.input_names])
                for g, w_ in zip(got, want, strict=True):
                    np.testing.assert_allclose(cp.asnumpy(g), w_, rtol=0,
                                               atol=1e-4 * float(np.abs(w_).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["residual", "pools"])
def test_channels_last_import_on_the_gpu_matches_the_reference(which):
    """``layout="channels_last"`` (the default on the cupy backend) with CUDA graphs: the
    residual CNN that meets every rule of the layout import (convolutions as
    channels-last ``pl.conv`` nodes, a graph output taken straight from one), and the
    chain of channels-last pooling windows with graph-layout operands, at two batches,
    launched, captured and replayed, against ``onnx.reference`` and against the
    channels-first import on the same GPU."""
    import cupy as cp
    from onnx.reference import ReferenceEvaluator

    from tests.inference.test_onnx_import import _inputs, _layout_model, _pool_model

    m, shapes = {"residual": _layout_model, "pools": _pool_model}[which]()
    last = load(m, backend="cupy", cuda_graph=True)  # the default on a GPU
    assert last.imported.layout == "channels_last"
    first = load(m, backend="cupy", cuda_graph=True, layout="channels_first")
    ref = ReferenceEvaluator(m)
    for batch in (3, 17):
        feeds = _inputs({k: (batch, *s[1:]) for k, s in shapes.items()}, seed=batch)
        want = ref.run(None, feeds)
        args = [cp.asarray(feeds[n]) for n in last.input_names]
        plain = [cp.asnumpy(g) for g in first.run(args)]
        for _ in range(3):
            got = last.run(args)
            for g, w_, p in zip(got, want, plain, strict=True):
                assert g.shape == w_.shape
                scale = float(np.abs(w_).max())
                np.testing.assert_allclose(cp.asnumpy(g), w_, rtol=0, atol=1e-4 * scale)
                np.testing.assert_allclose(cp.asnumpy(g), p, rtol=0, atol=1e-4 * scale)
