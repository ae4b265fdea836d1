"""The confirmation of a live runner's fastest candidates (``CandidateRows.confirm``) and
its place in ``tune_runner``: the timings are faked, the choice and the records are real."""

from __future__ import annotations

import threading

import pytest

from pyc_lab.kernels.cutlass.attention import AttnConfig
from pyc_lab.kernels.tuning import autotune, kernel_rows
from pyc_lab.kernels.tuning.keys import Measurement
from pyc_lab.kernels.tuning.options import GemmTuneOptions

CONFIGS = [AttnConfig(128, 2, 2, persistent=True), AttnConfig(128, 2, 2),
           AttnConfig(64, 2, 2), AttnConfig(192, 2, 2)]


class Rows(kernel_rows.CandidateRows):
    """Four candidates searched at the given times; ``wrong`` fails its check."""

    def __init__(self, searched: dict[str, float], wrong: str = "") -> None:
        self.config_type, self.configs, self.flops = AttnConfig, CONFIGS, 10**12
        self.baselines = {"lib": 1.0}
        self._libraries = {"lib": lambda: None}
        self._builds, self._futures, self._deadline, self._hung = {}, {}, None, None
        self._init_rows()
        for cfg in CONFIGS:
            ok = cfg.id != wrong
            self._finish(cfg, "ok" if ok else "wrong_result", searched[cfg.id] if ok else None,
                         1e-3 if ok else 0.5)
            if ok:
                self._launches[cfg.id] = (cfg, lambda: None)


@pytest.fixture
def rounds(monkeypatch):
    """Fake interleaved medians: what each name measures when timed again."""
    seen: list[list[str]] = []
    medians: dict[str, float] = {}

    def fake(fns, repeats, rounds=3):
        seen.append(sorted(fns))
        return {name: medians[name] for name in fns}

    monkeypatch.setattr(kernel_rows, "interleaved_ms", fake)
    return medians, seen


def test_confirm_times_the_fastest_again_and_keeps_the_medians(rounds):
    medians, seen = rounds
    ids = [c.id for c in CONFIGS]
    # the search saw ids[0] fastest; timed again beside the library, ids[1] is
    rows = Rows({ids[0]: 0.90, ids[1]: 0.95, ids[2]: 0.97, ids[3]: 1.50})
    medians.update({ids[0]: 0.99, ids[1]: 0.96, ids[2]: 0.98, "lib": 1.02})
    best = rows.confirm(repeats=5)
    assert seen == [sorted([ids[0], ids[1], ids[2], "lib"])]  # the top three, and the library
    assert best is not None and best.config == CONFIGS[1].to_dict() and best.time_ms == 0.96
    assert rows.baselines["lib"] == 1.02
    assert rows.rows[ids[0]]["ms"] == 0.99 and rows.rows[ids[3]]["ms"] == 1.50  # not re-timed
    assert rows.measurement(CONFIGS[0].to_dict()).time_ms == 0.99


def test_confirm_leaves_wrong_candidates_out_and_needs_a_correct_one(rounds):
    medians, seen = rounds
    ids = [c.id for c in CONFIGS]
    rows = Rows({ids[0]: 0.5, ids[1]: 0.9, ids[2]: 0.8, ids[3]: 0.7}, wrong=ids[0])
    medians.update({ids[1]: 0.9, ids[2]: 0.8, ids[3]: 0.7, "lib": 1.0})
    assert rows.confirm(repeats=5, top=2).config == CONFIGS[3].to_dict()
    assert seen[-1] == sorted([ids[3], ids[2], "lib"])
    assert rows.rows[ids[0]]["status"] == "wrong_result"
    nothing = Rows({c.id: 1.0 for c in CONFIGS})
    nothing._launches.clear()
    assert nothing.confirm(repeats=5) is None


class FakeRunner:
    """What ``tune_runner`` needs of a runner, with a confirmation that changes the winner."""

    device = problem = "fake"

    def __init__(self) -> None:
        self.baselines = {"lib": 1.0}
        self.rows: dict = {}
        self.confirmed = 0

    def confirm(self, repeats: int) -> Measurement:
        self.confirmed += 1
        return Measurement({"block_n": 64}, "ok", 0.8, 1.0)

    def measurements(self) -> list:
        return []


@pytest.mark.parametrize("stopped", [False, True])
def test_tune_runner_confirms_unless_stopped(monkeypatch, stopped):
    searched = Measurement({"block_n": 128}, "ok", 0.7, 1.0)
    monkeypatch.setattr(autotune, "search_best", lambda *a: ("exhausted", searched))
    monkeypatch.setattr(autotune, "record_tuning", lambda *a: False)
    runner, stop = FakeRunner(), threading.Event()
    if stopped:
        stop.set()
    result = autotune.tune_runner(runner, GemmTuneOptions(), None, stop, None, 0.0)
    assert runner.confirmed == (0 if stopped else 1)
    assert result.best.config == ({"block_n": 128} if stopped else {"block_n": 64})
