"""What the live runners of pyc_lab's own kernels share (the convolutions' and the
attention kernel's): the search space of a ranked configuration list, the candidate
table with its tuning-database measurements, and the confirmation of the fastest
candidates against the libraries in interleaved rounds.

A configuration is any frozen object with ``id`` and ``to_dict()`` (a convolution's
tile and cluster, an attention kernel's key block, stages and warpgroups); its
``from_dict`` class method reads a candidate back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...search import Outcome, SearchSpace, StopSearch
from ...units import tflops
from .builds import wait_for_build
from .gemm_runner import CONFIRM_TOP, interleaved_ms
from .keys import Measurement

__all__ = ["CandidateRows", "listed_space"]


def listed_space(configs: Sequence[Any]) -> SearchSpace:
    """The configurations as a search space: one parameter per ``to_dict`` field, and a
    restriction to the combinations listed. Configurations of two kinds (the convolution
    gradients' two kernel families) make one space over the union of their fields, a
    field a configuration lacks being ``None`` there."""
    dicts = [c.to_dict() for c in configs]
    names = list(dict.fromkeys(n for d in dicts for n in d))
    listed = {tuple(d.get(n) for n in names) for d in dicts}
    mixed = any(len(d) != len(names) for d in dicts)
    params = {n: sorted({d.get(n) for d in dicts}, key=(lambda v: (v is None, str(v)))
                        if mixed else None) for n in names}

    def exists(cand: Mapping[str, Any]) -> bool:
        return tuple(cand.get(n) for n in names) in listed

    return SearchSpace(params, restrictions=[exists])


class CandidateRows:
    """The table of a tuning run's candidates and their database measurements.

    Subclasses set ``config_type`` (with ``from_dict``), ``configs``, ``flops``,
    ``baselines``, ``_builds`` (config -> BuildResult), ``_futures`` (config -> build
    future), ``_deadline`` (the budget's end, or None) and ``_hung`` (the candidate that
    hung the GPU, or None) before evaluating, and ``_libraries`` (baseline name -> a
    call of that library); ``evaluate`` puts each correct candidate's timed launch in
    ``_launches`` (config id -> (config, launch)) for :meth:`confirm`.
    """

    config_type: Any
    configs: list[Any]
    flops: int
    baselines: dict[str, float]
    _builds: dict[Any, Any]
    _futures: dict[Any, Any]
    _deadline: float | None
    _hung: str | None

    def space(self) -> SearchSpace:
        """The ranked configurations as a search space."""
        return listed_space(self.configs)

    def _library_of(self, cfg: Any) -> tuple[Path | None, Outcome | None]:
        """``cfg``'s built library, or the outcome recorded instead (its build did not
        finish within the budget, or failed). A candidate that hung stops the search."""
        if self._hung is not None:
            raise StopSearch(f"{self._hung} hung; the GPU context is unusable")
        res = wait_for_build(self._futures[cfg], self._deadline)
        if res is None:
            return None, self._finish(cfg, "skipped", message="its build did not finish "
                                      "within the tuning budget")
        if not res.ok:
            return None, self._finish(cfg, "compile_error", message=res.message)
        return res.library, None

    def _init_rows(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self._measurements: dict[str, Measurement] = {}
        self._launches: dict[str, tuple[Any, Any]] = {}

    def confirm(self, repeats: int, top: int = CONFIRM_TOP) -> Measurement | None:
        """Time the ``top`` fastest correct candidates and the libraries again in
        interleaved rounds (:func:`~pyc_lab.kernels.tuning.gemm_runner.interleaved_ms`),
        keep the medians as their measurements and baselines, and return the fastest
        candidate's measurement (``None`` when none was correct). A search times each
        candidate once, seconds apart from the others; a drift of the clocks in between
        must not pick the winner."""
        ok = sorted((self._measurements[cid].time_ms, cid) for cid in self._launches)
        best = [cid for _ms, cid in ok[:top]]
        if not best:
            return None
        ms = interleaved_ms({**{cid: self._launches[cid][1] for cid in best},
                             **self._libraries}, repeats)
        for name in self._libraries:
            self.baselines[name] = ms[name]
        for cid in best:
            m = self._measurements[cid]
            self._finish(self._launches[cid][0], "ok", ms[cid], m.error, m.message)
        return self._measurements[min(best, key=ms.__getitem__)]

    def _finish(self, cfg: Any, status: str, ms: float | None = None,
                error: float | None = None, message: str = "") -> Outcome:
        res = self._builds.get(cfg)
        rate = tflops(self.flops, ms)
        row = {"config": cfg.id, "status": status, "ms": ms, "tflops": rate, "error": error,
               "build_s": round(res.seconds, 1) if res else None,
               "build": res.status if res else None, "message": message[:500],
               **cfg.to_dict()}
        self.rows[cfg.id] = row
        self._measurements[cfg.id] = Measurement(cfg.to_dict(), status, ms, rate, error,
                                                 message)
        return Outcome(status, ms, message, {**row, "built": len(self._builds),
                                             "total": len(self.configs)})

    def measurement(self, candidate: Mapping[str, Any]) -> Measurement | None:
        """The recorded measurement of a candidate."""
        return self._measurements.get(self.config_type.from_dict(dict(candidate)).id)

    def measurements(self) -> list[Measurement]:
        """Every candidate measured, failed builds, and the baseline rows."""
        for cfg, fut in self._futures.items():
            if cfg.id not in self.rows and fut.done() and not fut.result().ok:
                self._finish(cfg, "compile_error", message=fut.result().message)
        return [*self._measurements.values(), *(
            Measurement({"baseline": name}, "baseline", ms, tflops(self.flops, ms))
            for name, ms in self.baselines.items())]
