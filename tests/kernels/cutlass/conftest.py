"""Fixtures of the CUTLASS kernel tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fresh_conv_state(tmp_path, monkeypatch):
    """A tuning database of the test's own and no remembered convolution choices (the
    forward's and the gradients' races, the kept runners, the plans and the tuned-kernel
    lookups); the direct kernel left out of the forward's race (these tests are of the
    tuned kernels against the libraries)."""
    from pyc_lab.kernels import conv, conv_cutlass, conv_gemm, conv_grad_route
    from pyc_lab.kernels.tuning import database

    monkeypatch.setattr(database, "default_path", lambda: tmp_path / "tuning.sqlite")
    monkeypatch.setattr(conv_gemm, "_CHOICES", {})
    monkeypatch.setattr(conv_grad_route, "_CHOICES", {})
    monkeypatch.setattr(conv_gemm, "_RUNNERS", {})
    monkeypatch.setattr(conv, "_PLANS", {})
    monkeypatch.setattr(conv_cutlass, "_MEMO", {})
    monkeypatch.setattr(conv_gemm, "_direct_eligible", lambda *a: False)
