"""Real-browser tests: JupyterLab on loopback, driven by headless Chromium.

The fixtures here start one JupyterLab server per test module (a free port on
127.0.0.1, a random token, this checkout first on ``PYTHONPATH`` so that the kernels
import this checkout's ``pyc_lab``) and one headless Chromium (Debian's ``chromium``
package, driven by Playwright's Python API; Playwright's own browser download is never
used). Everything the server would write outside the repository (settings, workspaces,
runtime files, checkpoints, IPython and pyc_lab caches) goes into a temporary folder, and
autosave is off, so a run never changes the notebooks: the server fixture checks that
their bytes are the same afterwards.

Every server is stopped, also when a test or the start itself fails: ``/api/shutdown``
first (it shuts the kernels down), then SIGTERM and SIGKILL to the server's process
group, and any kernel still alive (kernels run in sessions of their own) by its pid.

Tests here carry ``@pytest.mark.browser``; they skip, saying why, where Chromium or the
``playwright`` package is missing. Screenshots and logs go to ``browser-artifacts/`` at
the repository root (git-ignored), or to ``$PYC_LAB_BROWSER_ARTIFACTS``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
CHROMIUM_ENV = "PYC_LAB_CHROMIUM"
ARTIFACTS_ENV = "PYC_LAB_BROWSER_ARTIFACTS"
#: Set (to anything but 0) where the browser tests must run: CI fails instead of
#: skipping them when Chromium or Playwright is missing.
REQUIRE_ENV = "PYC_LAB_REQUIRE_BROWSER"
DEFAULT_CHROMIUM = "/usr/bin/chromium"

#: Chromium flags: root and containers (no sandbox, no GPU, /tmp instead of a small
#: /dev/shm) and nothing that calls out to the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

#: JupyterLab settings for the test server's private settings folder: no autosave (the
#: notebooks must stay as committed), every cell in the DOM (no windowing, so that the
#: checks and the screenshots see the whole notebook), no news or update checks.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
}

SERVER_START_TIMEOUT_S = 120


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "browser: drives JupyterLab in headless Chromium (skipped without Debian's chromium "
        "or the playwright package; run alone with scripts/browser-test)",
    )


def chromium_path() -> str:
    """The Chromium binary: ``$PYC_LAB_CHROMIUM``, else Debian's ``/usr/bin/chromium``."""
    return os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM


def missing_requirement() -> str | None:
    """Why the browser tests cannot run here, or ``None`` when they can."""
    path = chromium_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return (f"needs Chromium at {path} (Debian: apt-get install chromium; or set "
                f"{CHROMIUM_ENV})")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs the playwright Python package (pip install playwright)"
    return None


def browser_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    browser_items = [item for item in items if item.get_closest_marker("browser")]
    if not browser_items:
        return
    reason = missing_requirement()
    if reason is None or browser_required():  # required: the fixtures fail, saying why
        return
    for item in browser_items:
        item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    folder = getattr(config, "_pyc_lab_browser_artifacts", None)
    if folder is not None:
        terminalreporter.write_line(f"browser tests: screenshots and logs in {folder}")


# --------------------------------------------------------------------------- artifacts


ARTIFACT_SUFFIXES = (".png", ".log", ".txt", ".html")


@pytest.fixture(scope="session")
def artifacts(pytestconfig: pytest.Config) -> Path:
    """The folder screenshots and logs are written to (last run's files removed)."""
    folder = Path(os.environ.get(ARTIFACTS_ENV) or REPO / "browser-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.is_file() and entry.suffix in ARTIFACT_SUFFIXES:
            entry.unlink()
    pytestconfig._pyc_lab_browser_artifacts = folder  # named in the terminal summary
    return folder


# --------------------------------------------------------------------------- the server


@dataclass
class LabServer:
    """A running JupyterLab: where it listens and how to talk to it."""

    url: str
    token: str
    process: subprocess.Popen
    log_path: Path

    def api(self, method: str, path: str, timeout: float = 30) -> Any:
        """Call the server's REST API; returns the decoded JSON (or ``None``)."""
        request = urllib.request.Request(
            f"{self.url}{path}", method=method,
            headers={"Authorization": f"token {self.token}"},
            data=b"" if method in ("POST", "PUT", "PATCH") else None)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def lab_url(self, path: str) -> str:
        """The URL that opens ``path`` (relative to the repository) in a fresh workspace."""
        return f"{self.url}/lab/tree/{path}?reset&token={self.token}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"

    def shutdown_kernels(self) -> None:
        """End every session (and so its kernel) the browser started."""
        for session in self.api("GET", "/api/sessions"):
            with contextlib.suppress(urllib.error.URLError, OSError):
                self.api("DELETE", f"/api/sessions/{session['id']}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_settings(folder: Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        path = folder / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _notebook_digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(NOTEBOOKS.glob("*.ipynb"))}


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _stop_server(server: LabServer) -> None:
    """Stop the server and everything it started; never raises."""
    import psutil

    proc = server.process
    children = _descendants(proc.pid)  # kernels run in their own sessions: remember them
    if proc.poll() is None:
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            server.api("POST", "/api/shutdown", timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # start_new_session=True: its group id is its pid
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    for child in children:  # psutil checks that a pid still names the same process
        with contextlib.suppress(psutil.Error):
            child.kill()


@pytest.fixture(scope="module")
def lab_server(artifacts: Path) -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1 (free port, token), rooted at the repository."""
    reason = missing_requirement()
    if reason is not None:
        if browser_required():
            pytest.fail(f"{REQUIRE_ENV} is set but the browser tests cannot run: {reason}")
        pytest.skip(reason)
    tmp = Path(tempfile.mkdtemp(prefix="pyc-lab-browser-"))
    for name in ("config", "runtime", "workspaces", "checkpoints", "ipython", "cache", "data"):
        (tmp / name).mkdir()
    _write_settings(tmp / "settings")
    # Checkpoints (JupyterLab makes one when it opens a notebook) go to the temporary
    # folder instead of notebooks/.ipynb_checkpoints.
    (tmp / "config" / "jupyter_server_config.json").write_text(json.dumps({
        "FileContentsManager": {"checkpoints_kwargs": {"root_dir": str(tmp / "checkpoints")}},
    }))
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        IPYTHONDIR=str(tmp / "ipython"),
        XDG_CACHE_HOME=str(tmp / "cache"),  # pyc_lab's caches and tuning database
        XDG_DATA_HOME=str(tmp / "data"),
        PYTHONUNBUFFERED="1",
    )
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={REPO}",
        f"--LabApp.user_settings_dir={tmp / 'settings'}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        # window.jupyterapp: the tests read the notebook model and kernel state from it.
        "--LabApp.expose_app_in_browser=True",
        # No calls to the network: no news feed, no update check, no PyPI extension manager.
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = artifacts / "jupyterlab.log"
    before = _notebook_digests()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = LabServer(f"http://127.0.0.1:{port}", token, proc, log_path)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode} while starting:\n"
                            f"{server.log_tail()}")
            try:
                server.api("GET", "/api/status", timeout=5)
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within {SERVER_START_TIMEOUT_S} s:"
                                f"\n{server.log_tail()}")
                time.sleep(0.5)
        yield server
    finally:
        _stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)
    changed = [name for name, digest in _notebook_digests().items()
               if before.get(name) != digest]
    assert not changed, (
        f"notebooks changed on disk while JupyterLab ran: {changed}. The tests never save "
        "(autosave is off); unless someone edited them meanwhile, JupyterLab wrote them")


# --------------------------------------------------------------------------- the browser


@pytest.fixture(scope="module")
def browser(lab_server: LabServer) -> Iterator[Any]:
    """Headless Chromium (Debian's) driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                                      args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def browser_context(browser: Any) -> Iterator[Any]:
    """One context (so JupyterLab's assets are fetched once), a page per notebook."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield context
    finally:
        context.close()
