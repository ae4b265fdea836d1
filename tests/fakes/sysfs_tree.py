"""Build a fake Linux ``/sys`` and ``/proc`` under a temporary directory.

:class:`SysfsTree` writes the files ``pyc_lab.hardware.providers.sysfs`` reads: CPU
topology, NUMA nodes, ``proc/cpuinfo`` and ``proc/meminfo``, and PCI devices under
``sys/devices/pci<domain>:<bus>/...`` with the ``sys/bus/pci/devices/<bdf>`` symlinks
that point into that tree, as the kernel lays them out.

:func:`two_gpu_tree` builds a whole machine (two sockets, two NUMA nodes) with two GPUs
placed in one of the :data:`LAYOUTS`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from pyc_lab.hardware.cpulist import format_cpulist

__all__ = [
    "CPU_MODEL",
    "GPU_A",
    "GPU_B",
    "LAYOUTS",
    "NODE_CPUS",
    "NODE_MEM_KIB",
    "TOTAL_MEM_KIB",
    "SysfsTree",
    "standard_host",
    "two_gpu_tree",
]

CPU_MODEL = "Intel(R) Xeon(R) Platinum 8480+"
#: 2 sockets x 4 cores x 2 threads; Linux numbers the first threads of every core first.
NODE_CPUS = {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
NODE_MEM_KIB = {0: 64 * 2**20, 1: 32 * 2**20}
TOTAL_MEM_KIB = 98 * 2**20
GPU_A = "0000:18:00.0"
GPU_B = "0000:3b:00.0"


class SysfsTree:
    """Writes fake sysfs/procfs files below ``root``; pass ``root`` to ``collect_sysfs``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def write(self, rel: str, text: str) -> Path:
        """Write ``text`` (plus a newline, as the kernel does) to ``root/rel``."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text}\n")
        return path

    # -- host -----------------------------------------------------------------
    def cpuinfo(self, model: str = CPU_MODEL, n_cpus: int = 16) -> None:
        """``proc/cpuinfo`` with one x86-style block per CPU."""
        blocks = [
            f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\n"
            for i in range(n_cpus)
        ]
        self.write("proc/cpuinfo", "\n".join(blocks))

    def meminfo(self, total_kib: int = TOTAL_MEM_KIB) -> None:
        """``proc/meminfo``."""
        self.write("proc/meminfo", f"MemTotal:       {total_kib} kB\n"
                                   f"MemFree:        {total_kib // 2} kB\n"
                                   f"MemAvailable:   {total_kib // 2} kB")

    def cpus(self, sockets: int = 2, cores_per_socket: int = 4,
             threads_per_core: int = 2) -> list[int]:
        """``cpu/online`` and ``cpu<N>/topology/{physical_package_id,core_id}``.

        CPU ``t * sockets * cores + s * cores + c`` is thread ``t`` of core ``c`` on
        socket ``s``, as Linux numbers them; core ids restart on every socket.
        """
        ids = []
        for t in range(threads_per_core):
            for s in range(sockets):
                for c in range(cores_per_socket):
                    cpu = t * sockets * cores_per_socket + s * cores_per_socket + c
                    topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
                    self.write(f"{topo}/physical_package_id", str(s))
                    self.write(f"{topo}/core_id", str(c))
                    ids.append(cpu)
        self.write("sys/devices/system/cpu/online", format_cpulist(ids))
        return sorted(ids)

    def numa_node(self, node: int, cpus: Iterable[int], mem_kib: int | None) -> None:
        """``node/node<N>/cpulist`` and, unless ``mem_kib`` is None, its ``meminfo``."""
        base = f"sys/devices/system/node/node{node}"
        self.write(f"{base}/cpulist", format_cpulist(cpus))
        if mem_kib is not None:
            self.write(f"{base}/meminfo", f"Node {node} MemTotal:       {mem_kib} kB\n"
                                          f"Node {node} MemFree:        {mem_kib // 2} kB")

    # -- PCI ------------------------------------------------------------------
    def pci_device(
        self,
        bdf: str,
        *,
        root_complex: str = "pci0000:00",
        bridges: Sequence[str] = (),
        vendor: str = "0x10de",
        device_class: str = "0x030200",
        numa_node: int | None = 0,
        local_cpulist: str | None = None,
        link_speed: str | None = "32.0 GT/s PCIe",
        max_link_speed: str | None = "32.0 GT/s PCIe",
        link_width: int | None = 16,
        max_link_width: int | None = 16,
    ) -> Path:
        """A PCI function at ``sys/devices/<root_complex>/<bridges...>/<bdf>``.

        Each bridge on the way gets its own directory (an Intel PCI bridge, class
        0x060400) and its own ``sys/bus/pci/devices`` link, as on a real machine. A value
        given as ``None`` leaves that file out.
        """
        parent = self.root / "sys" / "devices" / root_complex
        rel = Path("devices") / root_complex
        for bridge in bridges:
            parent, rel = parent / bridge, rel / bridge
            if not parent.exists():
                self._pci_files(parent, vendor="0x8086", device_class="0x060400",
                                numa_node=numa_node)
                self._link(bridge, rel)
        dev = parent / bdf
        self._pci_files(dev, vendor=vendor, device_class=device_class, numa_node=numa_node,
                        local_cpulist=local_cpulist, link_speed=link_speed,
                        max_link_speed=max_link_speed, link_width=link_width,
                        max_link_width=max_link_width)
        self._link(bdf, rel / bdf)
        return dev

    def gpu(self, bdf: str, **kwargs) -> Path:
        """An NVIDIA 3D controller (what an H100/H200 is); see :meth:`pci_device`."""
        return self.pci_device(bdf, **kwargs)

    def _pci_files(self, dev: Path, **values: object) -> None:
        dev.mkdir(parents=True, exist_ok=True)
        names = {"device_class": "class", "link_speed": "current_link_speed",
                 "link_width": "current_link_width"}
        for key, value in values.items():
            if value is not None:
                (dev / names.get(key, key)).write_text(f"{value}\n")

    def _link(self, bdf: str, rel: Path) -> None:
        links = self.root / "sys" / "bus" / "pci" / "devices"
        links.mkdir(parents=True, exist_ok=True)
        if not (links / bdf).is_symlink():
            # sys/bus/pci/devices/X -> ../../../devices/pci0000:00/.../X
            os.symlink(Path("..", "..", "..") / rel, links / bdf)


def standard_host(tree: SysfsTree, *, numa: bool = True) -> None:
    """Two sockets x 4 cores x 2 threads, 98 GiB; NUMA nodes 0 and 1 unless ``numa=False``."""
    tree.cpuinfo()
    tree.meminfo()
    tree.cpus(2, 4, 2)
    if numa:
        for node, cpus in NODE_CPUS.items():
            tree.numa_node(node, cpus, NODE_MEM_KIB[node])


#: Two-GPU placements and the ``nvidia-smi topo -m`` word each should give.
LAYOUTS = {
    # one PCIe switch: root port -> switch upstream port -> two downstream ports
    "same_switch": "PIX",
    # two switch levels between GPU A and the switch it shares with GPU B
    "nested_switches": "PXB",
    # two root ports of one root complex
    "same_root_complex": "PHB",
    # two root complexes (host bridges) of one NUMA node
    "same_numa": "NODE",
    # two root complexes on different NUMA nodes (sockets)
    "different_numa": "SYS",
}


def two_gpu_tree(root: str | Path, layout: str, *, numa_a: int | None = 0,
                 numa_b: int | None = None, **gpu_kwargs) -> SysfsTree:
    """A :func:`standard_host` machine with GPUs :data:`GPU_A` and :data:`GPU_B`.

    ``numa_b`` defaults to 1 for ``"different_numa"`` and to ``numa_a`` otherwise;
    ``gpu_kwargs`` go to both :meth:`SysfsTree.gpu` calls.
    """
    if layout not in LAYOUTS:
        raise KeyError(f"unknown layout {layout!r}; one of {sorted(LAYOUTS)}")
    if numa_b is None:
        numa_b = 1 if layout == "different_numa" else numa_a
    tree = SysfsTree(root)
    standard_host(tree)

    def cpus(node: int | None) -> str | None:
        if node is None:
            return None
        # the kernel gives a device without NUMA affinity every CPU as local
        return "0-15" if node < 0 else format_cpulist(NODE_CPUS[node])

    rc_a = rc_b = "pci0000:10"
    if layout == "same_switch":
        br_a = ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0"]
        br_b = ["0000:10:01.0", "0000:11:00.0", "0000:12:04.0"]
    elif layout == "nested_switches":
        br_a = ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0",
                "0000:14:00.0"]
        br_b = ["0000:10:01.0", "0000:11:00.0", "0000:12:04.0"]
    elif layout == "same_root_complex":
        br_a, br_b = ["0000:10:01.0"], ["0000:10:03.0"]
    else:
        rc_b = "pci0000:30"
        br_a, br_b = ["0000:10:01.0"], ["0000:30:01.0"]
    tree.gpu(GPU_A, root_complex=rc_a, bridges=br_a, numa_node=numa_a,
             local_cpulist=cpus(numa_a), **gpu_kwargs)
    tree.gpu(GPU_B, root_complex=rc_b, bridges=br_b, numa_node=numa_b,
             local_cpulist=cpus(numa_b), **gpu_kwargs)
    return tree
