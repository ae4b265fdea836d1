"""pl.kernels.prepare: the tuned winners a kernel cache lacks are built once, on request;
a pl.matmul call never builds."""

from __future__ import annotations

import pytest

import pyc_lab as pl
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels import matmul as mm
from pyc_lab.kernels import matmul_tuned
from pyc_lab.kernels.cutlass import nvcc as cutlass_build
from pyc_lab.kernels.tuning import database as tuning_db
from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement, ProblemKey

DEVICE = DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
OTHER = DeviceKey("NVIDIA H100 80GB HBM3", "9.0", "580.00", "13.0")
CFG = cg.GemmConfig((128, 128, 64), (1, 2, 1), "TmaWarpSpecializedCooperative",
                    "TmaWarpSpecializedCooperative", "Default")
SLOW = cg.GemmConfig((64, 128, 64), (1, 1, 1), "TmaWarpSpecializedPingpong",
                     "TmaWarpSpecialized", "Default")


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    monkeypatch.setattr(mm, "device_key", lambda index=0: (DEVICE, 90, 132))
    monkeypatch.setattr(matmul_tuned, "device_key", lambda index=0: (DEVICE, 90, 132))
    with tuning_db.TuningDB() as store:
        for op, shape in (("gemm", (256, 256, 256)), ("gemm_bias_gelu", (512, 512, 512))):
            store.record_many(DEVICE, ProblemKey(op, "f16", "f16", "f16", "tn", *shape),
                              [Measurement(CFG.to_dict(), "ok", 0.01),
                               Measurement(SLOW.to_dict(), "ok", 0.02)])
        store.record(OTHER, ProblemKey("gemm", "bf16", "bf16", "bf16", "tn", 64, 64, 64),
                     Measurement(SLOW.to_dict(), "ok", 0.01))
        store.record(DEVICE, ProblemKey("gemm", "f16", "f16", "f16", "tn", 64, 64, 64),
                     Measurement({"baseline": "cublas"}, "baseline", 0.001))
    mm.forget()
    yield
    mm.forget()


def test_prepare_builds_this_devices_winners_only(db, monkeypatch):
    built = []

    def fake_build_many(configs, dtype, layout, cc, workers, cache, epilogue):
        import concurrent.futures as cf

        out = {}
        for cfg in configs:
            built.append((cfg, dtype, layout, epilogue.op, cc))
            fut: cf.Future = cf.Future()
            fut.set_result(cg.BuildResult(cfg, "k" * 64, None, "built", 1.0))
            out[cfg] = fut
        return out

    monkeypatch.setattr(cg, "build_many", fake_build_many)
    frame = pl.kernels.prepare()
    assert sorted(frame["op"]) == ["gemm", "gemm_bias_gelu"]
    assert set(frame["config"]) == {CFG.id} and set(frame["status"]) == {"built"}
    assert sorted(b[3] for b in built) == ["gemm", "gemm_bias_gelu"]  # one per epilogue
    assert all(b[0] == CFG and b[4] == 90 for b in built)  # winners only, this cc
    assert pl.kernels.prepare(dtype="bf16").empty  # the bf16 winner is another GPU's


def test_a_winner_missing_from_the_cache_is_not_built_by_a_call(db, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("pl.matmul must not build")

    monkeypatch.setattr(cutlass_build, "build", no_build)
    monkeypatch.setattr(cg, "cached", lambda *args, **kwargs: None)
    kernel, why = mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert kernel is None
    assert "not built on this machine" in why and "pyc_lab.kernels.prepare()" in why


def test_a_cublaslt_pick_winner_needs_no_build(db, monkeypatch):
    from pyc_lab.kernels.lt_algos import LtPick

    pick = LtPick(1, tuple(range(10, 18)), 130100, 66, 24, 35, 1, 5)
    with tuning_db.TuningDB() as store:
        store.record_many(DEVICE, ProblemKey("gemm", "bf16", "bf16", "bf16", "tn", 64, 4096,
                                             4096), [Measurement(pick.to_dict(), "ok", 0.02)])
    mm.forget()

    def no_build(*args, **kwargs):
        raise AssertionError("a cuBLASLt pick has nothing to build")

    monkeypatch.setattr(cg, "build_many", no_build)
    frame = pl.kernels.prepare(dtype="bf16")
    assert frame.to_dict("records") == [{"op": "gemm", "dtype": "bf16", "layout": "tn",
                                         "shape": "64x4096x4096", "config": pick.id,
                                         "status": "ready", "message": ""}]
