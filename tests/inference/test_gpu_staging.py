"""The GPU bucket executor's staging logic, on the CPU with a NumPy stand-in for CuPy.

What a GPU adds (copies, CUDA graphs) is checked by the ``gpu`` tests in test_gpu.py;
here: one set of staging buffers per bucket shape, made once and reused, inputs copied
through them, outputs copied back through pinned-pool buffers, buffers given back on
close.
"""

from __future__ import annotations

import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pyc_lab.compiler.api import compile as pl_compile
from pyc_lab.inference import gpu
from pyc_lab.inference.batcher import Batcher, ServeOptions
from pyc_lab.runtime.pinned import PinnedPool


class DeviceArray(np.ndarray):
    """A 'device' array: NumPy memory with CuPy's set/get."""

    sets = 0
    gets = 0

    def set(self, host, stream=None):
        DeviceArray.sets += 1
        np.copyto(np.asarray(self), host)

    def get(self, stream=None, out=None, blocking=True):
        DeviceArray.gets += 1
        np.copyto(out, np.asarray(self))
        return out


class Stream:
    def __init__(self, non_blocking=False):
        self.synced = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        self.synced += 1


class Device:
    """CuPy's device context: which device each thread has current (a stack per thread)."""

    count = 2
    _current = threading.local()

    def __init__(self, index=0):
        self.id = index

    @classmethod
    def current(cls):
        stack = getattr(cls._current, "stack", None)
        return stack[-1] if stack else 0

    def __enter__(self):
        if not hasattr(Device._current, "stack"):
            Device._current.stack = []
        Device._current.stack.append(self.id)
        return self

    def __exit__(self, *exc):
        Device._current.stack.pop()
        return False


@pytest.fixture
def fake_cupy(monkeypatch):
    cp = types.ModuleType("cupy")
    cp.cuda = types.SimpleNamespace(
        Stream=Stream, Device=Device,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: Device.count))
    cp.asarray = lambda a: np.array(a).view(DeviceArray)
    cp.empty = lambda shape, dtype: np.empty(shape, dtype).view(DeviceArray)
    monkeypatch.setitem(sys.modules, "cupy", cp)

    def compile_on_host(fn, **_options):
        host = pl_compile(fn, backend="numpy")

        def run(*arrays):
            out = host(*[np.asarray(a) for a in arrays])
            outs = out if isinstance(out, tuple) else (out,)
            views = tuple(np.array(o).view(DeviceArray) for o in outs)
            return views if len(views) > 1 else views[0]

        run.cache_info = host.cache_info
        # bind: later calls run on what the bound buffers hold then (the real bound
        # call's contract, without the graphs)
        run.bind = lambda *bound: (lambda: run(*bound))
        return run

    monkeypatch.setattr(gpu, "pl_compile", compile_on_host)
    return cp


def test_buckets_are_staged_once_and_reused(fake_cupy, affine):
    pool = PinnedPool(device=None, mode="cpu")
    options = ServeOptions(max_batch=8, max_delay_ms=1)
    ex = gpu.BucketExecutor(affine, options, pool=pool)
    batcher = Batcher(affine, options, ex)
    try:
        xs = [np.full((1 + k % 3, 4), k, np.float32) for k in range(60)]
        with ThreadPoolExecutor(8) as tp:
            futs = list(tp.map(lambda x: batcher.submit([x]), xs))
        for x, f in zip(xs, futs, strict=True):
            np.testing.assert_array_equal(f.result(timeout=10), x * 2 + 1)
        batches = batcher.stats.batches
        assert set(ex._buckets) <= {(((b, 4), "<f4"),) for b in (1, 2, 4, 8)}
        assert DeviceArray.sets >= batches and DeviceArray.gets >= batches
        held = pool.stats()
    finally:
        batcher.close()
    assert not ex._buckets, "closing the batcher gives the staging buffers back"
    assert held  # the pool lent them


def test_gpu_device_is_refused_without_one(affine):
    from pyc_lab.errors import DeviceUnavailableError
    from pyc_lab.hardware.device import no_gpu_reason

    if no_gpu_reason() is None:
        pytest.skip("a GPU is usable here")
    with pytest.raises(DeviceUnavailableError):
        gpu.bucket_executor(affine, ServeOptions(), "gpu")
    assert gpu.bucket_executor(affine, ServeOptions(), "auto") is None
