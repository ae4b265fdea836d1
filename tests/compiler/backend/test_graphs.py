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


def _epilogue_graph(m: int, n: int):
    g = Graph(name="epi")
    x = g.add("input", shape=(m, 32), dtype=F32)
    w = g.add("input", shape=(32, n), dtype=F32)
    b = g.add("input", shape=(n,), dtype=F32)
    mm = g.add("matmul", [x.id, w.id, b.id], {"activation": "relu"})
    g.outputs = [mm.id]
    return g, {mm.id: "cublaslt"}, mm


def test_small_fused_epilogues_join_the_graph_large_ones_stay_in_cublaslt():
    """With CUDA graphs a small GEMM whose epilogue cuBLASLt would fuse becomes cuBLAS +
    a generated epilogue (recordable, said why); a large one keeps cuBLASLt; without
    CUDA graphs nothing changes."""
    from pyc_lab.compiler.backend.lowering import GRAPH_EPILOGUE_ELEMENTS

    g, impl, mm = _epilogue_graph(64, 128)
    small = lower(g, impl, cuda_graph=True)
    (step,) = small.steps
    assert type(step).__name__ == "_MatmulStep" and step.epilogue is not None
    assert "recorded into the CUDA graph" in small.kernels[0]["implementation"]
    assert "with CUDA graphs" in small.fallbacks[mm.id]
    plain = lower(g, impl)
    assert type(plain.steps[0]).__name__ == "_LtStep" and mm.id not in plain.fallbacks
    rows = GRAPH_EPILOGUE_ELEMENTS // 128 + 1
    g2, impl2, _ = _epilogue_graph(rows, 128)
    assert type(lower(g2, impl2, cuda_graph=True).steps[0]).__name__ == "_LtStep"


def test_a_replay_given_a_moved_in_place_input_runs_nothing_and_says_which():
    from types import SimpleNamespace

    from pyc_lab.compiler.backend.graphs import GraphProgram, Rebind

    launched = []
    fake_cp = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: "s"))
    graph = SimpleNamespace(launch=lambda stream: launched.append(stream))
    prog = GraphProgram(cp=fake_cp, program=[("graph", graph)], static_inputs=[None, None],
                        values={}, outputs=[], pool=None, stream=None,
                        bound={0: (4096, (8, 4)), 1: (8192, (4,))})

    def arr(ptr, strides):
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr), strides=strides)

    assert prog.replay([arr(4096, (8, 4)), arr(8192, (4,))]) == []
    assert launched == ["s"]
    for args, moved in (([arr(4096, (8, 4)), arr(9000, (4,))], [1]),
                        ([arr(4096, (4, 8)), arr(8192, (4,))], [0])):  # a transposed view
        try:
            prog.replay(args)
        except Rebind as exc:
            assert exc.positions == moved
        else:
            raise AssertionError("no Rebind")
    assert launched == ["s"]
