"""Shared test setup: GPU tests skip, with the reason, where no CUDA device is usable."""

from __future__ import annotations

import pytest

from pyc_lab.runtime.gpu import cupy_status


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
