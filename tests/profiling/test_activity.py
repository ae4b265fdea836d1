"""GpuActivity: CUPTI / Kineto records -> Trace spans (CPU), and real tracing (GPU)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from pyc_lab.errors import DeviceUnavailableError, PycLabError
from pyc_lab.profiling import activity
from pyc_lab.profiling.activity import GpuActivity, spans_from_chrome, spans_from_cupti
from pyc_lab.profiling.trace import Trace

US = 1e-6


def cupti_records() -> list[dict]:
    """Stream 7: H2D [0, 100] us (1 MB), kernel [100, 400], D2H [400, 450] (1 MB);
    stream 9: H2D [150, 250] (2 MB) under the kernel, a memset, and a record kind we
    skip (4: a driver API call)."""
    ns = 1000
    return [
        {"kind": 10, "start": 100 * ns, "end": 400 * ns, "stream_id": 7,
         "name": "cupy_sin__float32_float32", "grid": [128, 1, 1], "block": [256, 1, 1]},
        {"kind": 1, "start": 0, "end": 100 * ns, "stream_id": 7, "bytes": 1_000_000,
         "copy_kind": 1},
        {"kind": 1, "start": 400 * ns, "end": 450 * ns, "stream_id": 7, "bytes": 1_000_000,
         "copy_kind": 2},
        {"kind": 1, "start": 150 * ns, "end": 250 * ns, "stream_id": 9, "bytes": 2_000_000,
         "copy_kind": 1},
        {"kind": 2, "start": 460 * ns, "end": 470 * ns, "stream_id": 9, "bytes": 4096},
        {"kind": 4, "start": 0, "end": 10 * ns},
    ]


def test_cupti_records_become_spans_per_stream():
    spans = spans_from_cupti(cupti_records(), offset_s=50.0)
    assert [s.item for s in spans] == list(range(5))  # in start order; kind 4 skipped
    assert [(s.stage, s.lane) for s in spans] == [
        ("h2d", "stream 7"), ("compute", "stream 7"), ("h2d", "stream 9"),
        ("d2h", "stream 7"), ("memset", "stream 9")]
    kernel = spans[1]
    assert kernel.start_s == pytest.approx(50.0 + 100 * US, abs=1e-12)
    assert kernel.duration_s == pytest.approx(300 * US, abs=1e-9)
    assert kernel.meta == {"name": "cupy_sin__float32_float32", "grid": [128, 1, 1],
                           "block": [256, 1, 1]}
    assert [s.nbytes for s in spans] == [1_000_000, 0, 2_000_000, 1_000_000, 4096]
    report = Trace(spans).overlap()
    # copies: [0,100] [150,250] [400,450] = 250 us; under the kernel: [150,250] = 100 us
    assert report.copy_busy_s == pytest.approx(250 * US, abs=1e-9)
    assert report.copy_hidden_pct == pytest.approx(40.0, abs=1e-6)
    assert report.h2d_gbps == pytest.approx(3e6 / 200e-6 / 1e9, rel=1e-9)


def test_long_kernel_names_are_shortened_and_other_copies_named():
    rec = [{"kind": 10, "start": 0, "end": 5, "stream_id": 1, "name": "k" * 500},
           {"kind": 1, "start": 6, "end": 9, "stream_id": 1, "bytes": 8, "copy_kind": 8},
           {"kind": 1, "start": 9, "end": 12, "stream_id": 1, "bytes": 8, "copy_kind": 9}]
    spans = spans_from_cupti(rec)
    assert len(spans[0].meta["name"]) == 120 and spans[0].meta["name"].endswith("...")
    assert [s.stage for s in spans] == ["compute", "d2d", "copy"]


def test_kineto_chrome_events_become_spans():
    events = [
        {"ph": "X", "cat": "kernel", "name": "void cupy_sin(...)", "ts": 1000.0, "dur": 300.0,
         "args": {"stream": 13, "grid": [64, 1, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)",
         "ts": 900.0, "dur": 100.0, "args": {"stream": 14, "bytes": 4096}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)",
         "ts": 1300.0, "dur": 50.0, "args": {"stream": 14, "bytes": 4096}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 1400.0, "dur": 1.0,
         "args": {"stream": 13, "bytes": 64}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 990.0,
         "dur": 5.0, "args": {}},
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
    ]
    spans = spans_from_chrome(events)
    assert [(s.stage, s.lane, s.nbytes) for s in spans] == [
        ("h2d", "stream 14", 4096), ("compute", "stream 13", 0), ("d2h", "stream 14", 4096),
        ("memset", "stream 13", 64)]
    assert spans[1].start_s == pytest.approx(1000 * US) and spans[1].meta["grid"] == [64, 1, 1]
    assert spans[1].duration_s == pytest.approx(300 * US)


def test_no_gpu_says_so():
    with pytest.raises(DeviceUnavailableError, match="needs a CUDA device"):
        GpuActivity()
    with pytest.raises(PycLabError, match="backend must be"):
        GpuActivity("nsys")


def test_no_backend_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(activity, "cupy_status", lambda: (types.SimpleNamespace(), "ok"))
    monkeypatch.setattr(activity, "_backend_errors", lambda *_a, **_k: {
        "cupti": "cupti-python: ModuleNotFoundError: no cupti",
        "torch": "torch.profiler: ModuleNotFoundError: no torch"})
    with pytest.raises(DeviceUnavailableError, match=r"no cupti.*no torch.*pip install"):
        GpuActivity()
    with pytest.raises(DeviceUnavailableError, match="no torch") as err:
        GpuActivity("torch")
    assert "no cupti" not in str(err.value)
    monkeypatch.setattr(activity, "_backend_errors", lambda *_a, **_k: {
        "cupti": "cupti-python: ModuleNotFoundError: no cupti"})
    assert GpuActivity().backend == "torch"  # auto takes the first one that is there


def test_pyc_trace_runs_the_cell_untraced_without_a_gpu():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pyc_lab")
    try:
        with capture_output() as cap:
            assert shell.run_cell("%%pyc_trace\ntraced_value = 6 * 7\n").success
        assert shell.user_ns["traced_value"] == 42
        text = cap.outputs[-1].data["text/plain"]
        assert text.startswith("%%pyc_trace: the cell ran untraced:")
        assert "CUDA device" in text
    finally:
        shell.run_line_magic("unload_ext", "pyc_lab")


# -- on the GPU ------------------------------------------------------------------------------
def _backends() -> list[str]:
    return [b for b in activity.BACKENDS if b not in activity._backend_errors()]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", activity.BACKENDS)
def test_gpu_activity_records_copies_and_kernels_per_stream(backend):  # pragma: no cover
    import cupy as cp

    if backend not in _backends():
        pytest.fail(f"the GPU lane must carry the {backend} backend: "
                    f"{activity._backend_errors()[backend]}")
    n = 1 << 22
    host = cp.cuda.alloc_pinned_memory(n * 4)
    x = np.frombuffer(host, np.float32, n)
    x[:] = np.random.default_rng(3).standard_normal(n, dtype=np.float32)
    out = np.empty_like(x)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with GpuActivity(backend) as act:
        d = cp.empty(n, cp.float32)
        d.set(x, stream=s1)
        with s1:
            y = cp.sin(d)
        with s2:
            z = cp.zeros(1024, cp.float32) + 1  # work on a second stream
        y.get(stream=s1, out=out)
        s1.synchronize()
    np.testing.assert_allclose(out, np.sin(x), rtol=1e-6, atol=1e-6)
    assert float(z.sum()) == 1024.0
    spans = act.trace.spans
    stages = {s.stage for s in spans}
    assert {"h2d", "compute", "d2h"} <= stages, spans
    h2d = [s for s in spans if s.stage == "h2d" and s.nbytes == n * 4]
    d2h = [s for s in spans if s.stage == "d2h" and s.nbytes == n * 4]
    sin = [s for s in spans if s.stage == "compute" and "sin" in s.meta.get("name", "")]
    assert len(h2d) == 1 and len(d2h) == 1 and len(sin) == 1
    assert h2d[0].lane == sin[0].lane == d2h[0].lane  # all on s1
    assert len({s.lane for s in spans if s.stage == "compute"}) >= 2  # s1 and s2
    assert h2d[0].end_s <= sin[0].start_s + 1e-6 and sin[0].end_s <= d2h[0].start_s + 1e-6
    # 16 MiB over PCIe in well under 10 ms, and not implausibly fast either
    assert 16 * 2**20 / 100e9 < h2d[0].duration_s < 0.01
    assert act.trace.overlap().h2d_gbps > 5


@pytest.mark.gpu
def test_gpu_activity_sees_a_belts_three_streams_and_one_at_a_time():  # pragma: no cover
    import pyc_lab as pl

    with GpuActivity() as act:
        with pl.Pipeline(lambda i: np.full((256, 256), i, np.float32),
                         lambda a, s: a * 2, mode="gpu", depth=3) as pipe:
            outs = list(pipe.run(range(6)))
        with pytest.raises(PycLabError, match="one block at a time"), GpuActivity():
            pass
    assert [float(o[0, 0]) for o in outs] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    copies = [s for s in act.trace.spans if s.stage in ("h2d", "d2h")
              and s.nbytes == 256 * 256 * 4]
    assert len(copies) == 12
    assert len({s.lane for s in act.trace.spans}) >= 3  # h2d, compute and d2h streams


@pytest.mark.gpu
def test_pyc_trace_magic_shows_the_cells_gpu_work(tmp_path):  # pragma: no cover
    import json

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pyc_lab")
    path = tmp_path / "cell.json"
    try:
        with capture_output() as cap:
            assert shell.run_cell(
                f"%%pyc_trace --chrome {path}\nimport cupy as _cp\n"
                "_v = _cp.sin(_cp.arange(1 << 20, dtype=_cp.float32)).get()\n").success
        assert shell.user_ns["_v"].shape == (1 << 20,)
        assert "Timeline %%pyc_trace" in cap.outputs[-1].data["text/plain"]
        names = {e["name"] for e in json.loads(path.read_text())["traceEvents"]
                 if e["ph"] == "X"}
        assert {"compute", "d2h"} <= names
    finally:
        shell.run_line_magic("unload_ext", "pyc_lab")
