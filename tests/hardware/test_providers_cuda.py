"""The CUDA-driver provider against fake ``cuda.core`` devices and a fake driver module."""

from __future__ import annotations

import pytest

from pyc_lab.hardware.providers.base import Fact, Missing
from pyc_lab.hardware.providers.cuda import collect_cuda
from tests.fakes.fake_nvml import FakeCudaCore, FakeCudaDevice, FakeDriver

GIB = 2**30


def value(entry):
    assert isinstance(entry, Fact), f"expected a Fact, got {entry!r}"
    return entry.value


def two_devices(**kwargs) -> list[FakeCudaDevice]:
    return [
        FakeCudaDevice(0, "0000:18:00.0", uuid="aaaa", peers=[1], **kwargs),
        FakeCudaDevice(1, "0000:3B:00.0", uuid="GPU-bbbb", name="NVIDIA H100 80GB HBM3",
                       compute_capability=(9, 0), multiprocessor_count=132,
                       host_numa_id=1, peers=[0]),
    ]


def test_devices_become_facts():
    driver = FakeDriver({0: 141 * GIB, 1: 80 * GIB}, version=12080)
    report = collect_cuda(FakeCudaCore(two_devices()), driver)
    assert report.available and report.name == "cuda.core"
    assert report.system["cuda_driver_version"] == Fact("12.8", "cuda-bindings")
    g0, g1 = report.gpus
    assert value(g0["index"]) == 0 and value(g1["index"]) == 1
    assert value(g0["pci_bus_id"]) == "0000:18:00.0"
    assert value(g1["pci_bus_id"]) == "0000:3b:00.0"  # normalised
    assert value(g0["name"]) == "NVIDIA H200"
    assert value(g1["name"]) == "NVIDIA H100 80GB HBM3"
    # cuda.core gives bare UUIDs; pyc_lab writes them as nvidia-smi does
    assert value(g0["uuid"]) == "GPU-aaaa"
    assert value(g1["uuid"]) == "GPU-bbbb"
    assert value(g0["compute_capability"]) == "9.0"
    assert value(g0["sm_count"]) == 132
    assert value(g0["memory_bus_width_bits"]) == 6144
    # CUDA reports clocks in kHz
    assert value(g0["clock_sm_max_mhz"]) == 1980
    assert value(g0["clock_mem_max_mhz"]) == 3201
    assert value(g0["numa_node"]) == 0
    assert value(g1["numa_node"]) == 1
    assert g0["memory_total_bytes"] == Fact(141 * GIB, "cuda-bindings")
    assert g1["memory_total_bytes"] == Fact(80 * GIB, "cuda-bindings")
    assert g0["sm_count"].source == "cuda.core"


def test_host_numa_id_minus_one_is_missing():
    devs = [FakeCudaDevice(0, "0000:18:00.0", host_numa_id=-1)]
    g = collect_cuda(FakeCudaCore(devs), FakeDriver({0: GIB})).gpus[0]
    assert g["numa_node"] == Missing("host_numa_id is -1", "cuda.core")


def test_zero_properties_are_missing_not_zero():
    devs = [FakeCudaDevice(0, global_memory_bus_width=0, clock_rate=0, memory_clock_rate=0)]
    g = collect_cuda(FakeCudaCore(devs), FakeDriver({0: GIB})).gpus[0]
    for name in ("memory_bus_width_bits", "clock_sm_max_mhz", "clock_mem_max_mhz"):
        assert g[name] == Missing("no value", "cuda.core"), name


def test_one_failing_attribute_loses_only_itself():
    devs = [FakeCudaDevice(0, host_numa_id=RuntimeError("CUDA_ERROR_NOT_SUPPORTED"),
                           name=AttributeError("name"))]
    g = collect_cuda(FakeCudaCore(devs), FakeDriver({0: GIB})).gpus[0]
    assert isinstance(g["numa_node"], Missing)
    assert "CUDA_ERROR_NOT_SUPPORTED" in g["numa_node"].reason
    assert isinstance(g["name"], Missing)
    assert value(g["sm_count"]) == 132


def test_peer_access_needs_both_directions():
    devs = [FakeCudaDevice(0, "0000:18:00.0", peers=[1]),
            FakeCudaDevice(1, "0000:3b:00.0", peers=[0]),
            FakeCudaDevice(2, "0000:86:00.0", peers=[0])]  # 2 -> 0 only
    report = collect_cuda(FakeCudaCore(devs), FakeDriver({0: 1, 1: 1, 2: 1}))
    p2p = {k: v["p2p"] for k, v in report.links.items()}
    assert p2p == {
        ("0000:18:00.0", "0000:3b:00.0"): Fact(True, "cuda.core"),
        ("0000:18:00.0", "0000:86:00.0"): Fact(False, "cuda.core"),
        ("0000:3b:00.0", "0000:86:00.0"): Fact(False, "cuda.core"),
    }


def test_peer_query_failure_is_missing():
    devs = [FakeCudaDevice(0, "0000:18:00.0", peers=RuntimeError("peer query failed")),
            FakeCudaDevice(1, "0000:3b:00.0", peers=[0])]
    link = collect_cuda(FakeCudaCore(devs), FakeDriver({0: 1, 1: 1})).links[
        ("0000:18:00.0", "0000:3b:00.0")]
    assert isinstance(link["p2p"], Missing) and "peer query failed" in link["p2p"].reason


def test_device_order_and_ordinals_are_cudas():
    # CUDA_DEVICE_ORDER=FASTEST_FIRST or CUDA_VISIBLE_DEVICES can reorder devices
    devs = [FakeCudaDevice(0, "0000:3b:00.0"), FakeCudaDevice(1, "0000:18:00.0")]
    report = collect_cuda(FakeCudaCore(devs), FakeDriver({0: 1, 1: 1}))
    assert [(value(g["index"]), value(g["pci_bus_id"])) for g in report.gpus] == [
        (0, "0000:3b:00.0"), (1, "0000:18:00.0")]
    assert list(report.links) == [("0000:3b:00.0", "0000:18:00.0")]


def test_get_all_devices_raising_is_unavailable_with_reason():
    core = FakeCudaCore(error=RuntimeError("CUDA_ERROR_NO_DEVICE: no CUDA-capable device"))
    report = collect_cuda(core, FakeDriver())
    assert report.available is False
    assert report.reason == "RuntimeError: CUDA_ERROR_NO_DEVICE: no CUDA-capable device"
    assert report.gpus == []


def test_zero_devices_is_unavailable():
    report = collect_cuda(FakeCudaCore([]), FakeDriver())
    assert report.available is False
    assert "0 devices" in report.reason


def test_driver_errors_lose_only_memory_and_version():
    driver = FakeDriver({0: GIB}, errors={"cuDeviceTotalMem": 1, "cuDriverGetVersion": 3})
    report = collect_cuda(FakeCudaCore([FakeCudaDevice(0)]), driver)
    assert report.available
    assert isinstance(report.system["cuda_driver_version"], Missing)
    assert "cuDriverGetVersion returned 3" in report.system["cuda_driver_version"].reason
    g = report.gpus[0]
    assert isinstance(g["memory_total_bytes"], Missing)
    assert "cuDeviceTotalMem returned 1" in g["memory_total_bytes"].reason
    assert g["memory_total_bytes"].source == "cuda-bindings"
    assert value(g["sm_count"]) == 132


def test_cudevice_get_error_is_missing():
    driver = FakeDriver({}, version=13000)  # knows no ordinal
    report = collect_cuda(FakeCudaCore([FakeCudaDevice(0)]), driver)
    assert report.system["cuda_driver_version"] == Fact("13.0", "cuda-bindings")
    assert "cuDeviceGet returned 101" in report.gpus[0]["memory_total_bytes"].reason


def test_without_driver_bindings_memory_is_simply_absent(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_bindings(name, globals=None, locals=None, fromlist=(), level=0):
        if name.startswith("cuda.bindings") or (name == "cuda" and "bindings" in (fromlist or ())):
            raise ImportError("no cuda-bindings")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_bindings)
    report = collect_cuda(FakeCudaCore([FakeCudaDevice(0)]))
    assert report.available
    assert "memory_total_bytes" not in report.gpus[0]
    assert "cuda_driver_version" not in report.system
    assert value(report.gpus[0]["sm_count"]) == 132


def test_real_cuda_core_without_a_driver_is_unavailable():
    pytest.importorskip("cuda.core")
    report = collect_cuda()
    if report.available:  # pragma: no cover - only on a machine with a driver
        pytest.skip("this machine has a CUDA driver")
    assert report.name == "cuda.core" and report.reason
    assert report.gpus == []
