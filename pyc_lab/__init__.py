"""pyc_lab: a Jupyter-first GPU performance workbench.

``%load_ext pyc_lab`` in a notebook registers the magics (``%pyc_hw``, ``%%pyc_compile``,
``%pyc_tune``, ``%pyc_timeline``); from Python::

    import pyc_lab as pl
    hw = pl.detect_hardware()          # CPUs, NUMA, GPUs, links, with provenance
    f = pl.compile(fn)                 # trace, optimise, fuse; f.explain(*args)
    bw = pl.runtime.probe_bandwidth()  # measured copy bandwidths beside theoretical
    res = pl.autotune_gemm(4096, 4096, 4096, dtype="bf16")   # CUTLASS vs cuBLAS, recorded
    res = pl.replay_autotune(4096, 4096, 4096, dtype="f16")  # the same search, replayed
    y = pl.matmul(a, b)                # the tuned kernel for the shape, else cuBLAS

Importing pyc_lab needs no GPU, no CuPy and no NVML, and prints nothing.
"""

from __future__ import annotations

import logging

from . import compiler, runtime
from .compiler.api import CompiledFunction, compile
from .errors import DeviceUnavailableError, PycLabError, SnapshotError
from .runtime import (
    GpuActivity,
    HardwareProfile,
    PinnedPool,
    Pipeline,
    detect_hardware,
    probe_bandwidth,
    tune_pipeline,
)

__version__ = "0.1.0"

__all__ = [
    "CompiledFunction",
    "DeviceUnavailableError",
    "GpuActivity",
    "HardwareProfile",
    "PinnedPool",
    "Pipeline",
    "PycLabError",
    "SnapshotError",
    "TuneResult",
    "__version__",
    "autotune_gemm",
    "compile",
    "compiler",
    "detect_hardware",
    "load_ipython_extension",
    "matmul",
    "probe_bandwidth",
    "replay_autotune",
    "runtime",
    "tune_pipeline",
    "unload_ipython_extension",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())

_LAZY = {"matmul": ("kernels.matmul", "matmul"),
         "autotune_gemm": ("kernels.autotune", "autotune_gemm"),
         "TuneResult": ("kernels.autotune", "TuneResult"),
         "replay_autotune": ("kernels.replay", "replay_autotune")}


def __getattr__(name: str):
    """The kernel-layer entry points, imported on first use (they pull in more)."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """Register pyc_lab's magics with IPython (``%load_ext pyc_lab``). Prints nothing."""
    from .magics import register

    register(ipython)


def unload_ipython_extension(ipython) -> None:
    """Remove pyc_lab's magics (``%unload_ext pyc_lab``)."""
    from .magics import unregister

    unregister(ipython)
