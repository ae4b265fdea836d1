"""Display helpers shared by every pyc_lab widget."""

from __future__ import annotations

import html
from typing import Any

__all__ = ["escape", "frame_html", "has_live_frontend", "require_plotly", "view_bundle"]


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
    """HTML-escape ``str(text)``."""
    return html.escape(str(text))


def frame_html(frame: Any, caption: str | None = None) -> str:
    """A pandas DataFrame as a compact deterministic HTML table with an optional caption."""
    table = frame.to_html(border=0, na_rep="–", classes="pyc-lab-table")
    if caption:
        table = table.replace(">", f"><caption>{escape(caption)}</caption>", 1)
    return table


def view_bundle(view: Any, live: bool, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    """The mime bundle of a pyc_lab view (anything with to_text, to_html and widget).

    Live: the ipywidgets view's bundle with the view's own deterministic ``text/plain``;
    otherwise static ``text/plain`` and ``text/html``.
    """
    if live:
        bundle = view.widget()._repr_mimebundle_(include=include, exclude=exclude)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = view.to_text()
        return data
    return {"text/plain": view.to_text(), "text/html": view.to_html()}


class View:
    """Base of pyc_lab's views: ``to_text``, ``to_html`` and ``widget`` give the reprs.

    In a live Jupyter front end the view shows as its ipywidgets form (with the
    deterministic ``text/plain``); elsewhere as static text and HTML.
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

        go = require_plotly()
        return w.VBox([go.FigureWidget(self.figure()), w.HTML(self.to_html())])
