"""CUTLASS GEMM configurations, pruning, ranking, sources and builds (no GPU needed;
the build test needs nvcc and nvidia-cutlass)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels import cutlass_gemm as cg
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
    with pytest.raises(PycLabError, match="dtype 'f32'"):
        cg.configurations("f32", "tn")
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
    # misaligned: K = 4099 is not a multiple of 8 for row-major A
    kept, dropped = cg.prune(f16_tn, 4096, 4096, 4099)
    assert not kept and all("multiple of 8" in why for why in dropped.values())
    # a tiny problem drops tiles far larger than its output
    small, dropped = cg.prune(f16_tn, 64, 64, 64)
    assert all(c.cta_tile[0] <= 128 and c.cta_tile[1] <= 128 for c in small)
    assert any("far larger" in why for why in dropped.values())


def test_rank_prefers_fitting_tiles_and_spreads_kinds(f16_tn):
    kept, _ = cg.prune(f16_tn, 4096, 4096, 4096)
    ranked = cg.rank(kept, 4096, 4096, 4096)
    assert sorted(c.id for c in ranked) == sorted(c.id for c in kept)
    assert ranked == cg.rank(list(reversed(kept)), 4096, 4096, 4096)  # deterministic
    top = ranked[:6]
    assert len({(c.cta_tile, c.kernel_schedule) for c in top}) >= 3
    # for 512^3, 132 SMs: small tiles (more CTAs) score above 256-wide ones
    small = cg.rank(cg.prune(f16_tn, 512, 512, 512)[0], 512, 512, 512)
    assert small[0].cta_tile[0] * small[0].cta_tile[1] <= 128 * 128
    assert cg.score(small[0], 512, 512, 512) > cg.score(ranked[0], 512, 512, 512)


def test_emitted_source_is_deterministic_and_complete(f16_tn):
    cfg = cg.rank(cg.prune(f16_tn, 1024, 1024, 1024)[0], 1024, 1024, 1024)[0]
    src = cg.emit_source(cfg)
    assert src == cg.emit_source(cfg)
    for needle in ("CollectiveBuilder", "GemmUniversalAdapter", "pyc_run", "pyc_initialize",
                   "pyc_can_implement", "cutlass::half_t", cfg.id):
        assert needle in src
    bf = cg.emit_source(cg.configurations("bf16", "tn")[0], "bf16", "tn")
    assert "cutlass::bfloat16_t" in bf and "cutlass::half_t" not in bf


def test_build_caches_and_records_failures(tmp_path, f16_tn):
    cache = KernelCache(tmp_path / "kernels")
    cfg = cg.rank(cg.prune(f16_tn, 256, 256, 256)[0], 256, 256, 256)[0]
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
    with pytest.raises(PycLabError, match="activation must be"):
        pl.matmul(a, b, activation="silu")


def test_autotune_without_a_gpu_says_why():
    from pyc_lab.runtime.gpu import cupy_status

    if cupy_status()[0] is not None:
        pytest.skip("a GPU is present: tests/kernels/test_cutlass_gemm_gpu.py tunes for real")
    with pytest.raises(PycLabError, match="needs a CUDA device"):
        pl.autotune_gemm(256, 256, 256)
