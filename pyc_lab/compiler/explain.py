"""What the compiler did, for one input signature: ``CompiledFunction.explain(...)``."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from ..units import format_bytes
from .ir import Graph
from .ops import FUSED_OPS, REGISTRY
from .policy import REASONS

__all__ = ["Explanation", "graph_svg"]

_PALETTE = ["#8dd3c7", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
            "#bc80bd", "#ccebc5", "#ffed6f"]
_KIND_FILL = {"source": "#eeeeee", "matmul": "#f4a582", "norm": "#92c5de",
              "reduction": "#92c5de", "shape": "#ffffff", "eager": "#ff6b6b"}


@dataclass
class Explanation:
    """IR before and after, kernels, decisions, graph breaks, memory plan, pass log."""

    name: str
    backend: str
    mode: str
    ir_before: str
    ir_after: str
    kernels: list[dict[str, Any]]
    decisions: Any
    graph_breaks: list[dict[str, Any]]
    peak_bytes: int
    naive_bytes: int
    pass_log: Any
    memory: Any
    notes: list[str] = field(default_factory=list)
    compile_ms: float = 0.0
    graph: Graph | None = None
    #: what the trace assumed about globals and closure variables (re-checked per call)
    guards: list[str] = field(default_factory=list)
    #: why the function runs as written instead of compiled, or None
    dynamic: str | None = None
    #: whether calls replay CUDA graphs and why (cupy backend), or None
    cuda_graph: str | None = None

    @classmethod
    def from_artifact(cls, name: str, art: Any, mode: str) -> Explanation:
        """Build from a compiled :class:`~pyc_lab.compiler.artifact.Artifact`."""
        import pandas as pd

        decisions = pd.DataFrame(
            [{"node": f"%{_num(art.graph)[d.node]}", "op": d.op, "choice": d.choice,
              "reason": d.reason, "detail": d.detail or REASONS.get(d.reason, "")}
             for d in art.decisions if d.choice != "source"],
            columns=["node", "op", "choice", "reason", "detail"],
        )
        log = pd.DataFrame([{"pass": r.name, "changed": r.changed,
                             "nodes_before": r.nodes_before, "nodes_after": r.nodes_after,
                             "ms": round(r.ms, 3), "notes": "; ".join(r.notes)}
                            for r in art.pass_log])
        breaks = [{"node": f"%{_num(art.graph).get(b['node'], '?')}", "op": b["op"],
                   "reason": b["reason"], **({"dynamic": b["dynamic"]} if "dynamic" in b
                                              else {})} for b in art.breaks]
        num = _num(art.graph)
        memory = art.plan.to_frame()
        if "node" in memory:
            memory["node"] = [f"%{num[i]}" if i in num else f"#{i}" for i in memory["node"]]
        return cls(
            name=name, backend=art.backend, mode=mode,
            ir_before=art.graph_before.text(), ir_after=art.graph.text(),
            kernels=list(art.kernels), decisions=decisions, graph_breaks=breaks,
            peak_bytes=int(art.plan.peak_bytes), naive_bytes=int(art.plan.naive_bytes),
            pass_log=log, memory=memory, notes=list(art.notes),
            compile_ms=art.compile_ms, graph=art.graph,
            guards=art.guards.describe(), dynamic=art.dynamic,
            cuda_graph=_graph_line(art.runner),
        )

    # -- text -------------------------------------------------------------------------
    def summary(self) -> str:
        """A few deterministic lines: sizes, kernels, memory, breaks."""
        n_before = self.ir_before.count("\n  %")
        n_after = self.ir_after.count("\n  %")
        lines = [
            f"{self.name}: {self.backend} backend, mode {self.mode}",
            f"IR: {n_before} nodes before the passes, {n_after} after",
            f"kernels: {len(self.kernels)}"
            + "".join(f"\n  {k['name']}: {', '.join(k['ops'])} [{k.get('implementation', '')}]"
                      for k in self.kernels),
            f"memory: peak {format_bytes(self.peak_bytes)} vs naive "
            f"{format_bytes(self.naive_bytes)} of intermediates",
            f"graph breaks: {len(self.graph_breaks)}"
            + "".join(f"\n  {b['node']} {b['op']}: {b['reason']}"
                      + (f" ({b['dynamic']})" if "dynamic" in b else "")
                      for b in self.graph_breaks),
        ]
        shown = [g for g in self.guards if " is the module " not in g]
        if shown:  # what the trace assumed about globals (modules left out)
            lines.append(f"guards: {len(shown)}" + "".join(f"\n  {g}" for g in shown))
        if self.dynamic:
            lines.append(f"not compiled: {self.dynamic}")
        if self.cuda_graph:
            lines.append(f"CUDA graphs: {self.cuda_graph}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        parts = [f"<div class='pyc-lab-explain'><pre>{html.escape(self.summary())}</pre>"]
        if self.graph is not None:
            parts.append(graph_svg(self.graph))
        parts.append("<details><summary>IR before / after</summary><table><tr>"
                     f"<td style='vertical-align:top'><pre>{html.escape(self.ir_before)}</pre>"
                     f"</td><td style='vertical-align:top'><pre>{html.escape(self.ir_after)}"
                     "</pre></td></tr></table></details>")
        parts.append("<details><summary>decisions</summary>"
                     + self.decisions.to_html(index=False) + "</details>")
        parts.append("<details><summary>pass log</summary>"
                     + self.pass_log.drop(columns="ms").to_html(index=False) + "</details>")
        parts.append("</div>")
        return "".join(parts)


def _graph_line(runner: Any) -> str | None:
    """What an executable does about CUDA graphs, in words (None: not a CuPy one)."""
    mode = getattr(runner, "graph_mode", None)
    if mode is None:
        return None
    if mode == "auto":
        verdict = "yes" if runner.cuda_graph else "no"
        line = f"{verdict} (auto): {runner.graph_decision}"
    else:
        line = "yes (cuda_graph=True)" if mode else "no (cuda_graph=False)"
    if runner.graph_capture_error:
        line += f"; the capture failed, so calls run step by step: {runner.graph_capture_error}"
    return line


def _num(graph: Graph) -> dict[int, int]:
    return {nid: k for k, nid in enumerate(graph.nodes)}


def graph_svg(graph: Graph, *, width: int = 760) -> str:
    """The graph as an inline SVG, one row per depth, fused groups coloured.

    Deterministic: the same graph gives the same SVG text.
    """
    num = _num(graph)
    depth: dict[int, int] = {}
    for n in graph:
        depth[n.id] = 1 + max((depth[i] for i in n.inputs), default=-1)
    rows: dict[int, list[int]] = {}
    for nid, d in depth.items():
        rows.setdefault(d, []).append(nid)
    box_w, box_h, gap_y = 150, 34, 26
    height = (max(rows) + 1) * (box_h + gap_y) + 10 if rows else 40
    pos: dict[int, tuple[float, float]] = {}
    for d, ids in rows.items():
        step = width / (len(ids) + 1)
        for k, nid in enumerate(ids):
            pos[nid] = (step * (k + 1), 8 + d * (box_h + gap_y))
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           "font-family='monospace' font-size='11'>"]
    for n in graph:
        x1, y1 = pos[n.id]
        for i in n.inputs:
            x0, y0 = pos[i]
            out.append(f"<line x1='{x0:.1f}' y1='{y0 + box_h:.1f}' x2='{x1:.1f}' y2='{y1:.1f}' "
                       "stroke='#999'/>")
    fused_k = 0
    for n in graph:
        x, y = pos[n.id]
        kind = REGISTRY[n.op].kind
        if n.op in FUSED_OPS:
            fill = _PALETTE[fused_k % len(_PALETTE)]
            fused_k += 1
            label = n.attrs.get("name", "fused")
            sub = "+".join(n.attrs.get("ops", ()))
        else:
            fill = _KIND_FILL.get(kind, "#d9d9d9")
            label = n.name if n.op == "input" and n.name else n.op
            sub = n.type_text
        if len(sub) > 22:
            sub = sub[:21] + "…"
        out.append(
            f"<g><title>%{num[n.id]} = {html.escape(n.op)} : {n.type_text}</title>"
            f"<rect x='{x - box_w / 2:.1f}' y='{y:.1f}' width='{box_w}' height='{box_h}' "
            f"rx='5' fill='{fill}' stroke='#555'/>"
            f"<text x='{x:.1f}' y='{y + 14:.1f}' text-anchor='middle'>%{num[n.id]} "
            f"{html.escape(str(label))}</text>"
            f"<text x='{x:.1f}' y='{y + 27:.1f}' text-anchor='middle' fill='#444'>"
            f"{html.escape(sub)}</text></g>"
        )
    out.append("</svg>")
    return "".join(out)
