"""The topology widget: a picture of the machine beside its tables.

NUMA nodes are drawn as boxes holding their CPUs and GPUs; GPU-to-GPU links are drawn
and coloured by kind (NVLink count, PCIe switch/host bridge, NUMA node, SYS); dotted
lines join each GPU to its node's CPUs with the PCIe link's theoretical bandwidth;
hovering shows the details. Measured bandwidths, when given, are shown beside.

In a Jupyter kernel with ipywidgets the view is live (plotly FigureWidget, a button that
measures bandwidth); elsewhere it is static HTML and text. Its ``text/plain`` and
``text/html`` reprs are deterministic: no addresses, ids or timings.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..hardware.cpulist import format_cpulist
from ..hardware.profile import LINK_KINDS, HardwareProfile
from ..profiling.bandwidth import bandwidth_summary
from .display import View, escape, frame_html, require_plotly

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
_BOX_W, _BOX_H = 10.0, 7.0


def link_color(kind: str | None) -> str:
    """The colour a link kind is drawn in (NVLink green, PCIe blue/orange, SYS red)."""
    if kind and kind.startswith("NV"):
        return _NV_COLOR
    return _KIND_COLORS.get(kind or "", _UNKNOWN_COLOR)


class TopologyWidget(View):
    """Show a :class:`~pyc_lab.runtime.HardwareProfile`, and optionally bandwidths.

    Parameters
    ----------
    profile
        The machine to show (``pyc_lab.detect_hardware()`` or a snapshot).
    bandwidth
        A frame from :func:`pyc_lab.runtime.probe_bandwidth`, shown beside the picture.
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
    def _layout(self) -> tuple[dict[int, tuple[float, float, float, float]],
                               dict[int, tuple[float, float]]]:
        """Boxes per NUMA node (x0, y0, x1, y1) and a position per GPU."""
        nodes = [n.id for n in self.profile.host.numa_nodes] or [0]
        unplaced = [g.index for g in self.profile.gpus if g.numa_node not in nodes]
        if unplaced:
            nodes = [*nodes, -1]  # a box for GPUs whose NUMA node nobody knew
        boxes = {}
        for k, node in enumerate(nodes):
            x0 = k * (_BOX_W + 2.0)
            boxes[node] = (x0, 0.0, x0 + _BOX_W, _BOX_H)
        positions = {}
        for node, (x0, y0, x1, _y1) in boxes.items():
            members = [g.index for g in self.profile.gpus
                       if (g.numa_node if g.numa_node in nodes else -1) == node]
            cols = max(1, math.ceil(math.sqrt(len(members)))) if members else 1
            rows = max(1, math.ceil(len(members) / cols))
            for m, gpu in enumerate(members):
                r, c = divmod(m, cols)
                x = x0 + (c + 0.5) * (x1 - x0) / cols
                y = y0 + 0.6 + (rows - r - 0.5) * (_BOX_H - 2.6) / rows
                positions[gpu] = (x, y)
        return boxes, positions

    # -- pictures -------------------------------------------------------------
    def figure(self) -> Any:
        """The topology picture as a plotly ``go.Figure``."""
        go = require_plotly()
        p = self.profile
        boxes, pos = self._layout()
        fig = go.Figure()
        shapes, notes = [], []
        for node, (x0, y0, x1, y1) in boxes.items():
            shapes.append(dict(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color="#555"),
                               fillcolor="rgba(200,200,200,0.12)", layer="below"))
            info = next((n for n in p.host.numa_nodes if n.id == node), None)
            title = "NUMA ?" if node == -1 else f"NUMA node {node}"
            if info is not None:
                mem = ("" if info.memory_total_bytes is None
                       else f" · {info.memory_total_bytes / 2**30:.0f} GiB")
                cpus = f"CPUs {format_cpulist(info.cpus) or '-'}{mem}"
            else:
                cpus = "GPUs with unknown NUMA node"
            notes.append(dict(x=(x0 + x1) / 2, y=y1 - 0.45, text=f"<b>{title}</b>",
                              showarrow=False))
            shapes.append(dict(type="rect", x0=x0 + 0.6, y0=y1 - 2.0, x1=x1 - 0.6, y1=y1 - 0.9,
                               line=dict(color="#888"), fillcolor="rgba(255,255,255,0.8)"))
            notes.append(dict(x=(x0 + x1) / 2, y=y1 - 1.45, text=escape(cpus), showarrow=False,
                              font=dict(size=11)))

        # GPU <-> CPU (PCIe) edges, dotted.
        for g in p.gpus:
            if g.index not in pos:
                continue
            node = g.numa_node if g.numa_node in boxes else -1
            x0, _y0, x1, y1 = boxes[node]
            gx, gy = pos[g.index]
            fig.add_trace(go.Scatter(
                x=[gx, gx], y=[gy + 0.35, y1 - 2.0], mode="lines",
                line=dict(color="#aaa", dash="dot", width=1.5), hoverinfo="text",
                text=[f"GPU{g.index} ↔ CPUs: PCIe {_pcie(g)}"] * 2, showlegend=False,
            ))
            if g.pcie_bandwidth_gbps:
                notes.append(dict(x=gx, y=(gy + 0.35 + y1 - 2.0) / 2, showarrow=False,
                                  text=f"Gen{g.pcie_gen_max} x{g.pcie_width_max}<br>"
                                       f"{g.pcie_bandwidth_gbps:.0f} GB/s",
                                  font=dict(size=9, color="#666"), bgcolor="white"))

        # GPU <-> GPU links, one trace per kind so that the legend explains colours.
        by_kind: dict[str, list] = {}
        for link in p.links:
            if link.a in pos and link.b in pos:
                by_kind.setdefault(link.kind or "?", []).append(link)
        for kind in sorted(by_kind, key=_kind_order):
            xs: list = []
            ys: list = []
            texts: list = []
            for link in by_kind[kind]:
                cx, cy = _curve(pos[link.a], pos[link.b], bend=0.12 + 0.04 * (link.a % 3))
                p2p = {True: "yes", False: "no", None: "?"}[link.p2p]
                label = (f"GPU{link.a} ↔ GPU{link.b}: {kind}"
                         + (f" ({link.nvlinks} NVLinks)" if link.nvlinks else "")
                         + f", P2P {p2p}")
                xs += [*cx, None]
                ys += [*cy, None]
                texts += [label] * len(cx) + [None]
            width = 3.0 if kind.startswith("NV") else 2.0
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines", name=f"{kind} ({len(by_kind[kind])})",
                line=dict(color=link_color(kind), width=width), hoverinfo="text", text=texts,
                opacity=0.75,
            ))

        if p.gpus:
            peak = self._peak_by_gpu()
            fig.add_trace(go.Scatter(
                x=[pos[g.index][0] for g in p.gpus if g.index in pos],
                y=[pos[g.index][1] for g in p.gpus if g.index in pos],
                mode="markers+text", name="GPUs",
                marker=dict(symbol="square", size=38, color="#76b900",
                            line=dict(color="#333", width=1)),
                text=[f"GPU{g.index}" for g in p.gpus if g.index in pos],
                textfont=dict(color="white", size=11),
                hovertext=[_gpu_hover(g, peak.get(g.index)) for g in p.gpus if g.index in pos],
                hoverinfo="text",
            ))
        else:
            notes.append(dict(x=sum((b[0] + b[2]) / 2 for b in boxes.values()) / len(boxes),
                              y=2.0, text=_wrap(p.cuda_status, 70), showarrow=False,
                              font=dict(color="#b00", size=11)))
        width = max(520, 330 * len(boxes))
        fig.update_layout(
            shapes=shapes, annotations=notes, width=width, height=460,
            title=dict(text=escape(_title(p)), font=dict(size=14)),
            xaxis=dict(visible=False, range=[-0.5, max(b[2] for b in boxes.values()) + 0.5]),
            yaxis=dict(visible=False, range=[-0.5, _BOX_H + 0.5], scaleanchor=None),
            plot_bgcolor="white", margin=dict(l=10, r=10, t=70, b=10),
            legend=dict(title="links", orientation="h", y=-0.02),
        )
        return fig

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
            title=f"Copy bandwidth — {escape(self.bandwidth.attrs.get('device', ''))}",
            xaxis=dict(type="log", title="copy size (bytes)"),
            yaxis=dict(title="GB/s"), height=380, margin=dict(l=50, r=10, t=50, b=40),
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
            text += "\n\nBandwidth (best per kind):\n" + bandwidth_summary(
                self.bandwidth).to_string(index=False)
        return text

    def to_html(self) -> str:
        """Deterministic HTML: summary, GPU table, link matrix, NUMA table, bandwidth."""
        p = self.profile
        parts = [f"<div class='pyc-lab-topology'><h4>{escape(_title(p))}</h4><ul>"]
        parts += [f"<li>{escape(line.strip())}</li>" for line in p.summary_lines()]
        parts.append("</ul>")
        if p.gpus:
            parts.append(frame_html(p.to_frame(), "GPUs"))
        if len(p.gpus) > 1:
            parts.append(_matrix_html(p))
        parts.append(frame_html(p.numa_frame(), "NUMA nodes"))
        if self.bandwidth is not None:
            parts.append(frame_html(bandwidth_summary(self.bandwidth),
                                    "Measured bandwidth (best per kind)"))
        parts.append("</div>")
        return "".join(parts)

    def widget(self) -> Any:
        """A live ipywidgets view: interactive picture, tables, and a bandwidth button."""
        import ipywidgets as w

        go = require_plotly()
        picture = go.FigureWidget(self.figure())
        tables = w.HTML(self.to_html())
        bw_fig = go.FigureWidget(self.bandwidth_figure())
        bw_box = w.Box([bw_fig], layout=w.Layout(
            display="flex" if self.bandwidth is not None else "none"))
        button = w.Button(description="Measure bandwidth", icon="tachometer",
                          tooltip="Run pyc_lab.runtime.probe_bandwidth() (a few seconds)")
        status = w.HTML()

        def measure(_btn: Any) -> None:
            from ..profiling.bandwidth import probe_bandwidth

            button.disabled = True
            status.value = "measuring…"
            try:
                self.bandwidth = probe_bandwidth(profile=self.profile, **self.probe_kwargs)
                fresh = self.bandwidth_figure()
                with bw_fig.batch_update():
                    bw_fig.data = ()
                    for trace in fresh.data:
                        bw_fig.add_trace(trace)
                    bw_fig.layout = fresh.layout
                bw_box.layout.display = "flex"
                tables.value = self.to_html()
                status.value = escape(self.bandwidth.attrs.get("note") or "done")
            except Exception as exc:  # show, never kill the widget
                status.value = f"<span style='color:#b00'>{escape(exc)}</span>"
            finally:
                button.disabled = False

        button.on_click(measure)
        return w.VBox([w.HBox([picture, tables]), w.HBox([button, status]), bw_box])


def _title(p: HardwareProfile) -> str:
    gpus = f"{len(p.gpus)} GPU(s)" if p.gpus else "no GPU"
    return f"{p.host.cpu_model or 'unknown CPU'} · {len(p.host.numa_nodes)} NUMA node(s) · " \
           f"{gpus} · {p.origin}"


def _pcie(g: Any) -> str:
    if g.pcie_gen_max is None:
        return "unknown"
    return f"Gen{g.pcie_gen_max} x{g.pcie_width_max} = {g.pcie_bandwidth_gbps} GB/s per direction"


def _gpu_hover(g: Any, peak: dict[str, float] | None) -> str:
    mem = "?" if g.memory_total_bytes is None else f"{g.memory_total_bytes / 2**30:.0f} GiB"
    lines = [
        f"<b>GPU{g.index}: {escape(g.name)}</b>",
        f"cc {g.compute_capability}, {g.sm_count} SMs, {mem}",
        f"PCIe {_pcie(g)}",
        f"NUMA {g.numa_node} (from {g.sources.get('numa_node', '?')})",
        f"CPU affinity {format_cpulist(g.cpu_affinity) if g.cpu_affinity else '?'}",
        f"MIG {g.mig_mode}, bus {g.pci_bus_id}",
    ]
    for kind, gbps in sorted((peak or {}).items()):
        lines.append(f"{kind}: {gbps:.1f} GB/s measured")
    return "<br>".join(lines)


def _curve(a: tuple[float, float], b: tuple[float, float], bend: float) -> tuple[list, list]:
    """A quadratic Bézier from a to b bowed sideways, so collinear links stay apart."""
    (x0, y0), (x1, y1) = a, b
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    dx, dy = x1 - x0, y1 - y0
    cx, cy = mx - dy * bend, my + dx * bend
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
    return (f"<table class='pyc-lab-table'><caption>GPU links (nvidia-smi topo -m)</caption>"
            f"<tr><th></th>{head}</tr>{''.join(body)}</table>"
            f"<p style='font-size:smaller'>{escape(legend)}</p>")


def _wrap(text: str, width: int) -> str:
    words, lines, cur = text.split(), [], ""
    for word in words:
        if len(cur) + len(word) + 1 > width and cur:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    lines.append(cur)
    return "<br>".join(escape(x) for x in lines)

