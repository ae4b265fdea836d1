"""Compiled kernels, cached in-process by the SHA-256 of their source, and on disk.

A generated source is compiled by :mod:`pyc_lab.kernels.nvrtc` into a cubin for the
current device, kept under ``cache_dir("nvrtc")`` by the digest of the source, the
options, the device's compute capability and NVRTC's version, and loaded as a
``cupy.RawModule``: a new process compiles nothing an earlier one already did. The
loaded modules are kept per (device, source digest), so every executable that generates
the same source shares one module. :data:`STATS` counts hits and misses.

The kernels are compiled with ``-ftz=false``: float32 subnormals are kept, as NumPy
keeps them. ``cupy.RawModule(code=...)`` always adds ``-ftz=true``, which flushes a
subnormal operand or result to zero — ``abs(5e-39)`` gives 0, ``fmod(x, 5e-39)`` NaN,
``arctan2(5e-39, 0)`` 0 instead of pi/2 — so the source is not given to it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ...errors import PycLabError
from ...kernels import nvrtc
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


class CompileError(PycLabError):
    """NVRTC rejected a generated kernel (a code generator bug: please report it)."""


def source_digest(source: str) -> str:
    """SHA-256 of a kernel source and the compile options: the cache key."""
    return nvrtc.nvrtc_digest(source, OPTIONS)


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
    try:
        module = nvrtc.compile_module(source, OPTIONS, label=label).module
    except nvrtc.NvrtcError as exc:
        raise CompileError(str(exc)) from exc
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
