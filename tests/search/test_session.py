"""The tuning session: a runner, a strategy, a budget, observers and a stop event."""

from __future__ import annotations

import threading

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.search import (
    Budget,
    Exhaustive,
    Outcome,
    Runner,
    SearchSpace,
    StopSearch,
    TuningSession,
)


class Quadratic:
    """A runner over x in 0..9 whose time is (x - 6)^2 + 1; x = 3 fails to "compile"."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def space(self) -> SearchSpace:
        return SearchSpace({"x": list(range(10))})

    def evaluate(self, candidate: dict, fidelity: int) -> Outcome:
        self.calls.append((candidate["x"], fidelity))
        if candidate["x"] == 3:
            return Outcome("compile_error", message="no")
        return Outcome("ok", time=float((candidate["x"] - 6) ** 2 + 1))


def test_a_runner_is_anything_with_space_and_evaluate():
    assert isinstance(Quadratic(), Runner)
    with pytest.raises(PycLabError, match="space\\(\\) and evaluate\\(\\)"):
        TuningSession(object())


@pytest.mark.parametrize("strategy", ["exhaustive", "random", "successive_halving",
                                      "evolutionary"])
def test_every_strategy_finds_the_minimum_through_the_session(strategy):
    runner = Quadratic()
    result = TuningSession(runner, strategy, seed=1).run()
    assert result.best.candidate == {"x": 6}
    assert any(t.status == "compile_error" for t in result.trials)
    assert result.strategy == strategy


def test_observers_see_every_trial_in_order_and_can_stop():
    seen_a: list[int] = []
    seen_b: list[int] = []

    def stop_at_four(trial):
        seen_b.append(trial.candidate["x"])
        if trial.candidate["x"] == 4:
            raise StopSearch("enough")

    result = TuningSession(Quadratic(), "exhaustive",
                           observers=[lambda t: seen_a.append(t.candidate["x"]),
                                      stop_at_four]).run()
    assert seen_a == seen_b == [0, 1, 2, 3, 4]
    assert result.stopped_by == "observer"
    assert result.best.candidate == {"x": 4}


def test_a_failing_observer_never_stops_the_search(caplog):
    def broken(trial):
        raise ValueError("view update failed")

    result = TuningSession(Quadratic(), "exhaustive", observers=[broken]).run()
    assert result.stopped_by == "exhausted" and len(result.trials) == 10


def test_the_stop_event_ends_the_search_before_the_next_candidate():
    stop = threading.Event()
    runner = Quadratic()

    def press_stop(trial):
        if trial.candidate["x"] == 2:
            stop.set()

    result = TuningSession(runner, "exhaustive", observers=[press_stop], stop=stop).run()
    assert [x for x, _ in runner.calls] == [0, 1, 2]
    assert result.stopped_by == "observer"


def test_budget_and_options_reach_the_strategy():
    runner = Quadratic()
    session = TuningSession(runner, "exhaustive", strategy_options={"fidelity": 5},
                            budget=Budget(max_candidates=4))
    result = session.run()
    assert result.stopped_by == "max_candidates"
    assert {f for _, f in runner.calls} == {5}
    assert "max_candidates=4" in repr(session)


def test_bad_strategy_settings_are_clear_errors():
    with pytest.raises(PycLabError, match="unknown search strategy"):
        TuningSession(Quadratic(), "annealing")
    with pytest.raises(PycLabError, match="takes no option"):
        TuningSession(Quadratic(), "exhaustive", strategy_options={"eta": 3})
    with pytest.raises(PycLabError, match="already configured"):
        TuningSession(Quadratic(), Exhaustive(), strategy_options={"fidelity": 3})
    with pytest.raises(PycLabError, match="takes a Budget"):
        TuningSession(Quadratic(), budget=10)
