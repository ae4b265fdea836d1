"""Tuning the conveyor belt: depth, workers, compute streams and chunk size, searched.

:class:`BeltRunner` is a runner of the shared tuning session
(:class:`~pyc_lab.search.session.TuningSession`): each candidate configuration gets one
belt, run over the items once untimed (a warm-up: pinned slots allocated, kernels
compiled) and then once per repeat, timed on the host clock (the median of repeats); its
trace's overlap report is kept beside the time. The search is any of the strategies, so
a large sweep can use successive halving or the evolutionary search instead of trying
everything. :class:`BeltTuneOptions` holds the sweep's settings and their defaults.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..checks import check_callable
from ..errors import PycLabError
from ..search import Budget, Outcome, SearchSpace, TuningSession
from ..search.registry import normalise_name
from .pipeline import Pipeline

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["BeltRunner", "BeltSweep", "BeltTuneOptions", "tune_pipeline"]


def _values(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(v) for v in values)
    if not out or any(v < 1 for v in out):
        raise PycLabError(f"{name}={values!r}: give at least one value, each a whole number "
                          ">= 1")
    return out


@dataclass(frozen=True)
class BeltTuneOptions:
    """The settings of a belt sweep (the defaults of :func:`tune_pipeline`).

    Parameters
    ----------
    depths, workers, chunks, compute_streams
        The values to try (``chunks`` only when items are made per chunk size;
        ``compute_streams`` matters in GPU mode only).
    repeats
        Timed runs per configuration, all through one belt; the median wall time counts.
    warmup
        Untimed runs first, through the same belt (its pinned slots get allocated,
        kernels compiled, caches warmed), as a loader reused epoch after epoch would be.
    strategy
        A strategy name (:data:`pyc_lab.search.STRATEGIES`).
    budget_s
        Stop starting new configurations after this many seconds (``None``: no limit).
    mode
        Pipeline mode (``"auto"``, ``"cpu"`` or ``"gpu"``).
    seed
        Seed for strategies that sample.
    """

    depths: tuple[int, ...] = (1, 2, 3, 4)
    workers: tuple[int, ...] = (1, 2, 4)
    chunks: tuple[int, ...] | None = None
    compute_streams: tuple[int, ...] = (1,)
    repeats: int = 3
    warmup: int = 1
    strategy: str = "exhaustive"
    budget_s: float | None = None
    mode: str = "auto"
    seed: int | None = 0

    def __post_init__(self) -> None:
        for name in ("depths", "workers", "compute_streams"):
            object.__setattr__(self, name, _values(name, getattr(self, name)))
        if self.chunks is not None:
            object.__setattr__(self, "chunks", _values("chunks", self.chunks))
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or \
                self.repeats < 1:
            raise PycLabError(f"repeats must be at least 1, got {self.repeats}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or \
                self.warmup < 0:
            raise PycLabError(f"warmup must be 0 or more, got {self.warmup}")
        object.__setattr__(self, "strategy", normalise_name(self.strategy))
        Budget(max_seconds=self.budget_s)  # validates it
        if self.mode not in ("auto", "cpu", "gpu"):
            raise PycLabError(f"mode must be 'auto', 'cpu' or 'gpu', not {self.mode!r}")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The option names."""
        return tuple(f.name for f in dataclasses.fields(cls))


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


class BeltRunner:
    """Runs one belt per configuration and times it (a tuning-session runner).

    Parameters
    ----------
    prepare, compute
        As for :class:`~pyc_lab.runtime.pipeline.Pipeline`.
    items
        The items, or ``make_items(chunk) -> items`` when chunk sizes are swept.
    options
        The values to sweep, repeats, warm-up and mode.
    pipeline_options
        Passed on to every Pipeline (``h2d``, ``d2h``, ``timeout_s``, ...).
    """

    def __init__(self, prepare: Callable[[Any], Any], compute: Callable[..., Any],
                 items: Iterable[Any] | Callable[[int], Sequence[Any]],
                 options: BeltTuneOptions, pipeline_options: Mapping[str, Any]) -> None:
        self.make_items = items if callable(items) else None
        if options.chunks is not None and self.make_items is None:
            raise PycLabError("chunks needs items to be a function make_items(chunk) -> items")
        if self.make_items is not None and options.chunks is None:
            raise PycLabError("items is a function: give the chunk sizes to try in chunks=")
        self.fixed = None if self.make_items is not None else list(items)  # type: ignore[arg-type]
        if self.fixed is not None and not self.fixed:
            raise PycLabError("tune_pipeline: items is empty; give the items to push through "
                              "(timing a belt with nothing on it would pick at random)")
        for name, fn in (("prepare", prepare), ("compute", compute)):
            check_callable("tune_pipeline", name, fn, "as for Pipeline")
        self.prepare, self.compute = prepare, compute
        self.options = options
        self.pipeline_options = dict(pipeline_options)
        self.rows: list[dict[str, Any]] = []

    def space(self) -> SearchSpace:
        """depth x workers (x compute streams) (x chunk)."""
        o = self.options
        params: dict[str, list[int]] = {"depth": list(o.depths), "workers": list(o.workers)}
        if o.compute_streams != (1,):
            params["compute_streams"] = list(o.compute_streams)
        if o.chunks is not None:
            params["chunk"] = list(o.chunks)
        return SearchSpace(params)

    def evaluate(self, candidate: Mapping[str, Any], fidelity: int) -> Outcome:
        """Warm one belt up, run it ``repeats`` times, keep the median and its overlap."""
        o = self.options
        run_items = (self.fixed if self.make_items is None
                     else list(self.make_items(candidate["chunk"])))
        times: list[float] = []
        report = None
        try:
            with Pipeline(self.prepare, self.compute, depth=candidate["depth"],
                          workers=candidate["workers"], mode=o.mode,
                          compute_streams=candidate.get("compute_streams", 1),
                          **self.pipeline_options) as pipe:
                for k in range(o.warmup + o.repeats):
                    t0 = time.perf_counter()
                    for _out in pipe.run(run_items):
                        pass
                    if k >= o.warmup:
                        times.append(time.perf_counter() - t0)
                        report = pipe.trace.overlap()
        except PycLabError as exc:
            self.rows.append({**candidate, "status": "error", "median_s": None,
                              "copy_hidden_pct": None, "efficiency": None,
                              "pipeline_efficiency": None, "message": str(exc)})
            return Outcome("error", message=str(exc))
        median = statistics.median(times)
        self.rows.append({**candidate, "status": "ok", "median_s": median,
                          "copy_hidden_pct": None if report is None else report.copy_hidden_pct,
                          "efficiency": None if report is None else report.efficiency,
                          "pipeline_efficiency": None if report is None
                          else report.pipeline_efficiency,
                          "message": ""})
        return Outcome("ok", time=median)


def tune_pipeline(
    prepare: Callable[[Any], Any],
    compute: Callable[..., Any],
    items: Iterable[Any] | Callable[[int], Sequence[Any]],
    *,
    options: BeltTuneOptions | None = None,
    **settings: Any,
) -> BeltSweep:
    """Try belt configurations and return them all, the fastest in ``best``.

    Parameters
    ----------
    prepare, compute
        As for :class:`~pyc_lab.runtime.pipeline.Pipeline`.
    items
        The items to push through, or — to sweep the chunk size — a function
        ``make_items(chunk) -> items`` called with each value of ``chunks``.
    options
        A :class:`BeltTuneOptions` (its defaults when omitted).
    **settings
        Fields of :class:`BeltTuneOptions` (``depths``, ``workers``, ``chunks``,
        ``compute_streams``, ``repeats``, ``warmup``, ``strategy``, ``budget_s``,
        ``mode``, ``seed``, and ``rng`` for ``seed``) over ``options``; anything else is
        passed on to every Pipeline (``h2d``, ``d2h``, ``timeout_s``, ...).

    Returns
    -------
    BeltSweep

    Raises
    ------
    PycLabError
        For empty value lists or items, ``chunks`` without ``make_items``, ``repeats < 1``,
        or a ``prepare`` or ``compute`` that is not callable.
    """
    if "rng" in settings:
        settings["seed"] = settings.pop("rng")
    names = BeltTuneOptions.fields()
    chosen = {k: v for k, v in settings.items() if k in names}
    pipeline_options = {k: v for k, v in settings.items() if k not in names}
    opts = dataclasses.replace(options or BeltTuneOptions(), **chosen)
    runner = BeltRunner(prepare, compute, items, opts, pipeline_options)
    result = TuningSession(runner, opts.strategy, budget=Budget(max_seconds=opts.budget_s),
                           seed=opts.seed).run()
    sweep = BeltSweep(rows=runner.rows, strategy=opts.strategy, stopped_by=result.stopped_by)
    if result.best is not None:
        best = dict(result.best.candidate)
        sweep.best = dict(next(r for r in runner.rows if r["status"] == "ok"
                               and all(r.get(k) == v for k, v in best.items())))
    return sweep
