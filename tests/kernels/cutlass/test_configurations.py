"""The configuration space: from cutlass_cppgen where it is installed, else from the table
pyc_lab ships (so that notebooks and replays need no CUDA toolkit); pruning and ranking.

Only the check of the shipped table against cutlass_cppgen needs nvcc (marked ``nvcc``);
the rest runs on either source of configurations.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from pyc_lab.errors import DeviceUnavailableError, PycLabError
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.cutlass import config
from pyc_lab.paths import data_path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "make_cutlass_configurations.py"


@pytest.mark.nvcc  # cutlass_cppgen enumerates only with nvcc's version
def test_the_shipped_table_is_what_the_script_writes_from_cutlass_cppgen():
    pytest.importorskip("cutlass_library", reason="nvidia-cutlass is not installed")
    try:
        built = runpy.run_path(str(SCRIPT))["build"]()
    except DeviceUnavailableError as exc:
        pytest.skip(f"cutlass_cppgen cannot enumerate here: {exc}")
    shipped = json.loads(data_path("cutlass", "configurations.json").read_text())
    assert shipped == built, "run scripts/make_cutlass_configurations.py"


def test_without_cutlass_cppgen_the_shipped_table_answers(monkeypatch):
    def missing(*args, **kwargs):
        raise DeviceUnavailableError("CUTLASS kernels need nvidia-cutlass (no module)")

    monkeypatch.setattr(config, "live_configurations", missing)
    configs = cg.configurations("f16", "tn", 90)
    assert len(configs) > 40 and configs == sorted(configs, key=lambda c: c.id)
    kept, dropped = cg.prune(configs, 4096, 4096, 4096)
    assert kept and dropped
    assert cg.rank(kept, 4096, 4096, 4096, 132)[0].cta_tile[0] >= 128
    (simt,) = cg.configurations("f32", "tn", 90)
    assert simt.kernel_schedule
    with pytest.raises(PycLabError, match="sm_90 only"):
        cg.configurations("f16", "tn", 80)


# -- the space: configurations, pruning, ranking (cutlass_cppgen's or the shipped table) --
@pytest.fixture(scope="module")
def f16_tn():
    return cg.configurations("f16", "tn")


def test_the_space_has_every_kind_of_kernel(f16_tn):
    assert len(f16_tn) > 40
    assert len({c.id for c in f16_tn}) == len(f16_tn)
    kinds = {c.kernel_schedule for c in f16_tn}
    assert {"TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"} <= kinds
    assert {c.tile_scheduler for c in f16_tn} == {"Default", "StreamK"}
    assert all(cg.GemmConfig.from_dict(c.to_dict()) == c for c in f16_tn)
    tf32 = cg.configurations("tf32", "tn")
    assert len(tf32) > 40 and all(c.tile[2] == 32 for c in tf32)


def test_bad_dtype_layout_and_config_are_clear_errors():
    with pytest.raises(PycLabError, match="dtype 'f64'"):
        cg.configurations("f64", "tn")
    with pytest.raises(PycLabError, match="layout 'xx'"):
        cg.configurations("f16", "xx")
    with pytest.raises(PycLabError, match="not a CUTLASS GEMM config"):
        cg.GemmConfig.from_dict({"tile": [1, 2, 3]})


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


def test_alignment_is_per_dtype():
    # 4 float32 for TF32 tensor cores, none for SIMT
    assert "multiple of 4" in cg.problem_issue(64, 64, 66, "tn", "tf32")
    assert cg.problem_issue(64, 64, 66, "tn", "f32") == ""


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


def test_epilogues_name_their_op_and_fusion():
    e = cg.Epilogue(bias=True, activation="gelu")
    assert (e.name, e.op, e.fused) == ("bias_gelu", "gemm_bias_gelu", True)
    assert cg.Epilogue.from_op(e.op) == e and cg.Epilogue.from_op("gemm") == cg.Epilogue()
    assert cg.Epilogue(activation="silu").op == "gemm_silu"
    assert cg.Epilogue(bias=True).fusion_op("bf16") == \
        "cutlass::epilogue::fusion::LinCombPerColBias<cutlass::bfloat16_t, float>"
    with pytest.raises(PycLabError, match="not one of"):
        cg.Epilogue(activation="tanh")


def test_a_fused_epilogue_keeps_the_tma_epilogue_schedules(f16_tn):
    epi = cg.Epilogue(bias=True, activation="gelu")
    kept, dropped = cg.prune(f16_tn, 4096, 4096, 4096, "tn", "f16", epi)
    assert kept and all(c.epilogue_schedule.startswith("TmaWarpSpecialized") for c in kept)
    assert any("needs a TMA epilogue schedule" in why for why in dropped.values())
