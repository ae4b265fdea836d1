"""Topology facts from NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

NVML knows the most: clocks, PCIe links, NUMA and CPU affinity, MIG mode, NVLink state
per link and the PCIe common ancestor of two GPUs. Each query is asked on its own, so a
``NotSupported`` (seen for the NUMA node on virtual machines) loses only that value.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from types import ModuleType
from typing import Any

from ..cpulist import cpumask_to_list
from .base import Fact, Missing, ProviderReport, guarded, normalize_bus_id

__all__ = ["collect_nvml"]

NAME = "nvml"

#: NVML common-ancestor levels to ``nvidia-smi topo -m`` words.
_ANCESTOR_KIND = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

#: ``nvmlNvlinkVersion_t`` values to the NVLink generation they name.
_NVLINK_ENUM_TO_GEN = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _is_not_supported(exc: BaseException) -> bool:
    return "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc)


def collect_nvml(nvml: ModuleType | Any | None = None) -> ProviderReport:
    """Ask NVML about every GPU and every pair of GPUs.

    Parameters
    ----------
    nvml
        The ``pynvml`` module, or anything with the same functions. Imported when
        ``None``.

    Returns
    -------
    ProviderReport
        Unavailable (with the reason) when NVML cannot be imported or initialised.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return ProviderReport.unavailable(
                NAME, "nvidia-ml-py is not installed (pip install 'pyc-lab[gpu]')"
            )
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return ProviderReport.unavailable(NAME, f"{type(exc).__name__}: {exc}")
    try:
        return _collect(nvml)
    finally:
        with contextlib.suppress(Exception):  # shutting down is best effort
            nvml.nvmlShutdown()


def _collect(nvml: Any) -> ProviderReport:
    report = ProviderReport(name=NAME)
    guarded(report.system, "driver_version", NAME,
            lambda: _text(nvml.nvmlSystemGetDriverVersion()))

    def cuda_version() -> str:
        v = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
        return f"{v // 1000}.{v % 1000 // 10}"

    guarded(report.system, "cuda_driver_version", NAME, cuda_version)
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        return ProviderReport.unavailable(NAME, f"nvmlDeviceGetCount failed: {exc}")

    handles = []
    nvlink_peers: list[Counter] = []
    switch_links: list[int] = []
    n_words = max(1, math.ceil((os.cpu_count() or 1) / 64))
    for i in range(count):
        g: dict[str, Fact | Missing] = {"index": Fact(i, NAME)}
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
        except Exception as exc:  # e.g. NVML_ERROR_NO_PERMISSION for a GPU in no cgroup
            g["pci_bus_id"] = Missing(f"cannot open GPU {i}: {exc}", NAME)
            handles.append(None)
            nvlink_peers.append(Counter())
            switch_links.append(0)
            report.gpus.append(g)
            continue
        handles.append(h)
        guarded(g, "pci_bus_id", NAME,
                lambda h=h: normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(h).busId)))
        guarded(g, "name", NAME, lambda h=h: _text(nvml.nvmlDeviceGetName(h)))
        guarded(g, "uuid", NAME, lambda h=h: _text(nvml.nvmlDeviceGetUUID(h)))
        guarded(g, "compute_capability", NAME,
                lambda h=h: "{}.{}".format(*nvml.nvmlDeviceGetCudaComputeCapability(h)))
        guarded(g, "memory_total_bytes", NAME,
                lambda h=h: int(nvml.nvmlDeviceGetMemoryInfo(h).total))
        guarded(g, "memory_free_bytes", NAME,
                lambda h=h: int(nvml.nvmlDeviceGetMemoryInfo(h).free))
        guarded(g, "memory_bus_width_bits", NAME,
                lambda h=h: int(nvml.nvmlDeviceGetMemoryBusWidth(h)))
        for field, fn, clock in (
            ("clock_sm_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
            ("clock_sm_max_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
            ("clock_mem_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
            ("clock_mem_max_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"),
        ):
            guarded(g, field, NAME,
                    lambda h=h, fn=fn, clock=clock: int(getattr(nvml, fn)(h, getattr(nvml, clock))))
        for field, fn in (
            ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            guarded(g, field, NAME, lambda h=h, fn=fn: int(getattr(nvml, fn)(h)))

        def numa(h=h) -> int | Missing:
            node = int(nvml.nvmlDeviceGetNumaNodeId(h))
            return node if node >= 0 else Missing(f"NUMA node reported as {node}", NAME)

        guarded(g, "numa_node", NAME, numa)
        guarded(g, "cpu_affinity", NAME,
                lambda h=h: cpumask_to_list(nvml.nvmlDeviceGetCpuAffinity(h, n_words)) or None)

        def mig(h=h) -> str:
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(h)
            except Exception as exc:
                if _is_not_supported(exc):
                    return "not supported"
                raise
            return "enabled" if int(current) else "disabled"

        guarded(g, "mig_mode", NAME, mig)
        peers, switches, version = _nvlinks(nvml, h)
        nvlink_peers.append(peers)
        switch_links.append(switches)
        if version is not None:
            g["nvlink_version"] = Fact(version, NAME)
        else:
            g["nvlink_version"] = Missing("no active NVLink", NAME)
        report.gpus.append(g)

    for i in range(count):
        for j in range(i + 1, count):
            bi = report.gpus[i].get("pci_bus_id")
            bj = report.gpus[j].get("pci_bus_id")
            if not isinstance(bi, Fact) or not isinstance(bj, Fact):
                continue
            link: dict[str, Fact | Missing] = {}
            n = nvlink_peers[i].get(bj.value, 0)
            if switch_links[i] and switch_links[j]:
                n += min(switch_links[i], switch_links[j])
            link["nvlinks"] = Fact(n, NAME)
            if n:
                link["kind"] = Fact(f"NV{n}", NAME)
            else:
                def ancestor(i=i, j=j) -> str:
                    level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                    return _ANCESTOR_KIND.get(level, "SYS")

                guarded(link, "kind", NAME, ancestor)

            def p2p(i=i, j=j) -> bool:
                index = nvml.NVML_P2P_CAPS_INDEX_READ
                if isinstance(index, tuple):  # pynvml defines it as `= 0,` (a tuple)
                    index = index[0]
                status = nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], index)
                return int(status) == int(getattr(nvml, "NVML_P2P_STATUS_OK", 0))

            guarded(link, "p2p", NAME, p2p)
            report.links[(bi.value, bj.value)] = link
    return report


def _nvlinks(nvml: Any, handle: Any) -> tuple[Counter, int, int | None]:
    """Count active NVLinks by remote GPU bus id, links into NVSwitches, and the version."""
    peers: Counter = Counter()
    switches = 0
    version = None
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    for link in range(max_links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:
            continue  # NotSupported / InvalidArgument: no such link on this GPU
        if int(state) != int(getattr(nvml, "NVML_FEATURE_ENABLED", 1)):
            continue
        try:
            kind = int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        except Exception:
            kind = int(getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0))
        if version is None:
            try:
                raw = int(nvml.nvmlDeviceGetNvLinkVersion(handle, link))
                version = _NVLINK_ENUM_TO_GEN.get(raw)
            except Exception:
                pass
        if kind == int(getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)):
            switches += 1
            continue
        try:
            remote = normalize_bus_id(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(
                handle, link).busId))
        except Exception:
            continue
        if remote:
            peers[remote] += 1
    return peers, switches, version
