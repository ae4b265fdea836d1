"""Hypothesis profiles for the compiler's property-based tests.

``ci`` (the default) keeps the fuzz suite within about a minute on a two-core machine;
``nightly`` runs many more random programs. Pick one with ``HYPOTHESIS_PROFILE``::

    HYPOTHESIS_PROFILE=nightly pytest -o addopts="" tests/compiler/test_fuzz_numpy.py
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow,
                                                       HealthCheck.data_too_large]}
settings.register_profile("ci", max_examples=1200, **_COMMON)
settings.register_profile("nightly", max_examples=5000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
