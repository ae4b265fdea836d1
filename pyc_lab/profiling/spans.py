"""Spans: one stage of one item on one lane, and the order stages and lanes are shown in.

A :class:`Span` is the unit every trace, timeline and overlap report is made of:
``[start_s, end_s]`` on the host ``time.perf_counter`` clock (GPU spans are mapped onto
it by :class:`~pyc_lab.profiling.clock.CudaEventClock`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import PycLabError

__all__ = ["COPY_STAGES", "GPU_STAGES", "STAGES", "Span", "lane_order", "stage_order"]

#: The pipeline's stages, in pipeline order; other stage names are allowed.
STAGES: tuple[str, ...] = ("prepare", "h2d", "compute", "d2h")
#: Stages that run on the GPU (copy engines or SMs).
GPU_STAGES: frozenset[str] = frozenset({"h2d", "compute", "d2h"})
#: Stages that are host<->device copies.
COPY_STAGES: frozenset[str] = frozenset({"h2d", "d2h"})


@dataclass(frozen=True)
class Span:
    """One stage of one item: ``[start_s, end_s]`` on the host ``perf_counter`` clock.

    Parameters
    ----------
    item
        The item's index in the pipeline's input.
    stage
        ``"prepare"``, ``"h2d"``, ``"compute"``, ``"d2h"`` (others allowed).
    lane
        Where it ran: ``"cpu-worker-0"``, ``"stream h2d"``, ``"stream compute"``, ...
    start_s, end_s
        Start and end in seconds (``time.perf_counter`` clock); ``end_s >= start_s``.
    nbytes
        Bytes moved (copies) or processed, 0 when not meaningful.
    meta
        Free-form details shown in hovers and in the Chrome trace's ``args``.
    """

    item: int
    stage: str
    lane: str
    start_s: float
    end_s: float
    nbytes: int = 0
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)):
            raise PycLabError(f"span {self.stage!r} of item {self.item} has a non-finite time")
        if self.end_s < self.start_s:
            raise PycLabError(
                f"span {self.stage!r} of item {self.item} ends before it starts "
                f"({self.start_s} > {self.end_s}); check the clock mapping"
            )
        if self.nbytes < 0:
            raise PycLabError(f"span {self.stage!r} of item {self.item} has negative nbytes")

    @property
    def duration_s(self) -> float:
        """``end_s - start_s``."""
        return self.end_s - self.start_s


def stage_order(stages: Iterable[str]) -> list[str]:
    """Known stages in pipeline order, then any others alphabetically."""
    known = {name: k for k, name in enumerate(STAGES)}
    return sorted(set(stages), key=lambda st: (known.get(st, len(known)), st))


def lane_order(lanes: Iterable[str]) -> list[str]:
    """CPU workers/threads first (natural order), then streams (h2d, compute, d2h, others).

    Examples
    --------
    >>> lane_order(["stream d2h", "cpu-worker-10", "stream h2d", "cpu-worker-2"])
    ['cpu-worker-2', 'cpu-worker-10', 'stream h2d', 'stream d2h']
    """
    def key(lane: str) -> tuple[Any, ...]:
        is_stream = "stream" in lane.lower()
        stage = next((k for k, st in enumerate(STAGES) if st in lane.lower()), len(STAGES))
        natural = tuple((0, int(tok), "") if tok.isdigit() else (1, 0, tok)
                        for tok in re.findall(r"\d+|\D+", lane))
        return (is_stream, stage if is_stream else 0, natural)

    return sorted(set(lanes), key=key)
