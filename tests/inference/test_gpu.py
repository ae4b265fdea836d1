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
