"""Live GEMM autotuning needs a GPU: without one it says why (the device gate's reason)."""

from __future__ import annotations

import re

import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError


def test_autotune_without_a_gpu_says_why():
    from pyc_lab.hardware.device import no_gpu_reason

    reason = no_gpu_reason()
    if reason is None:
        pytest.skip("a GPU is present: test_cutlass_gemm_gpu.py tunes for real")
    with pytest.raises(PycLabError, match=f"needs a CUDA device: {re.escape(reason)}"):
        pl.autotune_gemm(256, 256, 256)
