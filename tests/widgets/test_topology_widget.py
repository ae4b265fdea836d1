"""The topology widget: picture, deterministic reprs, static and live views."""

from __future__ import annotations

import re

import pytest

import pyc_lab as pl
from pyc_lab.widgets import TopologyWidget, display
from pyc_lab.widgets import topology as topo


@pytest.fixture(scope="module")
def dgx():
    return pl.detect_hardware(snapshot="dgx-h100")


@pytest.fixture(scope="module")
def cpu_bandwidth():
    return pl.probe_bandwidth(sizes=[4096, 1 << 20], min_time_s=0.001)


def test_dgx_picture_has_two_numa_boxes_eight_gpus_and_28_nvlink_pairs(dgx):
    fig = TopologyWidget(dgx).figure()
    gpus = next(t for t in fig.data if t.name == "GPUs")
    assert list(gpus.text) == [f"GPU{i}" for i in range(8)]
    nv = next(t for t in fig.data if t.name and t.name.startswith("NV18"))
    assert nv.name == "NV18 (28)"
    assert nv.line.color == topo.link_color("NV18")
    # 28 curves of 17 points, each followed by a None separator.
    assert sum(x is None for x in nv.x) == 28
    boxes = [s for s in fig.layout.shapes if s.type == "rect" and s.y0 == 0.0]
    assert len(boxes) == 2
    box0, box1 = sorted(boxes, key=lambda s: s.x0)
    for i, x in enumerate(gpus.x):
        box = box0 if i < 4 else box1
        assert box.x0 < x < box.x1, f"GPU{i} drawn outside its NUMA node's box"
    assert "NUMA 0 (from public: nvidia-smi topo -m on DGX H100)" in gpus.hovertext[0]


def test_links_are_coloured_by_kind():
    assert topo.link_color("NV4") == topo.link_color("NV18")
    kinds = ["PIX", "PXB", "PHB", "NODE", "SYS"]
    assert len({topo.link_color(k) for k in kinds}) == len(kinds)
    assert topo.link_color(None) == topo.link_color("???")


def test_reprs_are_deterministic_and_free_of_addresses(dgx):
    a, b = TopologyWidget(dgx), TopologyWidget(pl.detect_hardware(snapshot="dgx-h100"))
    assert a.to_text() == b.to_text()
    assert a.to_html() == b.to_html()
    for text in (a.to_text(), a.to_html()):
        assert not re.search(r"0x[0-9a-f]{6,}", text)
        assert " at 0x" not in text
    assert "NV18" in a.to_html() and "GPU links (nvidia-smi topo -m)" in a.to_html()


def test_static_bundle_without_a_frontend(dgx):
    bundle = TopologyWidget(dgx)._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"].startswith("HardwareProfile (snapshot dgx-h100.json)")


def test_live_bundle_is_a_widget_with_deterministic_text(dgx, monkeypatch):
    monkeypatch.setattr(display, "has_live_frontend", lambda: True)
    bundle = TopologyWidget(dgx)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == TopologyWidget(dgx).to_text()


def test_live_widget_button_measures_and_shows_bandwidth():
    import ipywidgets as w

    hw = pl.detect_hardware()
    tw = TopologyWidget(hw, probe_kwargs={"sizes": [4096, 65536], "min_time_s": 0.001})
    box = tw.widget()
    bw_box = box.children[2]
    assert bw_box.layout.display == "none"
    button = next(c for c in box.children[1].children if isinstance(c, w.Button))
    button.click()
    assert tw.bandwidth is not None
    assert bw_box.layout.display == "flex"
    measured = "h2d_pinned" if hw.gpus else "host_memcpy"
    assert measured in box.children[0].children[1].value
    status = box.children[1].children[1].value
    assert "color:#b00" not in status


def test_no_gpu_picture_says_why(cpu_bandwidth):
    hw = pl.detect_hardware()
    if hw.gpus:
        pytest.skip("this machine has a GPU")
    fig = TopologyWidget(hw, cpu_bandwidth).figure()
    assert any("no CUDA device" in (a.text or "") for a in fig.layout.annotations)
    assert not any(t.name == "GPUs" for t in fig.data)


def test_bandwidth_figure_and_summary(cpu_bandwidth):
    tw = TopologyWidget(pl.detect_hardware(), cpu_bandwidth)
    fig = tw.bandwidth_figure()
    names = {t.name for t in fig.data}
    assert "host_memcpy" in names or "h2d_pinned" in names
    assert fig.layout.xaxis.type == "log"
    assert "Bandwidth (best per kind):" in tw.to_text()
    assert "Measured bandwidth (best per kind)" in tw.to_html()


def test_unknown_numa_gpus_get_their_own_box():
    hw = pl.HardwareProfile.from_json(pl.hardware.snapshot_path("h200"))
    hw.gpus[0].numa_node = None
    fig = TopologyWidget(hw).figure()
    assert any("NUMA ?" in (a.text or "") for a in fig.layout.annotations)
