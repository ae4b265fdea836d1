"""Fixtures of the CuPy backend's tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A generator seeded afresh on every run: inputs are never the same twice."""
    return np.random.default_rng()
