"""Launching generated kernels: which entry (vectorised when the pointers allow), which grid.

:func:`launch_elementwise` and :func:`launch_rows` pick a kernel's vectorised entry when
every vector-accessed pointer is aligned (else the general one) and launch one thread
per element or vector, or one block per group of rows; :class:`ColumnLaunch` holds a
column kernel's split of the reduced axes for one GPU and the workspace of its partial
results. Measured choices are cited where they are made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import PycLabError
from ..codegen.column_reduction import split_count
from ..codegen.cuda_types import KernelSource

__all__ = ["MAX_ELEMENTWISE_BLOCKS", "MAX_ROW_BLOCKS", "ColumnLaunch", "alignment_plan",
           "launch_elementwise", "launch_rows"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: The most blocks a row kernel is launched with (CUDA's grid limit is 2**31 - 1).
MAX_ROW_BLOCKS = 1 << 30
#: The most blocks an elementwise kernel is launched with.
MAX_ELEMENTWISE_BLOCKS = 1 << 30


def _pointer_ok(arr: Any, nbytes: int) -> bool:
    return arr.data.ptr % nbytes == 0


def alignment_plan(src: KernelSource, n_inputs: int) -> tuple[tuple[int, int], ...]:
    """What the vectorised entry of an elementwise or row kernel needs: (position in the
    launch's argument list ``(*ins, out, *extra_outs)``, byte alignment) per
    vector-accessed pointer; empty when there is no vectorised entry. Worked out once per
    step, so that a call only tests the pointers."""
    launch = src.launch
    if not launch.get("vec_kernel"):
        return ()
    need = launch["align_bytes"]
    plan = []
    for key, nbytes in need.items():
        if key == "out":
            plan.append((n_inputs, nbytes))
        elif key.startswith("out"):  # out1, out2, ...: the extra outputs
            plan.append((n_inputs + int(key[3:]), nbytes))
        else:  # in0, in1, ...: the inputs read by vectors
            plan.append((int(key[2:]), nbytes))
    return tuple(plan)


def _aligned(args: Sequence[Any], plan: tuple[tuple[int, int], ...]) -> bool:
    return all(args[position].data.ptr % nbytes == 0 for position, nbytes in plan)


def launch_elementwise(sm_count: int, kernels: dict[str, Any], src: KernelSource,
                       ins: list[Any], out: Any, extra_outs: Sequence[Any] = (),
                       plan: tuple[tuple[int, int], ...] | None = None) -> str | None:
    """Launch an elementwise (or epilogue) kernel: the vectorised entry when every vector
    pointer is aligned, else the general one; the name of the kernel launched (None:
    nothing to do).

    One thread per element (or vector): the kernels' grid-stride loops only matter past
    :data:`MAX_ELEMENTWISE_BLOCKS`. A grid capped at one device of resident blocks was
    1-12 % slower on the suite's elementwise programs on the H200 (GELU, polynomial,
    batch norm, rotary, Adam; benchmarks/results/h200/elementwise-grid.json).
    ``sm_count`` is kept for the launchers' common signature. ``extra_outs`` are the
    arrays of outputs 1, 2, ... of a body with several outputs; ``plan`` is
    :func:`alignment_plan`'s answer for ``src`` (worked out here when not given)."""
    launch = src.launch
    n = launch["n"]
    if n == 0:
        return None
    if len(extra_outs) != launch.get("outputs", 1) - 1:
        raise PycLabError(f"{src.name} writes {launch.get('outputs', 1)} output(s); "
                          f"{1 + len(extra_outs)} array(s) were given")
    block = launch["block"]
    args = (*ins, out, *extra_outs)
    vec_kernel = launch.get("vec_kernel")
    if vec_kernel:
        if plan is None:
            plan = alignment_plan(src, len(ins))
        if _aligned(args, plan):
            grid = max(1, min(_cdiv(launch["n_vec"], block), MAX_ELEMENTWISE_BLOCKS))
            kernels[vec_kernel]((grid,), (block,), args)
            return vec_kernel
    grid = max(1, min(_cdiv(n, block), MAX_ELEMENTWISE_BLOCKS))
    kernels[src.name]((grid,), (block,), args)
    return src.name


def launch_rows(sm_count: int, kernels: dict[str, Any], src: KernelSource,
                ins: list[Any], out: Any,
                plan: tuple[tuple[int, int], ...] | None = None,
                extra_outs: Sequence[Any] = ()) -> str | None:
    """Launch a row kernel: the vectorised entry when every vector pointer is aligned;
    the name of the kernel launched (None: no rows).

    One block per group of rows (the kernels' grid-stride loop only matters past
    :data:`MAX_ROW_BLOCKS`): a grid capped at one full device of resident blocks was
    5-17 % slower on every row program of the suite (softmax, layer norm, RMS norm,
    masked softmax, L2 normalisation, log-softmax; benchmarks/results/h200/
    row-kernels.json). ``sm_count`` is kept for the launcher's common signature;
    ``plan`` as for :func:`launch_elementwise`; ``extra_outs`` are the arrays of a
    program's outputs 1, 2, ... (row values it also writes)."""
    launch = src.launch
    rows = launch["rows"]
    if rows == 0:
        return None
    if len(extra_outs) != launch.get("outputs", 1) - 1:
        raise PycLabError(f"{src.name} writes {launch.get('outputs', 1)} output(s); "
                          f"{1 + len(extra_outs)} array(s) were given")
    block = launch["block"]
    grid = max(1, min(_cdiv(rows, launch["rows_per_block"]), MAX_ROW_BLOCKS))
    entry = src.name
    args = (*ins, out, *extra_outs)
    vec_kernel = launch.get("vec_kernel")
    if vec_kernel:
        if plan is None:
            plan = alignment_plan(src, len(ins))
        if _aligned(args, plan):
            entry = vec_kernel
    kernels[entry]((grid,), (block,), args)
    return entry


#: The most chunks a split column reduction's last chunk combines itself (more: the
#: separate ``_combine`` kernel, which spreads the columns over the whole GPU).
INLINE_COMBINE_PARTS = 64


class ColumnLaunch:
    """How a column kernel (:mod:`~pyc_lab.compiler.codegen.column_reduction`) is
    launched on one GPU: the split of the reduced axes into chunks for each entry, and
    the workspace holding the chunks' partial results and the tiles' arrival counters
    (allocated once, here, so that a CUDA graph captures fixed pointers). A split of at
    most :data:`INLINE_COMBINE_PARTS` chunks is one launch: the last chunk of each tile
    to finish adds the tile's partial results in chunk order (the counters are zero
    again after every launch); a longer one launches the ``_combine`` kernel after it."""

    def __init__(self, src: KernelSource, sm_count: int, cp: Any) -> None:
        self.src = src
        launch = src.launch
        self.splits = {src.name: split_count(launch, sm_count, False)}
        if launch.get("vec_kernel"):
            self.splits[launch["vec_kernel"]] = split_count(launch, sm_count, True)
        parts = max(self.splits.values())
        n = launch["outer"] * launch["inner"]
        self.partial = cp.empty(parts * n, dtype=launch["acc_dtype"]) if parts > 1 else None
        tiles = max(launch["config"]["tiles"], (launch.get("vec_config") or {}).get("tiles", 0))
        inline = any(1 < p <= INLINE_COMBINE_PARTS for p in self.splits.values())
        self.arrivals = cp.zeros(launch["outer"] * tiles, dtype=np.uint32) if inline else None
        self.sm_count = sm_count

    def launch(self, kernels: dict[str, Any], x: Any, out: Any) -> str:
        """Launch on ``x`` (C-contiguous) into ``out``; the name of the first kernel."""
        launch = self.src.launch
        entry, cfg = self.src.name, launch["config"]
        vec_kernel = launch.get("vec_kernel")
        if vec_kernel and _pointer_ok(x, launch["align_bytes"]["in0"]):
            entry, cfg = vec_kernel, launch["vec_config"]
        parts = self.splits[entry]
        chunk = _cdiv(launch["r"], parts)
        workspace = self.partial if parts > 1 else out
        inline = 1 < parts <= INLINE_COMBINE_PARTS
        grid = (launch["outer"] * cfg["tiles"], parts)
        arrivals = self.arrivals if inline else np.uint64(0)  # null: no combining here
        kernels[entry](grid, (launch["block"],),
                       (x, out, workspace, np.int64(chunk), arrivals))
        if parts > 1 and not inline:
            n = launch["outer"] * launch["inner"]
            blocks = max(1, min(_cdiv(n, launch["block"]),
                                self.sm_count * (2048 // launch["block"])))
            kernels[launch["combine_kernel"]]((blocks,), (launch["block"],),
                                              (self.partial, out, np.int32(parts)))
        return entry
