"""Compiled kernels, cached in-process by the SHA-256 of their source.

``cupy.RawModule(code=src, options=("-std=c++17",))`` compiles with NVRTC the first
time a function is taken from it; CuPy also keeps the binary in its on-disk cache, so
a new process compiles nothing that an earlier one already did. Here the loaded
modules are kept per (device, source digest), so every executable that generates the
same source shares one module. :data:`STATS` counts hits and misses.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

from ...errors import PycLabError
from .cuda_types import KernelSource

__all__ = ["OPTIONS", "STATS", "CompileError", "cache_stats", "clear_cache", "compile_kernel",
           "compile_module", "source_digest"]

log = logging.getLogger(__name__)

#: NVRTC options of every generated kernel.
OPTIONS: tuple[str, ...] = ("-std=c++17",)

#: ``hits``: a module was already loaded; ``misses``: a module was created and compiled.
STATS: dict[str, int] = {"hits": 0, "misses": 0}

_MODULES: dict[tuple[int, str], Any] = {}
_LOCK = threading.Lock()


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
    module = cupy.RawModule(code=source, options=OPTIONS)
    if hasattr(module, "compile"):  # older CuPy compiles at the first get_function
        try:
            module.compile()
        except Exception as exc:
            raise CompileError(f"{label}: NVRTC failed on the generated source: {exc}") \
                from exc
    with _LOCK:
        _MODULES.setdefault(key, module)
        module = _MODULES[key]
    log.debug("compiled %s (%s...)", label, key[1][:12])
    return module


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
