"""The sysfs/procfs provider against fake trees built in a temporary directory."""

from __future__ import annotations

import platform

import pytest

from pyc_lab.hardware.providers.base import Fact, Missing
from pyc_lab.hardware.providers.sysfs import collect_sysfs
from tests.fakes.sysfs_tree import (
    CPU_MODEL,
    GPU_A,
    GPU_B,
    LAYOUTS,
    NODE_CPUS,
    NODE_MEM_KIB,
    TOTAL_MEM_KIB,
    SysfsTree,
    standard_host,
    two_gpu_tree,
)


def value(entry):
    assert isinstance(entry, Fact), f"expected a Fact, got {entry!r}"
    return entry.value


# -- host -------------------------------------------------------------------------------
def test_host_facts(tmp_path):
    tree = SysfsTree(tmp_path)
    standard_host(tree)
    report = collect_sysfs(tmp_path)
    host = report.host
    assert report.available and report.name == "sysfs"
    assert host["cpu_model"] == Fact(CPU_MODEL, "procfs")
    assert host["architecture"] == Fact(platform.machine() or None, "platform")
    assert host["threads"] == Fact(16, "sysfs")
    assert host["sockets"] == Fact(2, "sysfs")
    assert host["cores"] == Fact(8, "sysfs")  # core ids repeat per socket: (pkg, core) pairs
    assert host["memory_total_bytes"] == Fact(TOTAL_MEM_KIB * 1024, "procfs")
    assert value(host["numa_nodes"]) == [
        {"id": 0, "cpus": NODE_CPUS[0], "memory_total_bytes": NODE_MEM_KIB[0] * 1024},
        {"id": 1, "cpus": NODE_CPUS[1], "memory_total_bytes": NODE_MEM_KIB[1] * 1024},
    ]
    # a fake root is not the live machine: no process affinity, no OS
    assert "process_affinity" not in host and "os" not in host
    assert report.gpus == [] and report.links == {}


def test_single_socket_smt_off(tmp_path):
    tree = SysfsTree(tmp_path)
    tree.cpus(sockets=1, cores_per_socket=6, threads_per_core=1)
    host = collect_sysfs(tmp_path).host
    assert (value(host["sockets"]), value(host["cores"]), value(host["threads"])) == (1, 6, 6)


def test_numa_nodes_sorted_numerically_and_memory_optional(tmp_path):
    tree = SysfsTree(tmp_path)
    tree.cpus(1, 12, 1)
    for node in (10, 2, 0, 1):
        tree.numa_node(node, [node], mem_kib=None if node == 10 else 1024)
    nodes = value(collect_sysfs(tmp_path).host["numa_nodes"])
    assert [n["id"] for n in nodes] == [0, 1, 2, 10]
    assert nodes[-1] == {"id": 10, "cpus": [10], "memory_total_bytes": None}
    assert nodes[0]["memory_total_bytes"] == 1024 * 1024


def test_memory_only_numa_node_has_no_cpus(tmp_path):
    # CXL / HBM-only nodes: a node with an empty cpulist
    tree = SysfsTree(tmp_path)
    standard_host(tree)
    tree.write("sys/devices/system/node/node2/cpulist", "")
    nodes = value(collect_sysfs(tmp_path).host["numa_nodes"])
    assert nodes[2] == {"id": 2, "cpus": [], "memory_total_bytes": None}


def test_cpu_model_from_arm_style_cpuinfo(tmp_path):
    SysfsTree(tmp_path).write("proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 50.00\n"
                                              "Model\t\t: Grace\n")
    assert collect_sysfs(tmp_path).host["cpu_model"] == Fact("Grace", "procfs")


def test_empty_tree_gives_missing_values_with_reasons(tmp_path):
    report = collect_sysfs(tmp_path)
    host = report.host
    assert report.available
    for name in ("cpu_model", "threads", "sockets", "cores", "memory_total_bytes",
                 "numa_nodes"):
        assert isinstance(host[name], Missing), name
        assert host[name].reason, name
    assert host["cpu_model"].source == "procfs"
    assert "physical_package_id" in host["sockets"].reason
    assert report.system["nvidia_pci_devices"] == Fact([], "sysfs")


def test_malformed_online_file_is_missing_not_an_exception(tmp_path):
    # parse_cpulist raises PycLabError (not ValueError); a fake root must not raise
    SysfsTree(tmp_path).write("sys/devices/system/cpu/online", "garbage")
    host = collect_sysfs(tmp_path).host
    assert isinstance(host["threads"], Missing)
    assert "bad CPU list 'garbage'" in host["threads"].reason
    assert isinstance(host["sockets"], Missing)


def test_malformed_node_cpulist_is_tolerated(tmp_path):
    tree = SysfsTree(tmp_path)
    standard_host(tree)
    tree.write("sys/devices/system/node/node1/cpulist", "4-x")
    nodes = value(collect_sysfs(tmp_path).host["numa_nodes"])
    assert nodes[0]["cpus"] == NODE_CPUS[0]
    assert nodes[1] == {"id": 1, "cpus": [], "memory_total_bytes": NODE_MEM_KIB[1] * 1024}


# -- NVIDIA PCI devices -------------------------------------------------------------------
def test_nvidia_pci_device_list(tmp_path):
    tree = two_gpu_tree(tmp_path, "same_switch")
    tree.pci_device("0000:00:02.0", vendor="0x10de", device_class="0x030000")  # VGA
    tree.pci_device("0000:00:03.0", vendor="0x10de", device_class="0x040300")  # HDMI audio
    tree.pci_device("0000:00:04.0", vendor="0x10de", device_class="0x068000")  # NVSwitch
    tree.pci_device("0000:00:05.0", vendor="0x1af4", device_class="0x030200")  # not NVIDIA
    tree.write("sys/bus/pci/devices/0000:00:06.0/vendor", "0x10de")  # no class file
    report = collect_sysfs(tmp_path)
    assert report.system["nvidia_pci_devices"] == Fact(
        ["0000:00:02.0", GPU_A, GPU_B], "sysfs")


# -- per-GPU PCIe facts ---------------------------------------------------------------------
def test_per_gpu_facts(tmp_path):
    tree = two_gpu_tree(tmp_path, "different_numa")
    tree.pci_device("0000:86:00.0", numa_node=-1, local_cpulist="0-15",
                    link_speed="16.0 GT/s PCIe", max_link_speed="32.0 GT/s PCIe",
                    link_width=8, max_link_width=16)
    report = collect_sysfs(tmp_path, [GPU_A, "0000:3B:00.0", "00000000:86:00.0"])
    a, b, c = report.gpus
    assert [value(g["pci_bus_id"]) for g in report.gpus] == [GPU_A, GPU_B, "0000:86:00.0"]
    assert value(a["numa_node"]) == 0 and value(b["numa_node"]) == 1
    assert value(a["cpu_affinity"]) == NODE_CPUS[0]
    assert value(b["cpu_affinity"]) == NODE_CPUS[1]
    assert value(a["pcie_gen"]) == 5 and value(a["pcie_gen_max"]) == 5
    assert value(a["pcie_width"]) == 16 and value(a["pcie_width_max"]) == 16
    # the H200-VM case: firmware gave no NUMA affinity
    assert isinstance(c["numa_node"], Missing)
    assert "numa_node is -1" in c["numa_node"].reason and c["numa_node"].source == "sysfs"
    assert value(c["cpu_affinity"]) == list(range(16))
    assert value(c["pcie_gen"]) == 4 and value(c["pcie_gen_max"]) == 5
    assert value(c["pcie_width"]) == 8 and value(c["pcie_width_max"]) == 16


@pytest.mark.parametrize(
    ("speed", "gen"),
    [("2.5 GT/s", 1), ("5.0 GT/s PCIe", 2), ("8 GT/s", 3), ("8.0 GT/s PCIe", 3),
     ("16.0 GT/s PCIe", 4), ("32.0 GT/s PCIe", 5), ("64.0 GT/s PCIe", 6)],
)
def test_link_speed_to_generation(tmp_path, speed, gen):
    SysfsTree(tmp_path).gpu(GPU_A, link_speed=speed, max_link_speed=speed)
    g = collect_sysfs(tmp_path, [GPU_A]).gpus[0]
    assert g["pcie_gen"] == Fact(gen, "sysfs")
    assert g["pcie_gen_max"] == Fact(gen, "sysfs")


@pytest.mark.parametrize("speed", ["Unknown", "Unknown speed", "20.0 GT/s PCIe", ""])
def test_unknown_link_speed_is_missing(tmp_path, speed):
    SysfsTree(tmp_path).gpu(GPU_A, link_speed=speed)
    g = collect_sysfs(tmp_path, [GPU_A]).gpus[0]
    assert isinstance(g["pcie_gen"], Missing)
    assert repr(speed) in g["pcie_gen"].reason
    assert value(g["pcie_gen_max"]) == 5


def test_zero_link_width_and_missing_files_are_missing(tmp_path):
    SysfsTree(tmp_path).gpu(GPU_A, link_width=0, max_link_width=None, numa_node=None,
                            local_cpulist="")
    g = collect_sysfs(tmp_path, [GPU_A]).gpus[0]
    assert g["pcie_width"] == Missing("no value", "sysfs")
    for name in ("pcie_width_max", "numa_node", "cpu_affinity"):
        assert isinstance(g[name], Missing), name


def test_gpu_absent_from_sysfs(tmp_path):
    standard_host(SysfsTree(tmp_path))
    report = collect_sysfs(tmp_path, [GPU_A, "not-a-bus-id"])
    assert len(report.gpus) == 1  # the bad id is dropped
    g = report.gpus[0]
    assert g["pci_bus_id"] == Fact(GPU_A, "sysfs")
    for name in ("numa_node", "cpu_affinity", "pcie_gen", "pcie_gen_max", "pcie_width",
                 "pcie_width_max"):
        assert isinstance(g[name], Missing) and GPU_A in g[name].reason, name


# -- PCIe path between two GPUs -------------------------------------------------------------
@pytest.mark.parametrize(("layout", "kind"), sorted(LAYOUTS.items()))
def test_link_kinds(tmp_path, layout, kind):
    two_gpu_tree(tmp_path, layout)
    report = collect_sysfs(tmp_path, [GPU_A, GPU_B])
    assert report.links == {(GPU_A, GPU_B): {"kind": Fact(kind, "sysfs (PCI path)")}}


def test_link_kind_is_symmetric(tmp_path):
    two_gpu_tree(tmp_path, "nested_switches")
    report = collect_sysfs(tmp_path, [GPU_B, GPU_A])
    assert report.links == {(GPU_B, GPU_A): {"kind": Fact("PXB", "sysfs (PCI path)")}}


def test_different_root_complexes_without_numa_affinity_are_unknown(tmp_path):
    # The H200 VM's situation: sysfs cannot tell NODE from SYS, so it must not guess.
    two_gpu_tree(tmp_path, "same_numa", numa_a=-1, numa_b=-1)
    report = collect_sysfs(tmp_path, [GPU_A, GPU_B])
    kind = report.links[(GPU_A, GPU_B)]["kind"]
    assert isinstance(kind, Missing)
    assert "no NUMA node to tell NODE from SYS" in kind.reason


def test_two_gpus_directly_under_one_root_complex_are_phb(tmp_path):
    tree = SysfsTree(tmp_path)
    tree.gpu(GPU_A)
    tree.gpu(GPU_B)
    report = collect_sysfs(tmp_path, [GPU_A, GPU_B])
    assert value(report.links[(GPU_A, GPU_B)]["kind"]) == "PHB"


def test_link_kind_to_an_absent_gpu_is_missing(tmp_path):
    two_gpu_tree(tmp_path, "same_switch")
    report = collect_sysfs(tmp_path, [GPU_A, "0000:99:00.0"])
    kind = report.links[(GPU_A, "0000:99:00.0")]["kind"]
    assert isinstance(kind, Missing)
    assert "no PCI root complex" in kind.reason


def test_three_gpus_give_every_pair(tmp_path):
    tree = two_gpu_tree(tmp_path, "same_switch")
    tree.gpu("0000:86:00.0", root_complex="pci0000:80", bridges=["0000:80:01.0"],
             numa_node=1)
    report = collect_sysfs(tmp_path, [GPU_A, GPU_B, "0000:86:00.0"])
    assert {k: value(v["kind"]) for k, v in report.links.items()} == {
        (GPU_A, GPU_B): "PIX",
        (GPU_A, "0000:86:00.0"): "SYS",
        (GPU_B, "0000:86:00.0"): "SYS",
    }


def test_live_root_never_raises():
    report = collect_sysfs("/")
    assert report.available
    assert isinstance(report.host["threads"], Fact)
    assert value(report.host["threads"]) >= 1
    assert isinstance(report.host["process_affinity"], Fact)
    assert isinstance(report.system["nvidia_pci_devices"], Fact)


def test_different_root_complexes_on_a_single_numa_host_are_node(tmp_path):
    # With one NUMA node on the host, both root complexes hang off it: NODE, not a guess.
    tree = SysfsTree(tmp_path)
    tree.numa_node(0, range(16), 64 * 2**20)
    tree.gpu(GPU_A, root_complex="pci0000:00", numa_node=-1)
    tree.gpu(GPU_B, root_complex="pci0000:80", numa_node=-1)
    report = collect_sysfs(tmp_path, [GPU_A, GPU_B])
    assert len(value(report.host["numa_nodes"])) == 1
    assert value(report.links[(GPU_A, GPU_B)]["kind"]) == "NODE"
