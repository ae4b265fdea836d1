"""Is a CUDA device usable from CuPy here, and if not, why not.

Every GPU-only feature asks :func:`cupy_status` first, so that "no driver", "no CuPy"
and "no device" all become one clear message instead of a raw CUDA error.
"""

from __future__ import annotations

from types import ModuleType

from ..errors import DeviceUnavailableError

__all__ = ["cupy_status", "require_cupy"]


def cupy_status() -> tuple[ModuleType | None, str]:
    """Return ``(cupy, "ok")`` when CuPy can use a CUDA device, else ``(None, reason)``."""
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed (pip install 'pyc-lab[gpu]')"
    except Exception as exc:  # a broken CuPy install raises odd things on import
        return None, f"CuPy failed to import: {type(exc).__name__}: {exc}"
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: insufficient driver, no device
        return None, f"CUDA runtime: {exc}"
    if n == 0:
        return None, "the CUDA runtime reports 0 devices"
    return cupy, "ok"


def require_cupy(feature: str) -> ModuleType:
    """Return CuPy, or raise :class:`DeviceUnavailableError` naming ``feature`` and why."""
    cp, reason = cupy_status()
    if cp is None:
        raise DeviceUnavailableError(
            f"{feature} needs a CUDA device: {reason}. Run it on a GPU machine, or use the "
            "CPU path where one is offered."
        )
    return cp
