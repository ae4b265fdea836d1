"""``detect_hardware()``: merge the providers' answers into one HardwareProfile.

The providers run in a fallback chain — NVML, then the CUDA driver (cuda.core /
cuda-bindings), then Linux sysfs with psutil and py-cpuinfo — and, for every value, the
first provider that knows it wins. Each value records its source and, in ``fallbacks``,
why every other provider had no answer, e.g. on a virtual machine::

    numa_node = 0  from cuda.core   (nvml: NotSupported; sysfs: numa_node is -1)

A JSON snapshot replaces the live chain: ``detect_hardware(snapshot="dgx-h100")``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from ..errors import SnapshotError
from .profile import _GPU_FIELDS as PROFILE_GPU_FIELDS
from .profile import GPUInfo, HardwareProfile, HostInfo, LinkInfo, NumaNode
from .providers.base import Fact, Missing, ProviderReport, normalize_bus_id

__all__ = ["detect_hardware", "gate_reason", "list_snapshots", "merge_reports",
           "snapshot_path"]

log = logging.getLogger(__name__)

_GPU_FIELDS = [f for f in PROFILE_GPU_FIELDS if f != "index"]
_HOST_FIELDS = [
    f.name for f in dataclasses.fields(HostInfo) if f.name not in ("sources", "fallbacks")
]


def list_snapshots() -> list[str]:
    """Names of the hardware snapshots shipped with pyc_lab (``"h200"``, ``"dgx-h100"``)."""
    folder = resources.files("pyc_lab") / "data" / "snapshots"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def snapshot_path(name_or_path: str | Path) -> Path:
    """Resolve a shipped snapshot name or a file path to a path.

    Raises
    ------
    SnapshotError
        If it is neither an existing file nor a shipped snapshot name.
    """
    if not isinstance(name_or_path, (str, Path)):
        raise SnapshotError(f"a hardware snapshot is a file path or a shipped name such as "
                            f"'h200', not {type(name_or_path).__name__} {name_or_path!r}")
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = str(name_or_path)
    if name and "/" not in name and "\\" not in name and name not in (".", ".."):
        # only a plain name can be a shipped snapshot: "../x" never leaves the folder
        shipped = resources.files("pyc_lab") / "data" / "snapshots" / f"{name}.json"
        if shipped.is_file():
            return Path(str(shipped))
    raise SnapshotError(
        f"no hardware snapshot {str(name_or_path)!r}: not a file, and not one of the shipped "
        f"snapshots {list_snapshots()}"
    )


def detect_hardware(
    snapshot: str | Path | None = None,
    *,
    providers: Sequence[ProviderReport] | None = None,
) -> HardwareProfile:
    """Describe this machine's CPUs, NUMA nodes, GPUs and GPU links.

    Never raises for a missing GPU or GPU library: the profile then holds the host facts
    and ``cuda_status`` says ``"no CUDA device: <reason>"``, with the device gate's reason
    (:func:`pyc_lab.hardware.device.no_gpu_reason`), e.g. ``"no CUDA device: no NVIDIA
    driver on this machine (libcuda not found)"``.

    Parameters
    ----------
    snapshot
        A shipped snapshot name (see :func:`list_snapshots`) or the path of a JSON file
        written by :meth:`HardwareProfile.to_json`. When given, nothing is probed.
    providers
        Reports to merge instead of probing (tests pass fakes). Chain order is list order.

    Returns
    -------
    HardwareProfile

    Raises
    ------
    SnapshotError
        Only when ``snapshot`` is given and cannot be read.

    Examples
    --------
    >>> hw = detect_hardware(snapshot="dgx-h100")
    >>> len(hw.gpus), hw.link(0, 7).kind
    (8, 'NV18')
    """
    if snapshot is not None:
        path = snapshot_path(snapshot)
        profile = HardwareProfile.from_json(path)
        profile.origin = f"snapshot {path.name}"
        return profile
    if providers is None:
        providers = _probe()
    return merge_reports(providers)


def _probe() -> list[ProviderReport]:
    from .providers.cuda import collect_cuda
    from .providers.nvml import collect_nvml
    from .providers.sysfs import collect_sysfs

    reports = [collect_nvml(), collect_cuda()]
    bus_ids: list[str] = []
    for r in reports:
        for g in r.gpus:
            b = g.get("pci_bus_id")
            if isinstance(b, Fact) and b.value not in bus_ids:
                bus_ids.append(b.value)
    reports.append(collect_sysfs("/", bus_ids))
    if not bus_ids:
        from .device import no_gpu_reason

        gate_reason(reports, no_gpu_reason(need_cupy=False))
    for r in reports:
        log.debug("provider %s: %s%s", r.name, r.status, f" ({r.detail})" if r.detail else "")
    return reports


def gate_reason(reports: Sequence[ProviderReport], reason: str | None) -> None:
    """Make the device gate's ``reason`` the headline of every unavailable provider.

    When no provider found a GPU, the gate (:mod:`pyc_lab.hardware.device`) knows why in
    plain words ("no NVIDIA driver on this machine (libcuda not found)"); each provider's
    own error text (``NVMLError_LibraryNotFound``, ...) moves to its ``detail``, which the
    profile keeps in ``provider_details`` and shows in ``sources_frame()``. Nothing
    changes when ``reason`` is ``None`` (the driver reports a GPU).
    """
    if reason is None:
        return
    for r in reports:
        if not r.available and r.reason != reason:
            r.detail = r.detail or r.reason
            r.reason = reason


def merge_reports(reports: Sequence[ProviderReport]) -> HardwareProfile:
    """Merge provider reports, first provider first, into a :class:`HardwareProfile`."""
    from .._version import __version__

    profile = HardwareProfile(
        origin="live",
        recorded_at=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        pyc_lab_version=__version__,
        providers={r.name: r.status for r in reports},
        provider_details={r.name: r.detail for r in reports if r.detail},
    )
    profile.host = _merge_host(reports)

    # GPU identity: the CUDA provider's order when it answered, else the first that did.
    gpu_reports = [r for r in reports if r.available and r.gpus and "index" in r.gpus[0]]
    order_report = next((r for r in gpu_reports if r.name == "cuda.core"), None) or (
        gpu_reports[0] if gpu_reports else None
    )
    keys: list[str] = []
    if order_report is not None:
        for pos, g in enumerate(order_report.gpus):
            b = g.get("pci_bus_id")
            keys.append(b.value if isinstance(b, Fact) else f"#{pos}")

    for pos, key in enumerate(keys):
        idx = order_report.gpus[pos].get("index") if order_report else None
        gpu = GPUInfo(index=idx.value if isinstance(idx, Fact) else pos)
        for field in _GPU_FIELDS:
            tried: list[str] = []
            for r in reports:
                entry = _gpu_entry(r, key, pos if r is order_report else None).get(field)
                if isinstance(entry, Fact) and field not in gpu.sources:
                    setattr(gpu, field, entry.value)
                    gpu.sources[field] = entry.source
                elif isinstance(entry, Missing):
                    tried.append(f"{entry.source}: {entry.reason}")
            if tried:
                gpu.fallbacks[field] = tried
        profile.gpus.append(gpu)

    by_key = {key: g.index for key, g in zip(keys, profile.gpus, strict=True)}
    for i, ka in enumerate(keys):
        for kb in keys[i + 1:]:
            link = LinkInfo(a=by_key[ka], b=by_key[kb])
            for field in ("kind", "nvlinks", "p2p"):
                for r in reports:
                    entry = r.links.get((ka, kb)) or r.links.get((kb, ka)) or {}
                    fact = entry.get(field)
                    if isinstance(fact, Fact):
                        setattr(link, field, fact.value)
                        link.sources[field] = fact.source
                        break
            if link.kind is None and link.nvlinks:
                link.kind = f"NV{link.nvlinks}"
            profile.links.append(link)

    for key in ("driver_version", "cuda_driver_version"):
        for r in reports:
            fact = r.system.get(key)
            if isinstance(fact, Fact):
                setattr(profile, key, fact.value)
                break
    profile.cuda_status = _cuda_status(profile, reports)
    return profile


def _gpu_entry(report: ProviderReport, key: str, pos: int | None) -> dict:
    if pos is not None:
        return report.gpus[pos]
    for g in report.gpus:
        b = g.get("pci_bus_id")
        if isinstance(b, Fact) and b.value == normalize_bus_id(key):
            return g
    return {}


def _merge_host(reports: Sequence[ProviderReport]) -> HostInfo:
    host = HostInfo()
    for field in _HOST_FIELDS:
        tried: list[str] = []
        for r in reports:
            entry = r.host.get(field)
            if isinstance(entry, Fact) and field not in host.sources:
                value = entry.value
                if field == "numa_nodes":
                    value = [NumaNode(**n) for n in value]
                setattr(host, field, value)
                host.sources[field] = entry.source
            elif isinstance(entry, Missing):
                tried.append(f"{entry.source}: {entry.reason}")
        if tried:
            host.fallbacks[field] = tried
    if not host.numa_nodes and host.threads:
        # No NUMA information at all: one node holding every CPU is the honest default.
        host.numa_nodes = [NumaNode(id=0, cpus=list(range(host.threads)),
                                    memory_total_bytes=host.memory_total_bytes)]
        host.sources["numa_nodes"] = "assumed (single node)"
    return host


def _cuda_status(profile: HardwareProfile, reports: Sequence[ProviderReport]) -> str:
    if profile.gpus:
        return f"{len(profile.gpus)} CUDA device(s)"
    down = [r for r in reports if not r.available and r.reason]
    if len({r.reason for r in down}) == 1 and all(r.detail for r in down):
        reasons = [down[0].reason]  # the device gate's one reason, given to every provider
    else:
        reasons = [f"{r.name}: {r.reason}" for r in down]
    pci = next(
        (r.system["nvidia_pci_devices"].value for r in reports
         if isinstance(r.system.get("nvidia_pci_devices"), Fact)),
        [],
    )
    if pci:
        reasons.append(
            f"sysfs sees {len(pci)} NVIDIA PCI device(s) ({', '.join(pci)}) but no driver "
            "answered: is the NVIDIA driver loaded?"
        )
    return "no CUDA device: " + ("; ".join(reasons) or "no provider found a GPU")

