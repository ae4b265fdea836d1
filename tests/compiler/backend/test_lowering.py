"""Lowering on the CPU: the launch list a graph becomes (steps, buffers, in-place writes,
materialised views, fallbacks) and the kernels an executable lists, with no device."""

from __future__ import annotations

import numpy as np

from pyc_lab.compiler import Graph
from pyc_lab.compiler.backend.executable import CupyExecutable
from pyc_lab.compiler.backend.lowering import lower
from pyc_lab.compiler.tracer import trace

F32 = np.float32


def test_executable_lists_its_kernels_without_a_device():
    g = Graph(name="block")
    x = g.add("input", shape=(8, 64), dtype=F32)
    w = g.add("input", shape=(64, 32), dtype=F32)
    b = g.add("input", shape=(32,), dtype=F32)
    mm = g.add("matmul", [x.id, w.id, b.id], {"activation": "relu"})
    body, _ = trace(lambda h: h * 2.0 + 1.0, [np.zeros((8, 32), F32)])
    fz = g.add("fused", [mm.id], {"body": body, "ops": ("multiply", "add"),
                                  "name": "fused_0"})
    sm = g.add("softmax", [fz.id], {"axis": -1})
    s0 = g.add("sum", [sm.id], {"axis": (0,), "keepdims": False})
    g.outputs = [sm.id, s0.id]
    impl = {mm.id: "cublas", fz.id: "fused_kernel", sm.id: "reduction_kernel",
            s0.id: "reduction_kernel"}
    exe = CupyExecutable(g, impl)
    ks = exe.kernels
    assert [k["impl"] for k in ks] == ["cublas", "fused_kernel", "reduction_kernel",
                                       "reduction_kernel"]
    assert ks[0]["kind"] == "cublas" and "relu" in ks[0]["source"]
    assert ks[1]["name"] == "fused_0" and "fused_0_vec" in ks[1]["source"]
    assert ks[2]["kind"] == "rows"
    # a sum over axis 0 is a column kernel (lanes across the 32 columns)
    assert ks[3]["kind"] == "columns"
    assert "1 x 32 columns, 8 values each" in ks[3]["notes"]
    for k in ks:
        assert set(k) >= {"name", "kind", "ops", "impl", "source"}


def _chain_graph():
    """x -> fa (x + 1) -> fb (a * 2) -> softmax -> fc (s - x): fb may overwrite a."""
    m = 16
    g = Graph(name="chain")
    x = g.add("input", shape=(m, 64), dtype=F32)
    body_a, _ = trace(lambda v: v + 1.0, [np.zeros((m, 64), F32)])
    a = g.add("fused", [x.id], {"body": body_a, "ops": ("add",), "name": "fa"})
    body_b, _ = trace(lambda v: v * 2.0, [np.zeros((m, 64), F32)])
    b = g.add("fused", [a.id], {"body": body_b, "ops": ("multiply",), "name": "fb"})
    s = g.add("softmax", [b.id], {"axis": -1})
    body_c, _ = trace(lambda u, v: u - v, [np.zeros((m, 64), F32)] * 2)
    c = g.add("fused", [s.id, x.id], {"body": body_c, "ops": ("subtract",), "name": "fc"})
    g.outputs = [c.id]
    g.verify()
    impl = {a.id: "fused_kernel", b.id: "fused_kernel", s.id: "reduction_kernel",
            c.id: "fused_kernel"}
    return g, impl, (a, b, s, c)


class _Plan:
    def __init__(self, buffer_of, nbytes, inplace=()):
        self.buffer_of = buffer_of
        self.buffer_bytes = [nbytes] * (max(buffer_of.values()) + 1)
        self.aliases = {}
        self.inplace = list(inplace)


def test_recorded_inplace_write_gets_a_non_restrict_kernel():
    g, impl, (a, b, s, c) = _chain_graph()
    plan = _Plan({a.id: 0, b.id: 0, s.id: 1, c.id: 2}, a.nbytes, [(b.id, a.id)])
    exe = CupyExecutable(g, impl, plan)
    by_name = {k["name"]: k for k in exe.kernels}
    assert "in place" in by_name["fb"]["implementation"]
    assert "__restrict__" not in by_name["fb"]["source"]
    assert "__restrict__" in by_name["fa"]["source"]
    steps = {st.node.id: st for st in exe._steps}
    assert steps[b.id].out_buffer == 0 and steps[a.id].out_buffer == 0
    # the output is written to a fresh array every call (returned without a copy)
    assert steps[c.id].out_buffer is None and exe._copy_outputs == [False]


def test_unrecorded_write_into_an_input_buffer_gets_a_fresh_array(caplog):
    g, impl, (a, b, s, c) = _chain_graph()
    plan = _Plan({a.id: 0, b.id: 0, s.id: 1, c.id: 2}, a.nbytes)  # no in-place record
    with caplog.at_level("WARNING"):
        exe = CupyExecutable(g, impl, plan)
    assert "writing a fresh array" in caplog.text
    fb = next(st for st in exe._steps if st.node.id == b.id)
    assert fb.out_buffer is None
    # softmax may not write the buffer it reads either: rows kernels are never in place
    plan = _Plan({a.id: 0, b.id: 1, s.id: 1, c.id: 2}, a.nbytes, [(s.id, b.id)])
    exe = CupyExecutable(g, impl, plan)
    sm = next(st for st in exe._steps if st.node.id == s.id)
    assert sm.out_buffer is None


def test_views_of_planned_buffers_are_materialised():
    g = Graph(name="views")
    x = g.add("input", shape=(8, 8), dtype=F32)
    body, _ = trace(lambda v: v + 1.0, [np.zeros((8, 8), F32)])
    a = g.add("fused", [x.id], {"body": body, "ops": ("add",), "name": "fa"})
    t = g.add("transpose", [a.id], {"axes": (1, 0)})
    xt = g.add("transpose", [x.id], {"axes": (1, 0)})
    body_c, _ = trace(lambda u, v: u - v, [np.zeros((8, 8), F32)] * 2)
    c = g.add("fused", [t.id, xt.id], {"body": body_c, "ops": ("subtract",), "name": "fc"})
    g.outputs = [c.id]
    plan = _Plan({a.id: 0, t.id: 1, xt.id: 0, c.id: 2}, a.nbytes)
    exe = CupyExecutable(g, {a.id: "fused_kernel", t.id: "cupy", xt.id: "cupy",
                             c.id: "fused_kernel"}, plan)
    steps = {st.node.id: st for st in exe._steps}
    assert steps[t.id].materialize == "buffer"  # a view of buffer 0 -> copied to buffer 1
    assert steps[xt.id].materialize is None  # a view of the input: nothing to protect


def test_lower_releases_values_after_their_last_reader_and_records_fallbacks():
    g, impl, (a, b, s, c) = _chain_graph()
    impl = {**impl, s.id: "cublas"}  # not a matmul: falls back to CuPy, with the reason
    launch = lower(g, impl)
    by_node = {st.node.id: st for st in launch.steps}
    assert type(by_node[s.id]).__name__ == "_CupyStep"
    assert launch.fallbacks == {s.id: "cublas not used: softmax is not a matmul"}
    assert by_node[b.id].release == [a.id]  # a is read by fb only
    assert by_node[s.id].release == [b.id]
    assert by_node[c.id].release == [s.id]  # x is an input and c the output: kept
    assert [k["node"] for k in launch.kernels] == [a.id, b.id, s.id, c.id]


def test_outputs_that_are_inputs_or_constants_are_copied():
    g = Graph(name="ident")
    x = g.add("input", shape=(10,), dtype=F32)
    c = g.add("constant", (), {"value": np.asarray(2.5, F32)})
    body, _ = trace(lambda v: v + 1.0, [np.zeros((10,), F32)])
    f = g.add("fused", [x.id], {"body": body, "ops": ("add",), "name": "fa"})
    g.outputs = [x.id, c.id, f.id]
    launch = lower(g, {f.id: "fused_kernel"})
    assert launch.copy_outputs == [True, True, False]


def _conv_graph():
    """x -> conv -> relu + x (one fused kernel) -> conv: the first convolution's value
    dies inside the program, the second is the output."""
    import pyc_lab as pl
    from pyc_lab.compiler.passes import PassManager

    def block(x, w):
        h = np.maximum(pl.conv(x, w, padding=1, layout="channels_last"), 0) + x
        return pl.conv(h, w, padding=1, layout="channels_last")

    g, _ = trace(block, [np.zeros((2, 5, 5, 4), F32), np.zeros((4, 4, 3, 3), F32)])
    g = PassManager(None).run(g).graph
    convs = [n for n in g if n.op == "conv"]
    fused = next(n for n in g if n.op == "fused")
    impl = {convs[0].id: "conv", convs[1].id: "conv", fused.id: "fused_kernel"}
    return g, impl, convs, fused


def test_a_convolution_writes_its_planned_buffer_unless_it_is_an_output():
    """A library convolution inside the program writes the buffer the memory plan gives
    it (reused as the plan says, not a fresh array held as long as the program); one
    whose value is a graph output writes a fresh array every call, returned as it is."""
    from pyc_lab.compiler.memory import plan_memory

    g, impl, (first, last), fused = _conv_graph()
    plan = plan_memory(g)
    exe = CupyExecutable(g, impl, plan)
    steps = {st.node.id: st for st in exe._steps}
    assert type(steps[first.id]).__name__ == "_RecordedLibraryStep"
    assert steps[first.id].materialize == "buffer"
    assert steps[first.id].out_buffer == plan.buffer_of[first.id]
    assert steps[last.id].materialize is None and steps[last.id].out_buffer is None
    assert exe._copy_outputs == [False]
    # the fused kernel reads the convolution's buffer, and writes another
    assert steps[fused.id].out_buffer not in (None, plan.buffer_of[first.id])
