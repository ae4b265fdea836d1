"""CUTLASS GEMM sources and builds, without a GPU: what ``cutlass_cppgen`` emits and what
``nvcc`` makes of it.

Every test here needs the CUDA toolkit's ``nvcc`` (sources need its version, builds run
it) and is marked ``nvcc``: ``tests/conftest.py`` skips them, with the reason, where there
is none. The configuration space, pruning and ranking, which need neither, are tested in
``test_configurations.py``.
"""

from __future__ import annotations

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass import config

pytest.importorskip("cutlass_library", reason="nvidia-cutlass is not installed")

pytestmark = pytest.mark.nvcc


@pytest.fixture(scope="module")
def f16_tn():
    return cg.configurations("f16", "tn")


def test_configurations_come_from_cutlass_cppgen(f16_tn):
    assert sorted(config.live_configurations("f16", "tn"), key=lambda c: c.id) == f16_tn
    assert len(f16_tn) > 40
    assert len({c.id for c in f16_tn}) == len(f16_tn)
    kinds = {c.kernel_schedule for c in f16_tn}
    assert {"TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"} <= kinds
    assert {c.tile_scheduler for c in f16_tn} == {"Default", "StreamK"}
    assert all(cg.GemmConfig.from_dict(c.to_dict()) == c for c in f16_tn)
    assert len(cg.configurations("bf16", "nt")) > 40


def test_a_config_cutlass_cppgen_does_not_offer_is_a_clear_error():
    fake = cg.GemmConfig((96, 96, 32), (1, 1, 1), "Nope", "Nope", "Default")
    with pytest.raises(PycLabError, match="not one of cutlass_cppgen's configurations"):
        cg.emit_source(fake)


def test_emitted_source_is_deterministic_and_complete(f16_tn):
    cfg = cg.rank(cg.prune(f16_tn, 1024, 1024, 1024)[0], 1024, 1024, 1024, 132)[0]
    src = cg.emit_source(cfg)
    assert src == cg.emit_source(cfg)
    for needle in ("CollectiveBuilder", "GemmUniversalAdapter", "pyc_run", "pyc_initialize",
                   "pyc_can_implement", "cutlass::half_t", cfg.id):
        assert needle in src
    bf = cg.emit_source(cg.configurations("bf16", "tn")[0], "bf16", "tn")
    assert "cutlass::bfloat16_t" in bf and "cutlass::half_t" not in bf


def test_float32_sources_tf32_tensor_cores_and_simt():
    tf32 = cg.configurations("tf32", "tn")
    src = cg.emit_source(cg.rank(cg.prune(tf32, 1024, 1024, 1024, "tn", "tf32")[0],
                                 1024, 1024, 1024, 132)[0], "tf32", "tn")
    assert "CollectiveBuilder" in src and "tf32gemm" in src and "hw_info" in src
    (simt,) = cg.configurations("f32", "tn")
    src = cg.emit_source(simt, "f32", "tn")
    assert "OpClassSimt" in src and "GemmCoord(M, N, K)" in src and "hw_info" not in src
    with pytest.raises(PycLabError, match="TMA epilogue schedule"):
        cg.emit_source(simt, "f32", "tn", epilogue=cg.Epilogue(bias=True))


def test_fused_epilogue_sources(f16_tn):
    epi = cg.Epilogue(bias=True, activation="gelu")
    kept, _ = cg.prune(f16_tn, 4096, 4096, 4096, "tn", "f16", epi)
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
