"""The skinny GEMM on a GPU: every configuration family against a float64 reference, on
fresh random inputs (never zeros) into NaN-poisoned outputs, odd M and N, long and short
K, split k launched repeatedly (deterministic), alpha/beta, special values, refusals; the
tuner measuring it beside the libraries, and pl.matmul running a tuned win."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels import matmul as mm
from pyc_lab.kernels import skinny as sk
from pyc_lab.kernels.arrays import bf16_dtype
from pyc_lab.kernels.matmul_route import tuned_verdict

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

EPS = {"f16": 2.0 ** -10, "bf16": 2.0 ** -7}
NAMES = {"f16": "float16", "bf16": "bfloat16"}


def rand(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> tuple:
    """A CuPy array uniform in [-1, 1] and its exact values as float64."""
    host = rng.uniform(-1, 1, shape).astype(bf16_dtype() if dtype == "bf16" else np.float16)
    dev = cp.asarray(host.view(np.uint16)).view(cp.dtype(NAMES[dtype]))
    return dev, host.astype(np.float64)


def poisoned(shape: tuple[int, ...], dtype: str) -> object:
    out = cp.empty(shape, dtype=cp.dtype(NAMES[dtype]))
    out.view(cp.uint16).fill(0x7E00 if dtype == "f16" else 0x7FC0)  # NaN
    return out


def to64(y: object) -> np.ndarray:
    host = cp.asnumpy(y.view(cp.uint16))
    return host.view(bf16_dtype() if y.dtype.name == "bfloat16" else np.float16) \
        .astype(np.float64)


def check(got: object, want: np.ndarray, dtype: str, k: int) -> None:
    g = to64(got)
    assert np.isfinite(g).all(), "NaN or Inf in the result (the poison survived?)"
    err = float(np.abs(g - want).max()) / max(float(np.abs(want).max()), 1e-3)
    tol = 2 * EPS[dtype] + k * 2.0 ** -22
    assert err <= tol, f"max error {err:.3g} > {tol:.3g} ({dtype}, K={k})"


CASES = [  # (m, n, k, config)
    (1, 4096, 4096, sk.SkinnyConfig(1, 8, 4)),
    (7, 4099, 4096, sk.SkinnyConfig(2, 4, 6)),
    (8, 1, 72, sk.SkinnyConfig(1, 4, 4)),
    (13, 1000, 8200, sk.SkinnyConfig(4, 4, 3, 2)),
    (16, 257, 2056, sk.SkinnyConfig(2, 8, 3)),
    (33, 513, 4104, sk.SkinnyConfig(4, 4, 2, 2)),
    (64, 640, 1024, sk.SkinnyConfig(2, 4, 4)),
    (5, 12345, 8, sk.SkinnyConfig(8, 4, 3)),
    # the GEMV form: rows per warp, warps, pieces in flight; a K tail inside a step
    (1, 4096, 4096, sk.SkinnyConfig(1, 8, 4, 1, "gemv")),
    (3, 4099, 4104, sk.SkinnyConfig(2, 4, 8, 1, "gemv")),
    (8, 1, 72, sk.SkinnyConfig(4, 8, 2, 1, "gemv")),
    (5, 12345, 8, sk.SkinnyConfig(4, 4, 4, 1, "gemv")),
    (2, 1000, 8200, sk.SkinnyConfig(2, 8, 8, 1, "gemv")),
]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize(("m", "n", "k", "cfg"), CASES)
def test_skinny_gemm_matches_float64(m, n, k, cfg, dtype):
    rng = np.random.default_rng()
    a, a64 = rand((m, k), dtype, rng)
    w, w64 = rand((n, k), dtype, rng)
    out = poisoned((m, n), dtype)
    gemm = sk.SkinnyGemm(cfg, dtype)
    assert gemm.can_implement(m, n, k)
    gemm(a, w.T, out)
    check(out, a64 @ w64.T, dtype, k)
    first = out.copy()
    out.view(cp.uint16).fill(0x7E00)
    gemm(a, w.T, out)  # the split counters were reset: the same bits again
    assert bool((out.view(cp.uint16) == first.view(cp.uint16)).all())


def test_every_tuner_candidate_is_right_for_a_decode_shape():
    rng = np.random.default_rng()
    m, n, k = 9, 1031, 4096
    a, a64 = rand((m, k), "bf16", rng)
    w, w64 = rand((n, k), "bf16", rng)
    cands = sk.candidates(m, n, k)
    assert not sk.compile_kernels("bf16", m, cands)
    for cfg in cands:
        out = poisoned((m, n), "bf16")
        sk.SkinnyGemm(cfg, "bf16")(a, w.T, out)
        check(out, a64 @ w64.T, "bf16", k)


def test_every_gemv_candidate_is_right_for_few_rows():
    rng = np.random.default_rng()
    for m in (1, 2, 6):
        n, k = 1031, 2056
        a, a64 = rand((m, k), "f16", rng)
        w, w64 = rand((n, k), "f16", rng)
        cands = [c for c in sk.candidates(m, n, k) if c.form == "gemv"]
        assert cands and not sk.compile_kernels("f16", m, cands)
        for cfg in cands:
            out = poisoned((m, n), "f16")
            sk.SkinnyGemm(cfg, "f16")(a, w.T, out)
            check(out, a64 @ w64.T, "f16", k)


@pytest.mark.parametrize("cfg", [sk.SkinnyConfig(2, 4, 4), sk.SkinnyConfig(2, 4, 4, 1, "gemv")],
                         ids=lambda c: c.id)
def test_alpha_beta_and_special_values(cfg):
    rng = np.random.default_rng()
    m, n, k = 6, 300, 512
    a, a64 = rand((m, k), "f16", rng)
    w, w64 = rand((n, k), "f16", rng)
    c, c64 = rand((m, n), "f16", rng)
    gemm = sk.SkinnyGemm(cfg, "f16")
    gemm(a, w.T, c, alpha=0.5, beta=-2.0)
    check(c, 0.5 * (a64 @ w64.T) - 2.0 * c64, "f16", k)
    # beta == 0 never reads out: NaN there does not leak; NaN / Inf inputs propagate
    a[2, 7] = cp.nan
    w[5, 100] = cp.inf
    out = poisoned((m, n), "f16")
    gemm(a, w.T, out)
    got = to64(out)
    a64[2, 7], w64[5, 100] = np.nan, np.inf
    with np.errstate(invalid="ignore"):
        want = a64 @ w64.T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    ok = np.isfinite(want)
    assert np.abs(got[ok] - want[ok]).max() / np.abs(want[ok]).max() < 4 * EPS["f16"]


def test_launches_on_two_streams_do_not_share_the_split_workspace():
    rng = np.random.default_rng()
    m, n, k = 4, 2048, 16384
    gemm = sk.SkinnyGemm(sk.SkinnyConfig(1, 8, 4, 2), "bf16")
    pairs = [(rand((m, k), "bf16", rng), rand((n, k), "bf16", rng)) for _ in range(2)]
    outs = [poisoned((m, n), "bf16") for _ in range(2)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    for _ in range(5):
        for ((a, _), (w, _)), out, s in zip(pairs, outs, streams, strict=True):
            gemm(a, w.T, out, stream=s)
    for s in streams:
        s.synchronize()
    for ((_, a64), (_, w64)), out in zip(pairs, outs, strict=True):
        check(out, a64 @ w64.T, "bf16", k)


def test_it_refuses_what_it_cannot_run():
    rng = np.random.default_rng()
    a, _ = rand((8, 512), "f16", rng)
    w, _ = rand((256, 512), "f16", rng)
    gemm = sk.SkinnyGemm(sk.SkinnyConfig(1, 8, 4), "f16")
    with pytest.raises(PycLabError, match="F-contiguous b"):
        gemm(a, cp.ascontiguousarray(w.T), poisoned((8, 256), "f16"))
    shifted = cp.empty(8 * 512 + 4, dtype=cp.float16)[4:].reshape(8, 512)  # 8 bytes off
    shifted[...] = a
    with pytest.raises(PycLabError, match="16-byte aligned"):
        gemm(shifted, w.T, poisoned((8, 256), "f16"))
    with pytest.raises(PycLabError, match="no bias"):
        gemm(a, w.T, poisoned((8, 256), "f16"), bias=cp.zeros(256, dtype=cp.float16))
    big, _ = rand((65, 512), "f16", rng)
    with pytest.raises(PycLabError, match="1 to 64 rows"):
        gemm(big, w.T, poisoned((65, 256), "f16"))


def test_the_tuner_measures_it_and_matmul_runs_a_win(tmp_path, monkeypatch):
    """N odd: no CUTLASS kernel takes it, the skinny GEMM does; the libraries are timed in
    the same run and pl.matmul follows the verdict, computing right either way."""
    from pyc_lab.kernels.tuning import database as tuning_db

    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    mm.forget()
    res = pl.autotune_gemm(7, 4099, 4096, dtype="bf16", repeats=5, lt_search=False)
    assert len(res.table) == len(sk.candidates(7, 4099, 4096))
    assert set(res.table.status) == {"ok"}, res.table
    assert res.best is not None and sk.is_skinny(res.best.config)
    assert res.stopped_by == "no CUTLASS candidates"
    assert {"cublas"} <= set(res.baselines)
    rng = np.random.default_rng()
    a, a64 = rand((7, 4096), "bf16", rng)
    w, w64 = rand((4099, 4096), "bf16", rng)
    y = pl.matmul(a, w.T)
    choice = dict(mm.last_choice)
    # pl.matmul follows the never-slower verdict on the run's own times (a win by less
    # than the margin goes to the library too)
    wins, why = tuned_verdict(res.best.time_ms, "exact", res.baselines)
    if wins:
        assert choice["impl"] == "skinny" and "beat" in choice["reason"], choice
        assert choice["config"] == res.winner.split(":", 1)[1]
    else:
        assert choice["impl"] != "skinny" and why in choice["reason"], choice
    check(y, a64 @ w64.T, "bf16", 4096)
    # torch tensors take the same route, on torch's stream
    torch = pytest.importorskip("torch")
    at, wt = torch.from_dlpack(a), torch.from_dlpack(w)
    with torch.cuda.stream(torch.cuda.Stream()):
        yt = pl.matmul(at, wt.T)
        torch.cuda.current_stream().synchronize()
    assert isinstance(yt, torch.Tensor)
    check(cp.from_dlpack(yt), a64 @ w64.T, "bf16", 4096)
    mm.forget()


def test_prepare_compiles_skinny_winners(tmp_path, monkeypatch):
    from pyc_lab.kernels.tuning import database as tuning_db
    from pyc_lab.kernels.tuning.keys import Measurement, ProblemKey, device_key

    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    device, _cc, _sm = device_key()
    cfg = sk.SkinnyConfig(2, 8, 3)
    with tuning_db.TuningDB() as db:
        p = ProblemKey("gemm", "f16", "f16", "f16", "tn", 24, 4096, 4096)
        db.record_many(device, p, [Measurement(cfg.to_dict(), "ok", 0.01),
                                   Measurement({"baseline": "cublas"}, "baseline", 0.02)])
        db.set_winner(device, p, Measurement(cfg.to_dict(), "ok", 0.01).config_id)
    rows = pl.kernels.prepare(dtype="f16")
    assert list(rows.status) == ["compiled"] and list(rows.config) == [cfg.id]
