"""Shared test setup.

- Tests marked ``gpu`` skip where no GPU is usable, with the device gate's one reason
  (:func:`pyc_lab.hardware.device.no_gpu_reason`).
- Tests marked ``nvcc`` (they run the CUDA toolkit's ``nvcc``, or need its version to
  enumerate CUTLASS configurations) skip where
  :func:`pyc_lab.kernels.cutlass.nvcc.nvcc_path` finds none.
- Skips are summarised at the end of a run as one line per distinct reason with its
  count (``addopts`` has ``-rfE``: failures and errors are still listed one by one).
- ``PYC_LAB_TEST_NO_NVCC=1`` makes the run behave as on a machine without the CUDA
  toolkit, to check that such a machine passes or skips every test: ``nvcc_path()``
  raises, and an ``nvcc`` that fails is put first on ``PATH`` (what cutlass_cppgen and
  subprocesses would run).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.hardware.device import no_gpu_reason

NO_NVCC_ENV = "PYC_LAB_TEST_NO_NVCC"
NVCC_SKIP = "needs the CUDA toolkit's nvcc (none on PATH, $CUDA_HOME or /usr/local/cuda)"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(NO_NVCC_ENV, "") not in ("", "0"):
        _pretend_there_is_no_nvcc()


def _pretend_there_is_no_nvcc() -> None:
    """Hide the CUDA toolkit from this test run (never from the library's own code)."""
    from pyc_lab.errors import DeviceUnavailableError
    from pyc_lab.kernels.cutlass import nvcc

    def nvcc_path() -> str:
        raise DeviceUnavailableError("building CUTLASS kernels needs the CUDA toolkit's "
                                     f"nvcc; none on PATH, $CUDA_HOME or /usr/local/cuda "
                                     f"({NO_NVCC_ENV} is set)")

    nvcc.nvcc_path = nvcc_path  # type: ignore[assignment]
    folder = Path(tempfile.mkdtemp(prefix="pyc-lab-no-nvcc-"))
    fake = folder / "nvcc"
    fake.write_text(f"#!/bin/sh\necho 'nvcc: hidden by {NO_NVCC_ENV}' >&2\nexit 127\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


def _nvcc_missing() -> bool:
    from pyc_lab.kernels.cutlass import nvcc

    try:
        nvcc.nvcc_path()
    except PycLabError:
        return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items):
        reason = no_gpu_reason()
        if reason is not None:
            skip = pytest.mark.skip(reason=f"needs a CUDA device: {reason}")
            for item in items:
                if item.get_closest_marker("gpu"):
                    item.add_marker(skip)
    if any(item.get_closest_marker("nvcc") for item in items) and _nvcc_missing():
        skip = pytest.mark.skip(reason=NVCC_SKIP)
        for item in items:
            if item.get_closest_marker("nvcc"):
                item.add_marker(skip)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """One line per distinct skip reason, with its count (instead of one per test)."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if getattr(r, "skipped", False)]
    if not skipped:
        return
    counts = Counter(_skip_reason(r) for r in skipped)
    terminalreporter.section(f"{len(skipped)} skipped, by reason", sep="-")
    for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n:4d}  {reason}")


@pytest.fixture(autouse=True)
def _private_tuning_database(tmp_path_factory, monkeypatch):
    """Tests never read or write the user's tuning database: ``pyc_lab.matmul`` and the
    compiler's tuned-kernel lookup would otherwise depend on what was tuned before."""
    from pyc_lab.kernels.tuning import database as tuning_db

    path = tmp_path_factory.getbasetemp() / "tuning-db" / "tuning.sqlite"
    monkeypatch.setattr(tuning_db, "user_default_path", tuning_db.default_path, raising=False)
    monkeypatch.setattr(tuning_db, "default_path", lambda: path)
