"""The memory planner: liveness, best-fit reuse, views, outputs and in-place writes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pyc_lab.compiler import trace
from pyc_lab.compiler.ir import Graph
from pyc_lab.compiler.memory import VIEW_OPS, MemoryPlan, plan_memory
from pyc_lab.compiler.ops import REGISTRY
from pyc_lab.compiler.passes import PassManager
from pyc_lab.errors import PycLabError


def traced(fn, *shapes, dtype=np.float32) -> Graph:
    rng = np.random.default_rng()
    graph, _ = trace(fn, [rng.standard_normal(s).astype(dtype) for s in shapes])
    return graph


def check_plan(graph: Graph, plan: MemoryPlan) -> None:
    """No two values live at once share a buffer (except views and in-place writes),
    every buffer is big enough, outputs own theirs, and the byte counts add up."""
    order = list(graph.nodes)
    pos = {nid: k for k, nid in enumerate(order)}
    owner = {}
    for n in graph:
        owner[n.id] = owner[n.inputs[0]] if n.op in VIEW_OPS else n.id
    end = {}
    for n in graph:
        end[owner[n.id]] = max(end.get(owner[n.id], pos[n.id]), pos[n.id])
        for i in n.inputs:
            end[owner[i]] = max(end.get(owner[i], pos[n.id]), pos[n.id])
    for o in graph.outputs:
        end[owner[o]] = len(order)
    inplace = dict(plan.inplace)
    writers: dict[int, list[int]] = {}
    for nid, buf in plan.buffer_of.items():
        n = graph.nodes[nid]
        assert n.op not in ("input", "constant")
        if n.op in VIEW_OPS:
            assert plan.aliases[nid] == owner[nid]
            assert plan.buffer_of[owner[nid]] == buf
            continue
        assert plan.buffer_bytes[buf] >= n.nbytes
        writers.setdefault(buf, []).append(nid)
    for buf, nids in writers.items():
        nids.sort(key=pos.__getitem__)
        for a, b in itertools.pairwise(nids):
            assert end[a] < pos[b] or (end[a] == pos[b] and b in inplace), (buf, a, b)
    for o in graph.outputs:
        if owner[o] in plan.buffer_of:
            assert writers[plan.buffer_of[owner[o]]] == [owner[o]]
    # a shape op of inputs and constants alone (through such ops) needs no buffer
    unplanned: set[int] = set()
    for n in graph:
        if n.op in ("input", "constant") or (
                n.op in VIEW_OPS and owner[n.id] in unplanned):
            unplanned.add(n.id)
        elif REGISTRY[n.op].kind == "shape" and n.op not in VIEW_OPS and \
                owner[n.id] not in {owner[o] for o in graph.outputs} and \
                all(owner[i] in unplanned for i in n.inputs):
            unplanned.add(n.id)
            assert n.id not in plan.buffer_of
    need = [n for n in graph if n.op not in ("input", "constant") and n.op not in VIEW_OPS
            and n.id not in unplanned]
    assert plan.naive_bytes == sum(n.nbytes for n in need)
    assert all(n.id in plan.buffer_of for n in need)
    assert plan.peak_bytes <= plan.planned_bytes == sum(plan.buffer_bytes)
    if need:
        assert plan.peak_bytes >= max(n.nbytes for n in need)
    frame = plan.to_frame()
    assert list(frame.columns) == ["node", "op", "bytes", "buffer", "reuse"]
    assert list(frame.node) == order
    assert set(frame.reuse) <= {"new", "reuse", "in-place", "view", "output", "input",
                                "constant", "unplanned"}
    assert (frame.reuse == "in-place").sum() == len(plan.inplace)


def _chain(x):
    for k in range(10):
        x = np.tanh(x) if k % 2 else x * 1.5
    return x


def test_chain_of_ten_elementwise_ops_reuses_two_or_three_buffers():
    graph = traced(_chain, (64, 64))
    assert sum(n.op not in ("input", "constant") for n in graph) == 10
    plan = plan_memory(graph)
    check_plan(graph, plan)
    assert 2 <= len(plan.buffer_bytes) <= 3
    assert plan.peak_bytes < plan.naive_bytes
    assert plan.naive_bytes == 10 * 64 * 64 * 4
    assert plan.peak_bytes == 2 * 64 * 64 * 4
    assert not plan.inplace
    kinds = plan.to_frame().set_index("node").reuse
    assert list(kinds[kinds.isin(["new", "reuse", "output"])]) == \
        ["new", "new"] + ["reuse"] * 7 + ["output"]


def test_memory_first_writes_in_place():
    graph = traced(_chain, (64, 64))
    plan = plan_memory(graph, "memory_first")
    check_plan(graph, plan)
    assert len(plan.buffer_bytes) == 2  # one scratch buffer, one output
    assert len(plan.inplace) == 8
    assert plan.peak_bytes < plan.naive_bytes


def test_inputs_and_constants_get_no_buffer_and_outputs_are_never_reused():
    def fn(x):
        a = np.exp(x)
        b = a + 1.0
        return b, np.tanh(b) * 2.0

    graph = traced(fn, (8,))
    plan = plan_memory(graph)
    check_plan(graph, plan)
    for n in graph:
        if n.op in ("input", "constant"):
            assert n.id not in plan.buffer_of
    out_bufs = [plan.buffer_of[o] for o in graph.outputs]
    assert len(set(out_bufs)) == 2
    frame = plan.to_frame().set_index("node")
    assert list(frame.loc[graph.outputs].reuse) == ["output", "output"]
    assert frame.loc[graph.inputs[0], "reuse"] == "input"


def test_views_alias_and_keep_their_source_alive():
    def fn(x):
        a = np.exp(x)                  # buffer A
        v = a.reshape(4, 8)            # view of A, read at the very end
        b = np.tanh(x)                 # must not take A
        c = b * 2.0                    # nor this
        t = b.T                        # transpose: own buffer
        return (v + c.reshape(4, 8)).sum() + t.sum()

    graph = traced(fn, (8, 4))
    plan = plan_memory(graph)
    check_plan(graph, plan)
    nodes = {n.op: n.id for n in graph if n.op in ("exp", "transpose")}
    reshape_of_a = next(n.id for n in graph if n.op == "reshape"
                        and n.inputs[0] == nodes["exp"])
    assert plan.aliases[reshape_of_a] == nodes["exp"]
    assert plan.buffer_of[reshape_of_a] == plan.buffer_of[nodes["exp"]]
    assert nodes["transpose"] not in plan.aliases
    frame = plan.to_frame().set_index("node")
    assert frame.loc[reshape_of_a, "reuse"] == "view"
    assert frame.loc[nodes["transpose"], "reuse"] in ("new", "reuse")


def test_view_of_an_input_has_no_buffer_and_output_views_pin_their_source():
    def fn(x):
        a = np.exp(x)
        return x.reshape(-1), a.reshape(2, -1), np.tanh(x) + 1.0

    graph = traced(fn, (4, 4))
    plan = plan_memory(graph)
    check_plan(graph, plan)
    r_in, r_a = (n.id for n in graph if n.op == "reshape")
    assert r_in not in plan.buffer_of and plan.aliases[r_in] == graph.inputs[0]
    exp_id = next(n.id for n in graph if n.op == "exp")
    frame = plan.to_frame().set_index("node")
    assert frame.loc[exp_id, "reuse"] == "output"
    assert frame.loc[r_a, "reuse"] == "view"
    assert frame["buffer"].isna().sum() == 3  # the input, its view and the constant 1.0


def test_best_fit_picks_the_smallest_free_buffer_that_fits_and_never_grows_one():
    g = Graph("fit")
    x = g.add("input", (), {"index": 0}, name="x", shape=(100,), dtype=np.float32)
    big = g.add("exp", (x.id,))                                          # 400 B
    small = g.add("slice", (big.id,), {"index": (("s", 0, 10, None),)})  # 40 B
    mid = g.add("slice", (big.id,), {"index": (("s", 0, 50, None),)})    # 200 B
    out1 = g.add("concatenate", (small.id, mid.id), {"axis": 0})         # output
    # a slice of the input alone needs no buffer (a view of it on the GPU)
    part = g.add("slice", (x.id,), {"index": (("s", 0, 30, None),)})
    # now 400, 40 and 200 B are free: 30 elements (120 B) take the 200 B buffer
    c = g.add("exp", (part.id,))
    d = g.add("exp", (c.id,))  # 120 B: the 400 B one (c still holds the 200 B one)
    e = g.add("concatenate", (x.id, d.id, c.id), {"axis": 0})            # 640 B, new
    g.outputs = [out1.id, e.id]
    plan = plan_memory(g)
    check_plan(g, plan)
    assert plan.buffer_bytes == [400, 40, 200, 240, 640]
    assert part.id not in plan.buffer_of
    assert plan.buffer_of[c.id] == plan.buffer_of[mid.id] == 2
    assert plan.buffer_of[d.id] == plan.buffer_of[big.id] == 0
    assert plan.buffer_of[e.id] == 4
    assert plan.peak_bytes == 240 + 200 + 400 + 640  # while e is written
    kinds = dict(zip(plan.to_frame().node, plan.to_frame().reuse, strict=True))
    assert [kinds[n.id] for n in (big, small, mid, out1, part, c, d, e)] == \
        ["new", "new", "new", "output", "unplanned", "reuse", "reuse", "output"]


@pytest.mark.parametrize("mode", ["balanced", "memory_first", "utilization_first"])
def test_plans_of_optimised_graphs_are_valid(mode):
    def fn(x, w, b):
        h = np.tanh(x @ w + b)
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return (p.reshape(2, 2, 8) * 3.0).reshape(4, 8), p.T @ x

    graph = traced(fn, (4, 8), (8, 8), (8,))
    for g in (graph, PassManager(mode=mode).run(graph).graph):
        plan = plan_memory(g, mode)
        check_plan(g, plan)
        assert plan.peak_bytes <= plan.naive_bytes


def test_unknown_mode_is_refused():
    with pytest.raises(PycLabError, match="known: balanced"):
        plan_memory(traced(np.tanh, (2,)), "greedy")
