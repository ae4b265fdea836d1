"""Inference views: deterministic reprs, figures built from a real server and load test."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("plotly")

from pyc_lab.errors import PycLabError
from pyc_lab.inference.load_testing import load_test
from pyc_lab.inference.model import load
from pyc_lab.inference.server import serve
from pyc_lab.widgets.inference import LoadTestChart, ServerMonitor, ServersView


@pytest.fixture
def server():
    def affine(x):
        return x * np.float32(2) + np.float32(1)

    s = serve(load(affine, inputs={"x": ("float32", (None, 4))}), max_batch=8,
              max_delay_ms=1, name="widget-test")
    yield s
    s.close()


def test_servers_view_lists_models_and_settings(server):
    view = ServersView([server])
    text = view.to_text()
    assert "widget-test" in text and "x: float32[N, 4]" in text and "1 2 4 8" in text
    assert text == ServersView([server]).to_text()
    assert "<table" in view.to_html()
    assert "no server is running" in ServersView([]).to_text()


def test_monitor_figure_and_stable_reprs(server):
    for k in range(50):
        server.predict(np.full((1, 4), k, np.float32))
    mon = ServerMonitor(server)
    fig = mon.figure()
    assert len(fig.data[0].x) == 50
    assert {a.text.split()[0] for a in fig.layout.annotations} == {"p50", "p90", "p99"}
    assert mon.to_text() == ServerMonitor(server).to_text()
    assert "ms" not in mon.to_text().replace("max_delay_ms", "")
    assert mon.snapshot()["requests"] == 50
    with pytest.raises(PycLabError):
        ServerMonitor("not a server")


def test_load_test_chart_fills_level_by_level(server):
    chart = LoadTestChart()
    assert "nothing measured" in chart.to_text()
    frame = load_test(server, [1, 2], duration_s=0.1, warmup_s=0.0, on_level=chart.add)
    assert len(chart.frame) == 2
    fig = LoadTestChart(frame).figure()
    assert len(fig.data) == 1 and list(fig.data[0].text) == ["c=1", "c=2"]
    assert "max_batch=8" in chart.to_text() and "<table" in chart.to_html()
