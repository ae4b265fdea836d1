"""Tune what a model needs: many GEMM problems, builds shared, one total budget.

:func:`autotune_many` tunes a list of problems on this GPU: every problem's candidates
(:func:`~pyc_lab.kernels.tuning.gemm_runner.candidates_for`) are submitted up front to
one :class:`~pyc_lab.kernels.tuning.builds.SharedBuilds` pool, so identical kernels are
built once and builds run in parallel while the first problems are measured; the
problems are then tuned one after another (:func:`~pyc_lab.kernels.tuning.autotune.
autotune_gemm`: CUTLASS candidates and the libraries in the same run, recorded), each
given an equal share of what is left of the total budget. With ``replay=True`` the same
search runs against a recording (:func:`~pyc_lab.kernels.tuning.autotune.
replay_autotune`), on a machine without a GPU.

The result's :attr:`ManyResult.summary` is one row per problem: the winner (a CUTLASS
configuration or a library), its speed-up over the best library, candidates tried and
the time spent.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PycLabError
from ..cutlass.config import Epilogue, check_dtype_layout
from .options import GemmTuneOptions
from .recording import check_problem
from .result import TuneResult, is_tuned_winner

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["GemmProblem", "ManyResult", "autotune_many", "parse_problems", "read_problems",
           "resolve_sweep"]

log = logging.getLogger(__name__)

#: Seconds of budget per problem when no total budget is given.
BUDGET_PER_PROBLEM_S = 60.0
SUMMARY_COLUMNS = ["problem", "dtype", "layout", "m", "n", "k", "winner", "winner_ms",
                   "best_cutlass_ms", "best_library", "best_library_ms", "speedup",
                   "candidates", "ok", "seconds", "status", "message"]


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM problem to tune: ``a`` (M x K) times ``b`` (K x N) in a dtype and layout,
    with an optional fused epilogue (a bias row and/or an activation)."""

    m: int
    n: int
    k: int
    dtype: str = GemmTuneOptions.dtype
    layout: str = GemmTuneOptions.layout
    bias: bool = False
    activation: str | None = None

    def __post_init__(self) -> None:
        check_problem(self.m, self.n, self.k, "autotune_many")
        check_dtype_layout(self.dtype, self.layout)
        GemmTuneOptions(dtype=self.dtype, layout=self.layout, bias=self.bias,
                        activation=self.activation)  # checks the activation

    @property
    def label(self) -> str:
        """``"f16 tn 4096x4096x4096"`` (``... +bias_gelu`` with an epilogue)."""
        epi = Epilogue(self.bias, self.activation)
        return (f"{self.dtype} {self.layout} {self.m}x{self.n}x{self.k}"
                + (f" +{epi.name}" if epi.fused else ""))


_SHAPE = re.compile(r"^\s*(\d+)\s*[xX,*]\s*(\d+)\s*[xX,*]\s*(\d+)\s*$")


def _one(item: Any, dtype: str, layout: str) -> GemmProblem:
    if isinstance(item, GemmProblem):
        return item
    if isinstance(item, str):
        match = _SHAPE.match(item)
        if match is None:
            raise PycLabError(f"autotune_many: problem {item!r} is not 'MxNxK'")
        return GemmProblem(*(int(g) for g in match.groups()), dtype, layout)
    if isinstance(item, Mapping):
        return GemmProblem(item["m"], item["n"], item["k"], item.get("dtype", dtype),
                           item.get("layout", layout), bool(item.get("bias", False)),
                           item.get("activation"))
    if all(hasattr(item, name) for name in ("m", "n", "k")):  # ProblemKey and the like
        return GemmProblem(item.m, item.n, item.k,
                           getattr(item, "dtype_a", getattr(item, "dtype", dtype)),
                           getattr(item, "layout", layout))
    if isinstance(item, (tuple, list)) and 3 <= len(item) <= 5:
        return GemmProblem(*item[:3], *(list(item[3:]) + [dtype, layout][len(item) - 3:]))
    raise PycLabError(f"autotune_many: cannot read a GEMM problem from {item!r}; give "
                      "(M, N, K[, dtype[, layout]]), 'MxNxK', a dict with m, n, k or a "
                      "ProblemKey")


def parse_problems(problems: Iterable[Any], dtype: str = GemmTuneOptions.dtype,
                   layout: str = GemmTuneOptions.layout) -> list[GemmProblem]:
    """The problems as :class:`GemmProblem` s, duplicates dropped (first kept).

    Parameters
    ----------
    problems
        Tuples ``(M, N, K)``, ``(M, N, K, dtype)`` or ``(M, N, K, dtype, layout)``,
        strings ``"MxNxK"``, dicts with ``m``, ``n``, ``k`` (and optionally ``dtype``,
        ``layout``, ``bias``, ``activation``: what
        :meth:`pyc_lab.compiler.CompiledFunction.gemm_problems` returns),
        :class:`~pyc_lab.kernels.tuning.keys.ProblemKey` s or :class:`GemmProblem` s.
    dtype, layout
        For the items that do not say.

    Raises
    ------
    PycLabError
        For an item that is none of those, or an empty list.
    """
    if isinstance(problems, (str, GemmProblem)):
        problems = [problems]
    out = list(dict.fromkeys(_one(p, dtype, layout) for p in problems))
    if not out:
        raise PycLabError("autotune_many: no problems given")
    return out


def read_problems(path: str | Path, dtype: str = GemmTuneOptions.dtype,
                  layout: str = GemmTuneOptions.layout) -> list[GemmProblem]:
    """Problems from a file: a JSON list (of what :func:`parse_problems` takes), or text
    with one problem a line, ``MxNxK [dtype [layout]]`` (``#`` starts a comment).

    Raises
    ------
    PycLabError
        For a missing or unreadable file, or a line that is not a problem.
    """
    import json

    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PycLabError(f"cannot read problems from {file}: {exc}") from None
    if file.suffix == ".json":
        try:
            return parse_problems(json.loads(text), dtype, layout)
        except ValueError as exc:
            raise PycLabError(f"{file} is not JSON: {exc}") from None
    items: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        match = _SHAPE.match(words[0])
        if match is None or len(words) > 3:
            raise PycLabError(f"{file}:{number}: {line.strip()!r} is not 'MxNxK [dtype "
                              "[layout]]'")
        items.append(GemmProblem(*(int(g) for g in match.groups()),
                                 *(words[1:] + [dtype, layout][len(words) - 1:])))
    return parse_problems(items, dtype, layout)


@dataclass
class ManyResult:
    """What :func:`autotune_many` found, per problem and in total.

    Attributes
    ----------
    problems
        The problems, in the order tuned.
    results
        ``problem -> TuneResult`` (``None`` where the problem could not be tuned: no
        CUTLASS kernel takes it, or it is not in the recording replayed).
    messages
        ``problem -> why`` for those.
    seconds
        Wall time of the whole run.
    budget_s
        The total budget it was given.
    builds_requested, builds_distinct
        Kernels asked for by all problems, and distinct kernels built (live only).
    replay
        Whether the results were replayed from a recording.
    workers
        ``problem -> where it was tuned`` (a Dask worker's address) over a cluster.
    """

    problems: list[GemmProblem]
    results: dict[GemmProblem, TuneResult | None]
    messages: dict[GemmProblem, str] = field(default_factory=dict)
    seconds: dict[GemmProblem, float] = field(default_factory=dict)
    total_seconds: float = 0.0
    budget_s: float | None = None
    builds_requested: int = 0
    builds_distinct: int = 0
    replay: bool = False
    workers: dict[GemmProblem, str] = field(default_factory=dict)

    @property
    def summary(self) -> pd.DataFrame:
        """One row per problem: winner, its time, the best CUTLASS and library times,
        ``speedup`` (best library / best CUTLASS; above 1: the tuned kernel is faster),
        candidates tried and correct, seconds spent, status and message (and, tuned
        over a cluster, the ``worker`` that tuned it)."""
        import pandas as pd

        rows = []
        for p in self.problems:
            res = self.results.get(p)
            row: dict[str, Any] = {"problem": p.label, "dtype": p.dtype, "layout": p.layout,
                                   "m": p.m, "n": p.n, "k": p.k,
                                   "seconds": round(self.seconds.get(p, 0.0), 2)}
            if self.workers:  # tuned over a cluster: where each problem ran
                row["worker"] = self.workers.get(p)
            if res is None:
                row.update(winner="library", status="not tuned",
                           message=self.messages.get(p, "")[:300], candidates=0, ok=0)
            else:
                lib = res.best_library
                table = res.table
                ok = int((table["status"] == "ok").sum()) if len(table) else 0
                row.update(winner=res.winner, winner_ms=res.winner_ms,
                           best_cutlass_ms=res.best.time_ms if res.best is not None
                           and res.best.ok else None,
                           best_library=lib[0] if lib else None,
                           best_library_ms=lib[1] if lib else None, speedup=res.speedup,
                           candidates=len(table), ok=ok, status=res.stopped_by or "done",
                           message=self.messages.get(p, ""))
            rows.append(row)
        columns = [*SUMMARY_COLUMNS, "worker"] if self.workers else SUMMARY_COLUMNS
        frame = pd.DataFrame(rows, columns=columns)
        frame.attrs["budget_s"] = self.budget_s
        frame.attrs["replay"] = self.replay
        return frame

    def __repr__(self) -> str:
        tuned = sum(r is not None for r in self.results.values())
        wins = sum(1 for r in self.results.values()
                   if r is not None and is_tuned_winner(r.winner))
        mode = "replayed" if self.replay else "tuned"
        return (f"ManyResult({len(self.problems)} problems, {tuned} {mode}, tuned-kernel wins "
                f"{wins}; see .summary)")


def resolve_sweep(problems: Iterable[Any], options: GemmTuneOptions | None,
                  settings: Mapping[str, Any], budget_s: float | None
                  ) -> tuple[GemmTuneOptions, list[GemmProblem], float]:
    """A sweep's options, problems and total budget (default
    :data:`BUDGET_PER_PROBLEM_S` per problem), checked: what every runner of a list of
    problems starts from.

    Raises
    ------
    PycLabError
        For unreadable problems, options or budget.
    """
    opts = GemmTuneOptions.resolve(options, {k: v for k, v in settings.items()
                                             if k != "budget_s"})
    items = parse_problems(problems, opts.dtype, opts.layout)
    if budget_s is None:
        budget_s = BUDGET_PER_PROBLEM_S * len(items)
    GemmTuneOptions.resolve(opts, {"budget_s": budget_s})  # validates the number
    return opts, items, float(budget_s)


def _share(total: float | None, started: float, left: int) -> float | None:
    """An equal share of what is left of ``total`` for each of ``left`` problems."""
    if total is None:
        return None
    return max(0.0, (total - (time.perf_counter() - started)) / max(1, left))


def autotune_many(problems: Iterable[Any], *, budget_s: float | None = None,
                  workers: int | None = None, db: Any = None, cache: Any = None,
                  options: GemmTuneOptions | None = None, replay: bool = False,
                  source: str | Path | None = None, stop: threading.Event | None = None,
                  **settings: Any) -> ManyResult:
    """Tune a list of GEMM problems with shared, parallel builds and one total budget.

    Parameters
    ----------
    problems
        What to tune (see :func:`parse_problems`): e.g. ``[(1, 4096, 4096),
        (2048, 14336, 4096, "bf16"), "8x4096x4096"]``, or a compiled function's
        matmuls for given arguments: ``f.gemm_problems(x, w, b)``.
    budget_s
        Total seconds for the whole list (default 60 per problem), shared fairly: each
        problem gets an equal share of what the problems before it left over.
        Shared builds run in the background throughout.
    workers
        Parallel nvcc builds (default: the CPU count); live only.
    db, cache
        The tuning database and kernel cache (the user's by default); live only.
    options, **settings
        :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions` fields for every
        problem (``dtype`` and ``layout`` are the defaults of problems that do not say;
        ``budget_s`` is replaced by each problem's share).
    replay
        Replay the search against a recording instead of tuning (no GPU needed);
        problems not in the recording are reported as not tuned.
    source
        The recording to replay (``None``: the H200 recording shipped with pyc_lab).
    stop
        Set it to stop after the candidate being measured; the problems left are
        reported as not tuned.

    Returns
    -------
    ManyResult
        ``.summary`` (pandas DataFrame, one row per problem) and ``.results``.

    Raises
    ------
    PycLabError
        For unreadable problems or options; live, without a GPU, nvcc or
        nvidia-cutlass. A problem no CUTLASS kernel takes is not an error: it is
        reported as not tuned (the library serves it).
    """
    opts, items, budget_s = resolve_sweep(problems, options, settings, budget_s)
    started = time.perf_counter()
    result = ManyResult(items, {}, budget_s=budget_s, replay=replay)
    shared = None if replay else _start_builds(items, opts, workers, cache)
    try:
        for i, p in enumerate(items):
            if stop is not None and stop.is_set():
                result.results[p] = None
                result.messages[p] = "stopped before this problem"
                continue
            share = _share(budget_s, started, len(items) - i)
            popts = dataclasses.replace(opts, dtype=p.dtype, layout=p.layout, budget_s=share,
                                        workers=workers or opts.workers, bias=p.bias,
                                        activation=p.activation)
            t0 = time.perf_counter()
            result.results[p] = None
            try:
                if replay:
                    from .autotune import replay_autotune

                    result.results[p] = replay_autotune(p.m, p.n, p.k, options=popts,
                                                        source=source, stop=stop)
                else:
                    from .autotune import autotune_gemm

                    result.results[p] = autotune_gemm(p.m, p.n, p.k, options=popts, db=db,
                                                      cache=cache, stop=stop,
                                                      builds=shared)
            except PycLabError as exc:
                result.messages[p] = str(exc)
                log.info("autotune_many: %s not tuned: %s", p.label, exc)
            result.seconds[p] = time.perf_counter() - t0
    finally:
        if shared is not None:
            result.builds_requested, result.builds_distinct = shared.requested, shared.distinct
            shared.shutdown(wait=False)
    result.total_seconds = time.perf_counter() - started
    return result


def _start_builds(items: list[GemmProblem], opts: GemmTuneOptions, workers: int | None,
                  cache: Any) -> Any:
    """Submit every problem's candidates to one shared pool, the best-ranked of each
    problem first (round-robin), so that every problem's first builds come early."""
    from ...hardware.device import require_cupy
    from .builds import SharedBuilds
    from .gemm_runner import candidates_for
    from .keys import device_key

    require_cupy("autotune_many")
    _device, cc, sm_count = device_key()
    shared = SharedBuilds(workers or opts.workers, cache)
    lists = []
    for p in items:
        popts = dataclasses.replace(opts, dtype=p.dtype, layout=p.layout, bias=p.bias,
                                    activation=p.activation)
        if not popts.cutlass:
            continue  # nothing to build
        try:
            lists.append((popts, candidates_for(p.m, p.n, p.k, popts, cc, sm_count)[0]))
        except PycLabError as exc:
            log.info("autotune_many: no candidates for %s: %s", p.label, exc)
    depth = max((len(c) for _o, c in lists), default=0)
    for j in range(depth):
        for popts, configs in lists:
            if j < len(configs):
                shared.submit([configs[j]], popts.dtype, popts.layout, cc, popts.epilogue)
    shared.requested = 0  # count what the runners ask for, not this warm-up
    return shared
