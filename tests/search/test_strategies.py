"""Search strategies of the autotuner, on synthetic objectives with known optima."""

from __future__ import annotations

import json
import logging
import math
import zlib

import numpy as np
import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.search import (
    DEFAULT_FIDELITY,
    STRATEGIES,
    Budget,
    Evolutionary,
    Exhaustive,
    Outcome,
    RandomSearch,
    SearchSpace,
    StopSearch,
    SuccessiveHalving,
    Trial,
    candidate_key,
    get_strategy,
    select_best,
)

# --------------------------------------------------------------------------- fixtures

#: A CUTLASS-like 4 x 4 x 4 space (64 candidates).
TILES = [32, 64, 128, 256]
SMALL = {"tile_m": TILES, "tile_n": TILES, "stages": [2, 3, 4, 5]}
SMALL_OPT = {"tile_m": 128, "tile_n": 64, "stages": 4}

#: A 20 x 10 x 10 = 2000-candidate space.
BIG = {"a": list(range(20)), "b": list(range(10)), "c": list(range(10))}
BIG_OPT = {"a": 13, "b": 4, "c": 7}
BIG_WEIGHTS = {"a": 0.03, "b": 0.1, "c": 0.2}


def quadratic(params: dict, optimum: dict, weights: dict | None = None):
    """A separable quadratic 'time' over value positions; 1.0 at ``optimum``."""
    pos = {n: {v: i for i, v in enumerate(vals)} for n, vals in params.items()}

    def true_time(c: dict) -> float:
        return 1.0 + sum(
            (weights or {}).get(n, 0.1) * (pos[n][c[n]] - pos[n][optimum[n]]) ** 2
            for n in params
        )

    return true_time


class Objective:
    """``evaluate(candidate, fidelity)`` around a true-time function, with call records.

    ``noise`` is the log-normal sigma of one timing iteration; the mean of ``fidelity``
    iterations has sigma ``noise / sqrt(fidelity)``. The noise is a deterministic
    function of (candidate, fidelity, seed), so runs repeat exactly.
    """

    def __init__(self, true_time, noise: float = 0.0, seed: int = 0, fail=None, clock=None):
        self.true_time = true_time
        self.noise = noise
        self.seed = seed
        self.fail = fail or (lambda c: None)
        self.clock = clock
        self.calls: list[tuple[dict, int]] = []

    def __call__(self, candidate: dict, fidelity: int) -> Outcome:
        self.calls.append((dict(candidate), fidelity))
        if self.clock is not None:
            self.clock.t += 1.0
        failure = self.fail(candidate)
        if failure == "raise":
            raise RuntimeError(f"kernel launch failed for {candidate}")
        if failure is not None:
            return Outcome(failure, None, "synthetic failure")
        t = self.true_time(candidate)
        if self.noise:
            h = zlib.crc32(f"{candidate_key(candidate)}|{fidelity}|{self.seed}".encode())
            z = np.random.default_rng(h).standard_normal()
            t *= math.exp(self.noise * z / math.sqrt(fidelity))
        return Outcome("ok", t)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def signature(result) -> list[tuple]:
    return [(candidate_key(t.candidate), t.fidelity, t.status, t.time) for t in result.trials]


# --------------------------------------------------------------------------- space


def test_space_enumerates_product_filtered_in_order():
    restriction = lambda c: c["tile_m"] * c["tile_n"] <= 128 * 128  # noqa: E731
    space = SearchSpace(SMALL, [restriction])
    expected = [
        {"tile_m": m, "tile_n": n, "stages": s}
        for m in TILES for n in TILES for s in SMALL["stages"]
        if m * n <= 128 * 128
    ]
    assert list(space) == expected
    assert len(space) == len(expected) == 52
    assert space.grid_size == 64
    assert space[0] == expected[0]
    assert space.index_of(expected[7]) == 7
    assert {"tile_m": 256, "tile_n": 256, "stages": 2} not in space
    assert expected[3] in space
    with pytest.raises(PycLabError):
        space.index_of({"tile_m": 256, "tile_n": 256, "stages": 2})


def test_space_neighbours_one_step_and_restricted():
    space = SearchSpace(SMALL, [lambda c: c["stages"] != 5])
    got = space.neighbours({"tile_m": 32, "tile_n": 128, "stages": 4})
    assert got == [
        {"tile_m": 64, "tile_n": 128, "stages": 4},
        {"tile_m": 32, "tile_n": 64, "stages": 4},
        {"tile_m": 32, "tile_n": 256, "stages": 4},
        {"tile_m": 32, "tile_n": 128, "stages": 3},  # stages=5 is restricted away
    ]
    with pytest.raises(PycLabError):
        space.neighbours({"tile_m": 48, "tile_n": 128, "stages": 4})


def test_space_sample_distinct_valid_and_seeded():
    space = SearchSpace(SMALL, [lambda c: c["stages"] >= 3])
    a = space.sample(20, rng=1)
    assert len({candidate_key(c) for c in a}) == 20
    assert all(c in space for c in a)
    assert a == space.sample(20, rng=1)
    assert len(space.sample(1000, rng=0)) == len(space) == 48


@pytest.mark.parametrize(
    "params",
    [{}, {"a": []}, {"a": [1, 1]}, {"a": "abc"}, {"a": [object()]}],
)
def test_space_rejects_bad_definitions(params):
    with pytest.raises(PycLabError):
        SearchSpace(params)


def test_space_restriction_that_raises_is_reported():
    space = SearchSpace({"a": [0, 1, 2]}, [lambda c: 1 / c["a"] > 0])
    with pytest.raises(PycLabError, match="ZeroDivisionError"):
        len(space)


# --------------------------------------------------------------------------- exhaustive


def test_exhaustive_finds_the_known_optimum_exactly():
    space = SearchSpace(SMALL)
    objective = Objective(quadratic(SMALL, SMALL_OPT))
    result = Exhaustive().run(space, objective)
    assert result.best is not None
    assert result.best.candidate == SMALL_OPT
    assert result.best.time == pytest.approx(1.0)
    assert result.stopped_by == "exhausted"
    assert result.n_evaluations == result.n_candidates == 64
    assert [c for c, _ in objective.calls] == list(space)
    assert {f for _, f in objective.calls} == {DEFAULT_FIDELITY}


def test_failures_are_recorded_and_skipped():
    def fail(c):
        if c["stages"] == 5:
            return "compile_error"
        if c == {"tile_m": 32, "tile_n": 32, "stages": 2}:
            return "wrong_result"
        if c == {"tile_m": 256, "tile_n": 32, "stages": 3}:
            return "raise"
        return None

    space = SearchSpace(SMALL)
    result = Exhaustive(fidelity=5).run(space, Objective(quadratic(SMALL, SMALL_OPT), fail=fail))
    assert result.stopped_by == "exhausted"
    assert len(result.trials) == 64  # the exception did not stop the run
    statuses = [t.status for t in result.trials]
    assert statuses.count("compile_error") == 16
    assert statuses.count("wrong_result") == 1
    assert statuses.count("error") == 1
    raised = next(t for t in result.trials if t.status == "error")
    assert raised.candidate == {"tile_m": 256, "tile_n": 32, "stages": 3}
    assert "RuntimeError" in raised.outcome.message and "launch failed" in raised.outcome.message
    assert len(result.failures) == 18
    assert result.best.candidate == SMALL_OPT and result.best.fidelity == 5


def test_failures_never_stop_the_other_strategies():
    fail = lambda c: "raise" if c["a"] == 13 and c["b"] == 4 else (  # noqa: E731
        "timeout" if c["c"] == 0 else None
    )
    space = SearchSpace(BIG)
    objective = Objective(quadratic(BIG, BIG_OPT, BIG_WEIGHTS), fail=fail)
    sh = SuccessiveHalving().run(space, objective, rng=0)
    assert sh.stopped_by == "exhausted"
    assert sh.best is not None and sh.best.fidelity == DEFAULT_FIDELITY
    # Failures drop out at once: none is measured above the screening fidelity.
    assert all(t.fidelity == 1 for t in sh.trials if not t.ok)
    assert sum(t.fidelity == 1 for t in sh.trials) == 2000
    evo = Evolutionary(generations=10).run(space, objective, rng=0)
    assert evo.stopped_by == "exhausted"
    assert evo.n_evaluations == 16 + 10 * 14
    assert evo.best is not None and evo.best.ok


def test_bad_returns_become_errors():
    space = SearchSpace({"a": [0, 1, 2, 3]})

    def evaluate(c, fidelity):
        return {0: 1.5, 1: Outcome("ok", float("nan")), 2: Outcome("ok"), 3: Outcome("ok", 2.0)}[
            c["a"]
        ]

    result = Exhaustive().run(space, evaluate)
    assert [t.status for t in result.trials] == ["error", "nan", "error", "ok"]
    assert "float" in result.trials[0].outcome.message
    assert result.best.candidate == {"a": 3}


# --------------------------------------------------------------------------- random


def test_random_evaluates_exactly_n_distinct_valid_candidates():
    restriction = lambda c: c["tile_m"] <= c["tile_n"]  # noqa: E731
    space = SearchSpace(SMALL, [restriction])
    objective = Objective(quadratic(SMALL, SMALL_OPT))
    result = RandomSearch().run(space, objective, Budget(max_candidates=17), rng=3)
    assert result.stopped_by == "max_candidates"
    assert len(objective.calls) == result.n_evaluations == 17
    assert len({candidate_key(c) for c, _ in objective.calls}) == 17
    assert all(restriction(c) for c, _ in objective.calls)
    # The best is the fastest of what was sampled.
    assert result.best.time == min(t.time for t in result.trials)


def test_random_without_budget_covers_the_space_once():
    space = SearchSpace(SMALL, [lambda c: c["stages"] != 2])
    result = RandomSearch(fidelity=3).run(space, Objective(quadratic(SMALL, SMALL_OPT)), rng=0)
    assert result.stopped_by == "exhausted"
    keys = [candidate_key(t.candidate) for t in result.trials]
    assert sorted(keys) == sorted(candidate_key(c) for c in space)
    assert [t.candidate for t in result.trials] != list(space)  # shuffled
    assert result.best.candidate == SMALL_OPT


# --------------------------------------------------------------------------- successive halving


def test_successive_halving_rungs_and_optimum():
    space = SearchSpace(BIG)
    objective = Objective(quadratic(BIG, BIG_OPT, BIG_WEIGHTS))
    result = SuccessiveHalving(eta=3, min_fidelity=1, max_fidelity=27).run(
        space, objective, rng=0
    )
    per_rung = {f: sum(t.fidelity == f for t in result.trials) for f in (1, 3, 9, 27)}
    assert per_rung == {1: 2000, 3: 667, 9: 223, 27: 75}
    assert result.n_candidates == 2000
    assert result.best.candidate == BIG_OPT and result.best.fidelity == 27
    exhaustive_high = len(space)  # exhaustive measures every candidate at 27
    assert per_rung[27] < exhaustive_high / 10
    # Each rung measures only the fastest third of the previous one.
    for lower, upper in ((1, 3), (3, 9), (9, 27)):
        lower_trials = sorted((t for t in result.trials if t.fidelity == lower),
                              key=lambda t: t.time)
        kept = {candidate_key(t.candidate) for t in lower_trials[: per_rung[upper]]}
        assert {candidate_key(t.candidate) for t in result.trials if t.fidelity == upper} == kept


def test_successive_halving_with_noise_shrinking_with_fidelity():
    true_time = quadratic(BIG, BIG_OPT, BIG_WEIGHTS)
    space = SearchSpace(BIG)
    screen_fooled = 0
    for seed in range(5):
        # 20 % noise on one iteration, 3.8 % on the mean of 27.
        noisy = Objective(true_time, noise=0.2, seed=seed)
        result = SuccessiveHalving().run(space, noisy, rng=seed)
        assert true_time(result.best.candidate) <= 1.05 * true_time(BIG_OPT) + 1e-12
        assert sum(t.fidelity == DEFAULT_FIDELITY for t in result.trials) < len(space) / 10
        screen = min((t for t in result.trials if t.fidelity == 1), key=lambda t: t.time)
        screen_fooled += true_time(screen.candidate) > 1.05 + 1e-12
    # The noise is real: trusting the one-iteration screen would have gone wrong.
    assert screen_fooled >= 2


def test_successive_halving_candidate_budget_and_single_survivor_jump():
    space = SearchSpace(BIG)
    result = SuccessiveHalving().run(
        space, Objective(quadratic(BIG, BIG_OPT, BIG_WEIGHTS)), Budget(max_candidates=100),
        rng=5,
    )
    assert result.stopped_by == "max_candidates"
    assert result.n_candidates == 100
    fids = [t.fidelity for t in result.trials]
    assert {f: fids.count(f) for f in set(fids)} == {1: 100, 3: 34, 9: 12, 27: 4}

    small = SearchSpace({"a": [0, 1, 2]})
    jump = SuccessiveHalving().run(small, Objective(lambda c: 1.0 + c["a"]), rng=0)
    assert [t.fidelity for t in jump.trials] == [1, 1, 1, 27]  # 3 -> 1 survivor -> top
    assert jump.best.candidate == {"a": 0}


@pytest.mark.parametrize(
    "options", [{"eta": 1}, {"min_fidelity": 0}, {"min_fidelity": 9, "max_fidelity": 3}]
)
def test_successive_halving_rejects_bad_options(options):
    with pytest.raises(PycLabError):
        SuccessiveHalving(**options)


def test_successive_halving_rungs_clip_to_max():
    assert SuccessiveHalving(eta=3, min_fidelity=1, max_fidelity=10).rungs() == [1, 3, 9, 10]
    assert SuccessiveHalving(eta=2, min_fidelity=4, max_fidelity=4).rungs() == [4]


# --------------------------------------------------------------------------- evolutionary


def test_evolutionary_finds_optimum_of_2000_candidates_within_300_evaluations():
    space = SearchSpace(BIG)
    assert len(space) == 2000
    true_time = quadratic(BIG, BIG_OPT, BIG_WEIGHTS)
    found = 0
    for seed in range(5):
        objective = Objective(true_time)
        result = Evolutionary(population=16, generations=None).run(
            space, objective, Budget(max_candidates=300), rng=seed
        )
        assert result.n_evaluations <= 300
        # Every evaluation is a new candidate.
        assert len({candidate_key(c) for c, _ in objective.calls}) == len(objective.calls)
        found += result.best.candidate == BIG_OPT
    assert found >= 4


def test_evolutionary_beats_random_sampling_at_equal_budget():
    space = SearchSpace(BIG)
    true_time = quadratic(BIG, BIG_OPT, BIG_WEIGHTS)
    evo, rnd = [], []
    for seed in range(5):
        budget = Budget(max_candidates=150)
        evo.append(Evolutionary(generations=None).run(space, Objective(true_time), budget,
                                                      rng=seed).best.time)
        rnd.append(RandomSearch().run(space, Objective(true_time), budget, rng=seed).best.time)
    assert np.mean(evo) < np.mean(rnd)


def test_evolutionary_respects_restrictions_and_exhausts_small_spaces():
    restriction = lambda c: (c["tile_m"] + c["tile_n"]) <= 256  # noqa: E731
    space = SearchSpace(SMALL, [restriction])
    objective = Objective(quadratic(SMALL, SMALL_OPT))
    result = Evolutionary(population=8, generations=None).run(space, objective, rng=1)
    assert result.stopped_by == "exhausted"
    assert result.n_candidates == result.n_evaluations == len(space)
    assert all(restriction(c) for c, _ in objective.calls)
    assert result.best.candidate == SMALL_OPT


@pytest.mark.parametrize(
    "options",
    [{"population": 1}, {"elite": 16}, {"mutation_rate": 1.5}, {"generations": -1}],
)
def test_evolutionary_rejects_bad_options(options):
    with pytest.raises(PycLabError):
        Evolutionary(**options)


# --------------------------------------------------------------------------- budget, observer


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_max_seconds_with_a_fake_clock(name):
    clock = FakeClock()
    space = SearchSpace(SMALL)
    objective = Objective(quadratic(SMALL, SMALL_OPT), clock=clock)  # each call takes 1 s
    result = get_strategy(name).run(space, objective, Budget(max_seconds=5.5, clock=clock),
                                    rng=0)
    assert result.stopped_by == "max_seconds"
    assert len(result.trials) == 6  # started at t = 0, 1, ..., 5; none at t = 6
    assert [t.started_s for t in result.trials] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(t.elapsed_s == 1.0 for t in result.trials)
    assert result.best is not None


def test_zero_budgets_evaluate_nothing():
    space = SearchSpace(SMALL)
    for name in STRATEGIES:
        r = get_strategy(name).run(space, Objective(quadratic(SMALL, SMALL_OPT)),
                                   Budget(max_candidates=0), rng=0)
        assert r.trials == [] and r.best is None and r.stopped_by == "max_candidates"


@pytest.mark.parametrize("bad", [{"max_candidates": -1}, {"max_seconds": -0.5},
                                 {"max_candidates": 2.5}, {"max_seconds": float("nan")}])
def test_budget_rejects_bad_limits(bad):
    with pytest.raises(PycLabError):
        Budget(**bad)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_observer_sees_every_trial_and_can_stop(name):
    seen: list[Trial] = []

    def observer(trial: Trial) -> None:
        seen.append(trial)
        if len(seen) == 7:
            raise StopSearch

    space = SearchSpace(BIG)
    objective = Objective(quadratic(BIG, BIG_OPT, BIG_WEIGHTS))
    result = get_strategy(name).run(space, objective, rng=0, observer=observer)
    assert result.stopped_by == "observer"
    assert result.trials == seen
    assert [t.index for t in result.trials] == list(range(7))
    assert len(objective.calls) == 7
    assert result.best.time == min(t.time for t in seen)


def test_observer_errors_are_logged_not_fatal(caplog):
    def observer(trial):
        raise ValueError("widget broke")

    space = SearchSpace(SMALL)
    with caplog.at_level(logging.ERROR, logger="pyc_lab.search"):
        result = Exhaustive().run(space, Objective(quadratic(SMALL, SMALL_OPT)),
                                  observer=observer)
    assert result.n_evaluations == 64 and result.stopped_by == "exhausted"
    assert "widget broke" in caplog.text


def test_stop_search_from_evaluate_stops_too():
    space = SearchSpace(SMALL)

    def evaluate(c, fidelity):
        if c["tile_m"] == 64:
            raise StopSearch
        return Outcome("ok", 1.0)

    result = Exhaustive().run(space, evaluate)
    assert result.stopped_by == "observer" and len(result.trials) == 16


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize(
    "make", [RandomSearch, SuccessiveHalving, lambda: Evolutionary(generations=8)]
)
def test_fixed_seed_repeats_the_search(make):
    space = SearchSpace(BIG, [lambda c: c["a"] + c["b"] != 10])
    true_time = quadratic(BIG, BIG_OPT, BIG_WEIGHTS)
    budget = Budget(max_candidates=200)
    one = make().run(space, Objective(true_time, noise=0.2), budget, rng=42)
    two = make().run(space, Objective(true_time, noise=0.2), budget, rng=42)
    other = make().run(space, Objective(true_time, noise=0.2), budget,
                       rng=np.random.default_rng(43))
    assert signature(one) == signature(two)
    assert signature(one) != signature(other)
    assert one.best.candidate == two.best.candidate


# --------------------------------------------------------------------------- result


def test_select_best_prefers_highest_fidelity_and_distrusts_late_failures():
    a, b, c = {"x": 1}, {"x": 2}, {"x": 3}
    trials = [
        Trial(0, a, 1, Outcome("ok", 0.5), 0.1),
        Trial(1, b, 1, Outcome("ok", 0.9), 0.1),
        Trial(2, c, 1, Outcome("ok", 0.7), 0.1),
        Trial(3, b, 9, Outcome("ok", 1.1), 0.1),
        Trial(4, c, 9, Outcome("timeout", None, "too slow"), 0.1),
    ]
    assert select_best(trials).index == 3  # b at fidelity 9, not a's noisy screen
    assert select_best(trials[:3]).index == 0
    assert select_best([trials[4]]) is None


def test_to_frame_columns_and_best_flag():
    space = SearchSpace({"tile_m": [64, 128], "time": [1, 2]})
    result = Exhaustive(fidelity=2).run(
        space, lambda c, f: Outcome("ok", c["tile_m"] / 64 + c["time"])
        if c["time"] == 1 or c["tile_m"] == 64 else Outcome("compile_error", None, "ptxas")
    )
    df = result.to_frame()
    assert list(df.columns) == [
        "index", "tile_m", "param_time", "fidelity", "status", "time", "message",
        "elapsed_s", "started_s", "best",
    ]
    assert len(df) == 4
    assert df["best"].sum() == 1
    assert df.loc[df["best"], "tile_m"].item() == 64
    assert df.loc[df["best"], "param_time"].item() == 1
    assert df["status"].tolist() == ["ok", "ok", "ok", "compile_error"]
    assert df["message"].iloc[-1] == "ptxas"
    assert (df["fidelity"] == 2).all()
    assert json.loads(json.dumps(result.best.to_dict())) == {
        "index": 0, "candidate": {"tile_m": 64, "time": 1}, "fidelity": 2, "status": "ok",
        "time": 2.0, "message": "", "elapsed_s": result.best.elapsed_s,
        "started_s": result.best.started_s,
    }
    empty = Exhaustive().run(space, lambda c, f: Outcome("ok", 1.0), Budget(max_candidates=0))
    assert list(empty.to_frame().columns) == ["index", *["fidelity", "status", "time", "message",
                                              "elapsed_s", "started_s", "best"]]
    assert "best=None" in repr(empty)


# --------------------------------------------------------------------------- registry


def test_registry_and_get_strategy():
    assert set(STRATEGIES) == {"exhaustive", "random", "successive_halving", "evolutionary"}
    sh = get_strategy("Successive-Halving", eta=2, max_fidelity=8)
    assert isinstance(sh, SuccessiveHalving) and sh.rungs() == [1, 2, 4, 8]
    assert sh.options() == {"eta": 2, "min_fidelity": 1, "max_fidelity": 8}
    assert isinstance(get_strategy("evolutionary", population=8), Evolutionary)
    with pytest.raises(PycLabError) as info:
        get_strategy("bayesian")
    for name in STRATEGIES:
        assert name in str(info.value)
    with pytest.raises(PycLabError, match="eta"):
        get_strategy("random", eta=3)
    with pytest.raises(PycLabError):
        get_strategy("random", fidelity=0)
