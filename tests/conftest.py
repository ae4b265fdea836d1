"""Shared test setup: GPU tests skip, with the reason, where no CUDA device is usable."""

from __future__ import annotations

import pytest

from pyc_lab.hardware.device import cupy_status


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    cp, reason = cupy_status()
    if cp is not None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_tuning_database(tmp_path_factory, monkeypatch):
    """Tests never read or write the user's tuning database: ``pyc_lab.matmul`` and the
    compiler's tuned-kernel lookup would otherwise depend on what was tuned before."""
    from pyc_lab.kernels.tuning import database as tuning_db

    path = tmp_path_factory.getbasetemp() / "tuning-db" / "tuning.sqlite"
    monkeypatch.setattr(tuning_db, "user_default_path", tuning_db.default_path, raising=False)
    monkeypatch.setattr(tuning_db, "default_path", lambda: path)
