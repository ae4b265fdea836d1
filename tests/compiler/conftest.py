"""Hypothesis profiles for the compiler's property-based tests.

``ci`` (the default) keeps the fuzz suite within about a minute on a two-core machine and
is derandomized: the same 1200 programs every run, so a red CI is a change's doing, not a
new random draw. ``nightly`` runs many more *random* programs each time, to find new
defects (fix them, and add the program as a regression test). Pick one with
``HYPOTHESIS_PROFILE``::

    HYPOTHESIS_PROFILE=nightly pytest -o addopts="" tests/compiler/test_fuzz_numpy.py
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow,
                                                       HealthCheck.data_too_large]}
settings.register_profile("ci", max_examples=1200, derandomize=True, **_COMMON)
settings.register_profile("nightly", max_examples=5000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
