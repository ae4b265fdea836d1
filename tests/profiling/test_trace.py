"""Traces: spans, frames, Chrome trace-event JSON, overlap metrics, clock mapping, NVTX."""

from __future__ import annotations

import gc
import json
import random
import threading
import tracemalloc
import types

import numpy as np
import pytest

from pyc_lab.errors import DeviceUnavailableError, PycLabError
from pyc_lab.profiling import nvtx, overlap, quantiles
from pyc_lab.profiling.clock import CudaEventClock
from pyc_lab.profiling.nvtx import nvtx_range
from pyc_lab.profiling.spans import Span, lane_order
from pyc_lab.profiling.trace import Trace
from tests.fakes.traces import SUMMARY_LINES, pipeline_trace

MS = 1e-3
T0 = 100.0  # an arbitrary perf_counter origin: everything is reported relative to it


# -- the overlap metrics, against answers worked out by hand ---------------------------
def test_overlap_of_the_synthetic_pipeline_matches_the_hand_computation():
    r = pipeline_trace().overlap()
    assert r.n_items == 4 and r.n_spans == 16
    assert r.wall_s == pytest.approx(6.25 * MS, abs=1e-9)
    # prepare [0,.75]+[1,1.75]+[2,2.75]+[3,3.75]; h2d 4 x 0.5; compute [1.5,4.5]+[5,6];
    # d2h 4 x 0.25.
    assert list(r.stage_busy_s) == ["prepare", "h2d", "compute", "d2h"]
    for stage, ms in {"prepare": 3.0, "h2d": 2.0, "compute": 4.0, "d2h": 1.0}.items():
        assert r.stage_busy_s[stage] == pytest.approx(ms * MS, abs=1e-9)
    # Copies: [1,1.5] [2,2.75] [3,3.75] [4,4.75] [6,6.25] = 3.0 ms; under compute:
    # 0 + 0.75 + 0.75 + 0.5 + 0 = 2.0 ms.
    assert r.copy_busy_s == pytest.approx(3.0 * MS, abs=1e-9)
    assert r.copy_hidden_s == pytest.approx(2.0 * MS, abs=1e-9)
    assert r.copy_hidden_pct == pytest.approx(200.0 / 3.0, abs=1e-9)
    # GPU busy [1,4.75] + [5,6.25] = 5.0 of 6.25 ms.
    assert r.gpu_busy_s == pytest.approx(5.0 * MS, abs=1e-9)
    assert r.gpu_idle_fraction == pytest.approx(0.2, abs=1e-9)
    # One compute gap, [4.5, 5.0]; the threshold is 5 % of the 1 ms median = 50 us.
    assert r.gap_threshold_s == pytest.approx(0.05 * MS, abs=1e-12)
    assert len(r.starvation_gaps) == 1
    start, length = r.starvation_gaps[0]
    assert start == pytest.approx(4.5 * MS, abs=1e-9)
    assert length == pytest.approx(0.5 * MS, abs=1e-9)
    # 4 MB in 2 ms and 1 MB in 1 ms.
    assert r.h2d_bytes == 4_000_000 and r.d2h_bytes == 1_000_000
    assert r.h2d_gbps == pytest.approx(2.0, abs=1e-9)
    assert r.d2h_gbps == pytest.approx(1.0, abs=1e-9)
    assert r.bound_stage == "compute"
    assert r.max_stage_bound_s == pytest.approx(4.0 * MS, abs=1e-9)
    assert r.efficiency == pytest.approx(0.64, abs=1e-9)
    # compute 4.0 + fill (prepare 0.75 + h2d 0.5, the median item) + drain (d2h 0.25)
    assert r.pipeline_bound_s == pytest.approx(5.5 * MS, abs=1e-9)
    assert r.pipeline_efficiency == pytest.approx(5.5 / 6.25, abs=1e-9)


def test_a_fully_serial_trace_hides_no_copy_time():
    t = Trace()
    clock = T0
    for i in range(3):
        for stage, ms in (("h2d", 1.0), ("compute", 2.0), ("d2h", 0.5)):
            t.record(i, stage, "stream 0", clock, clock + ms * MS, 1000)
            clock += ms * MS
    r = t.overlap()
    assert r.copy_hidden_pct == 0.0 and r.copy_hidden_s == 0.0
    assert r.gpu_idle_fraction == pytest.approx(0.0, abs=1e-9)
    # compute waits 1.5 ms (a d2h then an h2d) between items: two starvation gaps.
    assert [(round(s / MS, 6), round(n / MS, 6)) for s, n in r.starvation_gaps] == [
        (3.0, 1.5), (6.5, 1.5)]
    assert r.efficiency == pytest.approx(6.0 / 10.5, abs=1e-9)
    # 3 computes of 2 ms, plus the first item's h2d (1 ms) and the last one's d2h
    assert r.pipeline_bound_s == pytest.approx(7.5 * MS, abs=1e-9)


def test_serial_gaps_between_computes_count_as_starvation_with_a_small_threshold():
    t = Trace()
    t.record(0, "compute", "stream compute", T0, T0 + 1 * MS)
    t.record(1, "h2d", "stream h2d", T0 + 1 * MS, T0 + 2 * MS)
    t.record(1, "compute", "stream compute", T0 + 2 * MS, T0 + 3 * MS)
    t.record(2, "compute", "stream compute", T0 + 3.000001 * MS, T0 + 4 * MS)  # 1 ns gap
    r = t.overlap()
    assert r.gap_threshold_s == pytest.approx(50e-6)
    assert [(round(s / MS, 9), round(n / MS, 9)) for s, n in r.starvation_gaps] == [(1.0, 1.0)]
    assert len(t.overlap(gap_threshold_s=0.0).starvation_gaps) == 2
    assert t.overlap(gap_threshold_s=2 * MS).starvation_gaps == []


def test_a_perfectly_overlapped_trace_hides_every_copy():
    t = Trace()
    t.record(0, "compute", "stream compute", T0, T0 + 10 * MS)
    t.record(1, "h2d", "stream h2d", T0 + 1 * MS, T0 + 2 * MS, 5_000_000)
    t.record(1, "h2d", "stream h2d", T0 + 1.5 * MS, T0 + 3 * MS)  # overlapping copies
    t.record(2, "d2h", "stream d2h", T0 + 5 * MS, T0 + 6 * MS, 1_000_000)
    r = t.overlap()
    assert r.copy_busy_s == pytest.approx(3.0 * MS, abs=1e-9)
    assert r.copy_hidden_pct == pytest.approx(100.0, abs=1e-9)
    assert r.gpu_idle_fraction == pytest.approx(0.0, abs=1e-9)
    assert r.h2d_gbps == pytest.approx(2.5, abs=1e-9)  # union busy time, not summed
    assert r.efficiency == pytest.approx(1.0, abs=1e-9)


def test_empty_and_copy_free_traces():
    r = Trace().overlap()
    assert r.n_spans == 0 and r.wall_s == 0.0 and r.copy_hidden_pct == 0.0
    assert r.summary() == "empty trace: no spans recorded"
    t = Trace()
    t.record(0, "compute", "s", T0, T0 + MS)
    r = t.overlap()
    assert r.copy_hidden_pct == 0.0 and r.h2d_gbps is None and r.d2h_gbps is None


def test_overlap_report_frame_and_summary_are_stable():
    r = pipeline_trace().overlap()
    frame = r.to_frame()
    assert list(frame.columns) == ["metric", "value"]
    assert "copy_hidden_pct" in set(frame["metric"])
    assert r.summary() == pipeline_trace().overlap().summary()
    assert r.summary().splitlines() == SUMMARY_LINES


def test_interval_helpers():
    assert overlap.union([(3, 4), (0, 1), (1, 2), (0.5, 1.5)]) == [(0, 2), (3, 4)]
    assert overlap.intersect([(0, 2), (3, 4)], [(1, 3.5)]) == [(1, 2), (3, 3.5)]
    assert overlap.total([(0, 2), (3, 4)]) == 3


# -- bounded traces: recent items kept, older ones folded into whole-run figures ------------
def belt_spans(n: int, *, depth: int = 4, seed: int = 0) -> list[tuple]:
    """``n`` items of a depth-bounded belt (compute bound, some compute gaps), as the
    belt records them: each span when it ends, so stages of neighbouring items interleave."""
    rng = random.Random(seed)
    rows: list[tuple] = []
    d2h_end: list[float] = []
    compute_end = T0
    for i in range(n):
        p0 = max(T0 + i * MS, d2h_end[i - depth] if i >= depth else T0)
        p1 = p0 + rng.uniform(0.3, 0.9) * MS
        h1 = p1 + 0.5 * MS
        c0 = max(h1, compute_end) + rng.choice([0.0, 0.0, 0.0, 0.3]) * MS
        c1 = compute_end = c0 + rng.uniform(0.8, 1.2) * MS
        d2h_end.append(c1 + 0.25 * MS)
        rows += [(i, "prepare", f"cpu-worker-{i % 2}", p0, p1, 0),
                 (i, "h2d", "stream h2d", p1, h1, 1000),
                 (i, "compute", "stream compute", c0, c1, 0),
                 (i, "d2h", "stream d2h", c1, d2h_end[-1], 250)]
    return sorted(rows, key=lambda r: r[4])


def test_a_bounded_trace_reports_the_whole_run_as_a_full_one_does():
    full, bounded = Trace(), Trace(max_items=64)
    for row in belt_spans(3000):
        full.record(*row)
        bounded.record(*row)
    a, b = full.overlap(), bounded.overlap()
    kept = {s.item for s in bounded.spans}
    assert 64 <= len(kept) < 72 and max(kept) == 2999
    assert len(bounded) == 4 * len(kept) and bounded.folded_items == 3000 - len(kept)
    assert b.folded_items == bounded.folded_items and b.folded_spans == bounded.folded_spans
    # unions, bytes and counts: exact
    for name in ("wall_s", "copy_busy_s", "copy_hidden_s", "copy_hidden_pct", "gpu_busy_s",
                 "gpu_idle_fraction", "max_stage_bound_s", "efficiency"):
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-9), name
    assert b.stage_busy_s == pytest.approx(a.stage_busy_s, rel=1e-9)
    assert list(b.stage_busy_s) == list(a.stage_busy_s)
    assert (b.n_items, b.n_spans, b.h2d_bytes, b.d2h_bytes, b.bound_stage) == (
        a.n_items, a.n_spans, a.h2d_bytes, a.d2h_bytes, a.bound_stage)
    # medians and the folded gaps' lengths: within the sketches' 1 %
    assert b.gap_threshold_s == pytest.approx(a.gap_threshold_s, rel=0.02)
    assert b.pipeline_bound_s == pytest.approx(a.pipeline_bound_s, rel=0.01)
    assert b.n_starvation_gaps == a.n_starvation_gaps > 100
    assert b.starvation_s == pytest.approx(a.starvation_s, rel=0.01)
    # listed gaps: the kept spans' ones, on the whole run's clock, as in the full report
    assert b.starvation_gaps and b.folded_gaps == a.n_starvation_gaps - len(b.starvation_gaps)
    assert set(b.starvation_gaps) <= set(a.starvation_gaps)
    assert "spans of the first" in b.summary() and "folded" in repr(bounded)
    frame = bounded.to_frame()  # the kept items, on the whole run's clock
    assert set(frame["item"]) == kept
    assert frame["start_ms"].min() > 0 and bounded.origin_s == full.origin_s
    assert len(bounded.to_chrome()["traceEvents"]) > len(frame)


def test_a_bounded_trace_that_folded_nothing_is_a_full_one():
    full, bounded = pipeline_trace(), Trace(max_items=4, name="synthetic")
    for s in full.spans:
        bounded.add(s)
    assert bounded.folded_items == 0 and len(bounded) == 16
    assert bounded.overlap() == full.overlap()
    assert bounded.overlap().summary().splitlines() == SUMMARY_LINES
    assert repr(bounded) == repr(full)


def test_a_late_span_of_a_folded_item_is_folded_not_counted_as_a_new_item():
    t = Trace(max_items=8)
    for i in range(20):
        t.record(i, "compute", "stream compute", T0 + i * MS, T0 + (i + 0.5) * MS)
    assert 10 not in {s.item for s in t.spans} and t.folded_items >= 11
    t.record(10, "d2h", "stream d2h", T0 + 10.5 * MS, T0 + 10.75 * MS, 100)
    assert 10 not in {s.item for s in t.spans}
    r = t.overlap()
    assert r.n_items == 20 and r.n_spans == 21 and r.d2h_bytes == 100
    assert r.stage_busy_s["d2h"] == pytest.approx(0.25 * MS, rel=1e-9)
    t.clear()
    assert len(t) == 0 and t.folded_items == 0 and t.overlap().n_spans == 0


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_max_items_must_be_a_whole_number(bad):
    with pytest.raises(PycLabError, match="max_items must be a whole number >= 1"):
        Trace(max_items=bad)


def test_a_bounded_trace_does_not_grow():
    """Memory held after 8,000 items is what it was after 2,000 (a full trace would hold
    some 6 MB more); the ring turned over many times in between."""
    t = Trace(max_items=64)
    rows = belt_spans(8_000, seed=1)
    quarter = next(k for k, r in enumerate(rows) if r[0] >= 2_000)
    tracemalloc.start()
    try:
        for row in rows[:quarter]:
            t.record(*row)
        gc.collect()
        at_quarter = tracemalloc.get_traced_memory()[0]
        for row in rows[quarter:]:
            t.record(*row)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - at_quarter
    finally:
        tracemalloc.stop()
    assert t.overlap().n_items == 8_000 and len(t) < 4 * (64 + 8)
    assert grown < 32 * 1024, f"{grown} bytes more after 6000 more items"


def test_quantile_sketch_is_within_its_relative_accuracy():
    values = np.random.default_rng(3).lognormal(-7.0, 1.5, 20_000)
    q = quantiles.QuantileSketch(relative_accuracy=0.01)
    for v in values:
        q.add(float(v))
    for p in (0.01, 0.5, 0.9, 0.99):
        exact = float(np.quantile(values, p, method="lower"))
        assert q.quantile(p) == pytest.approx(exact, rel=0.011), p
    n, total = q.at_least(float(np.median(values)))
    big = values[values >= np.median(values)]
    assert abs(n - len(big)) <= 0.01 * len(values)
    assert total == pytest.approx(float(big.sum()), rel=0.02)
    assert q.count == 20_000 and q.total == pytest.approx(float(values.sum()))
    assert quantiles.QuantileSketch().quantile(0.5) is None
    copy = q.copy()
    copy.add(1e3)
    assert q.max < 1e3 <= copy.max



def test_a_value_added_several_times_counts_as_that_many_adds():
    rng = np.random.default_rng(5)
    values = rng.lognormal(-6.0, 1.0, 300)
    times = rng.integers(1, 9, 300)
    once, weighted = quantiles.QuantileSketch(), quantiles.QuantileSketch()
    for v, n in zip(values, times, strict=True):
        weighted.add(float(v), int(n))
        for _ in range(n):
            once.add(float(v))
    weighted.add(0.0, 3)  # the smallest bucket too
    for _ in range(3):
        once.add(0.0)
    assert weighted.count == once.count == int(times.sum()) + 3
    assert weighted.total == pytest.approx(once.total)
    for p in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
        assert weighted.quantile(p) == once.quantile(p), p

def test_add_many_counts_as_adding_each_value():
    """Values of ``add_many`` are buffered and counted together (before any read, or
    once ``FOLD_AT`` wait): the same counts as adding each, whatever the batch sizes."""
    rng = np.random.default_rng(11)
    for n in (5, 16, 300, quantiles.FOLD_AT + 7):
        values = rng.lognormal(-7.0, 2.0, n)
        values[:3] = (-1e-3, 0.0, 1e-12)  # negative, zero and below min_value
        one, many = quantiles.QuantileSketch(), quantiles.QuantileSketch()
        one.add(2e-3)
        many.add(2e-3)
        for v in values:
            one.add(float(v))
        many.add_many(values[:2])  # a list-like in pieces, a NumPy array, a list
        many.add_many(values[2:n // 2])
        many.add_many(values[n // 2:].tolist())
        assert (many.count, many.min, many.max) == (one.count, one.min, one.max), n
        assert many._bins == one._bins and many._low == one._low == 3, n
        assert many.total == pytest.approx(one.total, rel=1e-12), n
        assert many.quantile(0.9) == one.quantile(0.9)
    empty = quantiles.QuantileSketch()
    empty.add_many(np.zeros(40))  # every value in the smallest bucket
    assert empty.count == 40 and empty._low == 40 and not empty._bins
    held = quantiles.QuantileSketch()  # the buffer stays bounded without reads
    for _ in range(3 * quantiles.FOLD_AT // 64):
        held.add_many(rng.uniform(1e-4, 1e-3, 64))
        assert len(held._pending) < quantiles.FOLD_AT
    copied = held.copy()
    assert copied.count == held.count == 3 * quantiles.FOLD_AT and not copied._pending


# -- spans, traces, frames ---------------------------------------------------------------
def test_spans_are_validated():
    with pytest.raises(PycLabError, match="ends before it starts"):
        Span(0, "h2d", "s", 2.0, 1.0)
    with pytest.raises(PycLabError, match="non-finite"):
        Span(0, "h2d", "s", float("nan"), 1.0)
    with pytest.raises(PycLabError, match="negative"):
        Span(0, "h2d", "s", 0.0, 1.0, -1)
    with pytest.raises(PycLabError, match="takes a Span"):
        Trace().add((0, "h2d"))  # type: ignore[arg-type]


def test_spans_are_sorted_and_the_frame_counts_from_the_first_start():
    t = pipeline_trace()
    spans = t.spans
    assert [s.start_s for s in spans] == sorted(s.start_s for s in spans)
    frame = t.to_frame()
    assert list(frame.columns) == ["item", "stage", "lane", "start_ms", "end_ms",
                                   "duration_ms", "nbytes", "label"]
    assert len(frame) == len(t) == 16
    assert frame["start_ms"].iloc[0] == 0.0
    assert frame["end_ms"].max() == pytest.approx(6.25, abs=1e-9)
    assert (frame["duration_ms"] - (frame["end_ms"] - frame["start_ms"])).abs().max() < 1e-9
    assert str(frame["item"].dtype) == "int64" and str(frame["nbytes"].dtype) == "int64"
    assert list(Trace().to_frame().columns) == list(frame.columns)


def test_record_keeps_meta_and_span_times_a_block():
    t = Trace()
    span = t.record(3, "h2d", "stream h2d", 1.0, 1.5, 10, pinned=True)
    assert span.meta == {"pinned": True} and span.duration_s == 0.5
    with t.span(4, "prepare", "cpu-worker-1", nbytes=7, note="x"):
        pass
    last = next(s for s in t.spans if s.item == 4)
    assert last.stage == "prepare" and last.nbytes == 7 and last.end_s >= last.start_s
    with pytest.raises(ValueError), t.span(5, "prepare", "cpu-worker-1"):
        raise ValueError("boom")
    assert len(t) == 3  # the failed block is still recorded


def test_add_is_thread_safe():
    t = Trace()

    def worker(k: int) -> None:
        for i in range(1000):
            t.add(Span(i, "prepare", f"cpu-worker-{k}", float(i), float(i) + 0.5))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(t) == 8000 and len(t.spans) == 8000
    assert len(t.lanes) == 8


def test_lanes_are_ordered_workers_first_then_streams():
    assert lane_order(["stream d2h", "stream compute", "cpu-worker-10", "stream h2d",
                       "cpu-worker-2", "main"]) == [
        "cpu-worker-2", "cpu-worker-10", "main", "stream h2d", "stream compute",
        "stream d2h"]


# -- Chrome trace-event JSON ---------------------------------------------------------------
_X_KEYS = {"name": str, "cat": str, "ph": str, "ts": (int, float), "dur": (int, float),
           "pid": int, "tid": int, "args": dict}
_M_KEYS = {"name": str, "ph": str, "pid": int, "tid": int, "args": dict}


def validate_trace_events(doc: dict) -> None:
    """Structural check against the Trace Event Format (JSON object form)."""
    assert set(doc) >= {"traceEvents"}
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = doc["traceEvents"]
    assert isinstance(events, list)
    named_tids = set()
    used_tids = set()
    for ev in events:
        assert ev["ph"] in ("X", "M"), ev
        keys = _X_KEYS if ev["ph"] == "X" else _M_KEYS
        for key, kind in keys.items():
            assert key in ev, (key, ev)
            assert isinstance(ev[key], kind) and not isinstance(ev[key], bool), (key, ev)
        if ev["ph"] == "X":
            assert ev["ts"] >= 0 and ev["dur"] >= 0
            used_tids.add((ev["pid"], ev["tid"]))
        elif ev["name"] == "thread_name":
            assert isinstance(ev["args"]["name"], str)
            named_tids.add((ev["pid"], ev["tid"]))
        else:
            assert ev["name"] in ("process_name", "thread_sort_index", "process_sort_index")
    assert used_tids <= named_tids


def test_chrome_trace_is_valid_and_round_trips(tmp_path):
    t = pipeline_trace()
    path = tmp_path / "trace.json"
    doc = t.to_chrome(path)
    validate_trace_events(doc)
    assert json.loads(path.read_text()) == doc
    xs = [ev for ev in doc["traceEvents"] if ev["ph"] == "X"]
    assert len(xs) == 16
    assert {ev["name"] for ev in xs} == {"prepare", "h2d", "compute", "d2h"}
    assert all(ev["cat"] == "pyc_lab" and ev["pid"] == 1 for ev in xs)
    # microseconds from the first span: item 3's compute starts at 5 ms, lasts 1 ms.
    late = next(ev for ev in xs if ev["name"] == "compute" and ev["args"]["item"] == 3)
    assert late["ts"] == pytest.approx(5000.0, abs=1e-3)
    assert late["dur"] == pytest.approx(1000.0, abs=1e-3)
    h2d = next(ev for ev in xs if ev["name"] == "h2d")
    assert h2d["args"] == {"item": 0, "bytes": 1_000_000}
    names = {ev["tid"]: ev["args"]["name"] for ev in doc["traceEvents"]
             if ev["name"] == "thread_name"}
    assert [names[k] for k in sorted(names)] == [
        "cpu-worker-0", "stream h2d", "stream compute", "stream d2h"]
    assert len({ev["tid"] for ev in xs}) == 4  # one lane per stream or thread


def test_chrome_trace_without_path_writes_nothing_and_meta_becomes_json(tmp_path):
    t = Trace()
    t.record(0, "h2d", "stream h2d", 1.0, 1.001, 64, pinned=True, shape=(2, 3),
             dtype=object, ratio=float("inf"))
    doc = t.to_chrome()
    validate_trace_events(doc)
    x = next(ev for ev in doc["traceEvents"] if ev["ph"] == "X")
    assert x["args"] == {"item": 0, "bytes": 64, "pinned": True, "shape": [2, 3],
                         "dtype": "<class 'object'>", "ratio": "inf"}
    json.dumps(doc, allow_nan=False)
    validate_trace_events(Trace().to_chrome(tmp_path / "empty.json"))


# -- CUDA event clock (with a fake CuPy) and NVTX ---------------------------------------------
class _FakeEvent:
    def __init__(self, gpu_clock: list[float]):
        self._clock = gpu_clock
        self.t_ms: float | None = None

    def record(self, stream=None):
        self.t_ms = self._clock[0]

    def synchronize(self):
        pass


def _fake_cupy(gpu_clock: list[float]) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(synchronize=lambda: None),
        Event=lambda: _FakeEvent(gpu_clock),
        get_elapsed_time=lambda a, b: b.t_ms - a.t_ms,
    )
    return types.SimpleNamespace(cuda=cuda)


def test_cuda_event_clock_maps_events_onto_the_host_clock():
    gpu = [1000.0]  # the fake GPU clock, in ms
    clock = CudaEventClock(_fake_cupy(gpu))
    gpu[0] = 1002.5
    start = clock.event()
    gpu[0] = 1004.0
    end = clock.event()
    assert clock.to_host(start) == pytest.approx(clock.ref_host_s + 2.5e-3, abs=1e-12)
    t = Trace()
    span = clock.record_span(t, 7, "compute", "stream compute", start, end, 0, k=1)
    # host times are perf_counter seconds (about 1e5 s after a day of uptime): their
    # float64 difference is exact only to ~1e-11 s, so compare to 1 ns
    assert span.duration_s == pytest.approx(1.5e-3, abs=1e-9)
    assert len(t) == 1 and span.meta == {"k": 1}


def test_cuda_event_clock_keeps_the_tightest_reference_bracket():
    import time

    waits = iter([0.004, 0.0, 0.003, 0.002, 0.004])  # host wake-up delays per try
    made: list[_FakeEvent] = []

    class SlowEvent(_FakeEvent):
        def __init__(self, gpu_clock):
            super().__init__(gpu_clock)
            self.wait = next(waits)
            made.append(self)

        def synchronize(self):
            time.sleep(self.wait)

    fake = _fake_cupy([0.0])
    fake.cuda.Event = lambda: SlowEvent([0.0])
    t0 = time.perf_counter()
    clock = CudaEventClock(fake)
    assert len(made) == 5 and clock.ref_event is made[1]
    assert clock.uncertainty_s < 0.002
    assert t0 <= clock.ref_host_s <= time.perf_counter()


def test_cuda_event_clock_needs_a_device_here(monkeypatch):
    from pyc_lab.hardware import device as gpu

    monkeypatch.setattr(gpu, "cupy_status", lambda: (None, "no CuPy in this test"))
    with pytest.raises(DeviceUnavailableError, match="CudaEventClock"):
        CudaEventClock()


def test_nvtx_range_is_a_no_op_without_a_library_and_never_hides_errors(monkeypatch):
    monkeypatch.setattr(nvtx, "_nvtx_backend", lambda: ("none", None))
    with nvtx_range("prepare 0"):
        pass
    with pytest.raises(KeyError), nvtx_range("x"):
        raise KeyError("from the block")


def test_nvtx_range_uses_the_nvtx_package_and_swallows_its_errors(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        push_range=lambda message, domain: calls.append(("push", message, domain)),
        pop_range=lambda domain: calls.append(("pop", domain)),
    )
    monkeypatch.setattr(nvtx, "_nvtx_backend", lambda: ("nvtx", fake))
    with nvtx_range("h2d 3"):
        calls.append("body")
    assert calls == [("push", "h2d 3", "pyc_lab"), "body", ("pop", "pyc_lab")]

    def broken(**_kw):
        raise RuntimeError("NVTX library unavailable")

    monkeypatch.setattr(nvtx, "_nvtx_backend", lambda: (
        "nvtx", types.SimpleNamespace(push_range=broken, pop_range=broken)))
    with nvtx_range("still fine"):
        pass


def test_nvtx_range_through_cupy(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(RangePush=lambda name: calls.append(name),
                                 RangePop=lambda: calls.append("pop"))
    monkeypatch.setattr(nvtx, "_nvtx_backend", lambda: ("cupy", fake))
    with nvtx_range("compute 1"):
        pass
    assert calls == ["compute 1", "pop"]


def test_the_real_nvtx_backend_resolves_without_raising():
    nvtx._nvtx_backend.cache_clear()
    kind, _mod = nvtx._nvtx_backend()
    assert kind in ("nvtx", "cupy", "none")
    with nvtx_range("real"):
        pass
