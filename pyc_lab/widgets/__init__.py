"""Widgets: notebook views on top of the library (the library never imports these).

Each widget is live (ipywidgets + plotly) in a Jupyter kernel and falls back to static
HTML and text elsewhere; its ``text/plain`` and ``text/html`` reprs are deterministic.
"""

from .autotune import AutotuneWidget, KernelComparison
from .belt_sweep import SweepChart
from .inference import LoadTestChart, ServerMonitor, ServersView
from .many_tuning import ManyTuningChart
from .sweep_progress import SweepProgress
from .timeline import TimelineWidget, compare
from .topology import TopologyWidget

__all__ = ["AutotuneWidget", "KernelComparison", "LoadTestChart", "ManyTuningChart",
           "ServerMonitor", "ServersView", "SweepChart", "SweepProgress", "TimelineWidget",
           "TopologyWidget", "compare"]
