"""CUDA-graph segments on the CPU: the launch list split around the library calls."""

from __future__ import annotations

import numpy as np

from pyc_lab.compiler import Graph
from pyc_lab.compiler.backend.graphs import segments
from pyc_lab.compiler.backend.lowering import lower
from pyc_lab.compiler.tracer import trace

F32 = np.float32


def _kinds(launch_steps):
    return [(kind, [type(s).__name__ for s in steps]) for kind, steps in segments(launch_steps)]


def test_library_calls_split_the_graphs():
    """softmax -> matmul + bias (cuBLAS + epilogue) -> fused -> matmul -> sum."""
    g = Graph(name="seg")
    x = g.add("input", shape=(16, 32), dtype=F32)
    w = g.add("input", shape=(32, 32), dtype=F32)
    b = g.add("input", shape=(32,), dtype=F32)
    sm = g.add("softmax", [x.id], {"axis": -1})
    m1 = g.add("matmul", [sm.id, w.id, b.id], {"activation": "relu"})
    body, _ = trace(lambda v: v * 2.0 + 1.0, [np.zeros((16, 32), F32)])
    f = g.add("fused", [m1.id], {"body": body, "ops": ("multiply", "add"), "name": "f"})
    m2 = g.add("matmul", [f.id, w.id], {})
    m3 = g.add("matmul", [m2.id, w.id], {})
    s = g.add("sum", [m3.id], {"axis": (1,), "keepdims": False})
    g.outputs = [s.id]
    impl = {sm.id: "reduction_kernel", m1.id: "cublas", f.id: "fused_kernel",
            m2.id: "cublas", m3.id: "cublas", s.id: "reduction_kernel"}
    launch = lower(g, impl)
    assert _kinds(launch.steps) == [
        ("graph", ["_KernelStep"]),
        ("call", ["_MatmulStep"]),  # its epilogue runs inside the call, not the graph
        ("graph", ["_KernelStep"]),
        ("call", ["_MatmulStep"]),
        ("call", ["_MatmulStep"]),  # two calls in a row: no empty graph between them
        ("graph", ["_KernelStep"]),
    ]
    flat = [st for _, steps in segments(launch.steps) for st in steps]
    assert flat == launch.steps  # every step once, in launch order


def test_a_list_without_library_calls_is_one_graph():
    g = Graph(name="one")
    x = g.add("input", shape=(8, 8), dtype=F32)
    body, _ = trace(lambda v: v + 1.0, [np.zeros((8, 8), F32)])
    a = g.add("fused", [x.id], {"body": body, "ops": ("add",), "name": "a"})
    t = g.add("transpose", [a.id], {"axes": (1, 0)})
    s = g.add("softmax", [t.id], {"axis": -1})
    g.outputs = [s.id]
    launch = lower(g, {a.id: "fused_kernel", t.id: "cupy", s.id: "reduction_kernel"})
    assert _kinds(launch.steps) == [("graph", ["_KernelStep", "_CupyStep", "_KernelStep"])]
    assert segments([]) == []
