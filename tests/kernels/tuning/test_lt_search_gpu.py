"""cuBLASLt's heuristic picks kept and run again, on a GPU: every pick the search returns
computes the product when run from its stored form (float64 reference, fresh random
inputs, NaN-poisoned outputs, odd extents, both dtypes, transposed layouts); a pick run
on pointers it does not take, or made by another cuBLASLt version, falls back to the
heuristic and still computes it; the tuner measures the picks beside the libraries and
pl.matmul runs a winning one directly (or the library when it lost), and computes right
either way."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import lt_algos
from pyc_lab.kernels import matmul as mm
from pyc_lab.kernels.lt_tuned import FAMILY, TunedLt
from pyc_lab.kernels.matmul_route import tuned_verdict
from pyc_lab.kernels.tuning import lt_candidates
from tests.kernels.test_skinny_gpu import NAMES, check, poisoned, rand

cp = pytest.importorskip("cupy")
pytest.importorskip("nvmath")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("m", "n", "k", "dtype", "w_rows"), [
    (16, 4096, 4096, "f16", True),     # a decode layer, w row-major (b = w.T)
    (64, 1000, 520, "bf16", True),     # extents not multiples of 16
    (300, 256, 2048, "bf16", False),   # b row-major K x N (layout "tt")
    (7, 4104, 1032, "f16", True),
])
def test_every_setting_the_search_returns_computes_the_product(m, n, k, dtype, w_rows):
    rng = np.random.default_rng()
    a, a64 = rand((m, k), dtype, rng)
    if w_rows:
        w, w64 = rand((n, k), dtype, rng)
        b, b64 = w.T, w64.T
    else:
        b, b64 = rand((k, n), dtype, rng)
    out = poisoned((m, n), dtype)
    found = lt_candidates.search(a, b, out, NAMES[dtype], top=6)
    assert found and all(isinstance(p, lt_algos.LtPick) for p in found)
    want = a64 @ b64
    for pick in found:
        stored = lt_algos.LtPick.from_dict(pick.to_dict())  # as the database gives it back
        y = poisoned((m, n), dtype)
        kernel = TunedLt(stored, dtype)
        kernel(a, b, y)
        check(y, want, dtype, k)
        g = kernel.gemm(a, b, y)
        assert set(g.algorithms.values()) == {pick.algo_id}  # the pick ran, not a fallback
        kernel(a, b, y)  # again into its own result: the same answer
        check(y, want, dtype, k)


def test_a_pick_on_pointers_it_does_not_take_or_of_another_version_falls_back():
    import dataclasses

    rng = np.random.default_rng()
    m, n, k = 33, 2048, 1024
    a, a64 = rand((m, k + 1), "f16", rng)
    w, w64 = rand((n, k), "f16", rng)
    out = poisoned((m, n), "f16")
    pick = lt_candidates.search(a[:, :k].copy(), w.T, out, "float16", top=1)[0]
    # a view starting one element in: 2-byte aligned rows of a 2-byte aligned pointer
    view = a[:, 1:]
    y = poisoned((m, n), "f16")
    TunedLt(pick, "f16")(view, w.T, y)
    check(y, a64[:, 1:] @ w64.T, "f16", k)
    old = dataclasses.replace(pick, version=pick.version - 1)
    y = poisoned((m, n), "f16")
    TunedLt(old, "f16")(a[:, :k].copy(), w.T, y)
    check(y, a64[:, :k] @ w64.T, "f16", k)


def test_the_tuner_measures_picks_and_matmul_follows_the_verdict(tmp_path, monkeypatch):
    from pyc_lab.kernels.tuning import database as tuning_db

    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    mm.forget()
    m, n, k = 64, 4096, 4096
    res = pl.autotune_gemm(m, n, k, dtype="bf16", cutlass=False, skinny=False, repeats=5,
                           budget_s=60)
    lt_rows = res.table[res.table.config.str.startswith("lt")]
    assert 1 <= len(lt_rows) <= lt_candidates.LT_TOP
    assert set(lt_rows.status) == {"ok"}, res.table
    assert {"cublas", "cublaslt"} <= set(res.baselines)
    assert res.best is not None and lt_algos.is_lt_algo(res.best.config)
    rng = np.random.default_rng()
    a, a64 = rand((m, k), "bf16", rng)
    w, w64 = rand((n, k), "bf16", rng)
    out = poisoned((m, n), "bf16")
    y = pl.matmul(a, w.T, out=out)
    choice = dict(mm.last_choice)
    # pl.matmul follows the never-slower verdict on the run's own times
    wins, why = tuned_verdict(res.best.time_ms, "exact", res.baselines)
    if wins:
        assert choice["impl"] == FAMILY and "beat" in choice["reason"], choice
        assert choice["config"] == res.winner.split(":", 1)[1]
    else:
        assert choice["impl"] != FAMILY and why in choice["reason"], choice
    assert y is out
    check(y, a64 @ w64.T, "bf16", k)
    y2 = pl.matmul(a, w.T)  # a new result, the memoised route
    check(y2, a64 @ w64.T, "bf16", k)
    # torch tensors take the same route, on torch's stream
    torch = pytest.importorskip("torch")
    at, wt = torch.from_dlpack(a), torch.from_dlpack(w)
    with torch.cuda.stream(torch.cuda.Stream()):
        yt = pl.matmul(at, wt.T)
        torch.cuda.current_stream().synchronize()
    check(cp.from_dlpack(yt), a64 @ w64.T, "bf16", k)
    mm.forget()
