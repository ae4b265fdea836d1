"""CPU tests of a plan's CUDA-graph replays (:mod:`pyc_lab.kernels.gemm_replays`): when
an address set is captured, what a replay launches, and what is never captured, with
the CUDA runtime, the capture stream and the workspace replaced by recorders."""

from __future__ import annotations

import pytest

from pyc_lab.kernels import blas_direct, gemm_replays
from pyc_lab.kernels.blas_layout import describe
from pyc_lab.kernels.gemm_replays import AFTER, CAPACITY, SIGHTINGS, GraphReplays, settled
from pyc_lab.kernels.raced import RacedGemm

GEMM = describe((64, 32), (32, 1), (32, 48), (1, 32), (48, 1))
CAPTURE_STREAM = 0xCAB


class Runtime:
    """The two runtime calls a replay makes, recorded."""

    def __init__(self) -> None:
        self.launches: list[tuple[int, int]] = []
        self.capturing: set[int] = set()

    def streamIsCapturing(self, stream: int) -> bool:
        return stream in self.capturing

    def graphLaunch(self, exec_ptr: int, stream: int) -> None:
        self.launches.append((exec_ptr, stream))


class Graph:
    def __init__(self, exec_ptr: int) -> None:
        self.graphExec = exec_ptr


class Stream:
    """A capture stream: what was recorded between begin and end."""

    ptr = CAPTURE_STREAM

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.made = 0

    def begin_capture(self) -> None:
        self.rt.capturing.add(self.ptr)

    def end_capture(self) -> Graph:
        self.rt.capturing.discard(self.ptr)
        self.made += 1
        return Graph(1000 + self.made)


class Memory:
    def __init__(self, size: int) -> None:
        self.ptr = 0x5000 + size
        self.size = size


class Cublas(blas_direct.CublasGemm):
    """A direct cuBLAS call that records its calls instead of making them."""

    def __init__(self, fail_in_capture: bool = False) -> None:
        super().__init__(GEMM, "float16")
        self.calls: list[tuple] = []
        self.fail_in_capture = fail_in_capture

    def __call__(self, a_ptr, b_ptr, out_ptr, stream, workspace=None):
        if self.fail_in_capture and stream == CAPTURE_STREAM:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.calls.append((a_ptr, b_ptr, out_ptr, stream, workspace))


class Padded:
    impl = "cublas"
    capturable = False

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)


@pytest.fixture
def rt(monkeypatch):
    runtime = Runtime()
    stream = Stream(runtime)
    monkeypatch.setattr(gemm_replays, "_capture_stream", lambda: stream)
    monkeypatch.setattr(gemm_replays, "_graph_workspace",
                        lambda device, s, need: Memory(max(blas_direct.WORKSPACE_BYTES, need)))
    synced: list[int] = []
    monkeypatch.setattr(blas_direct, "_synchronise_device", synced.append)
    runtime.synced = synced
    runtime.stream = stream
    return runtime


def test_an_address_set_is_captured_at_its_second_call_then_launched(rt):
    gemm = Cublas()
    replays = GraphReplays(gemm, 0, runtime=rt)
    key = (0x100, 0x200, 0x300, 0x7)
    replays(*key)
    assert gemm.calls == [(*key, None)] and rt.launches == []
    replays(*key)  # captured on the replay set's own stream, with the graph workspace
    assert AFTER == 2
    assert len(gemm.calls) == 2
    a, b, out, stream, ws = gemm.calls[1]
    assert (a, b, out, stream) == (0x100, 0x200, 0x300, CAPTURE_STREAM)
    assert ws is not None and ws[1] >= blas_direct.WORKSPACE_BYTES
    assert rt.launches == [(1001, 0x7)]  # launched on the caller's stream
    for _ in range(5):
        replays(*key)
    assert len(gemm.calls) == 2, "a replayed call must not call the library"
    assert rt.launches == [(1001, 0x7)] * 6
    assert replays.captures == 1 and replays.graphs == 1


def test_each_address_set_and_stream_has_its_own_graph(rt):
    gemm = Cublas()
    replays = GraphReplays(gemm, 0, runtime=rt)
    one, other_out, other_stream = (1, 2, 3, 10), (1, 2, 4, 10), (1, 2, 3, 11)
    for key in (one, other_out, other_stream) * 2:
        replays(*key)
    assert replays.captures == 3
    assert [s for _, s in rt.launches] == [10, 10, 11]
    replays(*other_out)
    assert rt.launches[-1] == (1002, 10)


def test_the_oldest_graph_is_dropped_after_the_device_is_synchronised(rt):
    gemm = Cublas()
    replays = GraphReplays(gemm, 3, runtime=rt)
    keys = [(1, 2, 100 + i, 9) for i in range(CAPACITY + 1)]
    for key in keys:
        replays(*key)
        replays(*key)
    assert replays.graphs == CAPACITY and replays.captures == CAPACITY + 1
    assert rt.synced == [3]
    calls = len(gemm.calls)
    replays(*keys[0])  # dropped: a direct call again (and counted afresh)
    assert len(gemm.calls) == calls + 1
    replays(*keys[-1])
    assert len(gemm.calls) == calls + 1


def test_address_sets_cycling_past_the_capacity_stop_capturing(rt):
    """Layers of one shape, each with its own weight and output, cycle through more
    address sets than are kept: after CAPACITY drops nothing more is captured, so the
    captures and device synchronisations stop, and every call still runs."""
    gemm = Cublas()
    replays = GraphReplays(gemm, 0, runtime=rt)
    layers = [(0x10 + i, 0x900 + i, 0x500 + i, 7) for i in range(3 * CAPACITY)]
    for _ in range(6):  # forward passes
        for key in layers:
            replays(*key)
    assert replays.captures == 2 * CAPACITY
    assert len(rt.synced) == CAPACITY
    assert "cycle" in replays.refused
    assert replays.graphs == CAPACITY
    calls, launches = len(gemm.calls), len(rt.launches)
    held = list(replays._graphs)
    for key in layers:
        replays(*key)
    # the held graphs replay; the other layers call the library; each layer runs once
    assert len(rt.launches) - launches == len(held)
    assert len(gemm.calls) - calls == len(layers) - len(held)
    assert replays.captures == 2 * CAPACITY and len(rt.synced) == CAPACITY


def test_nothing_is_captured_or_launched_while_the_callers_stream_captures(rt):
    gemm = Cublas()
    replays = GraphReplays(gemm, 0, runtime=rt)
    key = (1, 2, 3, 0x42)
    replays(*key)
    replays(*key)
    assert rt.launches == [(1001, 0x42)]
    rt.capturing.add(0x42)  # the user records the plan into a graph of their own
    replays(*key)
    assert gemm.calls[-1] == (*key, None)
    assert rt.launches == [(1001, 0x42)]
    fresh = (5, 6, 7, 0x42)
    for _ in range(3):
        replays(*fresh)
    assert replays.captures == 1


def test_a_failed_capture_runs_directly_for_good(rt):
    gemm = Cublas(fail_in_capture=True)
    replays = GraphReplays(gemm, 0, runtime=rt)
    key = (1, 2, 3, 4)
    for _ in range(4):
        replays(*key)
    assert rt.launches == [] and replays.captures == 0
    assert "capture failed" in replays.refused and "capturing" in replays.refused
    # the failed attempt recorded nothing: each of the four calls ran directly, and the
    # capture was tried once
    assert [c[3] for c in gemm.calls] == [4, 4, 4, 4]
    assert rt.stream.made == 1
    assert CAPTURE_STREAM not in rt.capturing, "the capture stream was left capturing"


def test_a_race_is_captured_only_once_decided_and_only_a_library_call(rt, monkeypatch):
    monkeypatch.setattr(blas_direct, "_capturing", lambda stream: stream in rt.capturing)
    default, challenger = Cublas(), Padded()
    raced = RacedGemm(default, challenger, name="padded", margin=0.05)
    assert settled(raced) is None
    replays = GraphReplays(raced, 0, runtime=rt)
    raced.use_challenger = False
    assert settled(raced) is default
    key = (1, 2, 3, 4)
    replays(*key)
    replays(*key)
    assert replays.captures == 1 and default.calls[-1][3] == CAPTURE_STREAM

    raced_padded = RacedGemm(Cublas(), Padded(), name="padded", margin=0.05)
    raced_padded.use_challenger = True
    assert settled(raced_padded) is None
    replays = GraphReplays(raced_padded, 0, runtime=rt)
    for _ in range(3):
        replays(*key)
    assert replays.captures == 0 and "padded" in replays.refused
    assert len(raced_padded.challenger.calls) == 3


def test_an_undecided_race_is_not_captured_and_its_first_call_decides(rt, monkeypatch):
    default, challenger = Cublas(), Cublas()
    raced = RacedGemm(default, challenger, name="library", margin=0.02)
    monkeypatch.setattr(blas_direct, "_capturing", lambda stream: False)
    monkeypatch.setattr(blas_direct, "race", lambda runs, stream, rounds: [1.0, 0.5])
    replays = GraphReplays(raced, 0, runtime=rt)
    key = (1, 2, 3, 4)
    replays(*key)  # the direct call races, and keeps the challenger
    assert raced.use_challenger is True
    replays(*key)
    assert replays.captures == 1 and challenger.calls[-1][3] == CAPTURE_STREAM


def test_the_sightings_are_bounded(rt):
    gemm = Cublas()
    replays = GraphReplays(gemm, 0, runtime=rt)
    for i in range(SIGHTINGS * 3):
        replays(i, 2, 3, 4)
    assert len(replays._seen) == SIGHTINGS and replays.captures == 0
    replays(0, 2, 3, 4)  # its first sighting was forgotten: counted afresh
    assert replays.captures == 0


def test_the_graph_workspace_covers_cublaslt_needs_and_is_kept_per_stream(monkeypatch):
    made: list[int] = []

    class Cp:
        class cuda:
            @staticmethod
            def Memory(size):
                made.append(size)
                return Memory(size)

    import sys

    monkeypatch.setitem(sys.modules, "cupy", Cp)
    # blas_direct.private_workspace makes the device's cuBLAS handle first: no GPU here
    monkeypatch.setattr(blas_direct, "_device", lambda: 0)
    monkeypatch.setattr(blas_direct, "_cublas", lambda device: None)
    monkeypatch.setattr(gemm_replays, "_WORKSPACES", gemm_replays.OrderedDict())
    a = gemm_replays._graph_workspace(0, 1, 0)
    assert gemm_replays._graph_workspace(0, 1, 1 << 20) is a
    big = gemm_replays._graph_workspace(0, 1, 64 << 20)
    assert big is not a and big.size == 64 << 20
    for s in range(2, blas_direct.MAX_STREAMS + 5):
        gemm_replays._graph_workspace(0, s, 0)
    assert len(gemm_replays._WORKSPACES) == blas_direct.MAX_STREAMS
    assert made[0] == blas_direct.WORKSPACE_BYTES


def test_a_numpy_plan_has_no_graph_replays():
    import numpy as np

    import pyc_lab as pl

    rng = np.random.default_rng(7)
    a, w = rng.uniform(-1, 1, (5, 3)), rng.uniform(-1, 1, (4, 3))
    out = np.full((5, 4), np.nan)
    plan = pl.matmul_plan(a, w.T, out=out)
    assert plan.replays is None and "graphs:" not in plan.explain()
    plan(a, w.T)
    np.testing.assert_allclose(out, a @ w.T, rtol=1e-12)


def test_threads_on_one_address_set_capture_it_once_and_every_call_runs(rt):
    import threading

    gemm = Cublas()
    replays = GraphReplays(gemm, 0, runtime=rt)
    key = (1, 2, 3, 4)
    calls_per_thread, threads = 50, 8
    start = threading.Barrier(threads)

    def work() -> None:
        start.wait()
        for _ in range(calls_per_thread):
            replays(*key)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert replays.captures == 1 and rt.stream.made == 1
    direct = [c for c in gemm.calls if c[3] == 4]
    assert len(direct) + len(rt.launches) == calls_per_thread * threads
