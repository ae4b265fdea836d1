"""pyc_lab: a Jupyter-first GPU performance workbench.

``%load_ext pyc_lab`` in a notebook registers the magics (``%pyc_hw``, ``%%pyc_compile``,
``%pyc_tune``, ``%pyc_timeline``, ``%%pyc_trace``, ``%pyc_timeit``, ``%pyc_serve``); from
Python::

    import pyc_lab as pl
    hw = pl.detect_hardware()          # CPUs, NUMA, GPUs, links, with provenance
    bw = pl.probe_bandwidth()          # measured copy bandwidths beside theoretical
    f = pl.compile(fn)                 # trace, optimise, fuse; f.explain(*args)
    res = pl.autotune_gemm(4096, 4096, 4096, dtype="f16")    # CUTLASS vs cuBLAS, recorded
    res = pl.replay_autotune(4096, 4096, 4096, dtype="f16")  # the same search, replayed
    y = pl.matmul(a, b)                # a tuned kernel where it won, else the library
    o = pl.attention(q, k, v, causal=True)  # pyc_lab's Hopper kernel or SDPA, else blocked
    dq, dk, dv = pl.attention_backward(q, k, v, do, causal=True)  # torch: loss.backward()
    res = pl.autotune_attention(4, 16, 4096, 128, causal=True)  # vs every SDPA backend
    y = pl.conv2d(x, w, padding=1)     # cuDNN, the GEMM form or a tuned CUTLASS kernel
    res = pl.autotune_conv((128, 64, 56, 56), (64, 64, 3, 3), padding=1)  # vs cuDNN
    plan = pl.matmul_plan(a, b, out=y)  # the same choice, made once: plan(a, b)
    pipe = pl.Pipeline(prepare, compute, depth=3)            # the conveyor belt
    server = pl.serve(pl.inference.load("model.onnx"), max_batch=64, max_delay_ms=2)

The layers, each a sub-package that imports only those below it: ``hardware``
(facts), ``profiling`` (timing, traces), ``search`` (tuning strategies), ``kernels``
(CUTLASS, cuBLASLt, tuning), ``compiler``, ``runtime`` (pinned pools, the belt),
``inference`` (ONNX import, the batcher, the KServe v2 endpoint), then ``widgets``,
``magics`` and ``cli``. Importing pyc_lab loads none of them (each name
below is imported on first use), needs no GPU, no CuPy and no NVML, and prints nothing.
"""

from __future__ import annotations

import logging

from ._lazy import lazy_face
from ._version import __version__
from .errors import DeviceUnavailableError, PycLabError, SnapshotError

_EXPORTS = {
    "CompiledFunction": "compiler.api",
    "compile": "compiler.api",
    "GpuActivity": "profiling.activity",
    "probe_bandwidth": "profiling.bandwidth",
    "HardwareProfile": "hardware.profile",
    "detect_hardware": "hardware.detect",
    "PinnedPool": "runtime.pinned",
    "Pipeline": "runtime.pipeline",
    "tune_pipeline": "runtime.belt_tuning",
    "matmul": "kernels.matmul",
    "attention": "kernels.attention",
    "attention_backward": "kernels.attention",
    "conv": "kernels.conv",
    "conv1d": "kernels.conv",
    "conv2d": "kernels.conv",
    "conv_backward": "kernels.conv",
    "matmul_plan": "kernels.matmul",
    "MatmulPlan": "kernels.matmul_plan",
    "autotune_gemm": "kernels.tuning.autotune",
    "autotune_conv": "kernels.tuning.conv_tune",
    "autotune_attention": "kernels.tuning.attention_tune",
    "TuneResult": "kernels.tuning.autotune",
    "replay_autotune": "kernels.tuning.autotune",
    "replay_autotune_conv": "kernels.tuning.conv_replay",
    "autotune_many": "distributed.tuning",
    "cluster": "distributed.cluster",
    "serve": "inference.server",
}

__all__ = [
    "CompiledFunction",
    "DeviceUnavailableError",
    "GpuActivity",
    "HardwareProfile",
    "MatmulPlan",
    "PinnedPool",
    "Pipeline",
    "PycLabError",
    "SnapshotError",
    "TuneResult",
    "__version__",
    "attention",
    "attention_backward",
    "autotune_attention",
    "autotune_conv",
    "autotune_gemm",
    "autotune_many",
    "cluster",
    "compile",
    "conv",
    "conv1d",
    "conv2d",
    "conv_backward",
    "detect_hardware",
    "load_ipython_extension",
    "matmul",
    "matmul_plan",
    "probe_bandwidth",
    "replay_autotune",
    "replay_autotune_conv",
    "serve",
    "tune_pipeline",
    "unload_ipython_extension",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())


def load_ipython_extension(ipython) -> None:
    """Register pyc_lab's magics with IPython (``%load_ext pyc_lab``). Prints nothing."""
    from .magics import register

    register(ipython)


def unload_ipython_extension(ipython) -> None:
    """Remove pyc_lab's magics (``%unload_ext pyc_lab``)."""
    from .magics import unregister

    unregister(ipython)
