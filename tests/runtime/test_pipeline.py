"""Pipeline (CPU mode): order, backpressure, failures in every stage, timeouts, cleanup."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest

from pyc_lab.errors import DeviceUnavailableError, PycLabError
from pyc_lab.hardware.device import cupy_status
from pyc_lab.runtime import pipeline as pipeline_mod
from pyc_lab.runtime.host_lanes import HostLanes
from pyc_lab.runtime.pipeline import Pipeline, PipelineError, last_pipeline

HAS_GPU = cupy_status()[0] is not None
LIMIT_S = 10.0


class Recorder:
    """A stand-in Trace: keeps what ``record`` was given."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def record(self, item: int, stage: str, lane: str, start_s: float, end_s: float,
               nbytes: int = 0, **meta: Any) -> None:
        with self._lock:
            self.rows.append((item, stage, lane, start_s, end_s, nbytes, meta))


def drain(pipe: Pipeline, items: Iterable[Any]) -> tuple[list[Any], BaseException | None]:
    """Consume ``pipe.run(items)`` on a thread; fail the test (not hang) if it sticks."""
    box: dict[str, Any] = {"out": []}

    def target() -> None:
        try:
            for r in pipe.run(items):
                box["out"].append(r)
        except BaseException as exc:
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(LIMIT_S)
    assert not t.is_alive(), "the pipeline hung"
    return box["out"], box.get("exc")


def prep(i: int) -> np.ndarray:
    time.sleep(((i * 7919) % 5) * 0.002)  # finish out of order
    return np.full((8, 4), i, dtype=np.float32)


def double(x: np.ndarray, stream: Any) -> np.ndarray:
    assert stream is None
    return x * 2


def assert_clean(pipe: Pipeline) -> None:
    s = pipe.pool.stats()
    assert s["bytes_in_use"] == 0, s
    assert s["in_use"] == 0, s
    assert pipe.live_slots == 0


def make(prepare: Callable[[Any], Any] = prep, compute: Callable[..., Any] = double,
         **kw: Any) -> Pipeline:
    kw.setdefault("depth", 3)
    kw.setdefault("trace", Recorder())
    return Pipeline(prepare, compute, mode="cpu", **kw)


def test_results_in_order_despite_out_of_order_prepare() -> None:
    with make(workers=4, depth=4) as pipe:
        out, exc = drain(pipe, range(30))
        assert exc is None
        assert len(out) == 30
        for i, r in enumerate(out):
            assert isinstance(r, np.ndarray) and r.dtype == np.float32
            np.testing.assert_array_equal(r, double(prep(i), None))
        assert_clean(pipe)
        assert pipe.mode == "cpu" and pipe.mode_reason == "CPU mode requested"
        assert last_pipeline() is pipe
        m = pipe.dispatcher_metrics
        assert m is not None and m["count"] == 30


def test_results_do_not_alias_slot_memory() -> None:
    with make() as pipe:
        out = list(pipe.run(range(10)))
    assert [float(r[0, 0]) for r in out] == [2.0 * i for i in range(10)]


def test_tuples_and_one_argument_compute() -> None:
    def prep2(i: int) -> tuple[np.ndarray, np.ndarray]:
        return np.full(3, i, np.int64), np.full((2, 2), i, np.float64)

    def comp(arrays: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        a, b = arrays
        return a + 1, b.sum(keepdims=True)

    with make(prep2, comp) as pipe:
        out, exc = drain(pipe, range(5))
    assert exc is None
    for i, (a, b) in enumerate(out):
        np.testing.assert_array_equal(a, np.full(3, i + 1))
        assert b.shape == (1, 1) and b[0, 0] == 4 * i


def test_no_h2d_no_d2h() -> None:
    seen: list[bool] = []

    def comp(x: np.ndarray, stream: Any) -> float:
        seen.append(isinstance(x, np.ndarray))
        return float(x.sum())

    rec = Recorder()
    with make(compute=comp, h2d=False, d2h=False, trace=rec) as pipe:
        out, exc = drain(pipe, range(4))
        assert exc is None
        assert out == [32.0 * i for i in range(4)]
        assert all(seen)
        assert {r[1] for r in rec.rows} == {"prepare", "compute"}
        assert_clean(pipe)


def test_trace_has_every_stage_of_every_item() -> None:
    rec = Recorder()
    with make(trace=rec, workers=2) as pipe:
        _out, exc = drain(pipe, range(6))
        assert exc is None and pipe.trace is rec
    stages = {(r[0], r[1]) for r in rec.rows}
    assert stages == {(i, s) for i in range(6) for s in ("prepare", "h2d", "compute", "d2h")}
    lanes = {r[2] for r in rec.rows}
    assert {"stream h2d", "stream compute", "stream d2h"} <= lanes
    assert {lane for lane in lanes if lane.startswith("cpu-worker-")} <= {
        "cpu-worker-0", "cpu-worker-1"
    }
    for item, _stage, _lane, start, end, nbytes, _meta in rec.rows:
        assert end >= start and nbytes >= 0 and item in range(6)
    for i in range(6):  # stages of one item run in order
        t = {r[1]: (r[3], r[4]) for r in rec.rows if r[0] == i}
        assert t["prepare"][1] <= t["h2d"][0] <= t["h2d"][1] <= t["compute"][0]
        assert t["compute"][1] <= t["d2h"][0]


def test_default_trace_is_a_trace() -> None:
    pipe = Pipeline(prep, double, mode="cpu")
    if pipe.trace is None:  # pragma: no cover - trace module not there yet
        pytest.skip("pyc_lab.profiling.trace not available")
    assert hasattr(pipe.trace, "record")
    pipe.close()


def test_backpressure_slow_consumer_holds_slots() -> None:
    depth = 3
    lock = threading.Lock()
    state = {"prepared": 0, "consumed": 0, "max_ahead": 0, "max_live": 0}
    pipe: Pipeline

    def counting_prep(i: int) -> np.ndarray:
        with lock:
            state["prepared"] += 1
            ahead = state["prepared"] - state["consumed"]
            state["max_ahead"] = max(state["max_ahead"], ahead)
            state["max_live"] = max(state["max_live"], pipe.live_slots)
        return np.full(16, i, np.float32)

    pipe = make(counting_prep, depth=depth, workers=3)
    with pipe:
        for i, r in enumerate(pipe.run(range(20))):
            assert r[0] == 2 * i
            assert pipe.live_slots <= depth
            time.sleep(0.01)  # slow consumer
            with lock:
                state["consumed"] += 1
        assert state["prepared"] == 20
        assert state["max_ahead"] <= depth
        assert state["max_live"] <= depth
        assert pipe.max_live_slots <= depth
        assert pipe.pool.stats()["buffers"] <= 2 * depth  # memory stays bounded
        assert_clean(pipe)


class Boom(RuntimeError):
    pass


def _failing(stage: str, at: int, monkeypatch: pytest.MonkeyPatch,
             armed: dict[str, bool]) -> Pipeline:
    """A belt whose item ``at`` fails in ``stage`` while ``armed["on"]``; the host lanes'
    copies fail after they took their buffers and copied, so those must go back too."""
    def p(i: int) -> np.ndarray:
        if stage == "prepare" and i == at:
            raise Boom(f"prepare {i}")
        return np.full(4, i, np.float32)

    def c(x: np.ndarray, stream: Any) -> np.ndarray:
        if stage == "compute" and int(x[0]) == at:
            raise Boom(f"compute {int(x[0])}")
        return x + 1

    def copy(kind: str) -> Callable[..., Any]:
        real = getattr(HostLanes, kind)

        def f(self: HostLanes, job: Any, *args: Any) -> Any:
            out = real(self, job, *args)
            if armed["on"] and stage == kind and job.index == at:
                raise Boom(f"{kind} copy")
            return out
        return f

    monkeypatch.setattr(HostLanes, "h2d", copy("h2d"))
    monkeypatch.setattr(HostLanes, "d2h", copy("d2h"))
    return make(p, c, workers=1)


@pytest.mark.parametrize("stage", ["prepare", "h2d", "compute", "d2h"])
@pytest.mark.parametrize("at", [0, 2])
def test_failure_in_each_stage_names_item_and_cleans_up(
        stage: str, at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    armed = {"on": True}
    with _failing(stage, at, monkeypatch, armed) as pipe:
        out, exc = drain(pipe, range(10))
        assert isinstance(exc, PipelineError), exc
        assert isinstance(exc, PycLabError)
        assert str(exc).startswith(f"item {at}: {stage} failed: Boom")
        assert exc.index == at and exc.stage == stage
        assert isinstance(exc.__cause__, Boom)
        assert len(out) <= at
        for i, r in enumerate(out):
            assert r[0] == i + 1
        assert_clean(pipe)
        # the pipeline can run again after a failure
        pipe.compute = lambda x, s: x  # type: ignore[method-assign]
        armed["on"] = False
        pipe.prepare = lambda i: np.full(4, i, np.float32)
        out, exc = drain(pipe, range(5))
        assert exc is None and [r[0] for r in out] == [0, 1, 2, 3, 4]
        assert_clean(pipe)


def test_items_iterator_failure_propagates() -> None:
    def items() -> Iterable[int]:
        yield 0
        yield 1
        raise ValueError("source broke")

    with make() as pipe:
        _out, exc = drain(pipe, items())
        assert isinstance(exc, ValueError)
        assert_clean(pipe)


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (np.zeros((8, 5), np.float32), "float32[8, 5]"),
        (np.zeros((8, 4), np.float64), "float64[8, 4]"),
    ],
)
def test_wrong_shape_or_dtype_names_the_item(bad: np.ndarray, needle: str) -> None:
    def p(i: int) -> np.ndarray:
        return bad if i == 3 else np.zeros((8, 4), np.float32)

    with make(p, workers=2) as pipe:
        _out, exc = drain(pipe, range(8))
        assert isinstance(exc, PipelineError)
        msg = str(exc)
        assert msg.startswith("item 3: prepare returned")
        assert needle in msg and "expected float32[8, 4]" in msg
        assert exc.index == 3 and exc.stage == "prepare"
        assert_clean(pipe)


def test_wrong_shape_is_judged_against_item_0_even_if_later_items_finish_first() -> None:
    def p(i: int) -> np.ndarray:
        if i == 0:
            time.sleep(0.05)
            return np.zeros(4, np.float32)
        return np.zeros(5 if i == 1 else 4, np.float32)

    with make(p, workers=3) as pipe:
        _out, exc = drain(pipe, range(3))
        assert isinstance(exc, PipelineError) and exc.index == 1
        assert_clean(pipe)


def test_stage_timeout_names_item_and_stage() -> None:
    release = threading.Event()

    def c(x: np.ndarray, stream: Any) -> np.ndarray:
        if int(x[0, 0]) == 1:
            release.wait(5)
        return x

    try:
        with make(compute=c, timeout_s=0.5) as pipe:
            t0 = time.perf_counter()
            _out, exc = drain(pipe, range(6))
            assert time.perf_counter() - t0 < 3.0
            assert isinstance(exc, PipelineError)
            assert str(exc).startswith("item 1: compute timed out after 0.5 s")
            assert exc.index == 1 and exc.stage == "compute"
            s = pipe.pool.stats()
            assert s["bytes_in_use"] == 0 and s["discarded"] >= 1  # the hung slot is dropped
            assert pipe.live_slots == 0
    finally:
        release.set()


def test_break_releases_everything() -> None:
    prepared: list[int] = []

    def p(i: int) -> np.ndarray:
        prepared.append(i)
        return np.full(4, i, np.float32)

    with make(p, depth=3) as pipe:
        for i, _r in enumerate(pipe.run(range(1000))):
            if i == 2:
                break
        assert_clean(pipe)
        assert len(prepared) <= 2 + 3 + 1


def test_close_during_iteration() -> None:
    pipe = make()
    gen = pipe.run(range(100))
    assert next(gen)[0, 0] == 0
    pipe.close()
    assert pipe.pool.stats()["bytes_pinned"] == 0
    assert pipe.live_slots == 0
    with pytest.raises(StopIteration):
        next(gen)
    with pytest.raises(PipelineError, match="closed"):
        pipe.run(range(3))


def test_second_concurrent_run_refused() -> None:
    with make() as pipe:
        gen = pipe.run(range(5))
        next(gen)
        with pytest.raises(PipelineError, match="already running"):
            pipe.run(range(5))
        gen.close()
        assert list(r[0, 0] for r in pipe.run(range(2))) == [0, 2]


def test_keyboard_interrupt_from_compute_cleans_up_and_reraises() -> None:
    def c(x: np.ndarray, stream: Any) -> np.ndarray:
        if int(x[0, 0]) == 2:
            raise KeyboardInterrupt
        return x

    with make(compute=c) as pipe:
        out, exc = drain(pipe, range(10))
        assert isinstance(exc, KeyboardInterrupt)
        assert len(out) <= 2
        assert_clean(pipe)


def test_keyboard_interrupt_in_consumer_cleans_up() -> None:
    with make() as pipe:
        with pytest.raises(KeyboardInterrupt):
            for i, _r in enumerate(pipe.run(range(50))):
                if i == 1:
                    raise KeyboardInterrupt
        assert_clean(pipe)


def test_bad_arguments() -> None:
    with pytest.raises(PipelineError, match="depth"):
        Pipeline(prep, double, depth=0, mode="cpu")
    with pytest.raises(PipelineError, match="mode"):
        Pipeline(prep, double, mode="tpu")
    with pytest.raises(PipelineError, match="timeout_s"):
        Pipeline(prep, double, mode="cpu", timeout_s=0)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"timeout_s": math.nan}, "timeout_s must be a positive, finite number"),
    ({"timeout_s": math.inf}, "timeout_s must be a positive, finite number"),
    ({"timeout_s": -1.0}, "timeout_s must be a positive, finite number"),
    ({"timeout_s": "5"}, "timeout_s must be a number of seconds or None"),
    ({"timeout_s": True}, "timeout_s must be a number of seconds or None"),
    ({"prepare": None}, "prepare must be callable"),
    ({"prepare": np.zeros(3)}, "prepare must be callable"),
    ({"compute": "double"}, "compute must be callable"),
    ({"depth": True}, "depth must be a whole number"),
    ({"depth": 2.0}, "depth must be a whole number"),
    ({"depth": "3"}, "depth must be a whole number"),
    ({"workers": 0}, "workers must be >= 1"),
    ({"workers": False}, "workers must be a whole number"),
    ({"workers": 1.5}, "workers must be a whole number"),
    ({"workers": "2"}, "workers must be a whole number"),
    ({"compute_streams": 0}, "compute_streams must be >= 1"),
    ({"compute_streams": True}, "compute_streams must be a whole number"),
    ({"compute_streams": 1.0}, "compute_streams must be a whole number"),
    ({"compute_streams": "2"}, "compute_streams must be a whole number"),
    ({"device": -1}, "device must be >= 0"),
    ({"trace_items": 0}, "trace_items must be >= 1"),
    ({"trace_items": 100.0}, "trace_items must be a whole number"),
    ({"trace": "yes"}, "trace must be None"),
])
def test_bad_arguments_are_refused_at_construction_with_what_to_do(
        kwargs: dict[str, Any], needle: str) -> None:
    args = {"prepare": prep, "compute": double, **kwargs}
    before = threading.active_count()
    with pytest.raises(PipelineError, match=needle):
        Pipeline(args.pop("prepare"), args.pop("compute"), mode="cpu", **args)
    assert threading.active_count() == before


def test_integer_like_settings_are_accepted() -> None:
    with Pipeline(prep, double, mode="cpu", depth=np.int64(2), workers=np.int32(1),
                  timeout_s=np.float64(30), compute_streams=1, trace_items=None) as pipe:
        assert (pipe.depth, pipe.workers, pipe.timeout_s) == (2, 1, 30.0)
        assert len(list(pipe.run(range(3)))) == 3


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU behaviour")
def test_no_gpu_auto_is_cpu_and_gpu_mode_refused() -> None:
    pipe = Pipeline(prep, double)
    assert pipe.mode == "cpu" and pipe.mode_reason.startswith("no GPU: ")
    assert pipe.pool.mode.startswith("numpy")
    pipe.close()
    with pytest.raises(DeviceUnavailableError):
        Pipeline(prep, double, mode="gpu")


def test_module_state() -> None:
    pipe = make()
    list(pipe.run(range(1)))
    assert pipeline_mod.last_pipeline() is pipe
    pipe.close()


@pytest.mark.gpu
def test_gpu_pipeline_matches_numpy() -> None:  # pragma: no cover - needs a GPU
    def comp(x: Any, stream: Any) -> Any:
        return x * 2 + 1

    rec = Recorder()
    with Pipeline(prep, comp, mode="gpu", depth=3, trace=rec) as pipe:
        out = list(pipe.run(range(12)))
        assert pipe.pool.pinned
        assert pipe.pool.stats()["bytes_in_use"] == 0
    for i, r in enumerate(out):
        assert isinstance(r, np.ndarray)
        np.testing.assert_array_equal(r, prep(i) * 2 + 1)
    assert {r[1] for r in rec.rows} == {"prepare", "h2d", "compute", "d2h"}


@pytest.mark.gpu
def test_gpu_pipeline_compute_failure() -> None:  # pragma: no cover - needs a GPU
    def comp(x: Any, stream: Any) -> Any:
        if int(x[0, 0]) == 1:
            raise Boom("gpu")
        return x

    with Pipeline(prep, comp, mode="gpu", trace=Recorder()) as pipe:
        _out, exc = drain(pipe, range(5))
        assert isinstance(exc, PipelineError) and exc.index == 1
        assert pipe.pool.stats()["bytes_in_use"] == 0


def test_prepare_into_the_slot_with_a_spec() -> None:
    seen = []

    def fill(i: int, out: np.ndarray) -> None:
        seen.append((out.shape, out.dtype))
        out[...] = i  # written straight into the slot's (pinned) buffer

    with make(fill, spec=((8, 4), np.float32), workers=2) as pipe:
        out, exc = drain(pipe, range(9))
        assert exc is None
        assert [float(r[0, 0]) for r in out] == [2.0 * i for i in range(9)]
        assert set(seen) == {((8, 4), np.dtype(np.float32))}
        assert_clean(pipe)

    def fill2(i: int, out: tuple) -> None:
        out[0][...] = i
        out[1][...] = -i

    with make(fill2, lambda xs, s: xs[0] + xs[1], spec=[((3,), "f4"), (3, "f4")]) as pipe:
        assert [r.tolist() for r in pipe.run(range(3))] == [[0.0] * 3] * 3


def test_spec_errors_are_clear() -> None:
    with pytest.raises(PipelineError, match="pass spec="):
        make(lambda i, out: None)
    with pytest.raises(PipelineError, match="spec must be"):
        make(spec="nonsense")
    with make(spec=((4, 4), np.float32)) as pipe:  # item 0 is checked against it too
        _out, exc = drain(pipe, range(3))
        assert isinstance(exc, PipelineError) and exc.index == 0 and "spec=" in str(exc)
        assert_clean(pipe)

    def prep_with_default(i: int, scale: int = 2) -> np.ndarray:
        return np.full(4, i * scale, np.float32)

    with make(prep_with_default) as pipe:  # a defaulted second parameter is not `out`
        assert [float(r[0]) for r in pipe.run(range(3))] == [0.0, 4.0, 8.0]


def test_results_as_views_stay_valid_until_the_next_one() -> None:
    with make(workers=3, depth=3, copy_results=False) as pipe:
        n = 0
        for i, r in enumerate(pipe.run(range(12))):
            time.sleep(0.005)  # the belt runs ahead meanwhile; this slot is held
            np.testing.assert_array_equal(r, double(prep(i), None))
            assert pipe.live_slots <= 3
            n += 1
        assert n == 12
        assert_clean(pipe)
    with make(copy_results=False) as pipe:  # views share the slots' pinned buffers
        out = list(pipe.run(range(6)))
    assert len({r.__array_interface__["data"][0] for r in out}) <= 3


@pytest.mark.gpu
def test_gpu_prepare_into_pinned_slots_and_view_results() -> None:  # pragma: no cover
    def fill(i: int, out: np.ndarray) -> None:
        out[...] = prep(i)

    def comp(x: Any, stream: Any) -> Any:
        return x * 3 - 1

    rec = Recorder()
    with Pipeline(fill, comp, mode="gpu", depth=3, workers=2, trace=rec,
                  spec=((8, 4), np.float32), copy_results=False) as pipe:
        for i, r in enumerate(pipe.run(range(10))):
            time.sleep(0.002)  # the belt runs ahead; this result's slot is held
            np.testing.assert_array_equal(r, prep(i) * 3 - 1)
        assert pipe.pool.pinned
        assert pipe.pool.stats()["bytes_in_use"] == 0
    assert {r[1] for r in rec.rows} == {"prepare", "h2d", "compute", "d2h"}


def test_every_stage_of_every_item_is_an_nvtx_range(monkeypatch) -> None:
    import types

    from pyc_lab.profiling import nvtx as tr

    pushed: list[str] = []
    lock = threading.Lock()

    def push_range(message: str, domain: str) -> None:
        with lock:
            pushed.append(message)

    fake = types.SimpleNamespace(push_range=push_range, pop_range=lambda domain: None)
    monkeypatch.setattr(tr, "_nvtx_backend", lambda: ("nvtx", fake))
    with make() as pipe:
        assert len(list(pipe.run(range(4)))) == 4
    want = {f"pyc_lab {s} item {i}" for s in ("prepare", "h2d", "compute", "d2h")
            for i in range(4)}
    assert set(pushed) == want and len(pushed) == len(want)


def test_each_run_gets_a_fresh_trace_unless_one_was_given() -> None:
    with make(trace=None) as pipe:
        list(pipe.run(range(5)))
        first = pipe.trace
        list(pipe.run(range(3)))
        assert pipe.trace is not first
        assert sorted({s.item for s in pipe.trace.spans}) == [0, 1, 2]
        assert len(first.spans) == 5 * 4  # the earlier run's trace is left as it was
    rec = Recorder()
    with make(trace=rec) as pipe:  # a trace the caller passed collects every run
        list(pipe.run(range(2)))
        list(pipe.run(range(2)))
        assert pipe.trace is rec and len(rec.rows) == 2 * 2 * 4


@pytest.mark.gpu
@pytest.mark.parametrize("compute_streams", [1, 2])
def test_gpu_stages_run_ahead_and_stay_ordered_on_the_gpu(
        compute_streams: int) -> None:  # pragma: no cover
    """Stages only queue work (each stream waits for the item's previous stage on the
    GPU): results must still be right when compute is slow and copies are large, over
    several runs of one belt, and the spans of every item must come in stage order."""
    import cupy as cp

    n = 1 << 22
    rng = np.random.default_rng(7)
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(12)]

    def comp(x: Any, stream: Any) -> Any:
        for _ in range(20):
            cp.sin(x, out=x)
        return x

    want = []
    for d in data:
        x = cp.asarray(d)
        want.append(cp.asnumpy(comp(x, None)))
    with Pipeline(lambda i: data[i], comp, mode="gpu", depth=4, workers=2,
                  copy_results=False, compute_streams=compute_streams) as pipe:
        for _run in range(2):
            for i, r in enumerate(pipe.run(range(12))):
                np.testing.assert_allclose(r, want[i], rtol=0, atol=1e-6)
            assert pipe.pool.stats()["bytes_in_use"] == 0
        spans = {(s.item, s.stage): s for s in pipe.trace.spans}
        for i in range(12):
            order = [spans[i, st] for st in ("prepare", "h2d", "compute", "d2h")]
            for a, b in itertools.pairwise(order):  # 50 us: the host/GPU clock mapping
                assert a.end_s <= b.start_s + 5e-5, (i, a, b)
        assert pipe.trace.overlap().copy_hidden_pct > 0
        lanes = {s.lane for s in pipe.trace.spans if s.stage == "compute"}
        assert lanes == {"stream compute", *(f"stream compute {k}"
                                             for k in range(1, compute_streams))}


@pytest.mark.gpu
def test_gpu_already_pinned_arrays_are_copied_without_staging() -> None:  # pragma: no cover
    from pyc_lab.runtime.pinned import PinnedPool, is_page_locked

    src_pool = PinnedPool(device=0)
    bufs = [src_pool.acquire(4 * 1024 * 4) for _ in range(6)]
    arrays = [b.array(np.float32, (1024, 4)) for b in bufs]
    for i, a in enumerate(arrays):
        a[...] = i + np.arange(4096, dtype=np.float32).reshape(1024, 4)
    assert all(is_page_locked(a) for a in arrays)
    assert not is_page_locked(np.ones(4096, np.float32))
    with Pipeline(lambda i: arrays[i], lambda x, s: x * 2, mode="gpu", depth=2) as pipe:
        out = list(pipe.run(range(6)))
        # only the slots' output buffers came from the belt's pool: no input staging
        assert pipe.pool.stats()["bytes_pinned"] <= 2 * 4096 * 4 + 2 * (2 << 20)
        assert pipe.pool.stats()["buffers"] == 2
    for a, r in zip(arrays, out, strict=True):
        np.testing.assert_array_equal(r, a * 2)
    for b in bufs:
        b.release()
    src_pool.close()


def _belt_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("pyc-") and t.is_alive()}


def test_clean_runs_reuse_the_belts_threads_and_close_ends_them() -> None:
    before = _belt_threads()
    pipe = make(workers=2)
    list(pipe.run(range(6)))
    crew = _belt_threads() - before
    assert len(crew) == 2 + 3  # two prepare workers, three lanes
    assert pipe.dispatcher_metrics["count"] == 6
    list(pipe.run(range(4)))
    assert _belt_threads() - before == crew  # the same threads ran the second run
    assert pipe.dispatcher_metrics["count"] == 4  # metrics are per run
    _out, exc = drain(pipe, [0, 1, "x", 3])  # a failed run lets its threads go ...
    assert isinstance(exc, PipelineError) and exc.index == 2
    deadline = time.perf_counter() + 5
    while (_belt_threads() - before) & crew and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert not (_belt_threads() - before) & crew
    assert [float(r[0, 0]) for r in pipe.run(range(3))] == [0.0, 2.0, 4.0]  # ... a new crew
    pipe.close()
    deadline = time.perf_counter() + 5
    while _belt_threads() - before and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert _belt_threads() - before == set()
    assert_clean(pipe)


def test_a_reused_belt_takes_new_shapes_in_a_later_run() -> None:
    with make(lambda i: np.full((2, 3), i, np.float32), workers=1) as pipe:
        assert [r.shape for r in pipe.run(range(4))] == [(2, 3)] * 4
        pipe.prepare = lambda i: np.full((5,), i, np.float64)
        out = list(pipe.run(range(4)))
        assert [r.shape for r in out] == [(5,)] * 4 and out[3][0] == 6.0
        assert_clean(pipe)


# -- retention: a long run stays bounded, a short one keeps everything ----------------------
def tiny(i: int) -> np.ndarray:
    return np.full(4, i, np.float32)


def same(x: np.ndarray) -> np.ndarray:
    return x


def test_a_short_run_keeps_every_span_and_record() -> None:
    with Pipeline(tiny, same, mode="cpu", depth=3) as pipe:
        assert len(list(pipe.run(range(300)))) == 300
        trace = pipe.trace
        assert len(trace) == 300 * 4 and trace.folded_items == 0
        assert pipe.dispatcher_metrics["count"] == 300
        assert len(pipe._crew[1].records()) == 300  # type: ignore[index]
        assert "folded" not in trace.overlap().summary()


def test_a_long_run_keeps_recent_items_and_reports_the_whole_run() -> None:
    with Pipeline(tiny, same, mode="cpu", depth=4, trace_items=50) as pipe:
        out = list(pipe.run(range(1500)))
        assert len(out) == 1500 and float(out[-1][0]) == 1499.0
        trace = pipe.trace
        kept_items = {s.item for s in trace.spans}
        assert 50 <= len(kept_items) < 50 + 8 and max(kept_items) == 1499
        assert trace.folded_items == 1500 - len(kept_items)
        report = trace.overlap()
        assert report.n_items == 1500 and report.n_spans == 1500 * 4
        assert report.folded_items == trace.folded_items
        assert report.h2d_bytes == report.d2h_bytes == 1500 * 16
        assert set(report.stage_busy_s) == {"prepare", "h2d", "compute", "d2h"}
        assert 0 < report.max_stage_bound_s <= report.wall_s
        assert trace.to_frame()["item"].nunique() == len(kept_items)
        m = pipe.dispatcher_metrics
        assert m["count"] == 1500 and m["run_p50_ms"] <= m["run_p99_ms"]
        assert len(pipe._crew[1].records()) == 50  # type: ignore[index]


def test_trace_false_records_nothing() -> None:
    with Pipeline(tiny, same, mode="cpu", trace=False) as pipe:
        assert len(list(pipe.run(range(20)))) == 20
        assert not pipe.traced and len(pipe.trace) == 0
        assert pipe.trace.overlap().n_spans == 0
        assert pipe.dispatcher_metrics["count"] == 20


def test_a_long_belt_does_not_grow() -> None:
    """Memory held after 3,000 items is what it was after 1,000: the trace's ring, the
    dispatcher's records and their running aggregates are full and stay so (keeping
    every span and record grows by about 2 KB an item, some 4 MB here). The aggregates'
    quantile sketches buffer up to ``FOLD_AT`` values each before counting them (a
    bounded buffer whose fill differs from one moment to the next): reading the trace's
    figures counts them, so both measurements see empty buffers."""
    with Pipeline(tiny, same, mode="cpu", depth=4, trace_items=32) as pipe:
        items = pipe.run(range(3000))
        for _ in itertools.islice(items, 200):  # threads, slots and rings set up
            pass
        tracemalloc.start()
        try:
            for _ in itertools.islice(items, 800):
                pass
            pipe.trace.overlap()  # the sketches' buffers counted
            gc.collect()
            at_1000 = tracemalloc.get_traced_memory()[0]
            for _ in items:
                pass
            pipe.trace.overlap()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - at_1000
        finally:
            tracemalloc.stop()
        assert pipe.trace.overlap().n_items == 3000
    assert grown < 64 * 1024, f"{grown} bytes more after 2000 more items"


# -- close() and run() from several threads -------------------------------------------------
def test_close_from_another_thread_stops_a_running_belt() -> None:
    gate, computing = threading.Event(), threading.Event()

    def slow(x: np.ndarray, stream: Any) -> np.ndarray:
        if int(x[0, 0]) == 2:
            computing.set()
            gate.wait(5)
        return x

    pipe = make(lambda i: np.full((8, 4), i, np.float32), compute=slow)
    box: dict[str, Any] = {"out": []}

    def consume() -> None:
        try:
            for r in pipe.run(range(100)):
                box["out"].append(r)
        except BaseException as exc:
            box["exc"] = exc

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    assert computing.wait(5)
    time.sleep(0.05)  # the consumer now waits inside the belt for item 2
    closer = threading.Thread(target=pipe.close, daemon=True)
    closer.start()
    threading.Timer(0.2, gate.set).start()  # item 2's compute ends; close() waits for it
    closer.join(LIMIT_S)
    assert not closer.is_alive(), "close() hung"
    t.join(LIMIT_S)
    assert not t.is_alive(), "the consumer hung after close()"
    exc = box.get("exc")
    assert isinstance(exc, PipelineError) and "closed" in str(exc)
    assert pipe.pool.stats()["bytes_pinned"] == 0 and pipe.live_slots == 0
    with pytest.raises(PipelineError, match="closed"):
        pipe.run(range(3))


def test_only_one_of_several_racing_runs_starts() -> None:
    with make() as pipe:
        for _ in range(20):
            start = threading.Barrier(4)
            got: list[Any] = []

            def call(start: threading.Barrier = start, got: list[Any] = got) -> None:
                start.wait()
                with contextlib.suppress(PipelineError):  # refused: another run started
                    got.append(pipe.run(range(2)))

            threads = [threading.Thread(target=call) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(5)
            assert len(got) == 1
            assert [float(r[0, 0]) for r in got[0]] == [0.0, 2.0]


def test_run_racing_close_is_refused_or_stops_cleanly() -> None:
    for k in range(30):
        pipe = make()
        start = threading.Barrier(2)
        box: dict[str, Any] = {"out": []}

        def consume(pipe: Pipeline = pipe, start: threading.Barrier = start,
                    box: dict[str, Any] = box) -> None:
            start.wait()
            try:
                for r in pipe.run(range(20)):
                    box["out"].append(r)
            except PipelineError as err:
                box["exc"] = err

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        start.wait()
        time.sleep(0.002 * (k % 6))  # before the run, during it, or after it
        pipe.close()
        t.join(LIMIT_S)
        assert not t.is_alive(), "the run hung"
        exc = box.get("exc")
        assert exc is None or "closed" in str(exc), exc
        assert pipe.pool.stats()["bytes_pinned"] == 0 and pipe.live_slots == 0


def test_a_stage_handed_to_a_stopped_lane_fails_its_item_instead_of_hanging() -> None:
    with make() as pipe:
        gen = pipe.run(range(50))
        next(gen)
        pipe._crew[0].lanes["compute"].stop()  # type: ignore[index]
        _out, exc = drain_gen(gen)
        assert isinstance(exc, PipelineError) and "stopped before its compute stage" in str(exc)
        assert_clean(pipe)


def drain_gen(gen: Any) -> tuple[list[Any], BaseException | None]:
    box: dict[str, Any] = {"out": []}

    def target() -> None:
        try:
            for r in gen:
                box["out"].append(r)
        except BaseException as exc:
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(LIMIT_S)
    assert not t.is_alive(), "the pipeline hung"
    return box["out"], box.get("exc")
