"""Tuning the conveyor belt: sweep depth, workers and chunk size, keep the fastest.

Each configuration gets one belt, run over the items once untimed (a warm-up: pinned
slots allocated, kernels compiled) and then once per repeat, timed on the host clock
(the median of repeats); its trace's overlap report is kept beside the time. The search
itself is one of the autotuner's strategies (:mod:`pyc_lab.search`), so a
large sweep can use successive halving or the evolutionary search instead of trying
everything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError
from ..search import Budget, Outcome, SearchSpace, get_strategy
from .pipeline import Pipeline

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["BeltSweep", "tune_pipeline"]


@dataclass
class BeltSweep:
    """What :func:`tune_pipeline` measured: one row per configuration tried."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    strategy: str = ""
    stopped_by: str = ""

    def to_frame(self) -> pd.DataFrame:
        """depth, workers, chunk, status, median_s, copy_hidden_pct, efficiency, message."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def __repr__(self) -> str:
        best = "none" if self.best is None else ", ".join(
            f"{k}={v}" for k, v in self.best.items()
            if k in ("depth", "workers", "compute_streams", "chunk"))
        return (f"BeltSweep({len(self.rows)} configuration(s), best: {best}, "
                f"strategy {self.strategy}, stopped by {self.stopped_by})")


def tune_pipeline(
    prepare: Callable[[Any], Any],
    compute: Callable[..., Any],
    items: Iterable[Any] | Callable[[int], Sequence[Any]],
    *,
    depths: Sequence[int] = (1, 2, 3, 4),
    workers: Sequence[int] = (1, 2, 4),
    chunks: Sequence[int] | None = None,
    compute_streams: Sequence[int] = (1,),
    repeats: int = 3,
    warmup: int = 1,
    strategy: str = "exhaustive",
    budget_s: float | None = None,
    mode: str = "auto",
    rng: int | None = 0,
    **pipeline_options: Any,
) -> BeltSweep:
    """Try belt configurations and return them all, fastest first in ``best``.

    Parameters
    ----------
    prepare, compute
        As for :class:`~pyc_lab.runtime.pipeline.Pipeline`.
    items
        The items to push through, or — to sweep the chunk size — a function
        ``make_items(chunk) -> items`` called with each value of ``chunks``.
    depths, workers, chunks, compute_streams
        The values to try (``chunks`` only with ``make_items``; ``compute_streams``
        matters in GPU mode only).
    repeats
        Timed runs per configuration, all through one belt; the median wall time counts.
    warmup
        Untimed runs first, through the same belt (its pinned slots get allocated,
        kernels compiled, caches warmed), as a loader reused epoch after epoch would be.
    strategy
        A strategy name from :data:`pyc_lab.search.STRATEGIES`.
    budget_s
        Stop starting new configurations after this many seconds.
    mode
        Pipeline mode (``"auto"``, ``"cpu"`` or ``"gpu"``).
    rng
        Seed for strategies that sample.
    **pipeline_options
        Passed on to every Pipeline (``h2d``, ``d2h``, ``timeout_s``, ...).

    Returns
    -------
    BeltSweep

    Raises
    ------
    PycLabError
        For empty value lists, ``chunks`` without ``make_items``, or ``repeats < 1``.
    """
    if repeats < 1:
        raise PycLabError(f"repeats must be at least 1, got {repeats}")
    if warmup < 0:
        raise PycLabError(f"warmup must be 0 or more, got {warmup}")
    make_items = items if callable(items) else None
    if chunks is not None and make_items is None:
        raise PycLabError("chunks needs items to be a function make_items(chunk) -> items")
    fixed = None if make_items is not None else list(items)  # type: ignore[arg-type]
    params: dict[str, list] = {"depth": [int(d) for d in depths],
                               "workers": [int(w) for w in workers]}
    if tuple(compute_streams) != (1,):
        params["compute_streams"] = [int(c) for c in compute_streams]
    if chunks is not None:
        params["chunk"] = [int(c) for c in chunks]
    elif make_items is not None:
        raise PycLabError("items is a function: give the chunk sizes to try in chunks=")
    if any(not values for values in params.values()):
        raise PycLabError(f"every swept parameter needs at least one value, got {params}")
    space = SearchSpace(params, restrictions=[
        lambda c: c["depth"] >= 1 and c["workers"] >= 1 and c.get("compute_streams", 1) >= 1])
    sweep = BeltSweep(strategy=strategy)

    def evaluate(candidate: dict[str, Any], fidelity: int) -> Outcome:
        run_items = fixed if make_items is None else list(make_items(candidate["chunk"]))
        times = []
        report = None
        try:
            with Pipeline(prepare, compute, depth=candidate["depth"],
                          workers=candidate["workers"], mode=mode,
                          compute_streams=candidate.get("compute_streams", 1),
                          **pipeline_options) as pipe:
                for k in range(warmup + repeats):
                    t0 = time.perf_counter()
                    for _out in pipe.run(run_items):
                        pass
                    if k >= warmup:
                        times.append(time.perf_counter() - t0)
                        report = pipe.trace.overlap()
        except PycLabError as exc:
            sweep.rows.append({**candidate, "status": "error", "median_s": None,
                               "copy_hidden_pct": None, "efficiency": None,
                               "pipeline_efficiency": None,
                               "message": str(exc)})
            return Outcome("error", message=str(exc))
        median = statistics.median(times)
        sweep.rows.append({**candidate, "status": "ok", "median_s": median,
                           "copy_hidden_pct": None if report is None else report.copy_hidden_pct,
                           "efficiency": None if report is None else report.efficiency,
                           "pipeline_efficiency": None if report is None
                           else report.pipeline_efficiency,
                           "message": ""})
        return Outcome("ok", time=median)

    result = get_strategy(strategy).run(space, evaluate, Budget(max_seconds=budget_s), rng=rng)
    sweep.stopped_by = result.stopped_by
    if result.best is not None:
        best = dict(result.best.candidate)
        row = next(r for r in sweep.rows if all(r.get(k) == v for k, v in best.items())
                   and r["status"] == "ok")
        sweep.best = dict(row)
    return sweep
