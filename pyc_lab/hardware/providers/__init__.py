"""Topology providers, in fallback-chain order: NVML, CUDA driver, sysfs/psutil/py-cpuinfo.

Each provider returns a :class:`~pyc_lab.hardware.providers.base.ProviderReport` of
facts (value + source) and missing values (reason + source); it never raises because a
GPU, a library or a driver is absent.
"""

from .base import Fact, Missing, ProviderReport, normalize_bus_id
from .cuda import collect_cuda
from .nvml import collect_nvml
from .sysfs import collect_sysfs

__all__ = [
    "Fact",
    "Missing",
    "ProviderReport",
    "collect_cuda",
    "collect_nvml",
    "collect_sysfs",
    "normalize_bus_id",
]
