"""Compiled kernels, cached in-process by the SHA-256 of their source, and on disk.

A generated source is compiled with NVRTC (through CuPy's NVRTC wrapper) into a cubin
for the current device, kept under ``cache_dir("nvrtc")`` by the digest of the source,
the options, the device's compute capability and NVRTC's version, and loaded as a
``cupy.RawModule``: a new process compiles nothing an earlier one already did. The
loaded modules are kept per (device, source digest), so every executable that generates
the same source shares one module. :data:`STATS` counts hits and misses.

The kernels are compiled with ``-ftz=false``: float32 subnormals are kept, as NumPy
keeps them. ``cupy.RawModule(code=...)`` always adds ``-ftz=true``, which flushes a
subnormal operand or result to zero — ``abs(5e-39)`` gives 0, ``fmod(x, 5e-39)`` NaN,
``arctan2(5e-39, 0)`` 0 instead of pi/2 — so the source is not given to it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from functools import cache
from pathlib import Path
from typing import Any

from ...errors import PycLabError
from ...paths import cache_dir, replacing
from .cuda_types import KernelSource

__all__ = ["OPTIONS", "STATS", "CompileError", "cache_stats", "clear_cache", "compile_kernel",
           "compile_module", "source_digest"]

log = logging.getLogger(__name__)

#: NVRTC options of every generated kernel: subnormals kept (see the module's note) and no
#: multiply-add contraction, so that every ``+``, ``-`` and ``*`` rounds as NumPy's ufunc
#: does (``a * b - a * b`` is 0, not ``a * b``'s rounding error); the math library's own
#: functions still use FMA inside, as they are written to.
OPTIONS: tuple[str, ...] = ("-std=c++17", "-ftz=false", "-fmad=false")

#: ``hits``: a module was already loaded; ``misses``: a module was created and compiled.
STATS: dict[str, int] = {"hits": 0, "misses": 0}

_MODULES: dict[tuple[int, str], Any] = {}
_LOCK = threading.Lock()
_COMPILE_LOCK = threading.Lock()


class CompileError(PycLabError):
    """NVRTC rejected a generated kernel (a code generator bug: please report it)."""


def source_digest(source: str) -> str:
    """SHA-256 of a kernel source and the compile options: the cache key."""
    return hashlib.sha256((source + "\0" + " ".join(OPTIONS)).encode()).hexdigest()


def compile_module(source: str, label: str = "kernel") -> Any:
    """The ``cupy.RawModule`` of ``source`` on the current device (compiled once).

    The module is compiled here (not lazily at the first launch), so a broken source
    fails now, with NVRTC's log in a :class:`CompileError`.
    """
    import cupy

    from ...hardware.device import require_cupy

    require_cupy("compiling generated kernels")
    key = (int(cupy.cuda.runtime.getDevice()), source_digest(source))
    with _LOCK:
        module = _MODULES.get(key)
        if module is not None:
            STATS["hits"] += 1
            return module
        STATS["misses"] += 1
    with _COMPILE_LOCK:  # one compile and one cache write of a source at a time
        path = _cubin(cupy, source, key[1], label)
    module = cupy.RawModule(path=str(path))
    with _LOCK:
        _MODULES.setdefault(key, module)
        module = _MODULES[key]
    log.debug("compiled %s (%s...)", label, key[1][:12])
    return module


def _cubin(cupy: Any, source: str, digest: str, label: str) -> Path:
    """The file of ``source``'s cubin (or PTX, where NVRTC does not know the device's
    architecture) for the current device: from the disk cache, else compiled now and
    stored there (in a folder of this process's own when the cache cannot be written)."""
    arch = str(cupy.cuda.Device().compute_capability)
    major, minor = cupy.cuda.nvrtc.getVersion()
    name = f"{digest}-sm{arch}-nvrtc{major}.{minor}.bin"
    try:
        folder = cache_dir("nvrtc")
    except OSError as exc:
        log.info("the kernel cache folder cannot be made (%s); compiling in memory", exc)
        folder = _scratch()
    path = folder / name
    if path.is_file():
        return path
    from cupy.cuda import compiler

    try:
        binary, _mapping = compiler.compile_using_nvrtc(source, OPTIONS, arch)
    except Exception as exc:
        raise CompileError(f"{label}: NVRTC failed on the generated source: {exc}") \
            from exc
    try:
        with replacing(path, "store a compiled kernel") as tmp:
            tmp.write_bytes(binary)
    except (OSError, PycLabError) as exc:
        log.info("cannot store the compiled kernel in %s (%s); keeping it for this "
                 "process only", folder, exc)
        path = _scratch() / name
        path.write_bytes(binary)
    return path


@cache
def _scratch() -> Path:
    """A folder of this process's own for cubins the cache folder could not take (the
    module loads from its file)."""
    return Path(tempfile.mkdtemp(prefix=f"pyc-nvrtc-{os.getpid()}-"))


def compile_kernel(src: KernelSource, name: str | None = None) -> Any:
    """The compiled kernel ``name`` (default ``src.name``) of ``src``: a ``cupy.RawKernel``.

    Raises
    ------
    CompileError
        When NVRTC rejects the source or the kernel is not in it.
    """
    entry = name or src.name
    if entry not in src.entries:
        raise CompileError(f"{src.name}: no kernel {entry!r} in the source "
                           f"(it defines {', '.join(src.entries)})")
    module = compile_module(src.source, src.name)
    try:
        return module.get_function(entry)
    except Exception as exc:
        raise CompileError(f"{src.name}: could not load kernel {entry!r}: {exc}") from exc


def cache_stats() -> dict[str, int]:
    """A copy of :data:`STATS` plus the number of cached modules."""
    with _LOCK:
        return {**STATS, "modules": len(_MODULES)}


def clear_cache() -> None:
    """Forget every cached module and reset the counters."""
    with _LOCK:
        _MODULES.clear()
        STATS["hits"] = 0
        STATS["misses"] = 0
