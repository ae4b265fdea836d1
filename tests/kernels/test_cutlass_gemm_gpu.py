"""CUTLASS GEMMs on a GPU: built kernels against cuBLAS and float32, poisoned outputs,
re-bound pointers, autotuning end to end and ``pyc_lab.matmul`` using the winner."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import cutlass_gemm as cg
from pyc_lab.kernels import tuning_db
from pyc_lab.kernels.autotune import TOLERANCE, as_float32, gemm_inputs, reference
from pyc_lab.kernels.cache import KernelCache

cp = pytest.importorskip("cupy")
pytest.importorskip("cutlass_library")

pytestmark = pytest.mark.gpu

CASES = [("f16", "tn"), ("bf16", "tn"), ("f16", "nt")]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """One top-ranked kernel per case, built in parallel."""
    cache = KernelCache(tmp_path_factory.mktemp("kernels"))
    futures = {}
    for dtype, layout in CASES:
        cfg = cg.rank(cg.prune(cg.configurations(dtype, layout), 384, 256, 512, layout)[0],
                      384, 256, 512)[0]
        futures[(dtype, layout)] = cg.build_many([cfg], dtype, layout, cache=cache,
                                                 workers=1)[cfg]
    out = {}
    for case, fut in futures.items():
        res = fut.result()
        assert res.ok, res.message
        out[case] = cg.CutlassGemm(res.library, res.config, *case)
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
    with pytest.raises(pl.PycLabError, match="built for layout 'tn'"):
        gemm(a.T.copy().T, b, out)  # a column-major a does not fit a 'tn' kernel
    with pytest.raises(pl.PycLabError, match="do not fit together"):
        gemm(a, b, cp.empty((m, n + 8), dtype=cp.float16))


def test_autotune_records_and_matmul_uses_the_winner(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "tuning.sqlite")
    seen = []
    res = pl.autotune_gemm(256, 384, 512, dtype="f16", layout="tn", max_candidates=3,
                           budget_s=300, repeats=5, observer=seen.append,
                           cache=KernelCache(tmp_path / "kernels"))
    assert res.best is not None and res.best.ok, res.table
    assert len(res.table) == 3 and len(seen) >= 3
    assert set(res.table.status) <= {"ok", "compile_error", "wrong_result", "nan", "skipped"}
    cmp = res.compare()
    assert list(cmp.kernel[:2]) == ["tuned CUTLASS", "cublas"]
    assert (cmp.ms[:2] > 0).all()
    db = tuning_db.TuningDB(tmp_path / "tuning.sqlite")
    assert db.best(res.device, res.problem).config_id == res.best.config_id
    # pl.matmul finds the winner for this shape (the kernel is rebuilt from its cache)
    monkeypatch.setattr(cg, "KernelCache", lambda *a, **k: KernelCache(tmp_path / "kernels"))
    a, b, _ = gemm_inputs(256, 384, 512, "f16", "tn", 7)
    y = pl.matmul(a, b)
    assert pl.kernels.matmul.last_choice["impl"] == "cutlass", pl.kernels.matmul.last_choice
    assert max_rel_err(y, cp.asnumpy(cp.matmul(a, b).astype(cp.float32))) < 5e-3
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


def test_autotune_refuses_a_misaligned_problem():
    with pytest.raises(pl.PycLabError, match="multiple of 8"):
        pl.autotune_gemm(256, 256, 250, dtype="f16")
