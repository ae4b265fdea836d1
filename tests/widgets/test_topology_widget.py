"""The topology widget: picture, deterministic reprs, static and live views."""

from __future__ import annotations

import itertools
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
    boxes = _numa_boxes(fig)
    assert len(boxes) == 2
    box0, box1 = sorted(boxes, key=lambda s: s.x0)
    for i, (x, y) in enumerate(zip(gpus.x, gpus.y, strict=True)):
        box = box0 if i < 4 else box1
        assert box.x0 < x < box.x1, f"GPU{i} drawn outside its NUMA node's box"
        assert box.y0 < y < box.y1
    assert "NUMA 0 (from public: nvidia-smi topo -m on DGX H100)" in gpus.hovertext[0]


def _numa_boxes(fig):
    return [s for s in fig.layout.shapes
            if s.type == "rect" and s.fillcolor == "rgba(200,200,200,0.12)"]


def test_dgx_picture_lays_out_without_overlaps(dgx):
    fig = TopologyWidget(dgx).figure()
    gpus = next(t for t in fig.data if t.name == "GPUs")
    # one row per NUMA node, GPUs spread evenly, none on top of another
    assert len(set(gpus.y)) == 1
    xs = sorted(gpus.x)
    assert min(b - a for a, b in itertools.pairwise(xs)) >= 2.0
    # the link arcs hang below the GPU row, so they never cross a GPU or the CPU strip
    row = gpus.y[0]
    for trace in fig.data:
        if trace.name and trace.name.startswith("NV18"):
            assert max(y for y in trace.y if y is not None) <= row + 1e-9
    # no label sits on a GPU: the shared PCIe link is said once, in the CPU strip
    strips = [a.text for a in fig.layout.annotations if "to each GPU" in (a.text or "")]
    assert strips == ["CPUs 0-55,112-167 · 1024 GiB<br>PCIe Gen5 x16 · 63 GB/s to each GPU "
                      "(dotted)",
                      "CPUs 56-111,168-223 · 1024 GiB<br>PCIe Gen5 x16 · 63 GB/s to each GPU "
                      "(dotted)"]
    for note in fig.layout.annotations:
        for x in gpus.x:
            assert not (abs(note.x - x) < 0.7 and abs(note.y - row) < 0.7), note.text
    # the picture follows the output's width; its height fits the deepest arc
    assert fig.layout.width is None and fig.layout.autosize
    lowest = min(y for t in fig.data if t.y is not None for y in t.y if y is not None)
    assert fig.layout.yaxis.range[0] < lowest
    # the PCIe lines have one legend entry, the GPUs none
    assert [t.name for t in fig.data if t.showlegend is not False] == [
        "PCIe to CPUs", "NV18 (28)"]


def test_gpus_with_different_pcie_links_get_a_label_each(dgx):
    hw = pl.HardwareProfile.from_json(pl.hardware.snapshot_path("dgx-h100"))
    hw.gpus[0].pcie_gen_max, hw.gpus[0].pcie_width_max = 4, 8
    fig = TopologyWidget(hw).figure()
    labels = [a for a in fig.layout.annotations if (a.text or "").startswith("Gen")]
    assert [a.text for a in labels[:2]] == ["Gen4 x8 · 16 GB/s", "Gen5 x16 · 63 GB/s"]
    assert len(labels) == 4  # the first NUMA node's GPUs; the second shares one link
    assert labels[-1].xanchor == "right"  # the last one's label stays inside its box
    strips = [a.text for a in fig.layout.annotations if (a.text or "").startswith("CPUs")]
    assert "to each GPU" not in strips[0] and "to each GPU" in strips[1]


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
    _picture, controls, bw_chart, tables = tw.widget().children
    assert bw_chart.layout.display == "none" and bw_chart.outputs == ()
    button = next(c for c in controls.children if isinstance(c, w.Button))
    button.click()
    assert tw.bandwidth is not None
    assert bw_chart.layout.display is None
    (shown,) = bw_chart.outputs
    names = [t["name"] for t in shown["data"]["application/vnd.plotly.v1+json"]["data"]]
    measured = "h2d_pinned" if hw.gpus else "host_memcpy"
    assert measured in names
    assert measured in tables.value and "Measured bandwidth" in tables.value
    status = controls.children[1].value
    assert "color:#b00" not in status


def test_live_widget_stacks_picture_button_and_tables_at_full_width(dgx):
    import ipywidgets as w

    view = TopologyWidget(dgx).widget()
    picture, controls, _bw_chart, tables = view.children
    assert view.layout.width == "100%"
    # the picture is plotly's mime bundle in an Output widget (no FigureWidget, whose
    # models carry plotly.js each), stretched to the output's width
    assert isinstance(picture, w.Output) and picture.layout.width == "100%"
    (out,) = picture.outputs
    spec = out["data"]["application/vnd.plotly.v1+json"]
    assert spec["layout"].get("width") is None and spec["config"] == {"displaylogo": False}
    assert "FigureWidget" not in repr(view)
    # the button says its whole label
    button = controls.children[0]
    assert button.description == "Measure bandwidth"
    assert button.layout.width == "auto" and button.layout.min_width == "max-content"
    # the tables: a block at the output's width, no title repeated above them, no cell
    # wrapping, each table scrolling sideways in its own box
    assert isinstance(tables, w.HTML) and tables.layout.display == "block"
    assert "<h4>" not in tables.value
    assert tables.value.count("overflow-x:auto") == 3  # GPUs, links, NUMA nodes
    assert tables.value.count("white-space:nowrap") == 3


def test_html_lists_the_host_once_and_formats_numbers_for_people(dgx):
    html = TopologyWidget(dgx).to_html()
    # the GPU lines of the profile's summary are the GPU table's rows
    assert "<li>GPU0:" not in html and "<li>Host: Intel(R) Xeon(R)" in html
    assert "memory (GiB)" in html and "memory bw (GB/s)" in html
    assert "3352.3" not in html and ">3352<" in html  # 4 significant digits
    assert "<th>uuid</th>" not in html and "None" not in html
    assert not re.search(r"\d\.\d{5,}", html)


def test_plotly_text_is_escaped_once():
    hw = pl.detect_hardware(snapshot="h200")
    hw.gpus = []
    hw.cuda_status = ('no CUDA device: DynamicLibNotFoundError: "cuda" is an NVIDIA driver '
                      "library & <lib> can only be found via system search")
    hw.host.cpu_model = 'Intel "Sapphire" <R>'
    fig = TopologyWidget(hw).figure()
    texts = " ".join(a.text for a in fig.layout.annotations) + fig.layout.title.text
    assert '"cuda"' in texts and "&amp;" in texts and "&lt;lib&gt;" in texts
    assert 'Intel "Sapphire" &lt;R&gt;' in fig.layout.title.text
    assert "&quot;" not in texts and "&amp;quot;" not in texts and "&#x27;" not in texts


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
