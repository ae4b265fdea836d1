"""CUTLASS GEMM builds: ``nvcc`` runs in parallel into the hash-verified kernel cache.

One shared library per kernel, built with ``-O3 -DNDEBUG`` (with assertions left in,
``ptxas`` serialises the ``wgmma`` pipeline); a failure is a result carrying the
compiler's message, never an exception. Builds need ``nvcc`` and nvidia-cutlass (its
headers ship in the wheel), not a GPU. :func:`cached` only looks: what a hot path may
call.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import DeviceUnavailableError, PycLabError
from ..cache import KernelCache, cache_key
from .config import Epilogue, GemmConfig
from .emit import emit_source

__all__ = ["NVCC_FLAGS", "BuildResult", "build", "build_many", "build_parallel",
           "build_source", "cached", "cached_library", "nvcc_path", "toolchain"]

log = logging.getLogger(__name__)

NVCC_FLAGS = ("-std=c++17", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG",
              "-Xcudafe", "--diag_suppress=esa_on_defaulted_function_ignored",
              "-shared", "-Xcompiler", "-fPIC")


def nvcc_path() -> str:
    """The ``nvcc`` to build with (PATH, ``$CUDA_HOME``, ``/usr/local/cuda``)."""
    found = shutil.which("nvcc")
    for cand in (found, os.environ.get("CUDA_HOME") and f"{os.environ['CUDA_HOME']}/bin/nvcc",
                 "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    raise DeviceUnavailableError("building CUTLASS kernels needs the CUDA toolkit's nvcc; "
                                 "none on PATH, $CUDA_HOME or /usr/local/cuda")


@lru_cache(maxsize=1)
def toolchain() -> dict[str, str]:
    """Versions that change a build: nvcc and nvidia-cutlass (part of every cache key)."""
    from importlib.metadata import version

    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True,
                         timeout=60, check=False).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return {"nvcc": m.group(1) if m else out.strip()[-40:],
            "cutlass": version("nvidia-cutlass"), "flags": " ".join(NVCC_FLAGS)}


def _include_dirs() -> list[str]:
    import cutlass_library

    root = Path(cutlass_library.__file__).parent / "source"
    return [str(root / "include"), str(root / "tools" / "util" / "include")]


@dataclass
class BuildResult:
    """What building one configuration gave."""

    config: Any  # a GemmConfig, or a ConvConfig for a convolution
    key: str
    library: Path | None
    status: str  # "built", "cached" or "compile_error"
    seconds: float = 0.0
    message: str = ""

    @property
    def ok(self) -> bool:
        """Whether there is a library to load."""
        return self.library is not None


def _arch(cc: int) -> str:
    return f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"


def cached_library(source: str, cc: int = 90, cache: KernelCache | None = None
                   ) -> Path | None:
    """The library built from ``source`` for ``cc`` if it is in the kernel cache, else
    ``None``; never builds (what a first call of ``pl.conv`` or ``pl.attention`` may
    afford: nvcc takes minutes)."""
    cache = cache if cache is not None else KernelCache()
    entry = cache.get(cache_key(source, _arch(cc), toolchain()))
    return entry.files["kernel.so"] if entry is not None and "kernel.so" in entry.files \
        else None


def cached(config: GemmConfig, dtype: str = "f16", layout: str = "tn", cc: int = 90,
           cache: KernelCache | None = None, epilogue: Epilogue | None = None
           ) -> BuildResult | None:
    """The kernel's library if it is in the kernel cache, else ``None``; never builds.

    Raises
    ------
    PycLabError
        When the source cannot be emitted or the toolchain is missing (no key).
    """
    cache = cache if cache is not None else KernelCache()
    source = emit_source(config, dtype, layout, cc, epilogue or Epilogue())
    key = cache_key(source, _arch(cc), toolchain())
    entry = cache.get(key)
    if entry is not None and "kernel.so" in entry.files:
        return BuildResult(config, key, entry.files["kernel.so"], "cached")
    return None


def build(config: GemmConfig, dtype: str = "f16", layout: str = "tn", cc: int = 90,
          cache: KernelCache | None = None, timeout_s: float = 600.0,
          epilogue: Epilogue | None = None) -> BuildResult:
    """Build one kernel (or take it from the cache); a failure is a result, not a raise."""
    epilogue = epilogue or Epilogue()
    try:
        source = emit_source(config, dtype, layout, cc, epilogue)
    except PycLabError as exc:
        return BuildResult(config, "", None, "compile_error", 0.0, str(exc))
    return build_source(config, source, cc, cache, timeout_s,
                        meta={"config": config.to_dict(), "dtype": dtype, "layout": layout,
                              "epilogue": epilogue.name})


def build_source(config: Any, source: str, cc: int = 90, cache: KernelCache | None = None,
                 timeout_s: float = 600.0, meta: dict[str, Any] | None = None) -> BuildResult:
    """Build one complete CUTLASS translation unit into the kernel cache (or take it from
    there): the one nvcc path of every CUTLASS kernel pyc_lab makes (GEMMs and
    convolutions); a failure is a result, not a raise."""
    cache = cache if cache is not None else KernelCache()
    arch = _arch(cc)
    try:
        key = cache_key(source, arch, toolchain())
    except PycLabError as exc:
        return BuildResult(config, "", None, "compile_error", 0.0, str(exc))
    entry = cache.get(key)
    if entry is not None and "kernel.so" in entry.files:
        return BuildResult(config, key, entry.files["kernel.so"], "cached")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pyc-cutlass-") as tmp:
        src = Path(tmp) / "kernel.cu"
        lib = Path(tmp) / "kernel.so"
        src.write_text(source)
        cmd = [nvcc_path(), *NVCC_FLAGS, f"-arch={arch}",
               *(f"-I{d}" for d in _include_dirs()), str(src), "-o", str(lib)]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                 check=False)
        except subprocess.TimeoutExpired:
            return BuildResult(config, key, None, "compile_error",
                               time.perf_counter() - t0, f"nvcc ran over {timeout_s:.0f} s")
        seconds = time.perf_counter() - t0
        if run.returncode != 0 or not lib.is_file():
            errors = [ln for ln in run.stderr.splitlines() if "error" in ln.lower()]
            message = "\n".join(errors[:8]) or run.stderr[-2000:]
            return BuildResult(config, key, None, "compile_error", seconds, message)
        entry = cache.put(key, {"kernel.so": lib, "kernel.cu": source},
                          meta={**(meta or {}), "arch": arch, "seconds": round(seconds, 1)})
    return BuildResult(config, key, entry.files["kernel.so"], "built", seconds)


def build_parallel(configs: Sequence[Any], build_one: Callable[[Any], BuildResult],
                   workers: int | None = None,
                   on_done: Callable[[BuildResult], None] | None = None,
                   name: str = "pyc-nvcc") -> dict[Any, cf.Future]:
    """Run ``build_one(config)`` for each configuration on ``workers`` threads (each runs
    one nvcc); a future per configuration, in the order given (the best-ranked first).

    An exception from ``build_one`` becomes a ``compile_error`` result; ``on_done(result)``
    is called from the worker thread as each build ends.
    """
    workers = workers or max(1, min(len(configs), os.cpu_count() or 1))
    pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def job(cfg: Any) -> BuildResult:
        try:
            res = build_one(cfg)
        except Exception as exc:
            res = BuildResult(cfg, "", None, "compile_error", 0.0,
                              f"{type(exc).__name__}: {exc}")
        if on_done is not None:
            try:
                on_done(res)
            except Exception:
                log.exception("build callback failed")
        return res

    futures = {cfg: pool.submit(job, cfg) for cfg in configs}
    pool.shutdown(wait=False)
    return futures


def build_many(configs: Sequence[GemmConfig], dtype: str = "f16", layout: str = "tn",
               cc: int = 90, workers: int | None = None, cache: KernelCache | None = None,
               on_done: Callable[[BuildResult], None] | None = None,
               epilogue: Epilogue | None = None) -> dict[GemmConfig, cf.Future]:
    """Start building ``configs`` on ``workers`` threads (each runs one nvcc); returns
    a future per configuration, in the order given (the best-ranked first).

    ``on_done(result)`` is called from the worker thread as each build ends.
    """
    cache = cache if cache is not None else KernelCache()
    return build_parallel(configs, lambda cfg: build(cfg, dtype, layout, cc, cache,
                                                      epilogue=epilogue),
                          workers, on_done)
