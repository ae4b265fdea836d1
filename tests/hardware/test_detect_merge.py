"""merge_reports / detect_hardware: the fallback chain, provenance and GPU identity."""

from __future__ import annotations

import importlib

import pytest

import pyc_lab
from pyc_lab.errors import PycLabError, SnapshotError
from pyc_lab.hardware import HardwareProfile, NumaNode, detect_hardware, merge_reports
from pyc_lab.hardware.device import no_gpu_reason
from pyc_lab.hardware.providers import collect_cuda, collect_nvml, collect_sysfs
from pyc_lab.hardware.providers.base import ProviderReport
from tests.fakes.fake_nvml import (
    FakeCudaCore,
    FakeCudaDevice,
    FakeDriver,
    FakeNVML,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
    nvlinks_to,
    nvml_gpu,
)
from tests.fakes.sysfs_tree import GPU_A, GPU_B, NODE_CPUS, SysfsTree, standard_host, two_gpu_tree

NVML_A, NVML_B = b"00000000:18:00.0", b"00000000:3B:00.0"
GIB = 2**30


def nvml_h200(order=("a", "b"), **kwargs) -> FakeNVML:
    """Two H200s, four NVLinks between them, NUMA NotSupported (as on the H200 VM)."""
    gpus = {
        "a": nvml_gpu(NVML_A, name="nvml GPU A", uuid="GPU-aaaa",
                      numa=NVMLError_NotSupported(), nvlinks=nvlinks_to(NVML_B, 4),
                      pcie_gen=NVMLError_NotSupported(), cpu_affinity=[0x0F0F]),
        "b": nvml_gpu(NVML_B, name="nvml GPU B", uuid="GPU-bbbb",
                      numa=NVMLError_NotSupported(), nvlinks=nvlinks_to(NVML_A, 4),
                      cpu_affinity=[0x0F0F]),
    }
    return FakeNVML([gpus[k] for k in order], **kwargs)


def cuda_h200(order=(GPU_A, GPU_B), numa=(0, 0)) -> FakeCudaCore:
    return FakeCudaCore([
        FakeCudaDevice(i, bus, name=f"cuda GPU {i}", uuid=f"cuda-{i}", host_numa_id=numa[i],
                       multiprocessor_count=132 - i, peers=[1 - i])
        for i, bus in enumerate(order)
    ])


def sysfs_h200(tmp_path, bus_ids=(GPU_A, GPU_B)) -> ProviderReport:
    """Both GPUs on one NUMA node's two root complexes, firmware NUMA affinity -1."""
    two_gpu_tree(tmp_path, "same_numa", numa_a=-1, numa_b=-1,
                 link_speed="16.0 GT/s PCIe")
    return collect_sysfs(tmp_path, bus_ids)


def h200_reports(tmp_path, *, nvml_order=("a", "b")) -> list[ProviderReport]:
    """The live probe's chain order: NVML, CUDA, sysfs."""
    return [
        collect_nvml(nvml_h200(nvml_order)),
        collect_cuda(cuda_h200(), FakeDriver({0: 141 * GIB, 1: 141 * GIB})),
        sysfs_h200(tmp_path),
    ]


# -- the H200 NUMA situation -----------------------------------------------------------
def test_h200_numa_node_comes_from_cuda_core(tmp_path):
    profile = merge_reports(h200_reports(tmp_path))
    g = profile.gpus[0]
    assert g.numa_node == 0
    assert g.sources["numa_node"] == "cuda.core"
    assert g.source("numa_node") == "cuda.core"
    # NVML was asked first and said why not; sysfs, asked after, says why it could not.
    nvml_reason, sysfs_reason = g.fallbacks["numa_node"]
    assert nvml_reason.startswith("nvml: ") and "NotSupported" in nvml_reason
    assert sysfs_reason.startswith("sysfs: numa_node is -1")


def test_h200_numa_fallbacks_name_nvml_and_sysfs_when_sysfs_is_asked_before_cuda(tmp_path):
    nvml, cuda, sysfs = h200_reports(tmp_path)
    profile = merge_reports([nvml, sysfs, cuda])  # chain order is list order
    for g in profile.gpus:
        assert g.numa_node == 0
        assert g.sources["numa_node"] == "cuda.core"
        assert len(g.fallbacks["numa_node"]) == 2
        nvml_reason, sysfs_reason = g.fallbacks["numa_node"]
        assert nvml_reason == "nvml: NVMLError_NotSupported: Not Supported"
        assert sysfs_reason.startswith("sysfs: numa_node is -1")
    assert profile.numa_frame().loc[0, "gpus"] == "0,1"


def test_h200_detect_hardware_runs_the_probe_chain(tmp_path, monkeypatch):
    """detect_hardware() with the three real collectors, each pointed at a fake."""
    nvml_mod = importlib.import_module("pyc_lab.hardware.providers.nvml")
    cuda_mod = importlib.import_module("pyc_lab.hardware.providers.cuda")
    sysfs_mod = importlib.import_module("pyc_lab.hardware.providers.sysfs")
    two_gpu_tree(tmp_path, "same_numa", numa_a=-1, numa_b=-1)
    seen: dict = {}

    def sysfs(root, bus_ids=()):
        seen["root"], seen["bus_ids"] = root, list(bus_ids)
        return collect_sysfs(tmp_path, bus_ids)

    monkeypatch.setattr(nvml_mod, "collect_nvml", lambda: collect_nvml(nvml_h200(("b", "a"))))
    monkeypatch.setattr(cuda_mod, "collect_cuda",
                        lambda: collect_cuda(cuda_h200(), FakeDriver({0: 1, 1: 1})))
    monkeypatch.setattr(sysfs_mod, "collect_sysfs", sysfs)
    profile = detect_hardware()
    # sysfs was asked about the live root and every bus id NVML and CUDA found
    assert seen["root"] == "/"
    assert sorted(seen["bus_ids"]) == [GPU_A, GPU_B]
    assert list(profile.providers) == ["nvml", "cuda.core", "sysfs"]
    assert set(profile.providers.values()) == {"ok"}
    assert [g.pci_bus_id for g in profile.gpus] == [GPU_A, GPU_B]
    assert [(g.numa_node, g.sources["numa_node"]) for g in profile.gpus] == [
        (0, "cuda.core"), (0, "cuda.core")]
    assert profile.cuda_status == "2 CUDA device(s)"


# -- GPU identity and order -------------------------------------------------------------
def test_gpu_order_follows_cuda_when_nvml_lists_them_differently(tmp_path):
    profile = merge_reports(h200_reports(tmp_path, nvml_order=("b", "a")))
    assert [g.index for g in profile.gpus] == [0, 1]
    assert [g.pci_bus_id for g in profile.gpus] == [GPU_A, GPU_B]
    # every field of GPU 0 belongs to the GPU at GPU_A, whichever provider gave it
    a, b = profile.gpus
    assert (a.name, a.uuid, a.sm_count) == ("nvml GPU A", "GPU-aaaa", 132)
    assert (b.name, b.uuid, b.sm_count) == ("nvml GPU B", "GPU-bbbb", 131)
    assert a.sources["name"] == "nvml" and a.sources["sm_count"] == "cuda.core"


def test_cuda_ordinals_are_the_profile_indices(tmp_path):
    reports = [
        collect_nvml(nvml_h200(("a", "b"))),
        collect_cuda(cuda_h200(order=(GPU_B, GPU_A)), FakeDriver({0: 1, 1: 1})),
        sysfs_h200(tmp_path),
    ]
    profile = merge_reports(reports)
    assert [(g.index, g.pci_bus_id, g.name) for g in profile.gpus] == [
        (0, GPU_B, "nvml GPU B"), (1, GPU_A, "nvml GPU A")]
    assert profile.gpu(0).pci_bus_id == GPU_B
    link = profile.link(0, 1)
    assert (link.a, link.b, link.kind, link.nvlinks) == (0, 1, "NV4", 4)


def test_without_cuda_nvml_gives_the_order(tmp_path):
    reports = [
        collect_nvml(nvml_h200(("b", "a"))),
        collect_cuda(FakeCudaCore(error=RuntimeError("CUDA_ERROR_NO_DEVICE"))),
        sysfs_h200(tmp_path),
    ]
    profile = merge_reports(reports)
    assert [(g.index, g.pci_bus_id) for g in profile.gpus] == [(0, GPU_B), (1, GPU_A)]
    assert profile.providers["cuda.core"] == "unavailable: RuntimeError: CUDA_ERROR_NO_DEVICE"
    # nobody but the CUDA provider knows SM counts
    assert all(g.sm_count is None for g in profile.gpus)
    assert "sm_count" not in profile.gpus[0].sources


def test_cuda_device_without_bus_id_is_still_a_gpu():
    core = FakeCudaCore([FakeCudaDevice(0, pci_bus_id=RuntimeError("no bus id"))])
    profile = merge_reports([collect_cuda(core, FakeDriver({0: GIB}))])
    assert len(profile.gpus) == 1
    g = profile.gpus[0]
    assert g.index == 0 and g.pci_bus_id is None and g.name == "NVIDIA H200"
    assert g.fallbacks["pci_bus_id"] == ["cuda.core: RuntimeError: no bus id"]


def test_nvml_gpu_that_cannot_be_opened_keeps_its_place():
    fake = FakeNVML([nvml_gpu(NVML_A), nvml_gpu(NVML_B)],
                    handle_errors={0: NVMLError_NoPermission()})
    profile = merge_reports([collect_nvml(fake)])
    assert [g.index for g in profile.gpus] == [0, 1]
    assert profile.gpus[0].pci_bus_id is None and profile.gpus[0].name is None
    assert "cannot open GPU 0" in profile.gpus[0].fallbacks["pci_bus_id"][0]
    assert (profile.gpus[1].pci_bus_id, profile.gpus[1].name) == (GPU_B, "NVIDIA H200")
    assert profile.cuda_status == "2 CUDA device(s)"


# -- field and link fallbacks -----------------------------------------------------------
def test_first_provider_wins_and_fallbacks_record_who_failed(tmp_path):
    profile = merge_reports(h200_reports(tmp_path))
    a, b = profile.gpus
    # NVML knows the current PCIe gen of B; for A it is NotSupported, so sysfs answers
    assert (b.pcie_gen, b.sources["pcie_gen"]) == (1, "nvml")
    assert (a.pcie_gen, a.sources["pcie_gen"]) == (4, "sysfs")
    assert a.fallbacks["pcie_gen"] == ["nvml: NVMLError_NotSupported: Not Supported"]
    assert "pcie_gen" not in b.fallbacks
    # NVML's memory beats cuda-bindings'; cuda.core's name loses to NVML's
    assert a.memory_total_bytes == nvml_gpu()["memory_total"]
    assert a.sources["memory_total_bytes"] == "nvml"
    assert a.cpu_affinity == NODE_CPUS[0]
    assert a.mig_mode == "disabled" and a.nvlink_version == 4
    # fields nobody knew stay None without a source
    assert profile.driver_version == "570.124.06"
    assert profile.cuda_driver_version == "12.8"


def test_links_merge_nvlink_from_nvml(tmp_path):
    profile = merge_reports(h200_reports(tmp_path))
    assert len(profile.links) == 1
    link = profile.link(1, 0)
    assert (link.kind, link.nvlinks, link.p2p, link.is_nvlink) == ("NV4", 4, True, True)
    assert link.sources == {"kind": "nvml", "nvlinks": "nvml", "p2p": "nvml"}


def test_links_fall_back_to_sysfs_kind_and_cuda_p2p(tmp_path):
    reports = [
        collect_nvml(FakeNVML(init_error=NVMLError_LibraryNotFound())),
        collect_cuda(cuda_h200(), FakeDriver({0: 1, 1: 1}, version=12040)),
        sysfs_h200(tmp_path),
    ]
    profile = merge_reports(reports)
    link = profile.link(0, 1)
    # two root complexes, no firmware NUMA affinity and two NUMA nodes on the host:
    # nobody can tell NODE from SYS, so the kind stays unknown rather than guessed.
    assert len(profile.host.numa_nodes) == 2
    assert (link.kind, link.nvlinks, link.p2p) == (None, 0, True)
    assert link.sources == {"p2p": "cuda.core"}
    assert profile.link_matrix().loc["GPU0", "GPU1"] == "?"
    assert profile.cuda_driver_version == "12.4"  # from cuda-bindings when NVML is gone
    assert profile.driver_version is None
    g = profile.gpus[0]
    assert (g.name, g.sources["name"]) == ("cuda GPU 0", "cuda.core")
    # sysfs, asked after cuda.core answered, still says why it could not
    assert g.fallbacks["numa_node"] == ["sysfs: numa_node is -1 (firmware gave no affinity)"]
    assert (g.pcie_gen_max, g.sources["pcie_gen_max"]) == (5, "sysfs")
    assert g.pcie_bandwidth_gbps == 63.02
    # an unavailable provider contributes no per-field reasons, only its status
    assert not any(r.startswith("nvml") for f in g.fallbacks.values() for r in f)
    assert profile.providers["nvml"].startswith("unavailable: NVMLError_LibraryNotFound")


def test_link_of_unknown_kind_and_self_link(tmp_path):
    reports = [collect_cuda(FakeCudaCore([FakeCudaDevice(0, GPU_A), FakeCudaDevice(1, GPU_B)]),
                            FakeDriver({0: 1, 1: 1}))]
    profile = merge_reports(reports)
    link = profile.link(0, 1)
    assert (link.kind, link.p2p, link.nvlinks) == (None, False, 0)
    assert profile.link(1, 1).kind == "X"
    with pytest.raises(PycLabError, match="no GPU 7 in this profile; it has 2 GPU"):
        profile.link(0, 7)


# -- host -------------------------------------------------------------------------------
def test_host_comes_from_sysfs(tmp_path):
    profile = merge_reports(h200_reports(tmp_path))
    h = profile.host
    assert (h.sockets, h.cores, h.threads) == (2, 8, 16)
    assert [n.id for n in h.numa_nodes] == [0, 1]
    assert all(isinstance(n, NumaNode) for n in h.numa_nodes)
    assert h.numa_nodes[1].cpus == NODE_CPUS[1]
    assert h.sources["numa_nodes"] == "sysfs" and h.sources["cpu_model"] == "procfs"
    assert h.numa_node_of_cpu(12) == 1 and h.numa_node_of_cpu(99) is None


def test_host_without_numa_information_assumes_one_node(tmp_path):
    tree = SysfsTree(tmp_path)
    standard_host(tree, numa=False)
    profile = merge_reports([collect_sysfs(tmp_path)])
    h = profile.host
    assert h.numa_nodes == [NumaNode(0, list(range(16)), h.memory_total_bytes)]
    assert h.sources["numa_nodes"] == "assumed (single node)"
    assert h.fallbacks["numa_nodes"] == ["sysfs: no sys/devices/system/node/node*"]


# -- no GPU -----------------------------------------------------------------------------
def test_every_gpu_provider_unavailable(tmp_path):
    standard_host(SysfsTree(tmp_path))
    reports = [
        collect_nvml(FakeNVML(init_error=NVMLError_LibraryNotFound())),
        collect_cuda(FakeCudaCore(error=RuntimeError("CUDA_ERROR_NO_DEVICE"))),
        collect_sysfs(tmp_path),
    ]
    profile = merge_reports(reports)
    assert profile.gpus == [] and profile.links == [] and not profile.has_gpu
    assert profile.cuda_status.startswith("no CUDA device:")
    assert "nvml: NVMLError_LibraryNotFound: NVML Shared Library Not Found" in profile.cuda_status
    assert "cuda.core: RuntimeError: CUDA_ERROR_NO_DEVICE" in profile.cuda_status
    assert "sysfs sees" not in profile.cuda_status
    assert profile.host.threads == 16
    assert profile.summary_lines()[-1] == profile.cuda_status


def test_nvidia_device_without_driver_is_mentioned(tmp_path):
    tree = SysfsTree(tmp_path)
    standard_host(tree)
    tree.gpu(GPU_A)
    tree.gpu(GPU_B)
    reports = [
        collect_nvml(FakeNVML(init_error=NVMLError_LibraryNotFound())),
        collect_cuda(FakeCudaCore(error=RuntimeError("CUDA_ERROR_NO_DEVICE"))),
        collect_sysfs(tmp_path),
    ]
    status = merge_reports(reports).cuda_status
    assert status.startswith("no CUDA device: nvml: ")
    assert f"sysfs sees 2 NVIDIA PCI device(s) ({GPU_A}, {GPU_B})" in status
    assert "is the NVIDIA driver loaded?" in status


def test_no_reports_at_all():
    profile = merge_reports([])
    assert profile.gpus == [] and profile.providers == {}
    assert profile.cuda_status == "no CUDA device: no provider found a GPU"


def test_merge_stamps_origin_and_version(tmp_path):
    profile = merge_reports(h200_reports(tmp_path))
    assert profile.origin == "live"
    assert profile.pyc_lab_version == pyc_lab.__version__
    assert profile.recorded_at and profile.recorded_at.endswith("+00:00")


# -- the real machine -------------------------------------------------------------------
def test_detect_hardware_on_this_machine_never_raises():
    profile = pyc_lab.detect_hardware()
    assert isinstance(profile, HardwareProfile)
    assert profile.host.threads and profile.host.threads >= 1
    assert profile.host.memory_total_bytes and profile.host.memory_total_bytes > 0
    assert profile.host.numa_nodes
    assert profile.host.sources["threads"] in ("sysfs", "psutil")
    assert profile.providers["sysfs"] == "ok"
    if profile.gpus:  # pragma: no cover - only on a GPU machine
        pytest.skip("this machine has a GPU")
    assert profile.gpus == [] and profile.links == []
    assert profile.cuda_status.startswith("no CUDA device:")
    assert profile.providers["nvml"].startswith("unavailable: ")
    assert profile.providers["cuda.core"].startswith("unavailable: ")
    reason = no_gpu_reason(need_cupy=False)
    if reason is not None:  # the device gate's reason is the headline, once
        assert profile.cuda_status.startswith(f"no CUDA device: {reason}")
        assert profile.providers["nvml"] == f"unavailable: {reason}"
        assert set(profile.provider_details) == {"nvml", "cuda.core"}
    else:  # pragma: no cover - a driver with a GPU, whose libraries are missing
        assert "nvml: " in profile.cuda_status and "cuda.core: " in profile.cuda_status
    text = profile.to_text()
    assert text.startswith("HardwareProfile (live)") and profile.cuda_status in text


def test_detect_hardware_from_a_snapshot_file(tmp_path):
    saved = merge_reports(h200_reports(tmp_path))
    path = tmp_path / "h200-vm.json"
    saved.to_json(path)
    loaded = detect_hardware(snapshot=path)
    assert loaded.origin == "snapshot h200-vm.json"
    assert loaded.gpus == saved.gpus and loaded.host == saved.host


def test_detect_hardware_unknown_snapshot_is_a_snapshot_error(tmp_path):
    with pytest.raises(SnapshotError, match="no hardware snapshot 'no-such-machine'"):
        detect_hardware(snapshot="no-such-machine")
