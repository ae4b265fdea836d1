"""Replay: the real search strategies against recorded tuning runs, without a GPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.tuning import recording as replay
from pyc_lab.kernels.tuning.autotune import TuneResult, replay_autotune
from pyc_lab.paths import data_path
from pyc_lab.search import STRATEGIES
from tests.fakes.tuning_recording import CUBLAS_MS, SHAPE, TORCH_MS, write_recording

SHIPPED = data_path("tuning", replay.RECORDING)
ROWS = json.loads(SHIPPED.read_text())["rows"]

#: What an observer of autotune_gemm receives (its finish() row plus built/total).
OBSERVER_KEYS = {"config", "status", "ms", "tflops", "error", "build_s", "build", "message",
                 "tile", "cluster", "kernel_schedule", "epilogue_schedule", "tile_scheduler",
                 "built", "total"}


def _shipped_problems() -> dict[tuple, list[dict]]:
    """The shipped recording's GEMM candidate rows by (m, n, k, dtype, layout), read raw."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for row in ROWS:
        if row["op"] == "gemm" and row["status"] != "baseline":
            out[(row["m"], row["n"], row["k"], row["dtype_a"], row["layout"])].append(row)
    return dict(out)


SHIPPED_PROBLEMS = _shipped_problems()


@pytest.fixture
def synthetic(tmp_path):
    return write_recording(tmp_path / "synthetic.json")


def test_the_shipped_recording_is_package_data_and_lists_its_problems():
    assert replay.recording_path() == SHIPPED
    problems = replay.recorded_problems()
    assert problems.attrs["source"] == "h200-gemm.json (shipped with pyc_lab)"
    listed = {(r.m, r.n, r.k, r.dtype, r.layout): r for r in problems.itertuples()}
    assert set(listed) == set(SHIPPED_PROBLEMS)
    for key, rows in SHIPPED_PROBLEMS.items():
        row = listed[key]
        assert row.gpu_name == "NVIDIA H200"
        assert row.candidates == len({r["config_id"] for r in rows})
        assert row.ok == len({r["config_id"] for r in rows if r["status"] == "ok"})
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", row.recorded_on)
        assert row.recorded_on == max(r["recorded_at"] for r in rows)[:10]
        winner = [r for r in rows if r["is_winner"]]
        if winner:
            assert row.best_ms == pytest.approx(winner[0]["time_ms"])


def test_recorded_db_is_a_private_in_memory_copy():
    db = replay.recorded_db()
    assert db.in_memory and len(db) == len(ROWS)
    again = replay.recorded_db()
    assert len(again) == len(ROWS)  # nothing shared between the two


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("problem", sorted(SHIPPED_PROBLEMS),
                         ids=lambda p: "x".join(map(str, p[:3])) + f"-{p[3]}")
def test_each_strategy_finds_the_recorded_winner_or_a_near_one(problem, strategy):
    m, n, k, dtype, layout = problem
    fastest = min(r["time_ms"] for r in SHIPPED_PROBLEMS[problem] if r["status"] == "ok")
    res = pl.replay_autotune(m, n, k, dtype=dtype, layout=layout, strategy=strategy,
                             budget_s=60)
    assert isinstance(res, TuneResult) and isinstance(res, replay.ReplayResult)
    assert res.best is not None and res.best.ok
    assert res.best.time_ms <= 1.03 * fastest
    assert res.stopped_by in ("exhausted", "max_candidates")
    # every row of the table is a recorded measurement, not a new one
    recorded = {cg.GemmConfig.from_dict(r["config"]).id: r for r in SHIPPED_PROBLEMS[problem]}
    for row in res.table.itertuples():
        assert row.ms == pytest.approx(recorded[row.config]["time_ms"])
        assert row.build == "recorded" and row.build_s is None


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_strategies_on_a_larger_recording_with_failures(synthetic, strategy):
    res = replay_autotune(*SHAPE, dtype="f16", strategy=strategy, max_candidates=None,
                                 source=synthetic.path, seed=3)
    ranked_ok = sorted(synthetic.times.values())
    assert res.best.time_ms in ranked_ok[:3]  # the winner, or one of the next two
    if strategy in ("exhaustive", "successive_halving", "random"):
        assert res.best.time_ms == synthetic.fastest_ms
        assert len(res.table) == len(synthetic.configs)
    statuses = dict(zip(res.table.config, res.table.status, strict=True))
    for cfg, (status, _) in synthetic.failures.items():
        if cfg.id in statuses:
            assert statuses[cfg.id] == status


def test_max_candidates_keeps_the_best_ranked_like_the_live_tuner(synthetic):
    res = replay_autotune(*SHAPE, dtype="f16", strategy="exhaustive",
                                 max_candidates=5, source=synthetic.path)
    expected = {c.id for c in cg.rank(synthetic.configs, *SHAPE, 132)[:5]}
    assert set(res.table.config) == expected
    assert res.stopped_by == "exhausted"


def test_the_observer_gets_autotune_gemms_rows_failures_included(synthetic):
    seen = []
    replay_autotune(*SHAPE, dtype="f16", strategy="exhaustive", max_candidates=None,
                           source=synthetic.path, observer=seen.append)
    assert len(seen) == len(synthetic.configs)
    for row in seen:
        assert set(row) == OBSERVER_KEYS
        assert row["total"] == row["built"] == len(synthetic.configs)
    by_id = {row["config"]: row for row in seen}
    for cfg, (status, message) in synthetic.failures.items():
        row = by_id[cfg.id]
        assert (row["status"], row["message"], row["ms"], row["tflops"]) == (
            status, message, None, None)
        assert row["tile"] == list(cfg.tile) and row["cluster"] == list(cfg.cluster)
    for cfg, ms in synthetic.times.items():
        assert by_id[cfg.id]["ms"] == pytest.approx(ms)
        assert by_id[cfg.id]["tflops"] == pytest.approx(2 * 2048 ** 3 / (ms * 1e-3) / 1e12)


def test_baselines_come_from_the_recorded_baseline_rows(synthetic):
    res = replay_autotune(*SHAPE, dtype="f16", source=synthetic.path)
    assert res.baselines == {"cublas": pytest.approx(CUBLAS_MS),
                             "torch": pytest.approx(TORCH_MS)}
    cmp = res.compare().set_index("kernel")
    assert cmp.loc["tuned CUTLASS", "vs_cublas"] == pytest.approx(CUBLAS_MS / res.best.time_ms)
    assert cmp.loc["cublas", "pct_of_peak"] == pytest.approx(
        100 * 2 * 2048 ** 3 / (CUBLAS_MS * 1e-3) / 1e12 / 989.4)


def test_no_baseline_rows_give_no_baselines(tmp_path):
    rec = write_recording(tmp_path / "bare.json", baselines=False)
    res = replay_autotune(*SHAPE, dtype="f16", source=rec.path)
    assert res.baselines == {}
    assert list(res.compare()["kernel"]) == ["tuned CUTLASS"]
    for key in SHIPPED_PROBLEMS:  # the shipped recording: whatever its baseline rows say
        want = {r["config"]["baseline"]: r["time_ms"] for r in ROWS
                if r["status"] == "baseline" and (r["m"], r["n"], r["k"], r["dtype_a"],
                                                  r["layout"]) == key}
        got = replay_autotune(*key[:3], dtype=key[3], layout=key[4]).baselines
        assert got == pytest.approx(want)


def test_a_stop_event_ends_the_search_after_the_current_candidate(synthetic):
    stop = threading.Event()
    stop.set()
    res = replay_autotune(*SHAPE, dtype="f16", source=synthetic.path, stop=stop)
    assert res.stopped_by == "observer" and res.table.empty and res.best is None

    stop = threading.Event()
    seen = []

    def press_stop_after_three(row):
        seen.append(row)
        if len(seen) == 3:
            stop.set()

    res = replay_autotune(*SHAPE, dtype="f16", strategy="random", source=synthetic.path,
                                 stop=stop, observer=press_stop_after_three, pace_s=0.01)
    assert len(seen) == 3 and len(res.table) == 3 and res.stopped_by == "observer"


def test_a_candidate_recorded_as_hung_stops_the_search_as_it_did_live(tmp_path):
    rec = write_recording(tmp_path / "hung.json", hung=True)
    res = replay_autotune(*SHAPE, dtype="f16", strategy="exhaustive",
                                 max_candidates=None, source=rec.path)
    assert res.stopped_by == "observer"
    assert res.table.status.iloc[-1] == "timeout"
    assert len(res.table) < len(rec.configs)


def test_the_time_budget_counts_the_replays_own_seconds(synthetic):
    res = replay_autotune(*SHAPE, dtype="f16", strategy="exhaustive",
                                 max_candidates=None, source=synthetic.path, budget_s=0.12,
                                 pace_s=0.04)
    assert res.stopped_by == "max_seconds"
    assert 1 <= len(res.table) < len(synthetic.configs)
    assert replay_autotune(*SHAPE, dtype="f16", source=synthetic.path,
                                  budget_s=0).table.empty


def test_the_same_seed_replays_the_same_search(synthetic):
    def order(seed):
        rows = []
        replay_autotune(*SHAPE, dtype="f16", strategy="random", max_candidates=None,
                               source=synthetic.path, seed=seed, observer=rows.append)
        return [r["config"] for r in rows]

    assert order(1) == order(1)
    assert order(1) != order(2)


def test_a_problem_not_in_the_recording_lists_what_is():
    with pytest.raises(PycLabError) as err:
        pl.replay_autotune(1000, 1000, 1000, dtype="f16")
    text = str(err.value)
    assert "no recorded tuning of GEMM 1000x1000x1000 f16 tn" in text
    for m, n, k, dtype, layout in SHIPPED_PROBLEMS:
        assert f"{m}x{n}x{k} {dtype} {layout}" in text
    assert "pyc_lab.autotune_gemm" in text


def test_bad_input_is_a_clear_error(tmp_path, synthetic):
    with pytest.raises(PycLabError, match="m=0"):
        replay_autotune(0, 8, 8, dtype="f16")
    with pytest.raises(PycLabError, match="unknown search strategy 'greedy'"):
        replay_autotune(*SHAPE, dtype="f16", strategy="greedy", source=synthetic.path)
    with pytest.raises(PycLabError, match="max_candidates=0"):
        replay_autotune(*SHAPE, dtype="f16", max_candidates=0, source=synthetic.path)
    with pytest.raises(PycLabError, match="pace_s"):
        replay_autotune(*SHAPE, dtype="f16", pace_s=-1, source=synthetic.path)
    with pytest.raises(PycLabError, match="dtype 'f8'"):
        replay_autotune(*SHAPE, dtype="f8", source=synthetic.path)
    with pytest.raises(PycLabError, match="no tuning recording at"):
        replay_autotune(*SHAPE, dtype="f16", source=tmp_path / "nowhere.json")
    junk = tmp_path / "junk.json"
    junk.write_text('{"rows": 3}')
    with pytest.raises(PycLabError, match="not a pyc_lab tuning database export"):
        replay.recorded_problems(junk)


def test_the_result_says_it_is_a_replay_and_where_from(synthetic):
    res = pl.replay_autotune(4096, 4096, 4096, dtype="f16", strategy="exhaustive")
    info = res.replay
    assert info.gpu_name == "NVIDIA H200" and info.driver == "580.159.04"
    assert info.source == str(SHIPPED)
    assert info.label == f"recorded on NVIDIA H200, {info.recorded_on}"
    assert info.run_ids and all(info.run_ids)
    assert info.banner.startswith(f"replayed from a recording made on NVIDIA H200, "
                                  f"{info.recorded_on}")
    assert "no kernel runs here" in info.banner
    assert repr(res).startswith("ReplayResult(f16 tn 4096x4096x4096: best ")
    assert repr(res).endswith(f"; exhaustive, stopped by exhausted; {info.label})")
    assert set(res.compare()["source"]) == {info.label}
    assert res.compare().attrs["replay"] == info.banner
    assert res.recorded is False  # nothing was written to any tuning database

    other = replay_autotune(*SHAPE, dtype="f16", source=synthetic.path)
    assert other.replay.label == "recorded on NVIDIA H200, 2026-11-30"
    assert other.replay.source_label == str(synthetic.path)


def test_only_plain_gemms_are_listed_and_replayed(synthetic):
    problems = replay.recorded_problems(synthetic.path)
    assert [(r.dtype, r.m) for r in problems.itertuples()] == [("bf16", 1024), ("f16", 2048)]
    res = replay_autotune(*SHAPE, dtype="f16", source=synthetic.path)
    assert res.problem.op == "gemm" and "cublaslt" not in res.baselines
    assert len(replay.recorded_db(synthetic.path).measurements()) == 24 + 2 + 1 + 2


def test_recorded_results_hold_the_recorded_winners(synthetic):
    results = replay.recorded_results(synthetic.path)
    assert [r.problem.dtype_a for r in results] == ["bf16", "f16"]
    f16 = results[1]
    assert f16.best.time_ms == synthetic.fastest_ms
    assert f16.strategy == f16.stopped_by == "recorded"
    assert len(f16.table) == len(synthetic.configs)
    assert replay.recorded_results(synthetic.path, dtype="bf16")[0].problem.shape == (
        1024, 1024, 1024)
    one = replay.recorded_result(*SHAPE, dtype="f16", source=synthetic.path)
    assert one.best == f16.best and one.baselines == f16.baselines


def test_refresh_recording_script_checks_then_copies(tmp_path, synthetic):
    script = Path(__file__).resolve().parents[3] / "scripts" / "refresh_recording.py"
    dest = tmp_path / "pkg" / "h200-gemm.json"
    done = subprocess.run([sys.executable, str(script), str(synthetic.path), str(dest)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert dest.read_text() == synthetic.path.read_text()
    assert "(2 problems)" in done.stdout
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    failed = subprocess.run([sys.executable, str(script), str(junk),
                             str(tmp_path / "never.json")], capture_output=True, text=True,
                            check=False)
    assert failed.returncode == 1 and "refresh_recording:" in failed.stderr
    assert not (tmp_path / "never.json").exists()
