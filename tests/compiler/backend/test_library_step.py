"""A library step's bound call on the CPU, with stand-ins for CuPy arrays: which attention
operands the bound form takes (and as what views), and that a step makes the call once
per placement of its inputs, keeps it while they stay, runs the reference for large
inputs, and gives the call to CUDA-graph replays."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from pyc_lab.compiler.attention_op import attention_bound
from pyc_lab.compiler.backend.lowering import lower
from pyc_lab.compiler.backend.steps import BOUND_INPUT_BYTES, _LibraryStep
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.ops import REGISTRY
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.policy import choose
from pyc_lab.compiler.tracer import trace

F16, F32 = np.float16, np.float32
NOT_NUMPY = SimpleNamespace(name="a CuPy stand-in")


def _attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * np.float16(0.125)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.fixture
def recorded(monkeypatch):
    """``bound_attention`` replaced by a recorder of its arguments."""
    calls = []

    def record(q, k, v, *, causal, scale, mask):
        calls.append({"q": q, "k": k, "v": v, "causal": causal, "scale": scale,
                      "mask": mask})
        return "a bound call"

    monkeypatch.setattr("pyc_lab.kernels.attention_bound.bound_attention", record)
    return calls


def _ops(rng, *shapes, dtype=F16):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def test_the_bound_form_views_the_operands_as_the_reference_does(rng, recorded):
    q, k, v = _ops(rng, (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4))
    attrs = {"dtype": "float16", "scale": 0.5, "causal": True}
    assert attention_bound(NOT_NUMPY, [q, k, v], attrs) == "a bound call"
    (got,) = recorded
    assert got["q"].shape == (1, 6, 5, 8) and got["k"].shape == (1, 6, 7, 8)
    assert got["v"].shape == (1, 6, 7, 4) and np.shares_memory(got["q"], q)
    assert got["causal"] is True and got["scale"] == 0.5 and got["mask"] is None
    mask = rng.random((1, 5, 7)) < 0.5
    attention_bound(NOT_NUMPY, [q, k, v, mask], attrs)
    assert recorded[-1]["mask"].shape == (1, 1, 5, 7)
    # 3-D operands (one leading axis)
    q3, k3, v3 = _ops(rng, (4, 5, 8), (4, 7, 8), (4, 7, 8))
    attention_bound(NOT_NUMPY, [q3, k3, v3], attrs)
    assert recorded[-1]["q"].shape == (1, 4, 5, 8)


def test_operands_the_bound_form_leaves_to_the_reference(rng, recorded):
    q, k, v = _ops(rng, (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8))
    attrs = {"dtype": "float16", "scale": 0.5}
    assert attention_bound(np, [q, k, v], attrs) is None  # NumPy: the reference
    kb = rng.standard_normal((1, 3, 7, 8)).astype(F16)  # broadcast leading axes
    assert attention_bound(NOT_NUMPY, [q, kb, v], attrs) is None
    assert attention_bound(NOT_NUMPY, [q.astype(F32), k, v], attrs) is None  # promoted
    assert attention_bound(NOT_NUMPY, [q[..., ::2], k[..., ::2], v], attrs) is None
    per_head = rng.random((2, 1, 5, 7)) < 0.5  # not one mask for every (batch, head)
    assert attention_bound(NOT_NUMPY, [q, k, v, per_head], attrs) is None
    wider = rng.standard_normal((5, 7)).astype(F32)  # scores in the mask's precision
    assert attention_bound(NOT_NUMPY, [q, k, v, wider], attrs) is None
    strided = (rng.random((7, 5)) < 0.5).T  # a copy would not see later writes
    assert attention_bound(NOT_NUMPY, [q, k, v, strided], attrs) is None
    assert recorded == []


class _Array:
    """A CuPy array stand-in: an address, a shape, strides, a dtype."""

    def __init__(self, ptr, shape, dtype=F16):
        self.data = SimpleNamespace(ptr=ptr)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.strides = tuple(int(s) for s in np.empty(shape, dtype).strides)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize


def _step_and_executor():
    args = [np.ones((2, 3, 16, 8), F16)] * 3
    graph = PassManager(mode="balanced").run(trace(_attention, tuple(args))[0]).graph
    impl = {d.node: d.choice for d in choose(graph, "cupy", "balanced", supports)}
    steps = [s for s in lower(graph, impl).steps if isinstance(s, _LibraryStep)]
    (step,) = steps
    exe = SimpleNamespace(_cp=SimpleNamespace(empty=lambda shape, dtype: ("out", shape)),
                          _buffer_view=None, graph=graph, _fallbacks={})
    return step, exe


@pytest.fixture
def bound_op(monkeypatch):
    """The attention op's bound form replaced by one recording what it is made for and
    what each call writes to."""
    made, writes = [], []

    def bound(xp, ins, attrs):
        made.append([x.data.ptr for x in ins])
        return writes.append

    opdef = REGISTRY["attention"]
    monkeypatch.setitem(REGISTRY, "attention", dataclasses.replace(opdef, bound=bound))
    return made, writes


def test_a_step_binds_once_per_placement_of_its_inputs(bound_op):
    made, writes = bound_op
    step, exe = _step_and_executor()
    node = step.node
    first = {i: _Array(1000 * (n + 1), (2, 3, 16, 8)) for n, i in enumerate(node.inputs)}
    for _ in range(3):
        values = dict(first)
        step.run(exe, values)
        assert values[node.id] == ("out", node.shape)
    assert made == [[1000, 2000, 3000]] and len(writes) == 3
    moved = dict(first)
    moved[node.inputs[0]] = _Array(9000, (2, 3, 16, 8))
    step.run(exe, moved)
    assert made[-1] == [9000, 2000, 3000] and len(writes) == 4
    # the graph replay's call is the bound call on the static output
    call = step.static_call(exe, dict(first))
    call()
    assert writes[-1] == ("out", node.shape)


def test_large_inputs_run_the_reference(bound_op, monkeypatch):
    made, _ = bound_op
    step, exe = _step_and_executor()
    node = step.node
    side = BOUND_INPUT_BYTES // (2 * 3 * 8) + 1  # one operand alone over the bound
    values = {i: _Array(1000 * (n + 1), (2, 3, side, 8)) for n, i in enumerate(node.inputs)}
    ran = []
    monkeypatch.setattr("pyc_lab.compiler.backend.steps._CupyStep.run",
                        lambda self, exe, values: ran.append(self.node.id))
    step.run(exe, values)
    assert ran == [node.id] and made == []
