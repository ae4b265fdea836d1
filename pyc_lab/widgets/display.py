"""Display helpers shared by every pyc_lab widget.

Escaping: :func:`escape` is for HTML, :func:`plotly_text` for the text plotly draws
(titles, annotations, hovers), which has its own small markup.

Numbers: :func:`format_number` writes a number for people (a few significant digits,
no six-decimal floats), :func:`column_label` turns a column name such as ``median_ms``
into ``median (ms)``, and :func:`frame_html` / :func:`frame_text` apply both to a table.

Figures: a live view shows its static plotly figures through :func:`figure_output`, an
``ipywidgets.Output`` holding the figure as plotly's mime bundle, drawn by the plotly
renderer that JupyterLab loads once. A plotly ``FigureWidget`` instead carries plotly's
whole JavaScript bundle (about 5 MB) in every model, which a front end reconnecting to a
live kernel must fetch and evaluate for each figure at once; anywidget gives each model
two seconds, and a notebook with several of them fails with "Failed to initialize
model". FigureWidgets are kept for charts that Python updates while they are shown.
"""

from __future__ import annotations

import html
import math
import numbers
from typing import Any

__all__ = ["TABLE_CSS", "column_label", "escape", "figure_bundle", "figure_output", "format_number",
           "frame_html", "frame_text", "has_live_frontend", "html_widget", "plotly_text",
           "require_plotly", "set_figure", "view_bundle"]

#: Column-name endings that carry a unit, and how the unit is written.
_UNIT_SUFFIXES = (("_ms", "ms"), ("_s", "s"), ("_gbps", "GB/s"), ("_gib", "GiB"),
                  ("_mhz", "MHz"), ("_pct", "%"), ("_bytes", "bytes"))
#: Column names that read better written out.
_COLUMN_WORDS = {"tflops": "TFLOP/s", "pct_of_peak": "% of peak",
                 "pct_of_theoretical": "% of theoretical", "vs_cublas": "vs cuBLAS",
                 "cpus": "CPUs", "n_cpus": "# CPUs", "gpus": "GPUs", "sms": "SMs",
                 "mem_bw_gbps": "memory bw (GB/s)", "sm_clock_max_mhz": "max SM clock (MHz)",
                 "pcie_gbps": "PCIe (GB/s)", "pcie_max": "PCIe max", "pcie": "PCIe now",
                 "numa_node": "NUMA node", "numa_source": "NUMA from",
                 "cpu_affinity": "CPU affinity", "mig": "MIG", "pci_bus_id": "PCI bus id",
                 "uuid": "UUID"}
_TABLE_STYLE = "white-space:nowrap"
_SCROLL_STYLE = "overflow-x:auto;max-width:100%;margin:0 0 10px 0"
#: Cell spacing for pyc_lab tables inside widgets, where JupyterLab's own table style
#: (which rendered HTML outputs get) does not reach.
TABLE_CSS = ("<style>.pyc-lab-table td, .pyc-lab-table th {padding: 2px 8px; "
             "text-align: right} .pyc-lab-table caption {text-align: left; "
             "font-weight: bold; padding: 2px 8px}</style>")


def has_live_frontend() -> bool:
    """Whether we run in a Jupyter kernel that can show ipywidgets and plotly FigureWidgets.

    A plain terminal IPython, a script, or a kernel without ipywidgets/anywidget gets
    the static HTML/text view instead.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None or "IPKernelApp" not in getattr(ip, "config", {}):
        return False
    try:
        import anywidget  # noqa: F401  (plotly's FigureWidget is an anywidget)
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def require_plotly() -> Any:
    """Import plotly.graph_objects or raise a PycLabError saying how to install it."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        from ..errors import PycLabError

        raise PycLabError(
            "this view draws with plotly, which is not installed: pip install 'pyc-lab[lab]'"
        ) from None
    return go


def escape(text: Any) -> str:
    """HTML-escape ``str(text)`` (quotes included), for HTML tables and widgets."""
    return html.escape(str(text))


def plotly_text(text: Any) -> str:
    """Escape ``str(text)`` once for plotly's text markup (titles, annotations, hovers).

    Plotly reads ``<br>``, ``<b>`` and a few entities (``&amp;``, ``&lt;``, ``&gt;``)
    in the strings it draws but not ``&quot;`` or ``&#x27;``, which it would show
    literally; so only ``&``, ``<`` and ``>`` are escaped and quotes stay as they are.
    """
    return html.escape(str(text), quote=False)


def format_number(value: Any, digits: int = 4) -> str:
    """A number as people read it: ``digits`` significant digits, no trailing zeros.

    Whole numbers stay whole (``4096``), floats keep ``digits`` significant digits
    (``0.1841``, ``746.4``, ``63.02``), floats of ``10**digits`` or more are rounded to a
    whole number with thousands separators (``12,346``), missing values (``None``, NaN)
    become ``"–"``; anything else is ``str(value)``.
    """
    if value is None or isinstance(value, bool):
        return "–" if value is None else str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        x = float(value)
        if math.isnan(x):
            return "–"
        if math.isinf(x):
            return "∞" if x > 0 else "-∞"
        if x == 0:
            return "0"
        if abs(x) >= 10 ** digits:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"  # no exponent between 1e-4 and 10**digits
    return str(value)


def column_label(name: Any) -> str:
    """A column name for people: ``median_ms`` -> ``median (ms)``, ``tflops`` -> ``TFLOP/s``.

    Names that are not snake_case identifiers (already words) are left alone.
    """
    text = str(name)
    if text in _COLUMN_WORDS:
        return _COLUMN_WORDS[text]
    if " " in text or not text.replace("_", "").isalnum():
        return text
    for suffix, unit in _UNIT_SUFFIXES:
        if text.endswith(suffix) and len(text) > len(suffix):
            return f"{text[:-len(suffix)].replace('_', ' ')} ({unit})"
    return text.replace("_", " ")


def _readable(frame: Any, labels: bool) -> tuple[Any, bool]:
    """The frame with numbers formatted as strings and (optionally) columns relabelled,
    and whether its index is worth showing (not a plain unnamed 0..n-1 range)."""
    import pandas as pd

    shown = frame.copy()
    for col in shown.columns:
        shown[col] = [format_number(v) if _is_number(v) else ("–" if v is None else v)
                      for v in shown[col].tolist()]
    if labels:
        shown.columns = [column_label(c) for c in shown.columns]
        if shown.index.name is not None:
            shown.index.name = column_label(shown.index.name)
    plain = (isinstance(frame.index, pd.RangeIndex) and frame.index.name is None
             and frame.index.start == 0 and frame.index.step == 1)
    return shown, not plain


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def frame_html(frame: Any, caption: str | None = None, *, labels: bool = True) -> str:
    """A pandas DataFrame as a deterministic HTML table for people.

    Numbers are written by :func:`format_number`, columns named by :func:`column_label`
    (``labels=False`` keeps the names), a plain 0..n-1 index is left out, cells do not
    wrap, and the table scrolls sideways inside its own box when it is wider than the
    output instead of being squeezed or clipped.
    """
    shown, index = _readable(frame, labels)
    table = shown.to_html(border=0, na_rep="–", classes="pyc-lab-table", index=index)
    table = table.replace("<table ", f"<table style='{_TABLE_STYLE}' ", 1)
    if caption:
        table = table.replace(">", f"><caption>{escape(caption)}</caption>", 1)
    return f"<div class='pyc-lab-scroll' style='{_SCROLL_STYLE}'>{TABLE_CSS}{table}</div>"


def frame_text(frame: Any, *, labels: bool = True) -> str:
    """The text version of :func:`frame_html`: the same numbers and column names."""
    shown, index = _readable(frame, labels)
    return shown.to_string(index=index, na_rep="–")


def view_bundle(view: Any, live: bool, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    """The mime bundle of a pyc_lab view (anything with to_text, to_html and widget).

    Live: the ipywidgets view's bundle with the view's own deterministic ``text/plain``
    and ``text/html``; a front end that cannot show the widget (a notebook reopened
    without its kernel, an untrusted notebook, nbviewer) shows the HTML tables instead.
    Otherwise: static ``text/plain`` and ``text/html``.
    """
    if live:
        bundle = view.widget()._repr_mimebundle_(include=include, exclude=exclude)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = view.to_text()
        data["text/html"] = view.to_html()
        return data
    return {"text/plain": view.to_text(), "text/html": view.to_html()}


def figure_bundle(fig: Any) -> dict[str, Any]:
    """A plotly figure as plotly's mime bundle (``application/vnd.plotly.v1+json``)."""
    import json

    import plotly.io as pio

    spec = json.loads(pio.to_json(fig, validate=False))
    spec["config"] = {"displaylogo": False}
    return {"application/vnd.plotly.v1+json": spec, "text/plain": "plotly figure"}


def set_figure(out: Any, fig: Any | None) -> None:
    """Show ``fig`` in the ``ipywidgets.Output`` ``out`` (nothing for ``None``), replacing
    what it showed."""
    if fig is None:
        out.outputs = ()
        return
    out.outputs = ({"output_type": "display_data", "data": figure_bundle(fig),
                    "metadata": {}},)


def figure_output(fig: Any | None) -> Any:
    """An ``ipywidgets.Output`` showing a plotly figure at the width of the output.

    The figure travels as data (its JSON) and is drawn by the front end's plotly
    renderer, so a notebook reopened on a live kernel restores it as fast as any
    widget; see the module's docstring for why this is not a ``FigureWidget``.
    """
    import ipywidgets as w

    out = w.Output(layout=w.Layout(width="100%", min_width="0"))
    set_figure(out, fig)
    return out


def html_widget(value: str = "") -> Any:
    """An ``ipywidgets.HTML`` for a view's tables, laid out as a block at the output's width.

    The HTML widget lays its content out as a flex item that never shrinks below its
    widest table, so a wide table would push past the output's right edge and be cut
    off; as a block, the content takes the output's width and each table scrolls
    sideways inside its own box (see :func:`frame_html`).
    """
    import ipywidgets as w

    return w.HTML(value, layout=w.Layout(width="100%", display="block"))


class View:
    """Base of pyc_lab's views: ``to_text``, ``to_html`` and ``widget`` give the reprs.

    In a live Jupyter front end the view shows as its ipywidgets form (with the
    deterministic ``text/plain`` and ``text/html`` beside it); elsewhere as static text
    and HTML.
    """

    def to_text(self) -> str:  # pragma: no cover - every view defines it
        raise NotImplementedError

    def to_html(self) -> str:  # pragma: no cover - every view defines it
        raise NotImplementedError

    def widget(self) -> Any:  # pragma: no cover - every view defines it
        raise NotImplementedError

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return view_bundle(self, has_live_frontend(), include, exclude)

    def __repr__(self) -> str:
        return self.to_text()


class ChartView(View):
    """A view whose live form is its plotly figure above its HTML tables."""

    def figure(self) -> Any:  # pragma: no cover - every chart view defines it
        raise NotImplementedError

    def widget(self) -> Any:
        """A live ipywidgets view: the interactive chart above the tables."""
        import ipywidgets as w

        require_plotly()
        return w.VBox([figure_output(self.figure()), html_widget(self.to_html())],
                      layout=w.Layout(width="100%"))
