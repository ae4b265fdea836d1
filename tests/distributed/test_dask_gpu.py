"""Tuning over Dask on GPUs (the GPU lane): ``pl.cluster()`` starts one worker per GPU,
each seeing only its own GPU, and a live sweep (the libraries and pyc_lab's skinny GEMM
measured on the workers, no CUTLASS builds) merges the workers' measurements into the
caller's database under the device they were taken on. Two-GPU checks skip, saying so,
with fewer GPUs."""

from __future__ import annotations

import os

import pytest

import pyc_lab as pl
from pyc_lab.kernels.tuning.database import TuningDB

pytestmark = pytest.mark.gpu
pytest.importorskip("distributed", reason="needs Dask's distributed package")


def _gpus() -> int:
    return len(pl.detect_hardware().gpus)


@pytest.fixture(scope="module")
def client():
    c = pl.cluster()
    yield c
    c.close()


def test_one_worker_per_gpu_each_pinned_to_its_own(client):
    gpus = _gpus()
    assert pl.distributed.gpu_count(client) == gpus
    seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert sorted(seen.values()) == sorted(str(i) for i in range(gpus))


def test_a_live_sweep_merges_the_workers_measurements(client, tmp_path):
    db = TuningDB(tmp_path / "tuning.sqlite")
    problems = [(16, 4096, 4096, "bf16"), (32, 2048, 2048, "f16"), (8, 1024, 4096, "f16")]
    res = pl.autotune_many(problems, client=client, db=db, budget_s=60, cutlass=False)
    assert all(res.results[p] is not None for p in res.problems), res.messages
    rows = db.measurements()
    assert rows and {r.device.gpu_name for r in rows} == {res.results[res.problems[0]]
                                                        .device.gpu_name}
    assert {(r.problem.m, r.problem.n) for r in rows} == {(16, 4096), (32, 2048), (8, 1024)}


def test_two_gpus_tune_side_by_side(client):
    if _gpus() < 2:
        pytest.skip(f"needs two GPUs; this machine has {_gpus()}")
    problems = [(16, 4096, 4096, "bf16"), (32, 4096, 4096, "bf16"),
                (16, 8192, 4096, "f16"), (32, 8192, 4096, "f16")]
    res = pl.autotune_many(problems, client=client, budget_s=60, cutlass=False)
    assert len(set(res.workers.values())) >= 2
