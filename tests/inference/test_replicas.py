"""Model replicas behind one batcher: several executors (one per GPU with
``pl.serve(devices=...)``) fed from one queue, each by a worker thread of its own.

On the CPU: the batcher's semantics with plain executors (every caller its own rows,
batches overlapping on the replicas, a failure staying on its request, close draining
every replica), and the per-GPU executors with the NumPy stand-in for CuPy of
test_gpu_staging.py (each replica made and run under its own device). The GPU test at
the end needs two GPUs.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pyc_lab.inference import gpu
from pyc_lab.inference.batcher import Batcher, ServeOptions
from pyc_lab.inference.errors import InferenceError
from pyc_lab.runtime import pinned
from tests.inference.test_gpu_staging import Device, fake_cupy  # noqa: F401  (a fixture)


class Recorder:
    """An executor: the model's call, slowed a little, counting what ran where and how
    many ran at once."""

    running = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, model, name, fail_on=None, delay=0.01):
        self.model, self.name, self.fail_on, self.delay = model, name, fail_on, delay
        self.batches = 0

    def __call__(self, arrays):
        with Recorder.lock:
            Recorder.running += 1
            Recorder.most = max(Recorder.most, Recorder.running)
        try:
            time.sleep(self.delay)
            if self.fail_on is not None and np.any(arrays[0] == self.fail_on):
                raise ValueError(f"{self.name} refuses {self.fail_on}")
            self.batches += 1
            return self.model.run(arrays)
        finally:
            with Recorder.lock:
                Recorder.running -= 1


@pytest.fixture(autouse=True)
def _reset_recorder():
    Recorder.running = Recorder.most = 0


def _submit_all(batcher, xs):
    with ThreadPoolExecutor(16) as tp:
        return list(tp.map(lambda x: batcher.submit([x]), xs))


def test_replicas_share_one_queue_and_run_at_once(affine):
    options = ServeOptions(max_batch=4, max_delay_ms=1, timeout_s=60)
    replicas = [Recorder(affine, f"r{k}") for k in range(3)]
    batcher = Batcher(affine, options, replicas)
    try:
        assert batcher.executor is replicas[0] and batcher.executors == replicas
        xs = [np.full((1 + k % 2, 4), k, np.float32) for k in range(120)]
        futs = _submit_all(batcher, xs)
        for x, f in zip(xs, futs, strict=True):
            np.testing.assert_array_equal(f.result(timeout=30), x * 2 + 1)
        assert all(r.batches > 0 for r in replicas), [r.batches for r in replicas]
        assert sum(r.batches for r in replicas) == batcher.stats.batches
        assert Recorder.most >= 2, "the replicas never ran batches at the same time"
        assert batcher.stats.requests == len(xs)
    finally:
        batcher.close()
    assert not batcher.alive


def test_a_failing_replica_fails_only_the_bad_request(affine):
    options = ServeOptions(max_batch=8, max_delay_ms=2, timeout_s=60)
    replicas = [Recorder(affine, "a", fail_on=-7.0), Recorder(affine, "b", fail_on=-7.0)]
    batcher = Batcher(affine, options, replicas)
    try:
        xs = [np.full((1, 4), -7.0 if k % 10 == 3 else k, np.float32) for k in range(60)]
        futs = _submit_all(batcher, xs)
        for x, f in zip(xs, futs, strict=True):
            if x[0, 0] == -7.0:
                with pytest.raises(InferenceError, match=r"refuses -7\.0"):
                    f.result(timeout=30)
            else:
                np.testing.assert_array_equal(f.result(timeout=30), x * 2 + 1)
    finally:
        batcher.close()


def test_close_drains_every_replica_and_releases_each(affine):
    closed = []

    class Closing(Recorder):
        def close(self):
            closed.append(self.name)

    options = ServeOptions(max_batch=2, max_delay_ms=50, timeout_s=60)
    replicas = [Closing(affine, f"c{k}", delay=0.02) for k in range(2)]
    batcher = Batcher(affine, options, replicas)
    futs = [batcher.submit([np.full((1, 4), k, np.float32)]) for k in range(9)]
    batcher.close(drain=True, timeout_s=30)
    assert not batcher.alive
    for k, f in enumerate(futs):  # queued work was finished, not dropped
        np.testing.assert_array_equal(f.result(timeout=1), np.full((1, 4), 2 * k + 1))
    assert sorted(closed) == ["c0", "c1"]


def test_an_empty_or_odd_executor_list_is_refused(affine):
    with pytest.raises(InferenceError, match="non-empty sequence"):
        Batcher(affine, ServeOptions(), [])
    with pytest.raises(InferenceError, match="non-empty sequence"):
        Batcher(affine, ServeOptions(), [affine.run, "not callable"])


def test_serve_checks_devices_and_replicas(affine):
    from pyc_lab.inference.server import serve

    with pytest.raises(InferenceError, match="places replicas on GPUs"):
        serve(affine, device="cpu", devices=[0])
    with pytest.raises(InferenceError, match="non-empty list"):
        serve(affine, devices=[])
    with pytest.raises(InferenceError, match="non-empty list"):
        serve(affine, devices=0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InferenceError, match="replicas must be"):
            serve(affine, devices=[0], replicas=bad)
    with pytest.raises(InferenceError, match="pass devices too"):
        serve(affine, replicas=2)


def test_devices_without_a_gpu_is_a_clear_error(affine):
    from pyc_lab.errors import DeviceUnavailableError
    from pyc_lab.hardware.device import no_gpu_reason
    from pyc_lab.inference.server import serve

    if no_gpu_reason() is None:
        pytest.skip("a GPU is usable here")
    with pytest.raises(DeviceUnavailableError, match="needs a CUDA device"):
        serve(affine, devices=[0, 1])


def test_per_gpu_replicas_are_made_and_run_on_their_device(fake_cupy, affine,  # noqa: F811
                                                            monkeypatch):
    pools = []
    real_pool = pinned.PinnedPool

    def host_pool(device=0, mode="auto", **_):
        pools.append(device)
        return real_pool(device=None, mode="cpu")

    monkeypatch.setattr(gpu, "require_cupy", lambda feature: fake_cupy)
    monkeypatch.setattr(pinned, "PinnedPool", host_pool)
    ran_on: list[tuple[int, int]] = []
    options = ServeOptions(max_batch=4, max_delay_ms=1, timeout_s=60)
    executors = gpu.replica_executors(affine, options, [1, 0], replicas=2)
    assert [e.device for e in executors] == [1, 1, 0, 0]
    assert pools == [1, 1, 0, 0]  # each replica's pinned pool asked for its own GPU
    for e in executors:
        fn = e.fn

        def on_device(*arrays, fn=fn, e=e):
            ran_on.append((e.device, Device.current()))
            return fn(*arrays)

        on_device.bind = lambda *bound, run=on_device: (lambda: run(*bound))
        e.fn = on_device
    batcher = Batcher(affine, options, executors)
    try:
        xs = [np.full((1 + k % 3, 4), k, np.float32) for k in range(80)]
        for x, f in zip(xs, _submit_all(batcher, xs), strict=True):
            np.testing.assert_array_equal(f.result(timeout=30), x * 2 + 1)
    finally:
        batcher.close()
    assert ran_on and all(want == got for want, got in ran_on), ran_on[:5]
    assert {d for d, _ in ran_on} == {0, 1}
    with pytest.raises(InferenceError, match=r"devices \[2\] are not GPUs here"):
        gpu.replica_executors(affine, options, [0, 2])


@pytest.mark.gpu
def test_two_gpus_serve_one_model_behind_one_batcher(start):
    """Replicas on GPUs 0 and 1: every caller its own rows, both GPUs used."""
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs (the multi-GPU lane)")
    from pyc_lab.inference import zoo
    from pyc_lab.inference.model import load

    model = load(zoo.build("astro_mlp"))
    server = start(model, max_batch=16, max_delay_ms=1, device="auto", devices=[0, 1])
    executors = server._batcher(None).executors
    assert [e.device for e in executors] == [0, 1]
    xs = [zoo.example_inputs("astro_mlp", 1 + k % 4, seed=k)["x"] for k in range(400)]
    with ThreadPoolExecutor(32) as tp:
        outs = list(tp.map(server.predict, xs))
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, model(x), rtol=1e-4, atol=1e-5)
    assert all(e._buckets for e in executors), "a GPU never ran a batch"
