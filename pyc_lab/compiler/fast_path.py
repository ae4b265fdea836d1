"""The warm path of a compiled function's call: what a call of arrays of one kind is
compared with, and how its results are put back in the structure the function returned.

A call whose arguments are all arrays of the kinds (types, shapes, dtypes, contiguity)
of a call that ran before takes that call's artifact without its key and look-up; see
:meth:`~pyc_lab.compiler.api.CompiledFunction._fast_artifact`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .arguments import ARRAY_MODULE, array_module
from .artifact import Artifact
from .values import map_structure

__all__ = ["FastEntry", "call_kinds", "fast_entry", "pack", "packer"]


@dataclass(frozen=True)
class FastEntry:
    """A call's kind and how a later call of that kind runs (see :func:`_fast_entry`)."""

    kinds: tuple[tuple[Any, ...], ...]
    artifact: Artifact
    #: the artifact's runner, or its entry for arguments of a kind it has run already
    run: Callable[[list[Any]], list[Any]]
    #: the outputs put in the structure the function returned
    pack: Callable[[list[Any]], Any]


def fast_entry(art: Artifact, args: tuple) -> FastEntry | None:
    """What :meth:`CompiledFunction._fast_artifact` compares a later call with, made
    after ``args`` ran, or ``None`` where that call must take the full path: an argument
    that is not an array (a static value is part of the key by its value), an artifact
    that runs as written, may break the graph on the data, writes or returns an
    argument, returns a scalar, or reads captured arrays.

    A later call matching these arguments' kinds (types, shapes, dtypes, contiguity)
    passes every check the runner made of them, so a runner offering ``trusted(args)``
    gives the entry that skips those checks.
    """
    if art.dynamic is not None or art.breaks or art.captured or art.returns_input \
            or art.graph.writeback or art.graph.scalar_outputs:
        return None
    for value in args:
        module = ARRAY_MODULE.get(type(value))
        if not (array_module(value) if module is None else module):
            return None
    trusted = getattr(art.runner, "trusted", None)
    run = (trusted(args) if trusted is not None else None) or art.runner
    return FastEntry(call_kinds(args), art, run, packer(art.graph.output_tree))


def call_kinds(args: tuple) -> tuple[tuple[Any, ...], ...]:
    """Per array argument, what selects its artifact: type, shape, dtype, contiguity."""
    return tuple([(type(v), v.shape, v.dtype, v.flags.c_contiguous) for v in args])


def pack(outs: list[Any], tree: Any) -> Any:
    """The results in the structure the traced function returned (see ``trace``; a
    ``None`` it returned beside arrays stays ``None``)."""
    return map_structure(tree, lambda i: None if i is None else outs[i])


def packer(tree: Any) -> Callable[[list[Any]], Any]:
    """:func:`pack` for one output structure, worked out once: one output or a flat
    tuple of them (what most functions return) without walking the structure."""
    if isinstance(tree, int):
        return operator.itemgetter(tree)
    if type(tree) is tuple and all(isinstance(t, int) for t in tree):
        if len(tree) < 2:  # itemgetter of one index gives the value, not a tuple
            return lambda outs: tuple([outs[i] for i in tree])
        return operator.itemgetter(*tree)
    return lambda outs: pack(outs, tree)
