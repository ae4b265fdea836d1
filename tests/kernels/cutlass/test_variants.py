"""The wider GEMM space: variant configurations (alignment, swap, narrow tiles, split-K,
Stream-K, raster, swizzle), the per-problem choice of them, and their emitted C++.

The configurations and the per-problem space need neither a GPU nor nvcc; the emitted
sources need nvcc's version (``nvcc``-marked), and one test builds a variant kernel.
"""

from __future__ import annotations

import dataclasses

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.cutlass import config, variants
from pyc_lab.kernels.tuning.gemm_space import config_of, gemm_space, problem_configs

PLAIN = cg.GemmConfig((256, 256, 64), (2, 1, 1), "TmaWarpSpecializedCooperative",
                      "TmaWarpSpecializedCooperative", "Default")
SPLIT_SWAP = cg.GemmConfig((128, 16, 128), (1, 1, 1), "TmaWarpSpecializedCooperative",
                           "NoSmemWarpSpecialized", "StreamK", splits=4,
                           decomposition="SplitK", swap=True)
ALIGN2 = cg.GemmConfig((128, 128, 64), (1, 1, 1), "CpAsyncWarpSpecialized",
                       "NoSmemWarpSpecialized", "Default", alignment=2)


def test_plain_configs_keep_their_dicts_and_ids():
    d = PLAIN.to_dict()
    assert set(d) == {"tile", "cluster", "kernel_schedule", "epilogue_schedule",
                      "tile_scheduler"}
    assert PLAIN.id == "256x256x64_c2x1x1_TmaCoop_TmaCoop_Default"
    assert not PLAIN.is_variant and PLAIN.base == PLAIN


@pytest.mark.parametrize("cfg", [SPLIT_SWAP, ALIGN2,
                                 dataclasses.replace(PLAIN, raster="AlongN", swizzle=8)])
def test_variant_dicts_round_trip_and_name_themselves(cfg):
    assert cg.GemmConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.is_variant and not cfg.base.is_variant
    assert cg.GemmConfig.from_dict(cfg.base.to_dict()) == cfg.base
    assert cfg.id != cfg.base.id and cfg.id.startswith(cfg.base.id)
    assert SPLIT_SWAP.id.endswith("_SplitK4_swap") and ALIGN2.id.endswith("_a2")


@pytest.mark.parametrize("bad", [dict(alignment=3), dict(raster="Diagonal"),
                                 dict(swizzle=3), dict(splits=0),
                                 dict(decomposition="SplitK")])
def test_bad_variant_fields_are_clear_errors(bad):
    fields = dict(tile=(128, 128, 64), cluster=(1, 1, 1),
                  kernel_schedule="TmaWarpSpecializedCooperative",
                  epilogue_schedule="NoSmemWarpSpecialized", tile_scheduler="StreamK")
    with pytest.raises(PycLabError, match="GemmConfig"):
        cg.GemmConfig(**fields, **bad)
    with pytest.raises(PycLabError, match="StreamK tile scheduler"):
        cg.GemmConfig(**{**fields, "tile_scheduler": "Default"}, splits=2,
                      decomposition="SplitK")


def test_alignment_of_a_problem():
    assert config.problem_alignment(4096, 4096, 4096, "tn", "f16") == 8
    assert config.problem_alignment(1000, 1004, 1000, "tn", "bf16") == 4
    assert config.problem_alignment(1000, 1002, 998, "tn", "f16") == 2
    assert config.problem_alignment(1000, 1001, 999, "tn", "f16") == 0
    assert config.swapped_layout("tn") == "tn" and config.swapped_layout("nt") == "nt"
    assert config.swapped_layout("tt") == "nn"
    assert config.config_issue(ALIGN2, 1000, 1002, 998) == ""
    assert "cp.async" in config.config_issue(dataclasses.replace(PLAIN, alignment=2),
                                             1000, 1002, 998)
    assert "not a multiple of 8" in config.config_issue(PLAIN, 1000, 1002, 998)


def test_small_m_problems_get_swapped_narrow_tiles_and_split_k():
    ranked, _ = problem_configs(1, 4096, 4096, "f16", "tn")
    swapped = [c for c in ranked if c.swap]
    assert swapped and ranked[0].swap
    assert {c.cta_tile[1] for c in swapped} <= set(variants.NARROW_N)
    assert any(c.decomposition == "SplitK" for c in swapped)
    # a large problem gets none of the small-M kinds, but raster/swizzle variants
    big, _ = problem_configs(8192, 8192, 8192, "f16", "tn")
    assert not any(c.swap for c in big)
    assert any(c.raster != "Heuristic" or c.swizzle > 1 for c in big)


def test_few_tiles_and_long_k_get_split_k_and_stream_k():
    ranked, _ = problem_configs(256, 1024, 8192, "bf16", "tn")
    kinds = {c.decomposition for c in ranked if c.tile_scheduler == "StreamK"}
    assert {"SplitK", "StreamK", "Heuristic"} <= kinds
    assert all(c.splits * c.tile[2] * 2 <= 8192 for c in ranked if c.splits > 1)


def test_unaligned_extents_get_lower_alignment_kernels_only():
    ranked, dropped = problem_configs(1000, 1002, 998, "f16", "tn")
    assert ranked and all(c.alignment == 2 for c in ranked)
    assert all(c.kernel_schedule.startswith("CpAsync") for c in ranked)
    assert dropped
    none, _ = problem_configs(1000, 1001, 999, "f16", "tn")
    assert none == []
    plain, _ = problem_configs(1, 4096, 4096, "f16", "tn", wide=False)
    assert not any(c.is_variant for c in plain)


def test_fused_bias_epilogue_never_gets_swapped_kernels():
    ranked, _ = problem_configs(8, 4096, 4096, "f16", "tn", epilogue=cg.Epilogue(bias=True))
    assert ranked and not any(c.swap for c in ranked)


def test_the_space_covers_variant_fields():
    ranked, _ = problem_configs(16, 14336, 4096, "bf16", "tn")
    space = gemm_space(ranked)
    assert {"alignment", "raster", "swizzle", "splits", "decomposition", "swap"} <= \
        set(space.params)
    from pyc_lab.kernels.tuning.gemm_space import _NAMES, _key

    for cfg in ranked:
        assert config_of(dict(zip(_NAMES, _key(cfg), strict=True))) == cfg


@pytest.mark.nvcc  # cutlass_cppgen emits only with nvcc's version
def test_variant_sources_carry_their_scheduler_alignment_and_layout():
    pytest.importorskip("cutlass_library", reason="nvidia-cutlass is not installed")
    plain = cg.emit_source(PLAIN.base)
    assert "PYC_RASTER" not in plain and "args.scheduler" not in plain
    src = cg.emit_source(SPLIT_SWAP)
    assert "#define PYC_SPLITS 4" in src and "#define PYC_DECOMPOSITION 2" in src
    assert "#define PYC_STREAMK 1" in src and "args.scheduler.splits = PYC_SPLITS" in src
    assert "cutlass::gemm::StreamKScheduler" in src
    assert "cute::Shape<cute::_128, cute::_16, cute::_128>" in src
    assert "cutlass::half_t, cutlass::layout::ColumnMajor, 8,\n    cutlass::half_t, " \
           "cutlass::layout::ColumnMajor, 8,\n    cutlass::epilogue" in src  # C and D: C^T
    raster = cg.emit_source(dataclasses.replace(PLAIN, raster="AlongN", swizzle=4))
    assert "#define PYC_RASTER 2" in raster and "#define PYC_SWIZZLE 4" in raster
    assert "#define PYC_STREAMK 0" in raster
    a2 = cg.emit_source(ALIGN2, "bf16")
    assert "cutlass::bfloat16_t, cutlass::layout::RowMajor, 2," in a2
    assert "cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 2," in a2
    with pytest.raises(PycLabError, match="per-column bias"):
        cg.emit_source(SPLIT_SWAP, epilogue=cg.Epilogue(bias=True))


@pytest.mark.nvcc
def test_a_split_k_swapped_narrow_kernel_compiles(tmp_path):
    pytest.importorskip("cutlass_library", reason="nvidia-cutlass is not installed")
    from pyc_lab.kernels.cache import KernelCache

    res = cg.build(SPLIT_SWAP, "f16", "tn", cache=KernelCache(tmp_path))
    assert res.ok, res.message
    assert res.library.is_file()
