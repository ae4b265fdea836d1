"""The topology widget: a picture of the machine above its tables.

NUMA nodes are drawn as boxes side by side, each with its CPUs (and the PCIe links to
its GPUs) in a strip at the top and its GPUs in a row below; dotted lines join each GPU
to its node's CPUs. GPU-to-GPU links are arcs under the GPU row, coloured by kind
(NVLink count, PCIe switch/host bridge, NUMA node, SYS), nested by span so that each
stays visible; hovering shows the details. Measured bandwidths, when given, are drawn
and tabled below.

In a Jupyter kernel with ipywidgets the view is live: the picture at the width of the
output, a button that measures bandwidth, then the tables, which wrap side by side on a
wide screen and scroll sideways on a narrow one rather than squeezing. Elsewhere it is
static HTML and text. Its ``text/plain`` and ``text/html`` reprs are deterministic: no
addresses, ids or timings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hardware.cpulist import format_cpulist
from ..hardware.profile import LINK_KINDS, HardwareProfile
from ..profiling.bandwidth import bandwidth_summary
from .display import (
    TABLE_CSS,
    View,
    escape,
    figure_output,
    frame_html,
    frame_text,
    html_widget,
    plotly_text,
    require_plotly,
    set_figure,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["TopologyWidget", "link_color"]

_KIND_COLORS = {
    "PIX": "#1f77b4",
    "PXB": "#4f8fc0",
    "PHB": "#ff7f0e",
    "NODE": "#9467bd",
    "SYS": "#d62728",
}
_NV_COLOR = "#2ca02c"
_UNKNOWN_COLOR = "#7f7f7f"
# The picture's geometry, in data units (the figure stretches to the output's width).
_GPU_PITCH = 2.6  # between neighbouring GPUs of a row
_BOX_PAD = 1.3  # from a box's side to its first / last GPU's centre
_BOX_MIN_W = 9.0
_BOX_GAP = 1.6
_BOX_H = 6.4
_GPU_Y = 2.4  # the GPU row, above the arcs that join GPUs
_STRIP = (4.2, 5.6)  # the CPU strip's bottom and top
_PX_PER_UNIT = 40  # height of one data unit, in pixels
#: Which GPUs a link's arc joins is seen from its ends; its depth grows with its span.
_ARC_DEPTH = (0.35, 0.2)  # depth = a + b * span
#: The GPU table's columns in the live view and the static HTML (the rest is in the
#: hover and in ``profile.to_frame()``).
_GPU_COLUMNS = ["name", "cc", "sms", "memory_gib", "mem_bw_gbps", "pcie_max", "pcie_gbps",
                "numa_node", "cpu_affinity", "sm_clock_max_mhz", "mig", "pci_bus_id"]
#: The picture's widest: pixels per data unit, so that a lone box is not stretched thin.
_MAX_PX_PER_UNIT = 75


def link_color(kind: str | None) -> str:
    """The colour a link kind is drawn in (NVLink green, PCIe blue/orange, SYS red)."""
    if kind and kind.startswith("NV"):
        return _NV_COLOR
    return _KIND_COLORS.get(kind or "", _UNKNOWN_COLOR)


class TopologyWidget(View):
    """Show a :class:`~pyc_lab.hardware.profile.HardwareProfile`, and optionally bandwidths.

    Parameters
    ----------
    profile
        The machine to show (``pyc_lab.detect_hardware()`` or a snapshot).
    bandwidth
        A frame from :func:`pyc_lab.probe_bandwidth`, drawn and tabled below the picture.
    probe_kwargs
        Keyword arguments for the probe that the live widget's button runs (e.g.
        ``{"sizes": [1 << 20, 1 << 26]}`` for a quick measurement).
    """

    def __init__(self, profile: HardwareProfile, bandwidth: pd.DataFrame | None = None,
                 *, probe_kwargs: dict[str, Any] | None = None):
        self.profile = profile
        self.bandwidth = bandwidth
        self.probe_kwargs = dict(probe_kwargs or {})

    # -- layout ---------------------------------------------------------------
    def _members(self) -> dict[int, list[int]]:
        """The GPUs of each NUMA node's box, in index order; ``-1`` holds the GPUs whose
        node nobody knew (a box only when there are some)."""
        nodes = [n.id for n in self.profile.host.numa_nodes] or [0]
        members: dict[int, list[int]] = {node: [] for node in nodes}
        for g in self.profile.gpus:
            members.setdefault(g.numa_node if g.numa_node in nodes else -1, []).append(g.index)
        return members

    def _layout(self) -> tuple[dict[int, tuple[float, float, float, float]],
                               dict[int, tuple[float, float]]]:
        """Boxes per NUMA node (x0, y0, x1, y1), side by side, and a position per GPU:
        one row per box, wide enough for its GPUs; a box reaches down far enough to hold
        the arcs of the links between its own GPUs."""
        boxes, positions = {}, {}
        x0 = 0.0
        for node, gpus in self._members().items():
            width = max(_BOX_MIN_W, 2 * _BOX_PAD + _GPU_PITCH * max(len(gpus) - 1, 0))
            first = x0 + (width - _GPU_PITCH * max(len(gpus) - 1, 0)) / 2
            for k, gpu in enumerate(gpus):
                positions[gpu] = (round(first + k * _GPU_PITCH, 4), _GPU_Y)
            spans = [abs(positions[link.a][0] - positions[link.b][0])
                     for link in self.profile.links if link.a in gpus and link.b in gpus]
            depth = _ARC_DEPTH[0] + _ARC_DEPTH[1] * max(spans) if spans else 0.0
            bottom = round(min(_GPU_Y - 1.0, _GPU_Y - depth - 0.35), 4)
            boxes[node] = (x0, bottom, x0 + width, _BOX_H)
            x0 += width + _BOX_GAP
        return boxes, positions

    # -- pictures -------------------------------------------------------------
    def figure(self) -> Any:
        """The topology picture as a plotly ``go.Figure`` (its width follows the output's;
        its height, the deepest link arc's)."""
        go = require_plotly()
        p = self.profile
        boxes, pos = self._layout()
        members = self._members()
        fig = go.Figure()
        shapes: list[dict[str, Any]] = []
        notes: list[dict[str, Any]] = []
        for node, (x0, y0, x1, y1) in boxes.items():
            shapes.append(dict(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color="#555"),
                               fillcolor="rgba(200,200,200,0.12)", layer="below"))
            title = "NUMA ?" if node == -1 else f"NUMA node {node}"
            notes.append(dict(x=(x0 + x1) / 2, y=y1 - 0.4, text=f"<b>{title}</b>",
                              showarrow=False, font=dict(size=12)))
            shapes.append(dict(type="rect", x0=x0 + 0.4, y0=_STRIP[0], x1=x1 - 0.4,
                               y1=_STRIP[1], line=dict(color="#888"),
                               fillcolor="rgba(255,255,255,0.9)", layer="below"))
            gpus = [g for g in p.gpus if g.index in members.get(node, [])]
            lines = [plotly_text(self._cpu_words(node))]
            pcie = {_pcie_short(g) for g in gpus if g.pcie_gen_max is not None}
            if len(pcie) == 1 and all(g.pcie_gen_max is not None for g in gpus):
                lines.append(plotly_text(f"PCIe {pcie.pop()} to each GPU (dotted)"))
            notes.append(dict(x=(x0 + x1) / 2, y=sum(_STRIP) / 2, text="<br>".join(lines),
                              showarrow=False, font=dict(size=11)))
            if len(pcie) > 1 or (pcie and any(g.pcie_gen_max is None for g in gpus)):
                for k, g in enumerate(gpus):  # links differ within the node: label each
                    last = k == len(gpus) - 1  # its label goes left, inside the box
                    notes.append(dict(x=pos[g.index][0], y=(_GPU_Y + _STRIP[0]) / 2 + 0.2,
                                      xanchor="right" if last else "left",
                                      xshift=-4 if last else 4, showarrow=False,
                                      text=plotly_text(_pcie_short(g)),
                                      font=dict(size=9, color="#555")))

        # GPU <-> CPU (PCIe) edges, dotted; one legend entry for all of them.
        for k, g in enumerate(gpu for gpu in p.gpus if gpu.index in pos):
            gx, gy = pos[g.index]
            fig.add_trace(go.Scatter(
                x=[gx, gx], y=[gy + 0.5, _STRIP[0]], mode="lines", name="PCIe to CPUs",
                legendgroup="pcie", showlegend=k == 0,
                line=dict(color="#999", dash="dot", width=1.5), hoverinfo="text",
                text=[plotly_text(f"GPU{g.index} ↔ CPUs: PCIe {_pcie(g)}")] * 2,
            ))

        # GPU <-> GPU links as arcs below the row, one trace per kind (the legend).
        by_kind: dict[str, list] = {}
        for link in p.links:
            if link.a in pos and link.b in pos:
                by_kind.setdefault(link.kind or "?", []).append(link)
        lowest = _GPU_Y
        for kind in sorted(by_kind, key=_kind_order):
            xs: list = []
            ys: list = []
            texts: list = []
            for link in by_kind[kind]:
                cx, cy = _arc(pos[link.a], pos[link.b])
                lowest = min(lowest, *cy)
                p2p = {True: "yes", False: "no", None: "?"}[link.p2p]
                label = (f"GPU{link.a} ↔ GPU{link.b}: {kind}"
                         + (f" ({link.nvlinks} NVLinks)" if link.nvlinks else "")
                         + f", P2P {p2p}")
                xs += [*cx, None]
                ys += [*cy, None]
                texts += [plotly_text(label)] * len(cx) + [None]
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines", name=f"{kind} ({len(by_kind[kind])})",
                line=dict(color=link_color(kind), width=2.5 if kind.startswith("NV") else 2.0),
                hoverinfo="text", text=texts, opacity=0.7,
            ))

        if p.gpus:
            peak = self._peak_by_gpu()
            shown = [g for g in p.gpus if g.index in pos]
            size = 38 if len(shown) <= 8 else 30 if len(shown) <= 16 else 22
            fig.add_trace(go.Scatter(
                x=[pos[g.index][0] for g in shown], y=[pos[g.index][1] for g in shown],
                mode="markers+text", name="GPUs", showlegend=False,
                marker=dict(symbol="square", size=size, color="#76b900",
                            line=dict(color="#333", width=1)),
                text=[f"GPU{g.index}" for g in shown],
                textfont=dict(color="white", size=11 if size >= 38 else 9),
                hovertext=[_gpu_hover(g, peak.get(g.index)) for g in shown],
                hoverinfo="text",
            ))
        else:
            notes.append(dict(x=sum((b[0] + b[2]) / 2 for b in boxes.values()) / len(boxes),
                              y=_GPU_Y, text=_wrap(p.cuda_status, 60), showarrow=False,
                              font=dict(color="#b00", size=11)))
        bottom = min(min(b[1] for b in boxes.values()), lowest) - 0.3
        top = _BOX_H + 0.3
        fig.update_layout(
            shapes=shapes, annotations=notes, autosize=True,
            height=round(110 + _PX_PER_UNIT * (top - bottom)),
            title=dict(text=plotly_text(_title(p)), font=dict(size=14), x=0.01,
                       xanchor="left"),
            xaxis=dict(visible=False, range=[-0.4, max(b[2] for b in boxes.values()) + 0.4],
                       fixedrange=True),
            yaxis=dict(visible=False, range=[bottom, top], fixedrange=True),
            plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=10),
            legend=dict(title="links", orientation="h", x=0, y=-0.02, yanchor="top"),
            hoverlabel=dict(align="left"),
        )
        return fig

    def _cpu_words(self, node: int) -> str:
        """The CPU strip's text for a NUMA node's box."""
        info = next((n for n in self.profile.host.numa_nodes if n.id == node), None)
        if info is None:
            return "GPUs with unknown NUMA node"
        mem = ("" if info.memory_total_bytes is None
               else f" · {info.memory_total_bytes / 2**30:.0f} GiB")
        return f"CPUs {format_cpulist(info.cpus) or '-'}{mem}"

    def bandwidth_figure(self) -> Any:
        """Measured GB/s against copy size per kind, theoretical figures dashed."""
        go = require_plotly()
        fig = go.Figure()
        if self.bandwidth is None:
            return fig
        ok = self.bandwidth[self.bandwidth["status"] == "ok"]
        colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
        for k, (kind, group) in enumerate(ok.groupby("kind", sort=False)):
            color = colors[k % len(colors)]
            fig.add_trace(go.Scatter(
                x=group["size_bytes"], y=group["gbps"], mode="lines+markers", name=kind,
                line=dict(color=color), text=group["size"],
                hovertemplate="%{text}: %{y:.1f} GB/s<extra>" + kind + "</extra>",
            ))
            theo = group["theoretical_gbps"].dropna()
            if len(theo):
                fig.add_hline(y=float(theo.iloc[0]), line=dict(color=color, dash="dash",
                                                                width=1))
        fig.update_layout(
            title=plotly_text(f"Copy bandwidth — {self.bandwidth.attrs.get('device', '')}"),
            xaxis=dict(type="log", title="copy size (bytes)"),
            yaxis=dict(title="GB/s", rangemode="tozero"), height=380, autosize=True,
            margin=dict(l=50, r=10, t=50, b=40),
        )
        return fig

    def _peak_by_gpu(self) -> dict[int, dict[str, float]]:
        if self.bandwidth is None:
            return {}
        out: dict[int, dict[str, float]] = {}
        ok = self.bandwidth[(self.bandwidth["status"] == "ok") & self.bandwidth["peer"].isna()]
        for (dev, kind), group in ok.groupby(["device", "kind"]):
            out.setdefault(int(dev), {})[kind] = float(group["gbps"].max())
        return out

    # -- text and HTML --------------------------------------------------------
    def to_text(self) -> str:
        """Deterministic text: the profile, then the bandwidth summary when measured."""
        text = self.profile.to_text()
        if self.bandwidth is not None:
            text += "\n\nBandwidth (best per kind):\n" + frame_text(
                bandwidth_summary(self.bandwidth))
        return text

    def to_html(self) -> str:
        """Deterministic HTML: title, host summary, then the GPU table, link matrix, NUMA
        table and measured bandwidth side by side where they fit, each scrolling sideways
        rather than wrapping its cells."""
        return self._html(title=True)

    def _html(self, title: bool) -> str:
        p = self.profile
        parts = ["<div class='pyc-lab-topology'><div style='line-height:normal'>"]
        if title:
            parts.append(f"<h4>{escape(_title(p))}</h4>")
        # the GPU lines of the summary are the GPU table's rows: list the host only
        lines = [line.strip() for line in p.summary_lines()]
        if p.gpus:
            lines = [line for line in lines if not line.startswith("GPU")]
        parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>")
        tables = []
        if p.gpus:
            frame = p.to_frame()
            tables.append(frame_html(frame[[c for c in _GPU_COLUMNS if c in frame.columns]],
                                     "GPUs"))
        if len(p.gpus) > 1:
            tables.append(_matrix_html(p))
        tables.append(frame_html(p.numa_frame(), "NUMA nodes"))
        if self.bandwidth is not None:
            tables.append(frame_html(bandwidth_summary(self.bandwidth),
                                     "Measured bandwidth (best per kind)"))
        parts.append("<div style='display:flex;flex-wrap:wrap;gap:4px 32px;"
                     "align-items:flex-start;max-width:100%'>"
                     + "".join(f"<div style='flex:0 0 auto;max-width:100%'>{t}</div>"
                               for t in tables) + "</div>")
        parts.append("</div></div>")
        return "".join(parts)

    def widget(self) -> Any:
        """A live ipywidgets view: the picture, a bandwidth button, the measured bandwidth
        chart (once there is one) and the tables, stacked at the output's width."""
        import ipywidgets as w

        require_plotly()
        picture = figure_output(self.figure())
        boxes, _ = self._layout()
        units = max(b[2] for b in boxes.values()) + 0.8
        picture.layout.max_width = f"{max(560, round(_MAX_PX_PER_UNIT * units))}px"
        bw_chart = figure_output(self.bandwidth_figure() if self.bandwidth is not None
                                 else None)
        bw_chart.layout.display = None if self.bandwidth is not None else "none"
        tables = html_widget(self._html(title=False))
        button = w.Button(description="Measure bandwidth", icon="tachometer",
                          tooltip="Run pyc_lab.probe_bandwidth() (a few seconds)",
                          layout=w.Layout(width="auto", min_width="max-content",
                                          flex="0 0 auto"))
        status = w.HTML(layout=w.Layout(margin="0 0 0 12px"))

        def measure(_btn: Any) -> None:
            from ..profiling.bandwidth import probe_bandwidth

            button.disabled = True
            status.value = "measuring…"
            try:
                self.bandwidth = probe_bandwidth(profile=self.profile, **self.probe_kwargs)
                set_figure(bw_chart, self.bandwidth_figure())
                bw_chart.layout.display = None
                tables.value = self._html(title=False)
                status.value = escape(self.bandwidth.attrs.get("note") or "done")
            except Exception as exc:  # show, never kill the widget
                status.value = f"<span style='color:#b00'>{escape(exc)}</span>"
            finally:
                button.disabled = False

        button.on_click(measure)
        controls = w.HBox([button, status], layout=w.Layout(align_items="center",
                                                             flex_flow="row wrap"))
        return w.VBox([picture, controls, bw_chart, tables], layout=w.Layout(width="100%"))


def _title(p: HardwareProfile) -> str:
    gpus = f"{len(p.gpus)} GPU(s)" if p.gpus else "no GPU"
    return f"{p.host.cpu_model or 'unknown CPU'} · {len(p.host.numa_nodes)} NUMA node(s) · " \
           f"{gpus} · {p.origin}"


def _pcie(g: Any) -> str:
    if g.pcie_gen_max is None:
        return "unknown"
    return f"Gen{g.pcie_gen_max} x{g.pcie_width_max} = {g.pcie_bandwidth_gbps} GB/s per direction"


def _pcie_short(g: Any) -> str:
    """``"Gen5 x16 · 63 GB/s"``: a GPU's PCIe link in a few words."""
    if g.pcie_gen_max is None:
        return "PCIe ?"
    return f"Gen{g.pcie_gen_max} x{g.pcie_width_max} · {g.pcie_bandwidth_gbps:.0f} GB/s"


def _gpu_hover(g: Any, peak: dict[str, float] | None) -> str:
    mem = "?" if g.memory_total_bytes is None else f"{g.memory_total_bytes / 2**30:.0f} GiB"
    lines = [
        f"<b>{plotly_text(f'GPU{g.index}: {g.name}')}</b>",
        f"cc {g.compute_capability}, {g.sm_count} SMs, {mem}",
        f"PCIe {_pcie(g)}",
        f"NUMA {g.numa_node} (from {g.sources.get('numa_node', '?')})",
        f"CPU affinity {format_cpulist(g.cpu_affinity) if g.cpu_affinity else '?'}",
        f"MIG {g.mig_mode}, bus {g.pci_bus_id}",
    ]
    lines = [lines[0], *(plotly_text(line) for line in lines[1:])]
    for kind, gbps in sorted((peak or {}).items()):
        lines.append(plotly_text(f"{kind}: {gbps:.1f} GB/s measured"))
    return "<br>".join(lines)


def _arc(a: tuple[float, float], b: tuple[float, float]) -> tuple[list, list]:
    """A quadratic Bézier from a to b sagging below both ends, deeper the farther apart
    they are, so that links between GPUs of one row nest instead of covering each other."""
    (x0, y0), (x1, y1) = a, b
    depth = _ARC_DEPTH[0] + _ARC_DEPTH[1] * abs(x1 - x0)
    cx, cy = (x0 + x1) / 2, min(y0, y1) - 2 * depth  # the curve's lowest point: -depth
    xs, ys = [], []
    for k in range(17):
        t = k / 16
        xs.append(round((1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x1, 4))
        ys.append(round((1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y1, 4))
    return xs, ys


def _kind_order(kind: str) -> tuple[int, int]:
    if kind.startswith("NV"):
        return (0, -int(kind[2:] or 0) if kind[2:].isdigit() else 0)
    return (1, ["PIX", "PXB", "PHB", "NODE", "SYS"].index(kind)
            if kind in _KIND_COLORS else 9)


def _matrix_html(p: HardwareProfile) -> str:
    m = p.link_matrix()
    head = "".join(f"<th>{escape(c)}</th>" for c in m.columns)
    body = []
    for name, row in m.iterrows():
        cells = []
        for col, value in row.items():
            style = ""
            if str(col).startswith("GPU") and value != "X":
                style = f" style='color:{link_color(str(value))};font-weight:bold'"
            cells.append(f"<td{style}>{escape(value)}</td>")
        body.append(f"<tr><th>{escape(name)}</th>{''.join(cells)}</tr>")
    legend = ", ".join(f"{k}: {v}" for k, v in LINK_KINDS.items() if k != "X")
    return (f"<div class='pyc-lab-scroll' style='overflow-x:auto;max-width:100%'>"
            f"{TABLE_CSS}<table class='pyc-lab-table' style='white-space:nowrap'>"
            f"<caption>GPU links (nvidia-smi topo -m)</caption>"
            f"<tr><th></th>{head}</tr>{''.join(body)}</table></div>"
            f"<p style='font-size:smaller;max-width:60em'>{escape(legend)}</p>")


def _wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters, escaped for plotly."""
    words, lines, cur = text.split(), [], ""
    for word in words:
        if len(cur) + len(word) + 1 > width and cur:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    lines.append(cur)
    return "<br>".join(plotly_text(x) for x in lines)
