"""Runtime facts and machinery: topology, bandwidth probes, pinned pools, the pipeline, traces.

Nothing here imports a GPU library at import time; each function that needs one
imports it when called and raises :class:`~pyc_lab.errors.DeviceUnavailableError` (or
falls back to the CPU, where the docstring says so) when it is missing.
"""

from .activity import GpuActivity
from .bandwidth import probe_bandwidth
from .belt_tuning import BeltSweep, tune_pipeline
from .dispatcher import Dispatcher
from .pinned import PinnedBuffer, PinnedPool, parse_numa_maps, size_class
from .pipeline import Pipeline, PipelineError, last_pipeline
from .profile import GPUInfo, HardwareProfile, HostInfo, LinkInfo, NumaNode, pcie_bandwidth_gbps
from .topology import detect_hardware, list_snapshots, merge_reports, snapshot_path
from .trace import CudaEventClock, OverlapReport, Span, Trace, nvtx_range

__all__ = [
    "BeltSweep",
    "CudaEventClock",
    "Dispatcher",
    "GPUInfo",
    "GpuActivity",
    "HardwareProfile",
    "HostInfo",
    "LinkInfo",
    "NumaNode",
    "OverlapReport",
    "PinnedBuffer",
    "PinnedPool",
    "Pipeline",
    "PipelineError",
    "Span",
    "Trace",
    "detect_hardware",
    "last_pipeline",
    "list_snapshots",
    "merge_reports",
    "nvtx_range",
    "parse_numa_maps",
    "pcie_bandwidth_gbps",
    "probe_bandwidth",
    "size_class",
    "snapshot_path",
    "tune_pipeline",
]
