"""What every benchmark result records (device, driver, versions, git sha, date), and the
timers the benchmarks share (GPU time through CUDA events, host time per call)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def git_sha() -> str:
    """The commit under test: $PYC_LAB_GIT_SHA (the GPU lane has no .git), else git."""
    sha = os.environ.get("PYC_LAB_GIT_SHA")
    if sha:
        return sha
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions(*names: str) -> dict[str, str | None]:
    """Installed versions of the named distributions (None when absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment() -> dict[str, Any]:
    """Device, driver, CUDA and library versions, git sha and date of this run."""
    import pyc_lab

    hw = pyc_lab.detect_hardware()
    gpu = hw.gpus[0] if hw.gpus else None
    return {
        "device": gpu.name if gpu else "CPU only",
        "device_count": len(hw.gpus),
        "driver": hw.driver_version,
        "cuda_driver": hw.cuda_driver_version,
        "cpu": hw.host.cpu_model,
        "versions": versions("pyc-lab", "numpy", "pandas", "cupy-cuda13x", "torch",
                             "cuda-core", "cuda-bindings", "nvidia-ml-py"),
        "pyc_lab_version": pyc_lab.__version__,
        "git_sha": git_sha(),
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
    }


def write_result(out_dir: str | Path, name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` plus the environment as ``<out_dir>/<name>.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "environment": environment(), **payload},
                               indent=2, default=str) + "\n")
    return path


def cupy_and_torch(what: str) -> tuple[Any, Any] | None:
    """CuPy and torch on a usable GPU (the device gate's answer), or ``None`` after
    printing why ``what`` is skipped."""
    from pyc_lab.hardware.device import cupy_status

    cp, reason = cupy_status()
    if cp is None:
        print(f"skipped: {what} needs a CUDA device ({reason})")
        return None
    try:
        import torch
    except ImportError:
        print(f"skipped: {what} compares with torch; install torch")
        return None
    return cp, torch


def gpu_time(fn: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """Median GPU seconds of ``fn`` on the current stream (pyc_lab's ``benchmark``: CUDA
    events, the host's launch gaps kept out by a spin kernel)."""
    from pyc_lab.profiling import benchmark

    return benchmark(fn, repeats=repeats, warmup=warmup, gpu=True).median_s


def host_us(cp, fn: Callable[[], object], calls: int = 200, rounds: int = 7) -> float:
    """Median host microseconds per call of ``fn`` (not synchronised inside a round)."""
    return host_us_many(cp, {"fn": fn}, calls, rounds)["fn"]


def host_us_many(cp, fns: dict[str, Callable[[], object]], calls: int = 200,
                 rounds: int = 7) -> dict[str, float]:
    """Median host microseconds per call of each of ``fns``, their rounds interleaved
    (one round of each in turn), so that a slower spell of the host falls on all of them.

    As ``timeit`` does, the garbage collector is paused while a round runs: a collection
    of garbage other code left (a compiler's, an earlier benchmark's) would otherwise land
    on whichever call happens to trigger it. The GPU is synchronised between rounds,
    never inside one.
    """
    import gc

    for fn in fns.values():
        for _ in range(20):
            fn()
    cp.cuda.Device().synchronize()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            enabled = gc.isenabled()
            gc.disable()
            try:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - t0) / calls)
            finally:
                if enabled:
                    gc.enable()
            cp.cuda.Device().synchronize()
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def noop_executor(model: Any) -> Callable[[list[Any]], list[Any]]:
    """An executor for ``model``'s batches that costs nothing: per batch size, ones of each
    output's shape, made once (what is left of a served request is the request path)."""
    import numpy as np

    outs: dict[int, list[Any]] = {}

    def noop(arrays: list[Any]) -> list[Any]:
        rows = arrays[0].shape[0]
        if rows not in outs:
            outs[rows] = [np.ones((rows, *(d or 1 for d in s.shape[1:])), s.dtype)
                          for s in model.outputs]
        return outs[rows]

    return noop
