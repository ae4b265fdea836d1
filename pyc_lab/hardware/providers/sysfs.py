"""Host and PCIe facts from Linux sysfs/procfs, psutil and py-cpuinfo.

This provider needs no GPU library: it gives the CPU model, sockets, cores, NUMA nodes
with their CPUs and memory, and, for each GPU's PCI address, its NUMA node, local CPUs,
PCIe link speed and width, and the PCIe path between two GPUs. ``root`` reads another
tree than ``/`` (a saved copy of a machine's ``/sys`` and ``/proc``).
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable
from pathlib import Path

from ...errors import PycLabError
from ..cpulist import parse_cpulist
from .base import Fact, Missing, ProviderReport, guarded, normalize_bus_id

__all__ = ["collect_sysfs"]

NAME = "sysfs"

_SPEED_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_NVIDIA_VENDOR = "0x10de"


def _read(path: Path) -> str:
    return path.read_text().strip()


def collect_sysfs(root: str | Path = "/", bus_ids: Iterable[str] = ()) -> ProviderReport:
    """Read host facts, and PCIe facts for the GPUs at ``bus_ids``.

    Parameters
    ----------
    root
        Filesystem root holding ``sys/`` and ``proc/`` (``"/"`` on a live machine).
    bus_ids
        Normalised PCI bus ids of the GPUs other providers found.

    Returns
    -------
    ProviderReport
        Always available; a value it cannot read is a :class:`Missing` with the reason.
    """
    root = Path(root)
    live = root == Path("/")
    report = ProviderReport(name=NAME)
    _host(report, root, live)
    pci = root / "sys" / "bus" / "pci" / "devices"
    report.system["nvidia_pci_devices"] = Fact(_nvidia_devices(pci), NAME)
    ids = [b for b in (normalize_bus_id(x) for x in bus_ids) if b]
    for bus in ids:
        report.gpus.append(_gpu(pci / bus, bus))
    nodes = report.host.get("numa_nodes")
    single_node = isinstance(nodes, Fact) and len(nodes.value) == 1
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            link: dict[str, Fact | Missing] = {}
            guarded(link, "kind", "sysfs (PCI path)",
                    lambda a=a, b=b: _path_kind(pci, a, b, single_node))
            report.links[(a, b)] = link
    return report


def _host(report: ProviderReport, root: Path, live: bool) -> None:
    host = report.host
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    node_dir = root / "sys" / "devices" / "system" / "node"

    model = _cpu_model(root / "proc" / "cpuinfo")
    if model is not None:
        host["cpu_model"] = Fact(model, "procfs")
    elif live:
        guarded(host, "cpu_model", "py-cpuinfo", _cpuinfo_brand)
    else:
        host["cpu_model"] = Missing("no model name in proc/cpuinfo", "procfs")
    host["architecture"] = Fact(platform.machine() or None, "platform")

    online = None
    try:
        online = parse_cpulist(_read(cpu_dir / "online"))
        host["threads"] = Fact(len(online), NAME)
    except (OSError, ValueError, PycLabError) as exc:
        if live:
            guarded(host, "threads", "psutil", _psutil_count(logical=True))
        else:
            host["threads"] = Missing(str(exc), NAME)

    packages: set[str] = set()
    cores: set[tuple[str, str]] = set()
    for cpu in online or []:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        try:
            pkg = _read(topo / "physical_package_id")
            core = _read(topo / "core_id")
        except OSError:
            continue
        packages.add(pkg)
        cores.add((pkg, core))
    if packages:
        host["sockets"] = Fact(len(packages), NAME)
        host["cores"] = Fact(len(cores), NAME)
    else:
        host["sockets"] = Missing("no cpu*/topology/physical_package_id", NAME)
        if live:
            guarded(host, "cores", "psutil", _psutil_count(logical=False))
        else:
            host["cores"] = Missing("no cpu*/topology/core_id", NAME)

    mem = _meminfo_kib(root / "proc" / "meminfo", "MemTotal")
    if mem is not None:
        host["memory_total_bytes"] = Fact(mem * 1024, "procfs")
    elif live:
        guarded(host, "memory_total_bytes", "psutil", _psutil_memory)
    else:
        host["memory_total_bytes"] = Missing("no MemTotal in proc/meminfo", "procfs")

    nodes = []
    for d in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cpus = parse_cpulist(_read(d / "cpulist"))
        except (OSError, ValueError, PycLabError):
            cpus = []
        kib = _meminfo_kib(d / "meminfo", "MemTotal")
        nodes.append({"id": int(d.name[4:]), "cpus": cpus,
                      "memory_total_bytes": None if kib is None else kib * 1024})
    if nodes:
        host["numa_nodes"] = Fact(nodes, NAME)
    else:
        host["numa_nodes"] = Missing("no sys/devices/system/node/node*", NAME)

    if live:
        if hasattr(os, "sched_getaffinity"):
            host["process_affinity"] = Fact(sorted(os.sched_getaffinity(0)), "os")
        host["os"] = Fact(platform.platform(terse=True), "platform")


def _gpu(dev: Path, bus: str) -> dict[str, Fact | Missing]:
    g: dict[str, Fact | Missing] = {"pci_bus_id": Fact(bus, NAME)}
    if not dev.exists():
        reason = f"no {dev}"
        for name in ("numa_node", "cpu_affinity", "pcie_gen", "pcie_gen_max",
                     "pcie_width", "pcie_width_max"):
            g[name] = Missing(reason, NAME)
        return g

    def numa() -> int | Missing:
        node = int(_read(dev / "numa_node"))
        return node if node >= 0 else Missing(f"numa_node is {node} (firmware gave no affinity)",
                                              NAME)

    guarded(g, "numa_node", NAME, numa)
    guarded(g, "cpu_affinity", NAME, lambda: parse_cpulist(_read(dev / "local_cpulist")) or None)
    guarded(g, "pcie_gen", NAME, lambda: _gen(_read(dev / "current_link_speed")))
    guarded(g, "pcie_gen_max", NAME, lambda: _gen(_read(dev / "max_link_speed")))
    guarded(g, "pcie_width", NAME, lambda: int(_read(dev / "current_link_width")) or None)
    guarded(g, "pcie_width_max", NAME, lambda: int(_read(dev / "max_link_width")) or None)
    return g


def _gen(speed: str) -> int | Missing:
    m = re.match(r"\s*([0-9.]+)\s*GT/s", speed)
    if not m:
        return Missing(f"unrecognised link speed {speed!r}", NAME)
    gen = _SPEED_TO_GEN.get(float(m.group(1)))
    return gen if gen is not None else Missing(f"unknown PCIe speed {speed!r}", NAME)


def _pci_path(pci: Path, bus: str) -> list[str]:
    """Components from the root complex (``pci0000:00``) down to the device itself."""
    parts = (pci / bus).resolve().parts
    for k, part in enumerate(parts):
        if part.startswith("pci") and ":" in part:
            return list(parts[k:])
    raise FileNotFoundError(f"no PCI root complex in the sysfs path of {bus}")


def _path_kind(pci: Path, a: str, b: str, single_node: bool = False) -> str | Missing:
    """Classify the PCIe path between two devices as nvidia-smi does (PIX ... SYS).

    Across root complexes the NUMA nodes decide NODE or SYS; when the firmware gives no
    node (-1) that is only knowable on a host with a single NUMA node.
    """
    pa, pb = _pci_path(pci, a), _pci_path(pci, b)
    if pa[0] != pb[0]:
        na, nb = (_read_int(pci / x / "numa_node") for x in (a, b))
        if na is None or nb is None:
            if single_node:
                return "NODE"
            return Missing(f"{a} and {b} sit under different PCI root complexes and sysfs "
                           "gives no NUMA node to tell NODE from SYS", "sysfs (PCI path)")
        return "NODE" if na == nb else "SYS"
    ba, bb = pa[1:-1], pb[1:-1]
    common = 0
    while common < min(len(ba), len(bb)) and ba[common] == bb[common]:
        common += 1
    if common == 0:
        return "PHB"
    return "PIX" if len(ba) - common <= 1 and len(bb) - common <= 1 else "PXB"


def _read_int(path: Path) -> int | None:
    try:
        v = int(_read(path))
    except (OSError, ValueError):
        return None
    return v if v >= 0 else None


def _nvidia_devices(pci: Path) -> list[str]:
    found = []
    for dev in sorted(pci.glob("*")):
        try:
            if _read(dev / "vendor") == _NVIDIA_VENDOR and _read(dev / "class")[:6] in (
                "0x0300", "0x0302"
            ):
                found.append(dev.name)
        except OSError:
            continue
    return found


def _cpu_model(cpuinfo: Path) -> str | None:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for key in ("model name", "Model", "cpu model"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if m:
            return m.group(1).strip()
    return None


def _cpuinfo_brand() -> str | None:
    import cpuinfo

    return cpuinfo.get_cpu_info().get("brand_raw") or None


def _meminfo_kib(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    m = re.search(rf"{key}:\s*(\d+)\s*kB", text)
    return int(m.group(1)) if m else None


def _psutil_count(logical: bool):
    def get() -> int | None:
        import psutil

        return psutil.cpu_count(logical=logical)

    return get


def _psutil_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
