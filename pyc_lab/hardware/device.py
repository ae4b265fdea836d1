"""The device gate: is a GPU usable here, and if not, the one reason why.

Every GPU feature (the hardware profile, the bandwidth probe, GPU activity traces, the
compiler's cupy backend, the tuner, the belt, the test suite's skips) asks this module,
so that a machine without a GPU gets one plain answer everywhere instead of each
library's own error text. The answer is decided from three facts, checked in order:

1. can the NVIDIA driver's library (``libcuda.so.1``) be loaded?
2. does the driver start and report a GPU (``cuInit``, ``cuDeviceGetCount``)?
3. for CuPy-based features: is CuPy installed, and can it use the GPU?

The facts are gathered once per process (:func:`driver_facts`, :func:`cupy_facts`; both
are cached, ``.cache_clear()`` forgets them) and turned into a reason by
:func:`explain`, a pure function, so that every combination can be tested with faked
facts. The reasons read:

- ``no NVIDIA driver on this machine (libcuda not found)``
- ``the NVIDIA driver did not start (cuInit: CUDA_ERROR_...)``
- ``the NVIDIA driver reports no GPU``
- ``CuPy is not installed (pip install 'pyc-lab[gpu]')``
- ``CuPy failed to import (...)``
- ``the NVIDIA driver supports CUDA x.y but CuPy needs CUDA a.b: ...``
- ``CuPy cannot use the GPU (...)``
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

from ..errors import DeviceUnavailableError

__all__ = [
    "CupyFacts",
    "DriverFacts",
    "cupy_facts",
    "cupy_status",
    "driver_facts",
    "explain",
    "no_gpu_reason",
    "require_cupy",
]

#: The reason when the driver library cannot be loaded.
NO_DRIVER = "no NVIDIA driver on this machine (libcuda not found)"
#: The reason when the driver loads but reports no device.
NO_GPU = "the NVIDIA driver reports no GPU"
#: The reason when CuPy cannot be imported because it is not installed.
NO_CUPY = "CuPy is not installed (pip install 'pyc-lab[gpu]')"

_LIBCUDA = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
_CUDA_ERROR_NO_DEVICE = 100


@dataclass(frozen=True)
class DriverFacts:
    """What the NVIDIA driver says, asked through ``libcuda`` directly (no CUDA context).

    Attributes
    ----------
    libcuda
        Whether ``libcuda.so.1`` (``nvcuda.dll`` on Windows) could be loaded.
    init_error
        ``cuInit``'s error name when it failed for another reason than "no device"
        (``""`` otherwise).
    device_count
        GPUs the driver reports (0 when it reports none or could not say).
    cuda_version
        The newest CUDA version the driver supports (``"13.0"``), when it says.
    """

    libcuda: bool
    init_error: str = ""
    device_count: int = 0
    cuda_version: str | None = None


@dataclass(frozen=True)
class CupyFacts:
    """What CuPy says about the GPU.

    Attributes
    ----------
    installed
        Whether ``import cupy`` found a package (a broken one counts as installed).
    import_error
        Why ``import cupy`` failed although the package is there (``""`` otherwise).
    runtime_error
        Why CuPy's device query failed (``""`` when it answered).
    device_count
        GPUs CuPy sees.
    cuda_version
        The CUDA runtime version CuPy was built for (``"13.0"``), when known.
    """

    installed: bool
    import_error: str = ""
    runtime_error: str = ""
    device_count: int = 0
    cuda_version: str | None = None


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode(errors="replace")
    except (AttributeError, OSError):
        pass
    return f"CUresult {code}"


@lru_cache(maxsize=1)
def driver_facts() -> DriverFacts:
    """Ask the NVIDIA driver, once per process, whether it is there and how many GPUs it has.

    Loads ``libcuda`` with :mod:`ctypes` and calls ``cuInit``, ``cuDriverGetVersion`` and
    ``cuDeviceGetCount``: no GPU library needs to be installed, and no CUDA context is
    created.
    """
    try:
        lib = ctypes.CDLL(_LIBCUDA)
    except OSError:
        return DriverFacts(libcuda=False)
    version = ctypes.c_int(0)
    try:
        cuda_version = (_version(version.value)
                        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value
                        else None)
        code = int(lib.cuInit(0))
        if code == _CUDA_ERROR_NO_DEVICE:
            return DriverFacts(libcuda=True, cuda_version=cuda_version)
        if code != 0:
            return DriverFacts(libcuda=True, init_error=_error_name(lib, code),
                               cuda_version=cuda_version)
        count = ctypes.c_int(0)
        code = int(lib.cuDeviceGetCount(ctypes.byref(count)))
    except (AttributeError, OSError) as exc:  # a libcuda without the entry points
        return DriverFacts(libcuda=True, init_error=f"{type(exc).__name__}: {exc}")
    if code != 0:
        return DriverFacts(libcuda=True, init_error=_error_name(lib, code),
                           cuda_version=cuda_version)
    return DriverFacts(libcuda=True, device_count=count.value, cuda_version=cuda_version)


@lru_cache(maxsize=1)
def cupy_facts() -> CupyFacts:
    """Import CuPy and ask it for the device count, once per process."""
    try:
        import cupy
    except ImportError as exc:
        if getattr(exc, "name", None) == "cupy" or "No module named 'cupy'" in str(exc):
            return CupyFacts(installed=False)
        return CupyFacts(installed=True, import_error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a broken CuPy install raises odd things on import
        return CupyFacts(installed=True, import_error=f"{type(exc).__name__}: {exc}")
    try:
        runtime = _version(int(cupy.cuda.runtime.runtimeGetVersion()))
    except Exception:  # only used to explain a version mismatch
        runtime = None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: insufficient driver, no device
        return CupyFacts(installed=True, runtime_error=str(exc) or type(exc).__name__,
                         cuda_version=runtime)
    return CupyFacts(installed=True, device_count=count, cuda_version=runtime)


def explain(driver: DriverFacts, cupy: CupyFacts | None = None) -> str | None:
    """The one reason no GPU is usable, from the facts; ``None`` when one is.

    Parameters
    ----------
    driver
        What the NVIDIA driver said.
    cupy
        What CuPy said, for features that run through CuPy; ``None`` for those that only
        need the driver (the hardware profile).

    Returns
    -------
    str or None
        The reason, written for a user (see the module's docstring for the list).
    """
    if not driver.libcuda:
        return NO_DRIVER
    if driver.init_error:
        return f"the NVIDIA driver did not start (cuInit: {driver.init_error})"
    if driver.device_count < 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return NO_GPU if visible is None else f"{NO_GPU} (CUDA_VISIBLE_DEVICES={visible!r})"
    if cupy is None:
        return None
    if not cupy.installed:
        return NO_CUPY
    if cupy.import_error:
        return (f"CuPy failed to import ({cupy.import_error}); reinstall it "
                "(pip install 'pyc-lab[gpu]')")
    if cupy.runtime_error:
        if "InsufficientDriver" in cupy.runtime_error and driver.cuda_version:
            needs = f"CUDA {cupy.cuda_version}" if cupy.cuda_version else "a newer CUDA"
            major = driver.cuda_version.split(".")[0]
            return (f"the NVIDIA driver supports CUDA {driver.cuda_version} but CuPy needs "
                    f"{needs}: upgrade the driver, or install the CuPy built for CUDA "
                    f"{major} (cupy-cuda{major}x)")
        return f"CuPy cannot use the GPU ({cupy.runtime_error})"
    if cupy.device_count < 1:
        return f"{NO_GPU} to CuPy"
    return None


def no_gpu_reason(*, need_cupy: bool = True) -> str | None:
    """Why no GPU is usable in this process, or ``None`` when one is.

    Parameters
    ----------
    need_cupy
        ``True`` (the default) for features that run through CuPy; ``False`` for those
        that only need the driver (the hardware profile), so that CuPy is not imported.

    The facts behind the answer are gathered once per process.
    """
    driver = driver_facts()
    reason = explain(driver)
    if reason is not None or not need_cupy:
        return reason
    return explain(driver, cupy_facts())


def cupy_status() -> tuple[ModuleType | None, str]:
    """Return ``(cupy, "ok")`` when CuPy can use a GPU, else ``(None, reason)``.

    ``reason`` is :func:`no_gpu_reason`'s.
    """
    reason = no_gpu_reason()
    if reason is not None:
        return None, reason
    import cupy

    return cupy, "ok"


def require_cupy(feature: str) -> ModuleType:
    """Return CuPy, or raise :class:`DeviceUnavailableError` naming ``feature`` and why.

    Raises
    ------
    DeviceUnavailableError
        ``"<feature> needs a CUDA device: <reason>."``, with what to do when the reason
        does not already say it.
    """
    cp, reason = cupy_status()
    if cp is None:
        advice = ("" if "pip install" in reason or "upgrade" in reason else
                  " Run it on a GPU machine, or use the CPU path where one is offered.")
        raise DeviceUnavailableError(f"{feature} needs a CUDA device: {reason}.{advice}")
    return cp
