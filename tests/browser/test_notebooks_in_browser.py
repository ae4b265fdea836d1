"""Every tutorial notebook, run in JupyterLab in a real (headless) browser.

nbval checks what the kernel returns; this checks what a user sees. For each notebook
in ``notebooks/``: open it in JupyterLab, Run All, wait for the kernel to go idle and
every cell to finish, then check that

- every code cell ran, in order, and none shows an error or anything on stderr;
- no widget failed to display ("Error displaying widget") and the browser console has
  no errors (``console.error`` messages and uncaught page errors);
- each widget's DOM is there (ipywidgets views, plotly plots drawn at a real size with
  their data), as listed in ``EXPECTED`` below;
- buttons respond: notebook 01's topology widget measures bandwidth when its button is
  clicked, notebook 03's replayed tuner advances on Start and halts on Stop.

A screenshot of each notebook (and one of each widget checked) goes to the artifacts
folder (``browser-artifacts/``), with the browser console's messages and the server log.
The notebooks on disk are never changed (autosave is off; see ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NOTEBOOKS = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "notebooks")
                   .glob("*.ipynb"))

OPEN_TIMEOUT_MS = 180_000  # JupyterLab's first load on two busy cores
RUN_TIMEOUT_MS = 420_000  # Run All of one notebook
RENDER_TIMEOUT_MS = 60_000  # a widget or plot appearing after its cell ran
MEASURE_TIMEOUT_MS = 300_000  # the bandwidth probe behind the button (1 GiB copies)

#: Browser console errors that are expected and harmless. Each entry is a regular
#: expression matched against the whole message, with the reason it is harmless. None
#: is needed with JupyterLab 4.6 and the notebooks as they are; add one only for a
#: message from JupyterLab itself, never for one that a pyc_lab widget causes.
BENIGN_CONSOLE_ERRORS: list[tuple[str, str]] = []


@dataclass(frozen=True)
class Expected:
    """What one cell's output must show in the browser.

    Parameters
    ----------
    name
        Short name, used for the screenshot file.
    marker
        Text found in the source of exactly one code cell: the cell checked.
    selectors
        CSS selectors that must each match (at least once) inside the cell's output.
    texts
        Regular expressions that the output's visible text must each match.
    plots
        Visible plotly plots (``.js-plotly-plot``) the output must hold, each drawn at a
        real size.
    data_plots
        How many of those must draw at least one trace (a plot of a machine without a
        GPU can be all annotation).
    """

    name: str
    marker: str
    selectors: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    plots: int = 0
    data_plots: int = 0


_WIDGET = ".jupyter-widgets.widget-vbox"  # the views' outer ipywidgets VBox

EXPECTED: dict[str, list[Expected]] = {
    "01_hardware.ipynb": [
        Expected("topology-dgx-h100", "TopologyWidget(dgx)",
                 selectors=(_WIDGET, ".pyc-lab-topology", "button:has-text('Measure bandwidth')"),
                 texts=(r"NUMA node", r"GPU links"), plots=1, data_plots=1),
        Expected("topology-this-machine", "%pyc_hw",
                 selectors=(_WIDGET, ".pyc-lab-topology", "button:has-text('Measure bandwidth')"),
                 texts=(r"NUMA node",), plots=1),
        Expected("bandwidth-figure", "TopologyWidget(hw, bw).bandwidth_figure()",
                 plots=1, data_plots=1),
    ],
    "02_compiler.ipynb": [
        Expected("pyc-compile-decisions", "%%pyc_compile --show decisions",
                 selectors=("table",)),
    ],
    "03_autotune_gemm.ipynb": [
        Expected("autotune-widget", "tuner = AutotuneWidget(",
                 selectors=(_WIDGET, ".widget-hprogress .progress-bar", ".widget-dropdown",
                            "button:has-text('Start')", "button:has-text('Stop')",
                            ".pyc-lab-autotune table"),
                 texts=(r"done: \d+ of \d+ candidates", r"Replayed from a recording"),
                 plots=1, data_plots=1),
        Expected("kernel-comparison", "KernelComparison.from_recording()",
                 selectors=(_WIDGET, ".pyc-lab-kernel-comparison table"),
                 texts=(r"Kernel comparison",), plots=1, data_plots=1),
        Expected("pyc-tune-widget", "%pyc_tune gemm",
                 selectors=(_WIDGET, ".widget-hprogress .progress-bar", "button:has-text('Start')",
                            ".pyc-lab-autotune table"),
                 texts=(r"done: \d+ of \d+ candidates",), plots=1, data_plots=1),
    ],
    "04_pipeline.ipynb": [
        Expected("timeline-compare", "compare(slow.trace, belt.trace", plots=1, data_plots=1),
        Expected("timeline-widget", "TimelineWidget(belt.trace)",
                 selectors=(_WIDGET, ".pyc-lab-timeline"), plots=1, data_plots=1),
        Expected("pyc-timeline", "%pyc_timeline",
                 selectors=(_WIDGET, ".pyc-lab-timeline"), plots=1, data_plots=1),
        Expected("sweep-chart", "SweepChart(sweep)",
                 selectors=(_WIDGET, ".pyc-lab-sweep"), plots=1, data_plots=1),
    ],
}


# --------------------------------------------------------------------------- helpers


class Console:
    """Collects the page's console messages and uncaught errors."""

    def __init__(self, page: Any) -> None:
        self.lines: list[str] = []
        self.errors: list[str] = []
        page.on("console", self._message)
        page.on("pageerror", self._page_error)

    def _message(self, msg: Any) -> None:
        where = msg.location.get("url") or ""
        self.lines.append(f"[{msg.type}] {msg.text}  ({where})")
        if msg.type == "error" and not _benign(msg.text):
            self.errors.append(f"console.error: {msg.text}  ({where})")

    def _page_error(self, error: Any) -> None:
        self.lines.append(f"[pageerror] {error}")
        self.errors.append(f"uncaught: {error}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _benign(text: str) -> bool:
    return any(re.fullmatch(pattern, text, re.S) for pattern, _why in BENIGN_CONSOLE_ERRORS)


def wait_until(check: Callable[[], Any], timeout_ms: int, what: str,
               interval_s: float = 0.25, detail: Callable[[], str] | None = None) -> Any:
    """Poll ``check()`` until it returns something truthy; fail saying ``what`` (and
    ``detail()``, what was seen last)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = f"\n{detail()}" if detail is not None else ""
            pytest.fail(f"timed out after {timeout_ms / 1000:.0f} s waiting for {what}{seen}")
        time.sleep(interval_s)


_PANEL = "window.jupyterapp.shell.currentWidget"

_READY_JS = f"""(path) => {{
  const app = window.jupyterapp;
  const panel = app && {_PANEL};
  if (!panel || !panel.context || panel.context.path !== path || !panel.context.isReady)
    return false;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}}"""

_RUN_ALL_JS = """() => {
  window.__pycRunAll = {done: false};
  window.jupyterapp.commands.execute('notebook:run-all-cells').then(
    (ok) => { window.__pycRunAll = {done: true, ok: ok}; },
    (err) => { window.__pycRunAll = {done: true, ok: false, error: String(err)}; });
}"""

_FINISHED_JS = f"""() => {{
  const run = window.__pycRunAll;
  if (!run || !run.done) return false;
  const panel = {_PANEL};
  const kernel = panel.sessionContext.session.kernel;
  if (kernel.status !== 'idle') return false;
  return panel.content.widgets.every(
    (cell) => cell.model.type !== 'code' || !cell.promptNode.textContent.includes('*'));
}}"""

_CELLS_JS = f"""() => {{
  const panel = {_PANEL};
  return panel.content.widgets.map((cell, index) => {{
    const model = cell.model;
    const code = model.type === 'code';
    const outputs = [];
    if (code) {{
      for (let j = 0; j < model.outputs.length; j++) {{
        const out = model.outputs.get(j);
        const json = out.toJSON();
        outputs.push({{type: out.type, mimes: Object.keys(json.data || {{}}),
                      ename: json.ename || null, evalue: json.evalue || null}});
      }}
    }}
    return {{index, type: model.type, source: model.sharedModel.getSource(),
             count: code ? (model.executionCount ?? null) : null,
             prompt: code ? cell.promptNode.textContent : null, outputs}};
  }});
}}"""

_EXECUTE_JS = f"""async (code) => {{
  const kernel = {_PANEL}.sessionContext.session.kernel;
  const reply = await kernel.requestExecute({{code, silent: true, store_history: false}}).done;
  return reply.content.status === 'ok' ? 'ok' : reply.content.ename + ': ' + reply.content.evalue;
}}"""


def open_notebook(page: Any, lab: Any, path: str) -> None:
    """Open ``path`` in a fresh JupyterLab workspace and wait for an idle kernel."""
    page.goto(lab.lab_url(path), timeout=OPEN_TIMEOUT_MS)
    page.wait_for_function(_READY_JS, arg=path, timeout=OPEN_TIMEOUT_MS, polling=250)


def run_all(page: Any) -> None:
    """Run All, then wait until it returned, the kernel is idle and no cell is pending."""
    page.evaluate(_RUN_ALL_JS)
    page.wait_for_function(_FINISHED_JS, timeout=RUN_TIMEOUT_MS, polling=500)


def cells(page: Any) -> list[dict[str, Any]]:
    """Every cell as the notebook model holds it: type, source, count, prompt, outputs."""
    return page.evaluate(_CELLS_JS)


def cell_locator(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def find_cell(page: Any, marker: str) -> int:
    """The index of the one code cell whose source contains ``marker``."""
    found = [c["index"] for c in cells(page) if c["type"] == "code" and marker in c["source"]]
    assert len(found) == 1, f"expected one code cell containing {marker!r}, found {found}"
    return found[0]


def output_of(page: Any, marker: str) -> Any:
    return cell_locator(page, find_cell(page, marker)).locator(".jp-Cell-outputArea")


def kernel_execute(page: Any, code: str) -> None:
    """Run ``code`` in the notebook's kernel without adding a cell to the notebook."""
    status = page.evaluate(_EXECUTE_JS, code)
    assert status == "ok", f"{code!r} failed in the kernel: {status}"


def screenshot_notebook(page: Any, path: Path, parts: dict[str, Any] | None = None) -> None:
    """The whole notebook in one picture (side panels closed, the viewport made as tall
    as the notebook, scrolled to the top), then each of ``parts`` (name -> locator) in a
    picture of its own, ``<path stem>--<name>.png``."""
    page.evaluate("() => { window.jupyterapp.shell.collapseLeft(); "
                  "window.jupyterapp.shell.collapseRight(); }")
    size = page.viewport_size
    extra = page.evaluate("""() => {
      const outer = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
      if (!outer) return null;
      outer.scrollTop = 0;
      return [outer.scrollHeight, window.innerHeight - outer.clientHeight];
    }""")
    try:
        if extra:  # no scrolling inside the notebook: element pictures come out whole
            height = min(extra[0] + extra[1] + 40, 32_000)
            page.set_viewport_size({"width": size["width"], "height": height})
            page.evaluate("() => { document.querySelector("
                          "'.jp-NotebookPanel .jp-WindowedPanel-outer').scrollTop = 0; }")
            page.wait_for_timeout(1500)  # let plotly relayout after the resize
        page.screenshot(path=str(path))
        for name, locator in (parts or {}).items():
            with contextlib.suppress(Exception):  # best effort, one picture per part
                locator.screenshot(path=str(path.with_name(f"{path.stem}--{name}.png")),
                                   timeout=10_000)
    finally:
        page.set_viewport_size(size)


# --------------------------------------------------------------------------- checks


def check_every_cell_ran(page: Any, notebook: str) -> None:
    all_cells = cells(page)
    dom_cells = page.locator(".jp-Notebook .jp-Cell").count()
    assert dom_cells == len(all_cells), (
        f"{notebook}: {dom_cells} cells in the DOM, {len(all_cells)} in the model")
    code = [c for c in all_cells if c["type"] == "code" and c["source"].strip()]
    assert code, f"{notebook}: no code cells"
    not_run = [c["index"] for c in code if c["count"] is None]
    assert not not_run, f"{notebook}: cells {not_run} did not run (Run All stopped early?)"
    counts = [c["count"] for c in code]
    assert counts == sorted(counts) and len(set(counts)) == len(counts), (
        f"{notebook}: execution counts {counts} are not one run, top to bottom")


def check_no_errors(page: Any, notebook: str) -> None:
    problems = []
    for c in cells(page):
        for out in c["outputs"]:
            if out["type"] == "error":
                problems.append(f"cell {c['index']}: {out['ename']}: {out['evalue']}")
    stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    for k in range(stderr.count()):
        problems.append(f"stderr/error output in the page: {stderr.nth(k).inner_text()[:800]}")
    text = page.locator(".jp-Notebook").inner_text()
    if "Error displaying widget" in text:
        at = text.index("Error displaying widget")
        problems.append(f"a widget failed to display: {text[at:at + 200]!r}")
    assert not problems, f"{notebook}:\n" + "\n".join(problems)


def check_widget_outputs_rendered(page: Any, notebook: str) -> None:
    """Every widget output and plotly output the kernel sent has a view in the page."""
    outputs = [(c["index"], out) for c in cells(page) for out in c["outputs"]]
    widget_cells = {i for i, out in outputs
                    if "application/vnd.jupyter.widget-view+json" in out["mimes"]}
    plotly_cells = {i for i, out in outputs if "application/vnd.plotly.v1+json" in out["mimes"]}
    for index in sorted(widget_cells):
        area = cell_locator(page, index).locator(".jp-Cell-outputArea")
        wait_until(lambda area=area: area.locator(".jupyter-widgets .lm-Widget").count() > 0,
                   RENDER_TIMEOUT_MS, f"{notebook}: the widget view of cell {index}")
    for index in sorted(plotly_cells):
        area = cell_locator(page, index).locator(".jp-Cell-outputArea")
        wait_until(lambda area=area: area.locator(".js-plotly-plot .main-svg").count() > 0,
                   RENDER_TIMEOUT_MS, f"{notebook}: the plotly plot of cell {index}")


_PLOTS_JS = """(area) => Array.from(area.querySelectorAll('.js-plotly-plot')).map((plot) => {
  const svg = plot.querySelector('.main-svg');
  const box = svg ? svg.getBoundingClientRect() : null;
  const shown = !!plot.offsetParent || plot.getClientRects().length > 0;
  return {shown: shown && !!box && box.width > 0 && box.height > 0,
          width: box ? Math.round(box.width) : 0, height: box ? Math.round(box.height) : 0,
          traces: plot.querySelectorAll('g.trace').length};
})"""


def _plots(area: Any) -> list[dict[str, Any]]:
    """The plotly plots in ``area`` that are shown (not inside a hidden box): each with
    its drawn size and how many traces it draws."""
    return [p for p in area.evaluate(_PLOTS_JS) if p["shown"]]


def _drawn(plots: list[dict[str, Any]]) -> tuple[int, int]:
    """How many plots are drawn at a real size, and how many of those show data."""
    real = [p for p in plots if p["width"] >= 100 and p["height"] >= 100]
    return len(real), sum(p["traces"] > 0 for p in real)


def check_expected(page: Any, notebook: str, expected: Expected) -> None:
    area = output_of(page, expected.marker)
    label = f"{notebook} [{expected.marker}]"
    for selector in expected.selectors:
        wait_until(lambda s=selector: area.locator(s).count() > 0, RENDER_TIMEOUT_MS,
                   f"{label}: {selector!r} in the output")
    for pattern in expected.texts:
        wait_until(lambda p=pattern: re.search(p, area.inner_text()), RENDER_TIMEOUT_MS,
                   f"{label}: text matching {pattern!r}")
    if expected.plots:
        def enough() -> bool:
            drawn, with_data = _drawn(_plots(area))
            return drawn >= expected.plots and with_data >= expected.data_plots

        wait_until(enough, RENDER_TIMEOUT_MS,
                   f"{label}: {expected.plots} plotly plot(s) drawn, "
                   f"{expected.data_plots} with data",
                   detail=lambda: f"plots in the output: {area.evaluate(_PLOTS_JS)}")


# --------------------------------------------------------------------------- buttons


def click_measure_bandwidth(page: Any) -> None:
    """Notebook 01: the topology widget of this machine measures on its button."""
    area = output_of(page, "%pyc_hw")
    tables = area.locator(".pyc-lab-topology")
    measured = area.locator(".pyc-lab-topology table:has(caption:has-text('Measured bandwidth'))")
    assert measured.count() == 0, "the widget shows measured rows before the button was pressed"
    _drawn_before, with_data_before = _drawn(_plots(area))
    button = area.locator("button:has-text('Measure bandwidth')")
    row = area.locator(".widget-hbox:has(button:has-text('Measure bandwidth'))")
    button.click()
    wait_until(lambda: measured.count() > 0, MEASURE_TIMEOUT_MS,
               "measured bandwidth rows in the topology widget after the click")
    rows = measured.locator("tbody tr")
    assert rows.count() >= 1, "the measured-bandwidth table has no rows"
    text = tables.inner_text()
    assert "host_memcpy" in text or "h2d" in text, f"no measured copy kind shown:\n{text}"
    wait_until(lambda: button.is_enabled(), RENDER_TIMEOUT_MS,
               "the Measure bandwidth button to be enabled again")
    status = row.locator(".widget-html").inner_text().strip()
    assert status and "measuring" not in status, f"status after measuring: {status!r}"
    assert row.locator("span[style*='#b00']").count() == 0, f"the probe failed: {status}"

    def chart_drawn() -> bool:  # the bandwidth chart appears below, with the measured kinds
        return _drawn(_plots(area))[1] > with_data_before

    wait_until(chart_drawn, RENDER_TIMEOUT_MS, "the measured bandwidth chart to be drawn",
               detail=lambda: f"plots in the output: {area.evaluate(_PLOTS_JS)}")


_PROGRESS = re.compile(r"(running|stopped|done|failed): (\d+)(?: of (\d+))? candidates")


def start_and_stop_tuner(page: Any) -> None:
    """Notebook 03: Start replays the tuning (progress advances), Stop halts it."""
    # The notebook's tuner replays instantly (pace_s=0); slow it down so that Stop can
    # be pressed while it runs: each candidate then takes half a second.
    kernel_execute(page, "tuner.tuning.pace_s = 0.5")
    area = output_of(page, "tuner = AutotuneWidget(")
    controls = area.locator(".widget-hbox:has(button:has-text('Start'))")
    start = controls.locator("button:has-text('Start')")
    stop = controls.locator("button:has-text('Stop')")
    status = controls.locator(".widget-html")
    bar = controls.locator(".progress-bar")
    assert stop.is_disabled(), "Stop is enabled although nothing runs"

    def progress() -> tuple[str, int, int] | None:
        match = _PROGRESS.search(status.inner_text())
        if not match:
            return None
        return match.group(1), int(match.group(2)), int(match.group(3) or 0)

    start.click()
    first = wait_until(lambda: (p := progress()) and p[0] == "running" and p[1] >= 1 and p,
                       RENDER_TIMEOUT_MS, "the tuner to report its first candidate")
    width_first = bar.evaluate("el => el.getBoundingClientRect().width")
    assert stop.is_enabled() and start.is_disabled(), "Start/Stop not toggled while running"
    wait_until(lambda: (p := progress()) and p[0] == "running" and p[1] > first[1],
               RENDER_TIMEOUT_MS, "the tuner's progress to advance")
    wait_until(lambda: bar.evaluate("el => el.getBoundingClientRect().width") > width_first,
               RENDER_TIMEOUT_MS, "the progress bar to grow")
    stop.click()
    stopped = wait_until(lambda: (p := progress()) and p[0] == "stopped" and p,
                         RENDER_TIMEOUT_MS, "the tuner to stop after Stop")
    assert stopped[2] and stopped[1] < stopped[2], f"Stop did not stop it early: {stopped}"
    wait_until(lambda: start.is_enabled() and stop.is_disabled(), RENDER_TIMEOUT_MS,
               "Start enabled and Stop disabled after stopping")
    page.wait_for_timeout(2000)  # four paces: a run that ignored Stop would move on
    assert progress() == stopped, f"progress moved after Stop: {stopped} -> {progress()}"
    wait_until(lambda: "stopped by the Stop button" in area.inner_text(), RENDER_TIMEOUT_MS,
               "the tables to say the run was stopped by the Stop button")


BUTTONS: dict[str, Callable[[Any], None]] = {
    "01_hardware.ipynb": click_measure_bandwidth,
    "03_autotune_gemm.ipynb": start_and_stop_tuner,
}


# --------------------------------------------------------------------------- the tests


def test_expectations_name_existing_notebooks() -> None:
    unknown = sorted((set(EXPECTED) | set(BUTTONS)) - set(NOTEBOOKS))
    assert not unknown, f"checks for notebooks that do not exist: {unknown}"


@pytest.mark.browser
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_in_jupyterlab(notebook: str, lab_server: Any, browser_context: Any,
                                artifacts: Path) -> None:
    stem = Path(notebook).stem
    page = browser_context.new_page()
    console = Console(page)
    parts: dict[str, Any] = {}  # widget outputs to picture, by name
    ok = False
    try:
        open_notebook(page, lab_server, f"notebooks/{notebook}")
        run_all(page)
        check_every_cell_ran(page, notebook)
        check_widget_outputs_rendered(page, notebook)
        check_no_errors(page, notebook)
        for expected in EXPECTED.get(notebook, []):
            parts[expected.name] = output_of(page, expected.marker)
            check_expected(page, notebook, expected)
        if notebook in BUTTONS:
            BUTTONS[notebook](page)
            check_no_errors(page, notebook)
        ok = True
    finally:
        (artifacts / f"{stem}-console.log").write_text(console.text())
        if not ok:  # the page as it was, for debugging a failure
            with contextlib.suppress(Exception):
                (artifacts / f"{stem}-FAILED.html").write_text(page.content())
        try:
            screenshot_notebook(page, artifacts / f"{stem}{'' if ok else '-FAILED'}.png",
                                parts)
        except Exception as exc:  # a failed screenshot must not hide the test's own error
            (artifacts / f"{stem}-screenshot-error.txt").write_text(repr(exc))
        page.close()
        lab_server.shutdown_kernels()
    assert not console.errors, f"{notebook}: browser console errors:\n" + "\n".join(
        console.errors)
