"""``Pipeline(..., devices=[0, 1])`` on two GPUs (the multi-GPU lane): each item computes
on the GPU it was dealt to, from its own pinned pool, and the results come back in item
order, equal to NumPy's. Skips, saying so, with fewer than two GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.hardware.device import cupy_status
from pyc_lab.runtime.pipeline import Pipeline

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    cp, _ = cupy_status()
    return 0 if cp is None else cp.cuda.runtime.getDeviceCount()


def test_two_gpus_each_compute_their_items():
    if _gpus() < 2:
        pytest.skip(f"needs two GPUs; this machine has {_gpus()}")
    import cupy as cp

    seen: dict[int, int] = {}

    def prepare(i):
        return np.full((256, 256), i, dtype=np.float32)

    def compute(x, stream):
        seen[int(x[0, 0].get())] = cp.cuda.Device().id
        return x @ x

    with Pipeline(prepare, compute, mode="gpu", devices=[0, 1], depth=3) as pipe:
        got = list(pipe.run(range(24)))
        assert all(np.allclose(g, np.full((256, 256), 256.0 * i * i)) for i, g in
                   enumerate(got))
        assert seen == {i: i % 2 for i in range(24)}
        assert {lane.split(" ")[0] for lane in pipe.trace.lanes} == {"gpu0", "gpu1"}
