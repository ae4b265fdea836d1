"""The "library installed, no driver" path (the CI machine's situation) and its messages."""

from __future__ import annotations

import builtins

import pytest

import pyc_lab as pl
from pyc_lab.hardware import device as gpu


def test_status_matches_what_cupy_can_do():
    cp, reason = gpu.cupy_status()
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except ImportError:
        assert cp is None and "not installed" in reason
        return
    except Exception as exc:  # installed, but no driver: CI's situation
        assert cp is None
        assert reason.startswith("CUDA runtime: ") and str(exc) in reason
        with pytest.raises(pl.DeviceUnavailableError, match="the probe needs a CUDA device"):
            gpu.require_cupy("the probe")
        return
    assert (cp is not None) == (n > 0)


def test_missing_cupy_is_reported_not_raised(monkeypatch):
    real_import = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name == "cupy":
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    cp, reason = gpu.cupy_status()
    assert cp is None and reason == "CuPy is not installed (pip install 'pyc-lab[gpu]')"
    with pytest.raises(pl.DeviceUnavailableError, match=r"pip install 'pyc-lab\[gpu\]'"):
        gpu.require_cupy("bandwidth probing")
