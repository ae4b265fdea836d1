"""NVTX ranges: name a block of work for Nsight Systems, through whichever binding exists."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

__all__ = ["nvtx_range"]

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _nvtx_backend() -> tuple[str, Any]:
    """``("nvtx", module)``, ``("cupy", cupy.cuda.nvtx)`` or ``("none", None)``."""
    try:
        import nvtx

        return "nvtx", nvtx
    except Exception:  # missing, or a broken install: fall through
        pass
    try:
        from ..hardware.device import cupy_status

        cp, _reason = cupy_status()
        if cp is not None:
            return "cupy", cp.cuda.nvtx
    except Exception as exc:
        log.debug("no NVTX through CuPy: %s", exc)
    return "none", None


@contextlib.contextmanager
def nvtx_range(name: str, *, domain: str = "pyc_lab") -> Iterator[None]:
    """An NVTX range around the block so that Nsight Systems shows it; never raises.

    Uses the ``nvtx`` package when importable, else ``cupy.cuda.nvtx`` when CuPy has a
    device, else does nothing. Errors from the NVTX binding itself are logged and
    swallowed; errors from the block propagate unchanged.
    """
    kind, mod = _nvtx_backend()
    pushed = False
    try:
        if kind == "nvtx":
            mod.push_range(message=name, domain=domain)
            pushed = True
        elif kind == "cupy":
            mod.RangePush(name)
            pushed = True
    except Exception as exc:
        log.debug("NVTX push failed for %r: %s", name, exc)
    try:
        yield
    finally:
        if pushed:
            try:
                if kind == "nvtx":
                    mod.pop_range(domain=domain)
                else:
                    mod.RangePop()
            except Exception as exc:
                log.debug("NVTX pop failed for %r: %s", name, exc)
