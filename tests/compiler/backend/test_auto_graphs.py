"""``cuda_graph="auto"`` (the default of ``pl.compile``): which launch lists it captures
and why, decided on the CPU from the lowering (no device needed); the GPU half, that a
captured program replays NumPy's answers, is in test_graphs_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.backend.executable import AUTO_GRAPH_BYTES, CupyExecutable
from pyc_lab.compiler.codegen import supports
from pyc_lab.compiler.memory import plan_memory
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.policy import choose
from pyc_lab.compiler.tracer import trace
from pyc_lab.errors import PycLabError

F32 = np.float32


def _executable(fn, *args, cuda_graph="auto"):
    graph, _ = trace(fn, args)
    graph = PassManager(mode="balanced").run(graph).graph
    impl = {d.node: d.choice for d in choose(graph, "cupy", "balanced", supports)}
    return CupyExecutable(graph, impl, plan_memory(graph, "balanced"), cuda_graph=cuda_graph)


def _two_launches(x):  # a column sum and a row maximum: two kernels (two row spaces)
    return x.sum(axis=0), x.max(axis=1)


def _one_launch(x):
    return np.tanh(x) * 2 + 1


def test_several_launches_on_small_arrays_are_captured():
    exe = _executable(_two_launches, np.ones((64, 32), F32))
    assert exe.graph_mode == "auto"
    assert exe.cuda_graph
    assert "captured at the second call" in exe.graph_decision


def test_one_launch_is_not_captured():
    exe = _executable(_one_launch, np.ones((64, 32), F32))
    assert not exe.cuda_graph
    assert exe.graph_decision.startswith("one launch")


def test_large_arrays_are_not_captured():
    rows = AUTO_GRAPH_BYTES // (4 * 32) + 1  # just over the bound in inputs alone
    exe = _executable(_two_launches, np.ones((rows, 32), F32))
    assert not exe.cuda_graph
    assert "MiB" in exe.graph_decision and "GPU time" in exe.graph_decision


def test_a_library_call_a_graph_cannot_record_is_not_captured():
    def attention(q, k, v):
        s = q @ np.swapaxes(k, -1, -2) * F32(0.125)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ v

    q = np.ones((1, 2, 16, 8), F32)
    exe = _executable(attention, q, q, q)
    assert not exe.cuda_graph
    assert "cannot record" in exe.graph_decision


@pytest.mark.parametrize("asked", [True, False])
def test_an_explicit_choice_is_kept(asked):
    exe = _executable(_one_launch, np.ones((64, 32), F32), cuda_graph=asked)
    assert exe.cuda_graph is asked and exe.graph_mode is asked
    assert exe.graph_decision is None


def test_compile_refuses_other_values():
    with pytest.raises(PycLabError, match="cuda_graph must be True, False or 'auto'"):
        pl.compile(_one_launch, cuda_graph="always")


def test_explain_says_what_was_decided():
    from pyc_lab.compiler.explain import _graph_line

    auto = _executable(_two_launches, np.ones((64, 32), F32))
    assert _graph_line(auto).startswith("yes (auto): captured at the second call")
    assert _graph_line(_executable(_one_launch, np.ones(8, F32), cuda_graph=False)) == \
        "no (cuda_graph=False)"
    auto.graph_capture_error = "RuntimeError: boom"
    assert "the capture failed" in _graph_line(auto)
    # the NumPy backend has no executable: no line
    f = pl.compile(_one_launch)
    assert f.explain(np.ones(8, F32)).cuda_graph is None
