"""Topology facts from the CUDA driver, through ``cuda.core`` and ``cuda-bindings``.

CUDA gives the device ordinals users index with, SM counts, the host NUMA node closest
to each GPU (``host_numa_id``; on a virtual machine it can say 0 where sysfs says -1
and NVML says NotSupported) and peer-to-peer capability. It creates no CUDA context: every
value here is a device attribute.
"""

from __future__ import annotations

from typing import Any

from .base import Fact, Missing, ProviderReport, guarded, normalize_bus_id

__all__ = ["collect_cuda"]

NAME = "cuda.core"
BINDINGS = "cuda-bindings"


def collect_cuda(core: Any | None = None, driver: Any | None = None) -> ProviderReport:
    """Ask the CUDA driver about every device and every pair of devices.

    Parameters
    ----------
    core
        The ``cuda.core`` module or a stand-in exposing ``Device``. Imported when
        ``None``.
    driver
        The ``cuda.bindings.driver`` module (for total memory and the driver version),
        or ``None`` to import it; its absence only loses those values.

    Returns
    -------
    ProviderReport
        Unavailable, with the reason, when cuda.core is missing or no driver loads.
    """
    if core is None:
        try:
            import cuda.core as core  # type: ignore[no-redef]
        except ImportError:
            return ProviderReport.unavailable(
                NAME, "cuda-core is not installed (pip install 'pyc-lab[gpu]')"
            )
    if driver is None:
        try:
            from cuda.bindings import driver  # type: ignore[no-redef]
        except ImportError:
            driver = None
    try:
        devices = list(core.Device.get_all_devices())
    except Exception as exc:
        return ProviderReport.unavailable(NAME, f"{type(exc).__name__}: {exc}")
    if not devices:
        return ProviderReport.unavailable(NAME, "the CUDA driver reports 0 devices")

    report = ProviderReport(name=NAME)
    if driver is not None:
        def version() -> str:
            err, v = driver.cuDriverGetVersion()
            _check(err, "cuDriverGetVersion")
            return f"{v // 1000}.{v % 1000 // 10}"

        guarded(report.system, "cuda_driver_version", BINDINGS, version)

    for dev in devices:
        g: dict[str, Fact | Missing] = {}
        guarded(g, "index", NAME, lambda d=dev: int(d.device_id))
        guarded(g, "pci_bus_id", NAME, lambda d=dev: normalize_bus_id(d.pci_bus_id))
        guarded(g, "name", NAME, lambda d=dev: str(d.name))
        guarded(g, "uuid", NAME, lambda d=dev: _uuid(str(d.uuid)))
        guarded(g, "compute_capability", NAME,
                lambda d=dev: "{}.{}".format(*tuple(d.compute_capability)))
        guarded(g, "sm_count", NAME, lambda d=dev: int(d.properties.multiprocessor_count))
        guarded(g, "memory_bus_width_bits", NAME,
                lambda d=dev: int(d.properties.global_memory_bus_width) or None)
        guarded(g, "clock_sm_max_mhz", NAME,
                lambda d=dev: int(d.properties.clock_rate) // 1000 or None)
        guarded(g, "clock_mem_max_mhz", NAME,
                lambda d=dev: int(d.properties.memory_clock_rate) // 1000 or None)

        def numa(d=dev) -> int | Missing:
            node = int(d.properties.host_numa_id)
            return node if node >= 0 else Missing(f"host_numa_id is {node}", NAME)

        guarded(g, "numa_node", NAME, numa)
        if driver is not None:
            def total(d=dev) -> int:
                err, dev_handle = driver.cuDeviceGet(int(d.device_id))
                _check(err, "cuDeviceGet")
                err, nbytes = driver.cuDeviceTotalMem(dev_handle)
                _check(err, "cuDeviceTotalMem")
                return int(nbytes)

            guarded(g, "memory_total_bytes", BINDINGS, total)
        report.gpus.append(g)

    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            ba = report.gpus[i].get("pci_bus_id")
            bb = report.gpus[devices.index(b)].get("pci_bus_id")
            if not isinstance(ba, Fact) or not isinstance(bb, Fact):
                continue
            link: dict[str, Fact | Missing] = {}
            guarded(link, "p2p", NAME,
                    lambda a=a, b=b: bool(a.can_access_peer(b)) and bool(b.can_access_peer(a)))
            report.links[(ba.value, bb.value)] = link
    return report


def _uuid(text: str) -> str:
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _check(err: Any, what: str) -> None:
    if int(err) != 0:
        raise RuntimeError(f"{what} returned {err!r}")
