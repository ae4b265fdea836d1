"""CUTLASS GEMM configurations, pruning, ranking, sources and builds (no GPU needed;
the build test needs nvcc and nvidia-cutlass)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.cache import KernelCache

pytest.importorskip("cutlass_library", reason="nvidia-cutlass is not installed")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

pytestmark = needs_nvcc  # enumerating configurations reads nvcc's version


@pytest.fixture(scope="module")
def f16_tn():
    return cg.configurations("f16", "tn")


def test_configurations_come_from_cutlass_cppgen(f16_tn):
    assert len(f16_tn) > 40
    assert len({c.id for c in f16_tn}) == len(f16_tn)
    kinds = {c.kernel_schedule for c in f16_tn}
    assert {"TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"} <= kinds
    assert {c.tile_scheduler for c in f16_tn} == {"Default", "StreamK"}
    assert all(cg.GemmConfig.from_dict(c.to_dict()) == c for c in f16_tn)
    assert len(cg.configurations("bf16", "nt")) > 40


def test_bad_dtype_layout_and_config_are_clear_errors(f16_tn):
    with pytest.raises(PycLabError, match="dtype 'f64'"):
        cg.configurations("f64", "tn")
    with pytest.raises(PycLabError, match="layout 'xx'"):
        cg.configurations("f16", "xx")
    with pytest.raises(PycLabError, match="not a CUTLASS GEMM config"):
        cg.GemmConfig.from_dict({"tile": [1, 2, 3]})
    fake = cg.GemmConfig((96, 96, 32), (1, 1, 1), "Nope", "Nope", "Default")
    with pytest.raises(PycLabError, match="not one of cutlass_cppgen's configurations"):
        cg.emit_source(fake)


def test_prune_drops_what_cannot_work(f16_tn):
    kept, dropped = cg.prune(f16_tn, 4096, 4096, 4096)
    assert kept and len(kept) + len(dropped) == len(f16_tn)
    assert all(not ("Cooperative" in c.kernel_schedule and c.cta_tile[0] < 128) for c in kept)
    assert any("Cooperative kernel needs" in why for why in dropped.values())
    assert all(c.tile_scheduler != "StreamK" for c in kept)  # opt-in
    assert any("Stream-K candidates are opt-in" in why for why in dropped.values())
    with_sk = cg.prune(f16_tn, 4096, 4096, 4096, stream_k=True)[0]
    assert any(c.tile_scheduler == "StreamK" for c in with_sk)
    # misaligned: K = 4099 is not a multiple of 8 for row-major A
    kept, dropped = cg.prune(f16_tn, 4096, 4096, 4099)
    assert not kept and all("multiple of 8" in why for why in dropped.values())
    # a tiny problem drops tiles far larger than its output
    small, dropped = cg.prune(f16_tn, 64, 64, 64)
    assert all(c.cta_tile[0] <= 128 and c.cta_tile[1] <= 128 for c in small)
    assert any("far larger" in why for why in dropped.values())


def test_rank_prefers_fitting_tiles_and_spreads_kinds(f16_tn):
    kept, _ = cg.prune(f16_tn, 4096, 4096, 4096)
    ranked = cg.rank(kept, 4096, 4096, 4096, 132)
    assert sorted(c.id for c in ranked) == sorted(c.id for c in kept)
    assert ranked == cg.rank(list(reversed(kept)), 4096, 4096, 4096, 132)  # deterministic
    top = ranked[:6]
    assert len({(c.cta_tile, c.kernel_schedule) for c in top}) >= 3
    # for 512^3, 132 SMs: small tiles (more CTAs) score above 256-wide ones
    small = cg.rank(cg.prune(f16_tn, 512, 512, 512)[0], 512, 512, 512, 132)
    assert small[0].cta_tile[0] * small[0].cta_tile[1] <= 128 * 128
    assert cg.score(small[0], 512, 512, 512, 132) > cg.score(ranked[0], 512, 512, 512, 132)


def test_emitted_source_is_deterministic_and_complete(f16_tn):
    cfg = cg.rank(cg.prune(f16_tn, 1024, 1024, 1024)[0], 1024, 1024, 1024, 132)[0]
    src = cg.emit_source(cfg)
    assert src == cg.emit_source(cfg)
    for needle in ("CollectiveBuilder", "GemmUniversalAdapter", "pyc_run", "pyc_initialize",
                   "pyc_can_implement", "cutlass::half_t", cfg.id):
        assert needle in src
    bf = cg.emit_source(cg.configurations("bf16", "tn")[0], "bf16", "tn")
    assert "cutlass::bfloat16_t" in bf and "cutlass::half_t" not in bf


def test_float32_kernels_tf32_tensor_cores_and_simt():
    tf32 = cg.configurations("tf32", "tn")
    assert len(tf32) > 40 and all(c.tile[2] == 32 for c in tf32)
    src = cg.emit_source(cg.rank(cg.prune(tf32, 1024, 1024, 1024, "tn", "tf32")[0],
                                 1024, 1024, 1024, 132)[0], "tf32", "tn")
    assert "CollectiveBuilder" in src and "tf32gemm" in src and "hw_info" in src
    (simt,) = cg.configurations("f32", "tn")
    src = cg.emit_source(simt, "f32", "tn")
    assert "OpClassSimt" in src and "GemmCoord(M, N, K)" in src and "hw_info" not in src
    # alignment: 4 float32 for TF32 tensor cores, none for SIMT
    assert "multiple of 4" in cg.problem_issue(64, 64, 66, "tn", "tf32")
    assert cg.problem_issue(64, 64, 66, "tn", "f32") == ""
    with pytest.raises(PycLabError, match="TMA epilogue schedule"):
        cg.emit_source(simt, "f32", "tn", epilogue=cg.Epilogue(bias=True))


def test_epilogues_name_their_op_and_fusion():
    e = cg.Epilogue(bias=True, activation="gelu")
    assert (e.name, e.op, e.fused) == ("bias_gelu", "gemm_bias_gelu", True)
    assert cg.Epilogue.from_op(e.op) == e and cg.Epilogue.from_op("gemm") == cg.Epilogue()
    assert cg.Epilogue(activation="silu").op == "gemm_silu"
    assert cg.Epilogue(bias=True).fusion_op("bf16") == \
        "cutlass::epilogue::fusion::LinCombPerColBias<cutlass::bfloat16_t, float>"
    with pytest.raises(PycLabError, match="not one of"):
        cg.Epilogue(activation="tanh")


def test_fused_epilogue_sources_and_pruning(f16_tn):
    epi = cg.Epilogue(bias=True, activation="gelu")
    kept, dropped = cg.prune(f16_tn, 4096, 4096, 4096, "tn", "f16", epi)
    assert kept and all(c.epilogue_schedule.startswith("TmaWarpSpecialized") for c in kept)
    assert any("needs a TMA epilogue schedule" in why for why in dropped.values())
    src = cg.emit_source(kept[0], "f16", "tn", epilogue=epi)
    assert ("LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU_taylor, "
            "cutlass::half_t, float>") in src
    assert "#define PYC_BIAS 1" in src and src != cg.emit_source(kept[0], "f16", "tn")
    nosmem = next(c for c in f16_tn if c.epilogue_schedule == "NoSmemWarpSpecialized")
    with pytest.raises(PycLabError, match="TMA epilogue schedule"):
        cg.emit_source(nosmem, "f16", "tn", epilogue=epi)


def test_build_caches_and_records_failures(tmp_path, f16_tn):
    cache = KernelCache(tmp_path / "kernels")
    cfg = cg.rank(cg.prune(f16_tn, 256, 256, 256)[0], 256, 256, 256, 132)[0]
    done = []
    futures = cg.build_many([cfg], cache=cache, workers=1, on_done=done.append)
    res = futures[cfg].result()
    assert res.status == "built", res.message
    assert res.library.is_file() and res.library.stat().st_size > 10_000
    assert done == [res]
    again = cg.build(cfg, cache=cache)
    assert again.status == "cached" and again.key == res.key
    entry = cache.get(res.key)
    assert entry.meta["config"] == cfg.to_dict() and "kernel.cu" in entry.files
    # a configuration cutlass_cppgen does not offer fails as a result, not an exception
    bad = cg.GemmConfig((96, 96, 32), (1, 1, 1), "Nope", "Nope", "Default")
    res_bad = cg.build(bad, cache=cache)
    assert res_bad.status == "compile_error" and not res_bad.ok
    assert "not one of cutlass_cppgen's configurations" in res_bad.message


def test_fused_epilogue_and_simt_kernels_compile(tmp_path, f16_tn):
    """nvcc accepts the spliced fusion operation and the CUTLASS 2 wrapper (~45 s)."""
    cache = KernelCache(tmp_path / "kernels")
    epi = cg.Epilogue(bias=True, activation="silu")
    fused = cg.rank(cg.prune(f16_tn, 1024, 1024, 1024, "tn", "f16", epi)[0],
                    1024, 1024, 1024, 132)[0]
    (simt,) = cg.configurations("f32", "tn")
    with_epi = cg.build_many([fused], "f16", "tn", cache=cache, workers=1, epilogue=epi)
    plain = cg.build_many([simt], "f32", "tn", cache=cache, workers=1)
    for res in (with_epi[fused].result(), plain[simt].result()):
        assert res.status == "built", res.message
    assert cache.get(with_epi[fused].result().key).meta["epilogue"] == "bias_silu"


def test_matmul_on_numpy_and_bad_input():
    rng = np.random.default_rng()
    a, b = rng.uniform(-1, 1, (5, 7)), rng.uniform(-1, 1, (7, 3))
    bias = rng.uniform(-1, 1, 3)
    got = pl.matmul(a, b, bias=bias, activation="relu")
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0))
    assert pl.kernels.matmul.last_choice["impl"] == "numpy"
    out = rng.uniform(-1, 1, (5, 3))
    want = 2.0 * (a @ b) + 0.5 * out
    np.testing.assert_allclose(pl.matmul(a, b, out=out, alpha=2.0, beta=0.5), want)
    with pytest.raises(PycLabError, match="inner dimensions differ"):
        pl.matmul(a, a)
    y = a @ b + bias
    np.testing.assert_allclose(pl.matmul(a, b, bias=bias, activation="silu"),
                               y / (1 + np.exp(-y)))
    with pytest.raises(PycLabError, match="activation must be"):
        pl.matmul(a, b, activation="tanh")


def test_autotune_without_a_gpu_says_why():
    from pyc_lab.hardware.device import cupy_status

    if cupy_status()[0] is not None:
        pytest.skip("a GPU is present: test_cutlass_gemm_gpu.py tunes for real")
    with pytest.raises(PycLabError, match="needs a CUDA device"):
        pl.autotune_gemm(256, 256, 256)


RECORD_ELSEWHERE = """
import sys
from pyc_lab.kernels.tuning.database import TuningDB
from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement, ProblemKey
with TuningDB(sys.argv[1]) as db:
    db.record(DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0"),
              ProblemKey("gemm", "f16", "f16", "f16", "tn", 2048, 2048, 2048),
              Measurement({"tile": [128, 128, 64], "cluster": [1, 2, 1],
                           "kernel_schedule": "TmaWarpSpecializedCooperative",
                           "epilogue_schedule": "TmaWarpSpecializedCooperative",
                           "tile_scheduler": "Default"}, "ok", 0.02))
"""


def test_matmul_lookup_is_memoised_until_the_database_changes(tmp_path, monkeypatch):
    from pyc_lab.kernels import matmul as mm
    from pyc_lab.kernels.tuning import database as tuning_db

    device = tuning_db.DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
    path = tmp_path / "t.sqlite"
    monkeypatch.setattr(tuning_db, "default_path", lambda: path)
    monkeypatch.setattr(mm, "device_key", lambda index=0: (device, 90, 132))
    loads = []

    def fake_load(found, dtype, layout, epilogue, why, shape):
        loads.append(shape)
        return f"kernel {found.measurement.config['tile']}", why

    monkeypatch.setattr(mm, "_load", fake_load)
    monkeypatch.setattr(mm, "RECHECK_S", 3600.0)
    mm.forget()
    assert mm.tuned_kernel(256, 256, 256, "f16", "tn")[0] is None
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] is None
    cfg = cg.GemmConfig((128, 128, 64), (1, 2, 1), "TmaWarpSpecializedCooperative",
                        "TmaWarpSpecializedCooperative", "Default")
    with tuning_db.TuningDB() as db:  # a tuning in this process is seen at once
        db.record(device, tuning_db.ProblemKey("gemm", "f16", "f16", "f16", "tn",
                                               256, 256, 256),
                  tuning_db.Measurement(cfg.to_dict(), "ok", 0.01))
    kernel, why = mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert kernel == "kernel [128, 128, 64]" and why.startswith("exact match")
    for _ in range(3):  # memoised: no new lookup or load
        assert mm.tuned_kernel(256, 256, 256, "f16", "tn")[0] == kernel
    assert loads == [(256, 256, 256)]
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] is None  # looked up again: none
    # another process (a notebook beside this one) records 2048^3: seen once the file
    # is looked at again, after RECHECK_S
    subprocess.run([sys.executable, "-c", RECORD_ELSEWHERE, str(path)], check=True,
                   capture_output=True)
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] is None  # not looked at yet
    monkeypatch.setattr(mm, "RECHECK_S", 0.0)
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] == "kernel [128, 128, 64]"
    monkeypatch.setattr(mm, "RECHECK_S", 3600.0)
    mm.forget()
    mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert loads == [(256, 256, 256), (2048, 2048, 2048), (256, 256, 256)]


def test_an_unusable_tuned_entry_falls_back_with_the_reason(tmp_path, monkeypatch):
    from pyc_lab.kernels import matmul as mm
    from pyc_lab.kernels.tuning import database as tuning_db

    device = tuning_db.DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    monkeypatch.setattr(mm, "device_key", lambda index=0: (device, 90, 132))
    with tuning_db.TuningDB() as db:  # an entry this pyc_lab cannot build
        db.record(device, tuning_db.ProblemKey("gemm", "f16", "f16", "f16", "tn",
                                               256, 256, 256),
                  tuning_db.Measurement({"tile": [1, 2, 3]}, "ok", 0.01))
    mm.forget()
    kernel, why = mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert kernel is None and "unusable" in why and "not a CUTLASS GEMM config" in why

    def broken_load(*args):
        raise OSError("kernel.so: invalid ELF header")

    monkeypatch.setattr(mm, "_load", broken_load)
    mm.forget()
    kernel, why = mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert kernel is None and "OSError: kernel.so: invalid ELF header" in why

