"""Shared display helpers: escaping for plotly, numbers and tables for people, bundles."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from pyc_lab.widgets import display


@pytest.mark.parametrize(("value", "text"), [
    (0.184128, "0.1841"), (746.431572, "746.4"), (3352.3, "3352"), (63.02, "63.02"),
    (1024.0, "1024"), (12345.6, "12,346"), (0.003881, "0.003881"), (3.2e-6, "3.2e-06"),
    (0.0, "0"), (-1.5, "-1.5"), (np.float64(0.979666), "0.9797"), (np.int64(4096), "4096"),
    (7, "7"), (None, "–"), (math.nan, "–"), (math.inf, "∞"), (True, "True"), ("x", "x"),
])
def test_numbers_are_written_for_people(value, text):
    assert display.format_number(value) == text


@pytest.mark.parametrize(("name", "label"), [
    ("median_ms", "median (ms)"), ("copy_hidden_pct", "copy hidden (%)"),
    ("best_gbps", "best (GB/s)"), ("memory_gib", "memory (GiB)"), ("tflops", "TFLOP/s"),
    ("pct_of_peak", "% of peak"), ("vs_cublas", "vs cuBLAS"), ("at_size", "at size"),
    ("tuned CUTLASS TFLOP/s", "tuned CUTLASS TFLOP/s"), ("status", "status"),
])
def test_column_names_carry_their_units(name, label):
    assert display.column_label(name) == label


def test_plotly_text_escapes_once_and_keeps_quotes():
    text = '"cuda" is a driver library & <lib> isn\'t found'
    assert display.plotly_text(text) == '"cuda" is a driver library &amp; &lt;lib&gt; isn\'t found'
    assert display.escape(text) == ("&quot;cuda&quot; is a driver library &amp; &lt;lib&gt; "
                                    "isn&#x27;t found")


def _frame():
    return pd.DataFrame({"config": ["a", "b"], "median_ms": [0.18412837, 12.5],
                         "tflops": [746.431572, None], "n": [1, 2]})


def test_frame_html_is_for_people_and_scrolls_instead_of_wrapping():
    html = display.frame_html(_frame(), "Caption <b>")
    assert not re.search(r"\d\.\d{5,}", html)  # no six-decimal floats
    assert "<td>0.1841</td>" in html and "<td>746.4</td>" in html and "<td>–</td>" in html
    assert "<th>median (ms)</th>" in html and "<th>TFLOP/s</th>" in html
    assert "<caption>Caption &lt;b&gt;</caption>" in html
    assert html.startswith("<div class='pyc-lab-scroll' style='overflow-x:auto;max-width:100%")
    assert "<table style='white-space:nowrap'" in html
    assert "<th>0</th>" not in html  # a plain 0..n-1 index is left out
    named = _frame().set_index("config")
    assert "<th>config</th>" in display.frame_html(named)
    assert display.frame_html(_frame()) == display.frame_html(_frame())


def test_frame_text_matches_the_html_numbers():
    lines = display.frame_text(_frame()).splitlines()
    assert lines[0].split() == ["config", "median", "(ms)", "TFLOP/s", "n"]
    assert lines[1].split() == ["a", "0.1841", "746.4", "1"]
    assert lines[2].split() == ["b", "12.5", "–", "2"]


class _View(display.ChartView):
    def to_text(self):
        return "text"

    def to_html(self):
        return "<p>html</p>"

    def figure(self):
        import plotly.graph_objects as go

        return go.Figure(go.Bar(x=["a", "b"], y=[1, 2]), layout=dict(title="t"))


def test_live_bundle_carries_the_static_html_as_a_fallback():
    bundle = display.view_bundle(_View(), live=True)
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == "text" and bundle["text/html"] == "<p>html</p>"
    assert display.view_bundle(_View(), live=False) == {"text/plain": "text",
                                                        "text/html": "<p>html</p>"}


def test_chart_views_show_their_figure_as_plotly_data_not_a_figure_widget():
    import ipywidgets as w

    view = _View().widget()
    chart, tables = view.children
    assert isinstance(chart, w.Output) and isinstance(tables, w.HTML)
    assert tables.layout.display == "block" and tables.layout.width == "100%"
    (out,) = chart.outputs
    spec = out["data"]["application/vnd.plotly.v1+json"]
    assert spec["layout"]["title"]["text"] == "t" and spec["data"][0]["type"] == "bar"
    assert "uid" not in spec["data"][0]  # deterministic
    assert display.figure_bundle(_View().figure()) == out["data"]
    display.set_figure(chart, None)
    assert chart.outputs == ()
