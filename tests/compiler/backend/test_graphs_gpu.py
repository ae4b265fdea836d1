"""CUDA-graph capture and replay on a GPU: replays match eager runs and NumPy, replay on
another stream, and a capture that fails falls back to running kernel by kernel.

Every test is marked ``gpu`` (skipped, with the reason, where no CUDA device is usable).
"""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler import Graph
from pyc_lab.compiler.backend.executable import CupyExecutable
from pyc_lab.compiler.tracer import trace
from tests.compiler.backend.support import (
    F32,
    F64,
    assert_close,
    auto_impl,
    block_graph,
    block_inputs,
    check_block,
    cp,
    f64,
    mix,
    poison_pool,
    rand,
    run,
)
from tests.compiler.graphs import fused_graph

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", [None, "memory_first"])
def test_cuda_graph_replays_give_the_same_results_as_eager_runs(rng, mode):
    from pyc_lab.compiler.memory import plan_memory

    g = block_graph()
    plan = plan_memory(g, mode) if mode else None
    exe = CupyExecutable(g, auto_impl(g), plan, cuda_graph=True)
    plain = CupyExecutable(g, auto_impl(g), plan)
    kept = []
    for call in range(5):
        arrays = block_inputs(rng, g)
        poison_pool()
        dev = [cp.asarray(a) for a in arrays]
        got = exe(dev)
        if call >= 1:
            assert exe.graph_captured, exe.graph_capture_error
        ref = plain([cp.asarray(a) for a in arrays])
        for o, r in zip(got, ref, strict=True):  # cuBLAS may differ by stream: allclose
            np.testing.assert_allclose(cp.asnumpy(o), cp.asnumpy(r), rtol=1e-5, atol=1e-6)
        check_block(g, [cp.asnumpy(o) for o in got], arrays)
        kept.append(([cp.asnumpy(o) for o in got], got))
    assert exe.graph_capture_error is None
    # fresh inputs may land where the call before had its own (the memory pool reuses
    # blocks) and be read in place until one moves: at most one capture more per input
    assert 1 <= exe.captures <= 1 + len(g.inputs)
    assert exe.graph_segments >= 1
    # every call returned fresh arrays: later replays did not overwrite earlier results
    for host, dev in kept:
        for h, d in zip(host, dev, strict=True):
            np.testing.assert_array_equal(cp.asnumpy(d), h)


def test_cuda_graph_replay_on_another_stream(rng):
    g, node = fused_graph(mix, [((4096,), F32), ((4096,), F32)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"}, cuda_graph=True)
    stream = cp.cuda.Stream(non_blocking=True)
    for _ in range(3):
        x, y = rand(rng, (4096,), F32), rand(rng, (4096,), F32)
        with stream:
            (got,) = exe([cp.asarray(x), cp.asarray(y)])
            host = cp.asnumpy(got)
        stream.synchronize()
        assert_close(host, mix(*f64([x, y])), F32)
    assert exe.graph_captured


def test_cuda_graph_capture_failure_falls_back(rng):
    """An eager node that reads a value back to the host cannot be captured."""

    def scale_by_max(v):
        return v * float(v.max())  # device -> host copy: synchronises

    g = Graph(name="eager")
    x = g.add("input", shape=(100,), dtype=F32)
    e = g.add("eager", [x.id], {"fn": "scale_by_max", "reason": "test",
                                "_fn": scale_by_max,
                                "_rebuild": lambda vals: ((vals[0],), {})},
              shape=(100,), dtype=F32)
    body, _ = trace(lambda v: v + 1.0, [np.zeros((100,), F32)])
    f = g.add("fused", [e.id], {"body": body, "ops": ("add",), "name": "fused_e"})
    g.outputs = [f.id]
    exe = CupyExecutable(g, {e.id: "eager", f.id: "fused_kernel"}, cuda_graph=True)
    for _ in range(3):
        arr = rand(rng, (100,), F32)
        (got,) = run(exe, [arr])
        assert_close(got, arr.astype(F64) * float(arr.max()) + 1.0, F32)
    assert not exe.graph_captured
    assert exe.graph_capture_error


def test_direct_cublas_gemms_are_recorded_into_the_graph(rng):
    """With nvmath-python's bindings the cuBLAS GEMM is issued directly inside the
    capture: the block becomes one CUDA graph, and replays still match NumPy."""
    from pyc_lab.kernels import cublaslt

    if not cublaslt.status()[0]:
        pytest.skip(f"direct cuBLAS calls need nvmath-python: {cublaslt.status()[1]}")
    g = block_graph()
    exe = CupyExecutable(g, auto_impl(g), cuda_graph=True)
    for _ in range(4):
        arrays = block_inputs(rng, g)
        got = run(exe, arrays)
        check_block(g, got, arrays)
    assert exe.graph_captured, exe.graph_capture_error
    assert [kind for kind, _ in exe._program.program] == ["graph"]


def test_inputs_at_a_stable_address_are_read_in_place(rng):
    """Weights passed as the same arrays are not copied at a replay: the graphs read
    them where they are, so an in-place change is seen; one passed elsewhere costs
    a new capture that copies it; the results stay right."""
    g = block_graph()
    exe = CupyExecutable(g, auto_impl(g), cuda_graph=True)
    arrays = block_inputs(rng, g)
    dev = [cp.asarray(a) for a in arrays]
    for _ in range(3):
        x = block_inputs(rng, g)[0]
        dev[0] = cp.asarray(x)  # the activation: a fresh array each call
        arrays[0] = x
        got = [cp.asnumpy(o) for o in exe(dev)]
        check_block(g, got, arrays)
    assert exe.graph_captured
    bound = set(exe._program.bound)
    assert {1, 2, 3, 4} <= bound  # w, b, x2, gamma: the same arrays every call
    assert all(exe._program.static_inputs[k] is None for k in bound)
    # a weight changed in place is seen by the next replay
    new_w = block_inputs(rng, g)[1]
    dev[1][...] = cp.asarray(new_w)
    arrays[1] = new_w
    check_block(g, [cp.asnumpy(o) for o in exe(dev)], arrays)
    # the same weight at another address: right, and copied from then on
    dev[1] = dev[1].copy()
    check_block(g, [cp.asnumpy(o) for o in exe(dev)], arrays)
    assert 1 in exe._moved
    check_block(g, [cp.asnumpy(o) for o in exe(dev)], arrays)
    assert exe.graph_captured and 1 not in exe._program.bound


def test_many_captured_programs_made_and_dropped_leave_the_shared_workspaces_alone(rng):
    """More captures than the shared workspace table holds streams, each program dropped
    (its capture stream destroyed) before the next: each owns its cuBLAS workspace, so
    nothing in the shared table refers to a destroyed stream, later direct calls still
    run, and every replay matches NumPy."""
    import gc

    from pyc_lab.kernels import blas_direct

    before = set(blas_direct._WORKSPACES)
    g = block_graph()
    for _ in range(blas_direct.MAX_STREAMS + 4):
        exe = CupyExecutable(g, auto_impl(g), cuda_graph=True)
        arrays = block_inputs(rng, g)
        dev = [cp.asarray(a) for a in arrays]  # the same arrays: captured at call 2
        for _call in range(3):
            poison_pool()
            check_block(g, [cp.asnumpy(o) for o in exe(dev)], arrays)
        assert exe.graph_captured and exe.captures == 1, exe.graph_capture_error
        del exe
        gc.collect()
    assert set(blas_direct._WORKSPACES) <= before | {
        (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)}
    a = cp.asarray(rand(rng, (64, 32), F32))
    b = cp.asarray(rand(rng, (32, 48), F32))
    np.testing.assert_allclose(cp.asnumpy(a @ b), a.get().astype(F64) @ b.get().astype(F64),
                               rtol=1e-4, atol=1e-4)


def test_auto_graphs_capture_a_small_program_and_replay_numpys_answers(rng):
    # pl.compile's default (cuda_graph="auto"): two launches on small arrays (a column
    # mean, then a row program) are captured at the second call; replays with the same
    # arrays (mutated in place between calls), with fresh arrays at new addresses, and
    # poisoned pools all give NumPy's answers
    import pyc_lab as pl

    def fn(x):
        return (x - x.mean(axis=0)) / x.std(axis=1, keepdims=True)

    f = pl.compile(fn)
    host = rand(rng, (64, 33), F32)
    dev = cp.asarray(host)
    for call in range(6):
        if call == 3:
            host = rand(rng, (64, 33), F32)
            dev[...] = cp.asarray(host)  # same address, new data
        if call >= 4:
            host = rand(rng, (64, 33), F32)
            dev = cp.asarray(host)  # a new address
        poison_pool()
        got = cp.asnumpy(f(dev))
        assert_close(got, fn(host.astype(F64)), F32)
    runner = f._last.runner
    assert len(f.explain(dev).kernels) == 2
    assert runner.graph_mode == "auto" and runner.graph_captured, runner.graph_decision
    assert runner.graph_capture_error is None
    assert "yes (auto)" in f.explain(dev).summary()
