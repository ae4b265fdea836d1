"""Run test code where ``chmod`` really makes files read-only, also when tests run as root.

A process with ``CAP_DAC_OVERRIDE`` (root, usually) writes through any permission bits,
so a read-only test that only chmods would pass without testing anything. Such code runs
in a child process instead: as root, under ``setpriv`` with ``CAP_DAC_OVERRIDE``,
``CAP_DAC_READ_SEARCH`` and ``CAP_FOWNER`` dropped from the bounding set (a root that the
permission bits bind); as another user, directly. When neither can be had the test is
skipped with the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_DROP = "-dac_override,-dac_read_search,-fowner"


def _command() -> list[str]:
    if os.geteuid() != 0:
        return [sys.executable]
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    return [setpriv, f"--bounding-set={_DROP}", sys.executable]


@functools.cache
def why_not_enforced() -> str:
    """``""`` when a child process can be made to obey permission bits, else why not."""
    command = _command()
    if not command:
        return ("running as root, where chmod does not stop writes, and setpriv (to drop "
                "CAP_DAC_OVERRIDE) is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe"
        probe.write_text("x")
        probe.chmod(0o444)
        code = ("import sys\ntry:\n    open(sys.argv[1], 'a').close()\nexcept "
                "PermissionError:\n    print('enforced')")
        try:
            run = subprocess.run([*command, "-c", code, str(probe)], capture_output=True,
                                 text=True, timeout=60)
        except OSError as exc:
            return f"cannot start a child process without CAP_DAC_OVERRIDE ({exc})"
    if run.stdout.strip() != "enforced":
        return ("permission bits are not enforced even without CAP_DAC_OVERRIDE here "
                f"({run.stderr.strip()[-200:] or 'the write succeeded'})")
    return ""


def run_read_only_child(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``python -c code args...`` in a process that permission bits bind.

    Skips the calling test when no such process can be had (see :func:`why_not_enforced`).
    """
    why = why_not_enforced()
    if why:
        pytest.skip(why)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([*_command(), "-c", code, *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
