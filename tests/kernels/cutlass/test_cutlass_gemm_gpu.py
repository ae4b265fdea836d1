"""CUTLASS GEMMs on a GPU: built kernels against cuBLAS and float32, poisoned outputs,
re-bound pointers, autotuning end to end and ``pyc_lab.matmul`` using the winner.

The kernels these tests build go to one kernel cache per session, in
``$PYC_LAB_TEST_KERNEL_CACHE`` when set: ``python tests/kernels/cutlass/test_cutlass_gemm_gpu.py
DIR`` builds them all there without a GPU (nvcc only), so that the GPU lane can bring
them along instead of spending device minutes in nvcc. The cache verifies every entry
by hash; a toolchain that differs simply misses and rebuilds.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass import nvcc as cutlass_build
from pyc_lab.kernels.tuning import database as tuning_db
from pyc_lab.kernels.tuning.gemm_reference import (
    TOLERANCE,
    as_float32,
    bias_input,
    gemm_inputs,
    reference,
)

cp = pytest.importorskip("cupy")
pytest.importorskip("cutlass_library")
# the kernels are built with nvcc, and nvcc's version is part of every kernel-cache key
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

#: The SM count the kernels are ranked for: the H200's, where the GPU lane runs (the
#: prebuilt cache must hold what the tuner picks there).
SMS = 132
CASES = [("f16", "tn"), ("bf16", "tn"), ("f16", "nt"), ("tf32", "tn"), ("f32", "tn"),
         ("f32", "nt")]
#: Fused epilogues (dtype, bias, activation) built and checked against float64.
EPILOGUES = [("f16", True, "gelu"), ("bf16", False, "relu"), ("f16", True, "silu"),
             ("f16", True, None)]


def planned_builds() -> list[tuple]:
    """Every (config, dtype, layout, epilogue) these tests build, as they choose them."""
    plain = [(cg.rank(cg.prune(cg.configurations(dt, lay), 384, 256, 512, lay, dt)[0],
                      384, 256, 512, SMS)[0], dt, lay, cg.Epilogue()) for dt, lay in CASES]
    fused = []
    for dt, bias, act in EPILOGUES:
        epi = cg.Epilogue(bias, act)
        fused.append((cg.rank(cg.prune(cg.configurations(dt, "tn"), 384, 256, 512, "tn", dt,
                                       epi)[0], 384, 256, 512, SMS)[0], dt, "tn", epi))
    tuned = []  # what autotune_gemm(256, 384, 512, ...) below builds (SMS)
    for epi, count in ((cg.Epilogue(), 3), (cg.Epilogue(True, "gelu"), 2)):
        kept = cg.prune(cg.configurations("f16", "tn"), 256, 384, 512, "tn", "f16", epi)[0]
        tuned += [(c, "f16", "tn", epi) for c in cg.rank(kept, 256, 384, 512, SMS)[:count]]
    # and notebook 03's live cell: AutotuneWidget(2048, 2048, 2048, "f16", max_candidates=4)
    kept = cg.prune(cg.configurations("f16", "tn"), 2048, 2048, 2048, "tn", "f16")[0]
    notebook = [(c, "f16", "tn", cg.Epilogue()) for c in cg.rank(kept, 2048, 2048, 2048,
                                                                  SMS)[:4]]
    # Stream-K at 1024^3 (its workspace reset before every launch)
    kept = cg.prune(cg.configurations("f16", "tn"), 1024, 1024, 1024, "tn", "f16",
                    stream_k=True)[0]
    stream_k = [(c, "f16", "tn", cg.Epilogue()) for c in cg.rank(kept, 1024, 1024, 1024, SMS)
                if c.tile_scheduler == "StreamK"][:2]
    return plain + fused + tuned + notebook + stream_k


def prebuild(directory: str) -> None:
    """Build :func:`planned_builds` into ``directory`` (no GPU needed)."""
    import concurrent.futures as cf

    cache = KernelCache(directory)
    jobs = list(dict.fromkeys(planned_builds()))
    with cf.ThreadPoolExecutor(max(1, min(4, (os.cpu_count() or 2)))) as pool:
        results = pool.map(lambda j: cg.build(j[0], j[1], j[2], cache=cache, epilogue=j[3]),
                           jobs)
        for (c, dt, lay, e), res in zip(jobs, results, strict=True):
            print(res.status, dt, lay, e.name or "plain", c.id, res.message[:200], flush=True)


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """The session's kernel cache (``$PYC_LAB_TEST_KERNEL_CACHE`` or a temporary one)."""
    return KernelCache(os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
                       or tmp_path_factory.mktemp("kernels"))


@pytest.fixture(scope="module")
def kernels(kernel_cache):
    """One top-ranked kernel per case, built in parallel."""
    cache = kernel_cache
    futures = {}
    for dtype, layout in CASES:
        cfg = cg.rank(cg.prune(cg.configurations(dtype, layout), 384, 256, 512, layout,
                               dtype)[0], 384, 256, 512, SMS)[0]
        futures[(dtype, layout)] = cg.build_many([cfg], dtype, layout, cache=cache,
                                                 workers=1)[cfg]
    out = {}
    for case, fut in futures.items():
        res = fut.result()
        assert res.ok, res.message
        out[case] = cg.CutlassGemm(res.library, res.config, *case)
    return out


@pytest.fixture(scope="module")
def fused_kernels(kernel_cache):
    """One top-ranked 'tn' kernel per fused epilogue, built in parallel."""
    cache = kernel_cache
    futures = {}
    for dtype, bias, act in EPILOGUES:
        epi = cg.Epilogue(bias, act)
        cfg = cg.rank(cg.prune(cg.configurations(dtype, "tn"), 384, 256, 512, "tn", dtype,
                               epi)[0], 384, 256, 512, SMS)[0]
        futures[(dtype, bias, act)] = (epi, cg.build_many([cfg], dtype, "tn", cache=cache,
                                                          workers=1, epilogue=epi)[cfg])
    out = {}
    for case, (epi, fut) in futures.items():
        res = fut.result()
        assert res.ok, res.message
        out[case] = cg.CutlassGemm(res.library, res.config, case[0], "tn", epilogue=epi)
    return out


def max_rel_err(got, want):
    got = cp.asnumpy(got.astype(cp.float32)).astype(np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_float32_and_cublas(kernels, case):
    dtype, layout = case
    gemm = kernels[case]
    m, n, k = 384, 256, 512
    seed = int(np.random.default_rng().integers(1_000_000))
    a, b, out = gemm_inputs(m, n, k, dtype, layout, seed=seed)
    assert gemm.can_implement(m, n, k)
    gemm(a, b, out)  # out is NaN-poisoned by gemm_inputs
    got = as_float32(out, dtype)
    want = cp.asnumpy(as_float32(a, dtype)).astype(np.float64) @ \
        cp.asnumpy(as_float32(b, dtype)).astype(np.float64)
    assert bool(cp.isfinite(got).all())
    assert max_rel_err(got, want) < TOLERANCE[dtype]
    ref, _, _ = reference(a, b, dtype)  # cuBLAS (through torch for bf16)
    assert max_rel_err(got, cp.asnumpy(ref)) < TOLERANCE[dtype]


def act64(h, act):
    if act == "relu":
        return np.maximum(h, 0)
    if act == "gelu":
        return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    if act == "silu":
        return h / (1 + np.exp(-h))
    return h


@pytest.mark.parametrize("case", EPILOGUES)
def test_fused_epilogue_matches_float64(fused_kernels, case):
    dtype, has_bias, act = case
    gemm = fused_kernels[case]
    m, n, k = 384, 256, 512
    seed = int(np.random.default_rng().integers(1_000_000))
    a, b, out = gemm_inputs(m, n, k, dtype, "tn", seed=seed)
    bias = bias_input(n, dtype, seed + 1) if has_bias else None
    gemm(a, b, out, bias=bias)
    h = cp.asnumpy(as_float32(a, dtype)).astype(np.float64) @ \
        cp.asnumpy(as_float32(b, dtype)).astype(np.float64)
    if has_bias:
        h = h + cp.asnumpy(as_float32(bias, dtype)).astype(np.float64)
    got = as_float32(out, dtype)
    assert bool(cp.isfinite(got).all())
    assert max_rel_err(got, act64(h, act)) < TOLERANCE[dtype]
    if has_bias:
        with pytest.raises(pl.PycLabError, match="needs a contiguous bias"):
            gemm(a, b, out)  # the bias is required
    else:
        with pytest.raises(pl.PycLabError, match="no bias epilogue"):
            gemm(a, b, out, bias=out[0])


def test_rebinding_alpha_beta_and_wrong_layouts(kernels):
    gemm = kernels[("f16", "tn")]
    m, n, k = 384, 256, 512
    for seed in (1, 2):  # new pointers each time: re-bound
        a, b, out = gemm_inputs(m, n, k, "f16", "tn", seed)
        c = cp.asarray(np.random.default_rng(seed).uniform(-1, 1, (m, n)).astype(np.float16))
        gemm(a, b, out, c=c, alpha=0.5, beta=2.0)
        want = 0.5 * (cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)) \
            + 2.0 * cp.asnumpy(c).astype(np.float64)
        assert max_rel_err(out, want) < TOLERANCE["f16"]
    out2 = cp.full_like(out, cp.nan)
    gemm.bind(a, b, out2)
    gemm.launch(cp.cuda.get_current_stream().ptr)  # the bound problem, nothing checked
    assert bool(cp.isfinite(out2).all())
    out3 = cp.full_like(out, cp.nan)
    gemm(a, b, out3)
    graph = gemm.capture()  # one launch of the bound problem, replayed
    out3.fill(cp.nan)
    graph.launch()
    cp.cuda.get_current_stream().synchronize()
    assert max_rel_err(out3, cp.asnumpy(a).astype(np.float64) @
                       cp.asnumpy(b).astype(np.float64)) < TOLERANCE["f16"]
    with pytest.raises(pl.PycLabError, match="built for layout 'tn'"):
        gemm(a.T.copy().T, b, out)  # a column-major a does not fit a 'tn' kernel
    with pytest.raises(pl.PycLabError, match="do not fit together"):
        gemm(a, b, cp.empty((m, n + 8), dtype=cp.float16))


def _record_win(db: Any, res: Any) -> None:
    """A later run of the same problem in which the tuned winner beat every library: what
    pl.matmul needs to route to a CUTLASS kernel under the never-slower rule."""
    best = res.best
    with db:
        db.record_many(res.device, res.problem, [
            tuning_db.Measurement(best.config, "ok", 0.5 * best.time_ms),
            *(tuning_db.Measurement({"baseline": name}, "baseline", 2.0 * best.time_ms)
              for name in ("cublas", "cublaslt", "torch"))], run_id="forced-win")


def test_autotune_records_and_matmul_uses_the_winner(tmp_path, monkeypatch, kernel_cache):
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "tuning.sqlite")
    seen = []
    res = pl.autotune_gemm(256, 384, 512, dtype="f16", layout="tn", max_candidates=3,
                           budget_s=300, repeats=5, observer=seen.append,
                           cache=kernel_cache, lt_search=False)
    assert res.best is not None and res.best.ok, res.table
    assert len(res.table) == 3 and len(seen) >= 3
    assert set(res.table.status) <= {"ok", "compile_error", "wrong_result", "nan", "skipped"}
    cmp = res.compare()
    assert list(cmp.kernel[:2]) == ["tuned CUTLASS", "cublas"]
    assert (cmp.ms[:2] > 0).all()
    db = tuning_db.TuningDB(tmp_path / "tuning.sqlite")
    assert db.best(res.device, res.problem).config_id == res.best.config_id
    # pl.matmul follows the run's verdict: the tuned kernel only where it beat the library
    monkeypatch.setattr(cutlass_build, "KernelCache", lambda *a, **k: kernel_cache)
    a, b, _ = gemm_inputs(256, 384, 512, "f16", "tn", 7)
    y = pl.matmul(a, b)
    choice = dict(pl.kernels.matmul.last_choice)
    if res.winner.startswith("cutlass"):
        assert choice["impl"] == "cutlass" and "beat" in choice["reason"], choice
    else:
        assert choice["impl"] != "cutlass" and "lost to" in choice["reason"], choice
    assert max_rel_err(y, cp.asnumpy(cp.matmul(a, b).astype(cp.float32))) < 5e-3
    # a run in which the tuned kernel won routes pl.matmul to it, and it computes right
    _record_win(db, res)
    pl.kernels.matmul.forget()
    y = pl.matmul(a, b)
    assert pl.kernels.matmul.last_choice["impl"] == "cutlass", pl.kernels.matmul.last_choice
    assert max_rel_err(y, cp.asnumpy(a).astype(np.float64) @
                       cp.asnumpy(b).astype(np.float64)) < TOLERANCE["f16"]
    # an untuned shape goes to cuBLAS and says why
    a2, b2, _ = gemm_inputs(128, 128, 64, "f16", "tn", 8)
    pl.matmul(a2, b2)
    assert pl.kernels.matmul.last_choice["impl"] == "cublas"
    assert "no tuned kernel" in pl.kernels.matmul.last_choice["reason"]
    # bias + gelu go through cuBLASLt's epilogue
    bias = cp.asarray(np.random.default_rng(3).uniform(-1, 1, 384).astype(np.float16))
    y3 = pl.matmul(a, b, bias=bias, activation="gelu")
    assert pl.kernels.matmul.last_choice["impl"] == "cublaslt"
    h = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64) + \
        cp.asnumpy(bias)
    want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    assert max_rel_err(y3, want) < 2e-2


def test_tuned_epilogue_serves_matmul_and_the_compiler(tmp_path, monkeypatch, kernel_cache):
    from pyc_lab.compiler.functions import gelu

    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "tuning.sqlite")
    monkeypatch.setattr(cutlass_build, "KernelCache", lambda *a, **k: kernel_cache)
    res = pl.autotune_gemm(256, 384, 512, dtype="f16", layout="tn", max_candidates=2,
                           budget_s=300, repeats=5, bias=True, activation="gelu")
    assert res.best is not None and res.problem.op == "gemm_bias_gelu", res.table
    assert "cublaslt" in res.baselines  # the library's fused epilogue, same run
    rng = np.random.default_rng()
    x = cp.asarray(rng.uniform(-1, 1, (256, 512)).astype(np.float16))
    w = cp.asarray(rng.uniform(-1, 1, (384, 512)).astype(np.float16))  # (N, K): 'tn'
    bias = cp.asarray(rng.uniform(-1, 1, 384).astype(np.float16))
    want = act64(cp.asnumpy(x).astype(np.float64) @ cp.asnumpy(w).astype(np.float64).T
                 + cp.asnumpy(bias), "gelu")
    _record_win(tuning_db.TuningDB(tmp_path / "tuning.sqlite"), res)  # route to CUTLASS
    pl.kernels.matmul.forget()
    y = pl.matmul(x, w.T, bias=bias, activation="gelu")
    choice = pl.kernels.matmul.last_choice
    assert (choice["impl"], choice["epilogue"]) == ("cutlass", "bias_gelu"), choice
    assert max_rel_err(y, want) < TOLERANCE["f16"]
    # the same problem without the epilogue was not tuned: cuBLAS
    pl.matmul(x, w.T)
    assert pl.kernels.matmul.last_choice["impl"] == "cublas"

    def layer(x, w, b):
        return gelu(x @ w.T + b)

    f = pl.compile(layer, backend="cupy")
    ex = f.explain(x, w, bias)
    row = ex.decisions[ex.decisions.choice == "cutlass"]
    assert len(row) == 1 and row.iloc[0].reason == "CUTLASS_TUNED", ex.decisions
    for _ in range(2):
        x2 = cp.asarray(rng.uniform(-1, 1, (256, 512)).astype(np.float16))
        out = f(x2, w, bias)
        want2 = act64(cp.asnumpy(x2).astype(np.float64) @ cp.asnumpy(w).astype(np.float64).T
                      + cp.asnumpy(bias), "gelu")
        assert max_rel_err(out, want2) < TOLERANCE["f16"]
    exe = f._last.runner  # the CupyExecutable: its CUTLASS step ran the tuned kernel
    (step,) = [s for s in exe._steps if type(s).__name__ == "_CutlassStep"]
    assert step.kernel is not None and step.kernel.epilogue.name == "bias_gelu"
    assert not exe._fallbacks, exe._fallbacks


def test_a_failing_candidate_never_stops_the_run(tmp_path, monkeypatch, kernel_cache):
    """One candidate fails to compile, one returns wrong numbers: both are recorded with
    their reasons and the third, correct one wins."""
    real_build, real_call = cutlass_build.build, cg.CutlassGemm.__call__
    real_launch = cg.CutlassGemm.launch
    kept = cg.prune(cg.configurations("f16", "tn"), 256, 384, 512, "tn", "f16")[0]
    broken, wrong, good = cg.rank(kept, 256, 384, 512, SMS)[:3]

    def build(cfg, *args, **kwargs):
        if cfg == broken:
            return cg.BuildResult(cfg, "", None, "compile_error", 0.1, "error: injected")
        return real_build(cfg, *args, **kwargs)

    def call(self, a, b, out, *args, **kwargs):
        real_call(self, a, b, out, *args, **kwargs)
        self.test_out = out
        if self.config == wrong:
            out[0, 0] = out[0, 0] + 100  # a wrong answer, finite
        return out

    def launch(self, stream_ptr=0):  # the tuner's second, watched launch of the bound call
        real_launch(self, stream_ptr)
        if self.config == wrong:
            self.test_out[0, 0] = self.test_out[0, 0] + 100

    monkeypatch.setattr(cutlass_build, "build", build)
    monkeypatch.setattr(cg.CutlassGemm, "__call__", call)
    monkeypatch.setattr(cg.CutlassGemm, "launch", launch)
    res = pl.autotune_gemm(256, 384, 512, dtype="f16", max_candidates=3, budget_s=300,
                           repeats=3, strategy="exhaustive", cache=kernel_cache,
                           db=tuning_db.TuningDB(tmp_path / "t.sqlite"))
    status = res.table.set_index("config").status
    assert status[broken.id] == "compile_error" and status[wrong.id] == "wrong_result"
    assert status[good.id] == "ok" and res.best is not None
    assert cg.GemmConfig.from_dict(res.best.config) == good
    msg = res.table.set_index("config").message
    assert "injected" in msg[broken.id] and "vs cuBLAS" in msg[wrong.id]


def test_stream_k_kernels_launch_again_and_again(tmp_path, kernel_cache):
    """A Stream-K kernel's fix-up barriers only count up: every launch (and every graph
    replay) must start from a freshly reset workspace."""
    res = pl.autotune_gemm(1024, 1024, 1024, dtype="f16", stream_k=True, max_candidates=2,
                           restrict=lambda c: c.tile_scheduler == "StreamK", repeats=5,
                           budget_s=300, hang_s=20, cache=kernel_cache, lt_search=False,
                           db=tuning_db.TuningDB(tmp_path / "t.sqlite"))
    assert len(res.table) == 2 and set(res.table.status) == {"ok"}, res.table
    cfg = cg.GemmConfig.from_dict(res.best.config)
    gemm = cg.CutlassGemm(cg.build(cfg, "f16", "tn", cache=kernel_cache).library, cfg)
    a, b, out = gemm_inputs(1024, 1024, 1024, "f16", "tn", 5)
    want = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    for _ in range(4):  # every launch reduces its splits from a fresh workspace
        out.fill(cp.nan)
        gemm(a, b, out)
        assert max_rel_err(out, want) < TOLERANCE["f16"]
    graph = gemm.capture()
    for _ in range(3):
        out.fill(cp.nan)
        graph.launch()
        cp.cuda.get_current_stream().synchronize()
        assert max_rel_err(out, want) < TOLERANCE["f16"]


def test_autotune_refuses_a_problem_no_kernel_can_align_to():
    """An odd K leaves f16 rows 2-byte aligned: no CUTLASS kernel (alignment 8, 4 or 2
    elements) loads them, so the tuner refuses and says why."""
    with pytest.raises(pl.PycLabError, match="no common alignment of 2 elements"):
        pl.autotune_gemm(256, 256, 251, dtype="f16")


if __name__ == "__main__":
    prebuild(sys.argv[1])
