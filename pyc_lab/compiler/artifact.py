"""What :func:`~pyc_lab.compiler.api.compile` builds for one input signature: the
graphs before and after the passes, the decisions, the memory plan, the runner and the
guards the call re-checks (see :class:`Artifact`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import guards as guards_
from .ir import Graph
from .policy import Decision

__all__ = ["Artifact"]


@dataclass
class Artifact:
    """Everything built for one input signature."""

    key: tuple
    backend: str
    graph_before: Graph
    graph: Graph
    pass_log: Any
    notes: list[str]
    decisions: list[Decision]
    plan: Any
    breaks: list[dict[str, Any]]
    runner: Callable[[list[Any]], list[Any]]
    kernels: list[dict[str, Any]] = field(default_factory=list)
    compile_ms: float = 0.0
    calls: int = 0
    guards: guards_.Guards = field(default_factory=guards_.Guards)
    #: names of the captured arrays that are graph inputs after the arguments
    captured: list[str] = field(default_factory=list)
    #: output position -> (input position, view ops): results that are a written
    #: argument or a view of one
    returns_input: dict[int, tuple[int, tuple]] = field(default_factory=dict)
    #: why the function now runs as written (a graph break's shape changed), or None
    dynamic: str | None = None
