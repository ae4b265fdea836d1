"""Hardware facts: what the machine is and how it is wired (the ground every layer uses).

- :mod:`.profile` — :class:`HardwareProfile` (GPUs, links, NUMA nodes, host), JSON
  snapshots, frames for notebooks;
- :mod:`.detect` — :func:`detect_hardware`: the providers' reports merged, each value
  with where it came from; the shipped snapshots;
- :mod:`.providers` — NVML, the CUDA driver (cuda.core) and Linux sysfs, one module each;
- :mod:`.device` — the device gate: is a GPU usable here, and if not, the one reason why;
- :mod:`.peaks` — dense arithmetic peaks of known GPUs (for "% of peak");
- :mod:`.cpulist` — Linux CPU-list strings and masks.
"""

from .._lazy import lazy_face

_EXPORTS = {
    "GPUInfo": "profile", "HardwareProfile": "profile", "HostInfo": "profile",
    "LinkInfo": "profile", "NumaNode": "profile", "pcie_bandwidth_gbps": "profile",
    "detect_hardware": "detect", "list_snapshots": "detect", "merge_reports": "detect",
    "snapshot_path": "detect",
    "cupy_status": "device", "no_gpu_reason": "device", "require_cupy": "device",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
