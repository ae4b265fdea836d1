"""The autotuner widgets, built from replays: reprs, chart, Stop, thread, comparison."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.hardware.device import cupy_status
from pyc_lab.kernels.tuning import autotune as tuner
from pyc_lab.kernels.tuning import recording as replay
from pyc_lab.widgets import AutotuneWidget, KernelComparison, display
from pyc_lab.widgets import autotune as aw
from tests.fakes.tuning_recording import CUBLAS_MS, FLOPS, SHAPE, TORCH_MS, write_recording

SHIPPED_ROWS = json.loads(Path(replay.recording_path()).read_text())["rows"]
PEAK = 989.4


@pytest.fixture
def synthetic(tmp_path):
    return write_recording(tmp_path / "synthetic.json")


def widget(rec, **kw) -> AutotuneWidget:
    kw = {"strategy": "exhaustive", "max_candidates": None, "mode": "replay", "pace_s": 0.0,
          **kw}
    return AutotuneWidget(*SHAPE, dtype="f16", source=rec.path, **kw)


def test_a_finished_replay_has_deterministic_reprs(synthetic):
    a, b = widget(synthetic), widget(synthetic)
    a.run()
    b.run()
    text = a.to_text()
    assert text == b.to_text() and a.to_html() == b.to_html() and repr(a) == text
    lines = text.splitlines()
    assert lines[0] == ("AutotuneWidget: GEMM 2048x2048x2048 f16 tn; strategy exhaustive, "
                        "budget 180 s, all candidates")
    assert lines[1].startswith("Replayed from a recording made on NVIDIA H200, 2026-11-30 "
                               "(driver 580.159.04, CUDA 13.0; ")
    assert lines[2] == ("state: done: 24 of 24 candidates (21 ok, 3 failed); "
                        "stopped by exhausted")
    best_ms = synthetic.fastest_ms
    assert lines[3].startswith("best: ") and f"recorded {best_ms:.4g} ms" in lines[3]
    assert "Tuned vs libraries:" in text and "Candidates:" in text
    for status in ("compile_error", "wrong_result", "nan"):
        assert status in text
    for out in (text, a.to_html()):
        assert not re.search(r"0x[0-9a-f]{6,}", out)
    assert "class='pyc-lab-autotune'" in a.to_html()


def test_before_a_run_the_widget_says_so(synthetic):
    w = widget(synthetic)
    assert w.to_text().splitlines()[2] == "state: not started: press Start (or call .run())"
    assert w.result is None and w.compare() is None


def test_chart_traces_include_failures_and_the_recorded_baselines(synthetic):
    w = widget(synthetic)
    w.run()
    fig = w.figure()
    names = [t.name for t in fig.data]
    assert names[0] == "ok (recorded)"
    for status, message in {"compile_error": "ptxas error", "wrong_result": "max error 0.41",
                            "nan": "NaN or Inf"}.items():
        trace = next(t for t in fig.data if t.name == f"{status} (recorded)")
        assert trace.marker.symbol == "x" and list(trace.y) == [0.0]
        assert f"status: {status} (recorded)" in trace.hovertext[0]
        assert message in trace.hovertext[0]
        assert trace.marker.color == aw.status_color(status)
    ok = fig.data[0]
    assert len(ok.x) == 21
    assert max(ok.y) == pytest.approx(FLOPS / (synthetic.fastest_ms * 1e-3) / 1e12)
    star = next(t for t in fig.data if t.name == "best so far (recorded)")
    assert list(star.y) == [pytest.approx(max(ok.y))]
    cublas = next(t for t in fig.data if t.name.startswith("cuBLAS (recorded)"))
    torch = next(t for t in fig.data if t.name.startswith("torch (recorded)"))
    assert list(cublas.y) == pytest.approx([FLOPS / (CUBLAS_MS * 1e-3) / 1e12] * 2)
    assert list(torch.y) == pytest.approx([FLOPS / (TORCH_MS * 1e-3) / 1e12] * 2)
    assert "recorded on NVIDIA H200, 2026-11-30" in fig.layout.title.text


def test_the_recorded_baselines_show_before_the_run(synthetic):
    names = [t.name for t in widget(synthetic).figure().data]
    assert names == ["cuBLAS (recorded) 573 TFLOP/s", "torch (recorded) 554 TFLOP/s"]


def test_the_stop_button_stops_the_background_search(synthetic):
    w = widget(synthetic, pace_s=0.05)
    view = w.widget()
    assert w.widget() is view  # one view per widget
    start, stop = w._parts["start"], w._parts["stop"]
    assert stop.disabled and not start.disabled
    start.click()
    assert w.running and start.disabled and not stop.disabled
    deadline = time.monotonic() + 10
    while len(w.rows) < 2 and time.monotonic() < deadline:
        w.join(0.01)
    stop.click()
    assert w.stop_event.is_set()
    assert w.join(10)
    assert w.state == "stopped" and w.result.stopped_by == "observer"
    assert 2 <= len(w.result.table) < 24
    assert "stopped by the Stop button" in w.to_text()
    assert not start.disabled and stop.disabled


def test_the_background_thread_completes_and_fills_the_view(synthetic):
    w = widget(synthetic, pace_s=0.002)
    w.widget()
    assert w.run(wait=False) is None
    with pytest.raises(PycLabError, match="already tuning"):
        w.run()
    assert w.join(30)
    assert w.state == "done" and len(w.result.table) == 24
    p = w._parts
    assert (p["progress"].value, p["progress"].max) == (24, 24)
    assert [t.name for t in p["chart"].data] == [t.name for t in w.figure().data]
    assert "Tuned CUTLASS vs libraries" in p["tables"].value
    assert p["status"].value.startswith("done: 24 of 24 candidates")
    assert "Replayed from a recording" in p["banner"].value


def test_the_controls_pick_a_recorded_problem_and_start_it(synthetic):
    w = widget(synthetic)
    w.widget()
    p = w._parts
    labels = [label for label, _ in p["recorded"].options]
    assert labels == ["1024x1024x1024 bf16 tn", "2048x2048x2048 f16 tn"]
    p["recorded"].value = (1024, 1024, 1024, "bf16", "tn")
    assert (p["m"].value, p["dtype"].value) == (1024, "bf16")
    p["start"].click()
    assert w.join(10)
    assert (w.m, w.dtype) == (1024, "bf16")
    assert w.result.problem.shape == (1024, 1024, 1024)
    p["m"].value = 999
    p["start"].click()  # not recorded: the error is shown, the widget lives on
    assert "no recorded tuning of GEMM 999x1024x1024 bf16 tn" in p["status"].value


def test_a_failed_run_is_shown_and_raised(synthetic, monkeypatch):
    w = widget(synthetic)

    def broken(*args, **kwargs):
        raise PycLabError("the recording went away")

    monkeypatch.setattr(tuner, "replay_autotune", broken)
    with pytest.raises(PycLabError, match="went away"):
        w.run()
    assert w.state == "failed" and "failed: the recording went away" in w.to_text()


def test_modes():
    with pytest.raises(PycLabError, match="mode='sometimes'"):
        AutotuneWidget(mode="sometimes")
    with pytest.raises(PycLabError, match="no recorded tuning of GEMM 100x100x100 f16"):
        AutotuneWidget(100, 100, 100, mode="replay")
    if cupy_status()[0] is not None:
        pytest.skip("a GPU is present: auto means live here")
    w = AutotuneWidget(mode="auto")
    assert w.mode == "replay" and w.fallback
    assert w.banner().endswith("(no usable CUDA device on this machine)")
    with pytest.raises(PycLabError, match="needs a CUDA device"):
        AutotuneWidget(mode="live")


def test_bundles_static_and_live(synthetic, monkeypatch):
    w = widget(synthetic)
    w.run()
    assert set(w._repr_mimebundle_()) == {"text/plain", "text/html"}
    monkeypatch.setattr(display, "has_live_frontend", lambda: True)
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == w.to_text()


def test_without_plotly_and_ipywidgets_text_and_html_still_work(synthetic, monkeypatch):
    w = widget(synthetic)
    w.run()
    text, html = w.to_text(), w.to_html()
    kc = KernelComparison.from_recording(synthetic.path)
    kc_text = kc.to_text()
    for name in ("plotly", "plotly.graph_objects", "ipywidgets", "anywidget"):
        monkeypatch.setitem(sys.modules, name, None)
    assert w.to_text() == text and w.to_html() == html
    assert set(w._repr_mimebundle_()) == {"text/plain", "text/html"}
    assert KernelComparison.from_recording(synthetic.path).to_text() == kc_text
    with pytest.raises(PycLabError, match="plotly"):
        w.figure()
    with pytest.raises(PycLabError, match="plotly"):
        kc.figure()


def test_kernel_comparison_numbers_equal_the_recorded_ones():
    kc = KernelComparison.from_recording()
    frame = kc.to_frame()
    winners = [r for r in SHIPPED_ROWS if r["is_winner"] and r["op"] == "gemm"]
    assert winners
    for row in winners:
        label = f"{row['m']}x{row['n']}x{row['k']} {row['dtype_a']} {row['layout']}"
        tuned = frame[(frame.problem == label) & (frame.kernel == "tuned CUTLASS")]
        assert tuned.ms.item() == pytest.approx(row["time_ms"])
        tflops = 2 * row["m"] * row["n"] * row["k"] / (row["time_ms"] * 1e-3) / 1e12
        assert tuned.tflops.item() == pytest.approx(tflops)
        assert tuned.pct_of_peak.item() == pytest.approx(100 * tflops / PEAK)
        for base in (r for r in SHIPPED_ROWS if r["status"] == "baseline"
                     and (r["m"], r["n"], r["k"], r["dtype_a"]) ==
                     (row["m"], row["n"], row["k"], row["dtype_a"])):
            name = aw.kernel_label(base["config"]["baseline"])
            got = frame[(frame.problem == label) & (frame.kernel == name)]
            assert got.ms.item() == pytest.approx(base["time_ms"])
    assert kc.title.startswith(f"{len(winners)} problem(s) — recorded on NVIDIA H200, ")
    assert kc.to_text() == KernelComparison.from_recording().to_text()


def test_kernel_comparison_with_baselines(synthetic):
    kc = KernelComparison.from_recording(synthetic.path, dtype="f16")
    ratios = kc.ratios().iloc[0]
    tuned = FLOPS / (synthetic.fastest_ms * 1e-3) / 1e12
    assert ratios["problem"] == "2048x2048x2048 f16 tn"
    assert ratios["tuned CUTLASS TFLOP/s"] == pytest.approx(tuned)
    assert ratios["cuBLAS TFLOP/s"] == pytest.approx(FLOPS / (CUBLAS_MS * 1e-3) / 1e12)
    assert ratios["tuned CUTLASS x cuBLAS"] == pytest.approx(CUBLAS_MS / synthetic.fastest_ms)
    assert ratios["torch x cuBLAS"] == pytest.approx(CUBLAS_MS / TORCH_MS)
    assert ratios["tuned % of peak"] == pytest.approx(100 * tuned / PEAK)
    median = CUBLAS_MS / synthetic.fastest_ms
    assert kc.summary() == (f"tuned CUTLASS vs cuBLAS: median {median:.2f}x over 1 "
                            "problem(s), faster on 0")
    fig = kc.figure()
    assert [t.name for t in fig.data] == ["tuned CUTLASS", "cuBLAS", "torch"]
    assert list(fig.data[0].y) == [pytest.approx(tuned)]
    assert fig.layout.barmode == "group"
    assert any("dense peak 989.4" in (a.text or "") for a in fig.layout.annotations)


def test_kernel_comparison_from_results_and_rows(synthetic):
    results = [tuner.replay_autotune(*SHAPE, dtype="f16", source=synthetic.path)]
    from_results = KernelComparison(results)
    rows = [{"m": 2048, "n": 2048, "k": 2048, "dtype": "f16", "kernel": k, "ms": ms,
             "gpu_name": "NVIDIA H200"}
            for k, ms in [("tuned CUTLASS", results[0].best.time_ms), ("cublas", CUBLAS_MS),
                          ("torch", TORCH_MS)]]
    from_rows = KernelComparison(rows)
    assert from_rows.ratios().equals(from_results.ratios())
    assert from_rows.title == "1 problem(s) on NVIDIA H200"
    import pandas as pd

    assert KernelComparison(pd.DataFrame(rows)).ratios().equals(from_rows.ratios())
    assert "recorded on NVIDIA H200, 2026-11-30" in from_results.title
    with pytest.raises(PycLabError, match="lacks"):
        KernelComparison([{"m": 1}])
    with pytest.raises(PycLabError, match="at least one"):
        KernelComparison([])
    with pytest.raises(PycLabError, match="no GEMM problem"):
        KernelComparison.from_recording(synthetic.path, dtype="tf32")


def test_kernel_comparison_bundles(synthetic, monkeypatch):
    kc = KernelComparison.from_recording(synthetic.path)
    assert set(kc._repr_mimebundle_()) == {"text/plain", "text/html"}
    assert repr(kc) == kc.to_text()
    assert "class='pyc-lab-kernel-comparison'" in kc.to_html()
    monkeypatch.setattr(display, "has_live_frontend", lambda: True)
    assert "application/vnd.jupyter.widget-view+json" in kc._repr_mimebundle_()


def test_coinciding_baseline_lines_both_stay_visible(synthetic):
    fig = widget(synthetic).figure()
    cublas, torch = fig.data
    assert cublas.name.startswith("cuBLAS") and torch.name.startswith("torch")
    # cuBLAS is drawn first, wide and pale; torch on top of it, narrow and dotted
    assert (cublas.line.dash, torch.line.dash) == ("solid", "dot")
    assert cublas.line.width > 2 * torch.line.width and cublas.opacity < 1
    assert torch.opacity == 1
    assert fig.layout.legend.yanchor == "top"  # below the plot, clear of the axis title


def test_tables_write_numbers_for_people(synthetic):
    w = widget(synthetic)
    w.run()
    html = w.to_html()
    assert not re.search(r"\d\.\d{5,}", html)
    assert "<th>TFLOP/s</th>" in html and "<th>% of peak</th>" in html
    text = w.to_text()
    header = text.split("Tuned vs libraries:\n")[1].splitlines()[0]
    assert header.split() == ["kernel", "ms", "TFLOP/s", "%", "of", "peak", "vs", "cuBLAS"]
    assert not re.search(r"\d\.\d{5,}", text)
    kc = KernelComparison.from_recording(synthetic.path)
    for out in (kc.to_text(), kc.to_html()):
        assert not re.search(r"\d\.\d{5,}", out)


def test_kernel_comparison_labels_get_room_and_the_legend_sits_above(synthetic):
    fig = KernelComparison.from_recording().figure()
    assert fig.layout.xaxis.automargin and fig.layout.xaxis.tickangle == -35
    legend = fig.layout.legend
    assert legend.orientation == "h" and legend.yanchor == "bottom" and legend.y >= 1
    assert fig.layout.uniformtext.mode == "hide"  # % labels only where the bars hold them
    assert fig.layout.width is None
