"""The NVML provider against a dict-handle NVML stand-in (no GPU, no libnvidia-ml)."""

from __future__ import annotations

import pytest

from pyc_lab.hardware.providers import nvml as nvml_provider
from pyc_lab.hardware.providers.base import (
    Fact,
    Missing,
    ProviderReport,
    guarded,
    normalize_bus_id,
)
from pyc_lab.hardware.providers.nvml import collect_nvml
from tests.fakes.fake_nvml import (
    FakeNVML,
    NVMLError_InvalidArgument,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
    NVMLError_Unknown,
    nvlinks_to,
    nvml_gpu,
    switch_links,
)

BUS_A = b"00000000:18:00.0"
BUS_B = b"00000000:3B:00.0"  # NVML writes hex digits in upper case


def two_gpus(a: dict | None = None, b: dict | None = None, links=None, **kwargs) -> FakeNVML:
    ga = nvml_gpu(**{"bus_id": BUS_A, "name": b"NVIDIA H200", "uuid": "GPU-aaaa", **(a or {})})
    gb = nvml_gpu(**{"bus_id": BUS_B, "name": "NVIDIA H200 NVL", "uuid": b"GPU-bbbb",
                     **(b or {})})
    return FakeNVML([ga, gb], links, **kwargs)


def value(entry):
    assert isinstance(entry, Fact), f"expected a Fact, got {entry!r}"
    return entry.value


def link_of(report: ProviderReport) -> dict:
    assert list(report.links) == [("0000:18:00.0", "0000:3b:00.0")]
    return report.links[("0000:18:00.0", "0000:3b:00.0")]


# -- normalize_bus_id / guarded ---------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"00000000:18:00.0", "0000:18:00.0"),
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("18:00.0", "0000:18:00.0"),
        ("0001:9a:1f.7", "0001:9a:1f.7"),
        (b"00000000:18:00.0\x00\x00", "0000:18:00.0"),
        (" 0000:18:00.0\n", "0000:18:00.0"),
        ("not a bus", None),
        ("0000:18:00.8", None),  # function is 0-7
        ("", None),
        (None, None),
    ],
)
def test_normalize_bus_id(raw, expected):
    assert normalize_bus_id(raw) == expected


def test_guarded_stores_fact_missing_or_reason():
    target: dict = {}
    guarded(target, "ok", "src", lambda: 3)
    guarded(target, "none", "src", lambda: None)
    guarded(target, "missing", "src", lambda: Missing("told so", "other"))
    guarded(target, "boom", "src", lambda: (_ for _ in ()).throw(NVMLError_NotSupported()))
    guarded(target, "bare", "src", lambda: (_ for _ in ()).throw(KeyError()))
    assert target["ok"] == Fact(3, "src")
    assert target["none"] == Missing("no value", "src")
    assert target["missing"] == Missing("told so", "other")
    assert target["boom"] == Missing("NVMLError_NotSupported: Not Supported", "src")
    assert target["bare"] == Missing("KeyError", "src")


# -- a healthy 2-GPU machine -----------------------------------------------------------
def test_two_gpus_identity_and_system_facts():
    fake = two_gpus()
    report = collect_nvml(fake)
    assert report.available and report.name == "nvml" and report.status == "ok"
    assert value(report.system["driver_version"]) == "570.124.06"
    assert value(report.system["cuda_driver_version"]) == "12.8"
    assert [value(g["index"]) for g in report.gpus] == [0, 1]
    assert [value(g["pci_bus_id"]) for g in report.gpus] == ["0000:18:00.0", "0000:3b:00.0"]
    # bytes and str answers (older and newer pynvml) both become str
    assert [value(g["name"]) for g in report.gpus] == ["NVIDIA H200", "NVIDIA H200 NVL"]
    assert [value(g["uuid"]) for g in report.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert value(report.gpus[0]["compute_capability"]) == "9.0"
    assert all(f.source == "nvml" for g in report.gpus for f in g.values())
    # NVML was shut down again after a successful init
    assert fake.called("nvmlInit") == [()] and fake.called("nvmlShutdown") == [()]
    assert not fake.initialised


def test_memory_clocks_and_pcie_link():
    fake = two_gpus(a={"clock_sm": 1200, "clock_sm_max": 1980, "clock_mem": 2619,
                       "clock_mem_max": 3201, "pcie_gen": 4, "pcie_gen_max": 5,
                       "pcie_width": 8, "pcie_width_max": 16, "memory_total": 1000,
                       "memory_free": 400, "bus_width": 5120, "cc": (8, 6)})
    g = collect_nvml(fake).gpus[0]
    assert value(g["compute_capability"]) == "8.6"
    assert value(g["memory_total_bytes"]) == 1000
    assert value(g["memory_free_bytes"]) == 400
    assert value(g["memory_bus_width_bits"]) == 5120
    # SM and memory clocks are not swapped, current and max are not swapped
    assert value(g["clock_sm_mhz"]) == 1200
    assert value(g["clock_sm_max_mhz"]) == 1980
    assert value(g["clock_mem_mhz"]) == 2619
    assert value(g["clock_mem_max_mhz"]) == 3201
    assert value(g["pcie_gen"]) == 4
    assert value(g["pcie_gen_max"]) == 5
    assert value(g["pcie_width"]) == 8
    assert value(g["pcie_width_max"]) == 16


def test_cuda_driver_version_formatting():
    assert value(collect_nvml(two_gpus(cuda_version=13000)).system["cuda_driver_version"]) \
        == "13.0"
    assert value(collect_nvml(two_gpus(cuda_version=12040)).system["cuda_driver_version"]) \
        == "12.4"


def test_cpu_affinity_from_bitmask_words(monkeypatch):
    monkeypatch.setattr(nvml_provider.os, "cpu_count", lambda: 128)
    fake = two_gpus(a={"cpu_affinity": [0x0F0F, 0]}, b={"cpu_affinity": [0, 0b11]})
    report = collect_nvml(fake)
    assert value(report.gpus[0]["cpu_affinity"]) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert value(report.gpus[1]["cpu_affinity"]) == [64, 65]
    # 128 CPUs need two 64-bit words
    assert [n for (_i, n) in fake.called("nvmlDeviceGetCpuAffinity")] == [2, 2]


def test_cpu_affinity_asks_for_at_least_one_word(monkeypatch):
    monkeypatch.setattr(nvml_provider.os, "cpu_count", lambda: None)
    fake = two_gpus(a={"cpu_affinity": [0b101]})
    assert value(collect_nvml(fake).gpus[0]["cpu_affinity"]) == [0, 2]
    assert {n for (_i, n) in fake.called("nvmlDeviceGetCpuAffinity")} == {1}


def test_empty_cpu_affinity_is_missing():
    g = collect_nvml(two_gpus(a={"cpu_affinity": [0]})).gpus[0]
    assert g["cpu_affinity"] == Missing("no value", "nvml")


@pytest.mark.parametrize(
    ("mig", "expected"),
    [((0, 0), "disabled"), ((1, 1), "enabled"), ((0, 1), "disabled"), ((1, 0), "enabled"),
     (NVMLError_NotSupported(), "not supported")],
)
def test_mig_mode(mig, expected):
    assert value(collect_nvml(two_gpus(a={"mig": mig})).gpus[0]["mig_mode"]) == expected


def test_mig_mode_other_errors_are_missing_not_not_supported():
    g = collect_nvml(two_gpus(a={"mig": NVMLError_NoPermission()})).gpus[0]
    assert isinstance(g["mig_mode"], Missing)
    assert "NoPermission" in g["mig_mode"].reason


# -- NUMA -------------------------------------------------------------------------------
def test_numa_not_supported_is_missing_and_loses_nothing_else():
    report = collect_nvml(two_gpus(a={"numa": NVMLError_NotSupported()}, b={"numa": 1}))
    g0, g1 = report.gpus
    assert isinstance(g0["numa_node"], Missing)
    assert g0["numa_node"].source == "nvml"
    assert "NotSupported" in g0["numa_node"].reason
    assert value(g1["numa_node"]) == 1
    # the neighbouring queries of the same GPU still answered
    assert value(g0["cpu_affinity"]) == list(range(8))
    assert value(g0["name"]) == "NVIDIA H200"


def test_negative_numa_node_is_missing():
    g = collect_nvml(two_gpus(a={"numa": -1})).gpus[0]
    assert g["numa_node"] == Missing("NUMA node reported as -1", "nvml")


def test_every_query_failing_still_gives_a_report():
    broken = {k: NVMLError_NotSupported() for k in nvml_gpu() if k not in ("bus_id", "mig")}
    report = collect_nvml(two_gpus(a=broken))
    assert report.available
    g = report.gpus[0]
    assert value(g["pci_bus_id"]) == "0000:18:00.0"
    for name in ("name", "uuid", "compute_capability", "memory_total_bytes", "clock_sm_mhz",
                 "pcie_gen", "pcie_width_max", "numa_node", "cpu_affinity"):
        assert isinstance(g[name], Missing), name
    assert g["nvlink_version"] == Missing("no active NVLink", "nvml")
    assert value(report.gpus[1]["name"]) == "NVIDIA H200 NVL"


# -- NVLink -----------------------------------------------------------------------------
def test_direct_nvlinks_count_and_kind():
    fake = two_gpus(
        a={"nvlinks": nvlinks_to(BUS_B, 4) + nvlinks_to(BUS_B, 2, state=0)},
        b={"nvlinks": nvlinks_to(BUS_A, 4)},
        links={(0, 1): {"ancestor": 50}},
    )
    report = collect_nvml(fake)
    link = link_of(report)
    assert value(link["nvlinks"]) == 4  # the two disabled links do not count
    assert value(link["kind"]) == "NV4"
    assert value(link["p2p"]) is True
    # NVML enum 6 is NVLink 4.0
    assert value(report.gpus[0]["nvlink_version"]) == 4


@pytest.mark.parametrize(("raw", "gen"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4),
                                          (7, 5)])
def test_nvlink_version_enum(raw, gen):
    fake = two_gpus(a={"nvlinks": nvlinks_to(BUS_B, 2, version=raw)})
    assert value(collect_nvml(fake).gpus[0]["nvlink_version"]) == gen


def test_nvswitch_links_give_nv_min_count():
    fake = two_gpus(
        a={"nvlinks": switch_links(18)},
        b={"nvlinks": switch_links(12) + switch_links(6, state=0)},
    )
    report = collect_nvml(fake)
    link = link_of(report)
    assert value(link["nvlinks"]) == 12
    assert value(link["kind"]) == "NV12"
    assert [value(g["nvlink_version"]) for g in report.gpus] == [4, 4]


def test_nvswitch_on_one_gpu_only_is_no_nvlink():
    fake = two_gpus(a={"nvlinks": switch_links(18)}, links={(0, 1): {"ancestor": 40}})
    link = link_of(collect_nvml(fake))
    assert value(link["nvlinks"]) == 0
    assert value(link["kind"]) == "NODE"


def test_links_to_a_third_gpu_do_not_count_for_this_pair():
    fake = two_gpus(a={"nvlinks": nvlinks_to(b"00000000:99:00.0", 6)},
                    links={(0, 1): {"ancestor": 30}})
    link = link_of(collect_nvml(fake))
    assert value(link["nvlinks"]) == 0
    assert value(link["kind"]) == "PHB"


def test_nvlink_queries_failing_are_skipped_per_link():
    links = nvlinks_to(BUS_B, 4)
    links[0] = dict(links[0], state=NVMLError_NotSupported())  # link 0 does not exist
    links[1] = dict(links[1], remote=NVMLError_Unknown())  # remote unknown: not counted
    links[2] = dict(links[2], type=NVMLError_NotSupported())  # type unknown: GPU assumed
    links[3] = dict(links[3], version=NVMLError_NotSupported())
    report = collect_nvml(two_gpus(a={"nvlinks": links}))
    link = link_of(report)
    assert value(link["nvlinks"]) == 2
    assert value(link["kind"]) == "NV2"
    # version comes from the first active link that answers
    assert value(report.gpus[0]["nvlink_version"]) == 4


def test_no_nvlink_state_support_at_all():
    fake = two_gpus(a={"nvlinks": NVMLError_NotSupported()},
                    b={"nvlinks": NVMLError_NotSupported()},
                    links={(0, 1): {"ancestor": 10}})
    report = collect_nvml(fake)
    assert value(link_of(report)["kind"]) == "PIX"
    assert all(isinstance(g["nvlink_version"], Missing) for g in report.gpus)


# -- PCIe common ancestor and P2P --------------------------------------------------------
@pytest.mark.parametrize(
    ("level", "kind"),
    [(10, "PIX"), (20, "PXB"), (30, "PHB"), (40, "NODE"), (50, "SYS"), (99, "SYS")],
)
def test_common_ancestor_levels(level, kind):
    link = link_of(collect_nvml(two_gpus(links={(0, 1): {"ancestor": level}})))
    assert link["kind"] == Fact(kind, "nvml")
    assert link["nvlinks"] == Fact(0, "nvml")


def test_common_ancestor_failure_is_missing():
    link = link_of(collect_nvml(two_gpus(links={(0, 1): {"ancestor": NVMLError_Unknown()}})))
    assert isinstance(link["kind"], Missing)
    assert value(link["nvlinks"]) == 0


@pytest.mark.parametrize(("status", "ok"), [(0, True), (1, False), (5, False)])
def test_p2p_status(status, ok):
    fake = two_gpus(links={(0, 1): {"p2p": status}})
    assert link_of(collect_nvml(fake))["p2p"] == Fact(ok, "nvml")
    assert fake.called("nvmlDeviceGetP2PStatus") == [(0, 1, 0)]


def test_p2p_failure_is_missing():
    link = link_of(collect_nvml(two_gpus(links={(0, 1): {"p2p": NVMLError_NotSupported()}})))
    assert isinstance(link["p2p"], Missing)


def test_real_pynvml_defines_p2p_read_index_as_a_tuple():
    """Why the next test exists: pynvml writes ``NVML_P2P_CAPS_INDEX_READ = 0,``."""
    pynvml = pytest.importorskip("pynvml")
    assert pynvml.NVML_P2P_CAPS_INDEX_READ in (0, (0,))


def test_p2p_works_with_pynvmls_tuple_constant():
    # ctypes cannot convert the tuple (the fake raises ctypes.ArgumentError as ctypes does),
    # so the provider must unwrap it
    fake = two_gpus(links={(0, 1): {"p2p": 0}})
    fake.NVML_P2P_CAPS_INDEX_READ = (0,)  # exactly as pynvml defines it
    assert link_of(collect_nvml(fake))["p2p"] == Fact(True, "nvml")
    assert fake.called("nvmlDeviceGetP2PStatus") == [(0, 1, 0)]


def test_fake_p2p_rejects_a_tuple_index_like_ctypes():
    # guards the test double: it must fail where real pynvml + ctypes fail
    import ctypes

    fake = two_gpus()
    fake.nvmlInit()
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(ctypes.ArgumentError):
        fake.nvmlDeviceGetP2PStatus(h0, h1, (0,))


def test_three_gpus_give_three_pairs_in_nvml_order():
    gpus = [nvml_gpu(f"00000000:{b}:00.0".encode()) for b in ("18", "3B", "86")]
    fake = FakeNVML(gpus, {(0, 1): {"ancestor": 40}, (0, 2): {"ancestor": 50},
                           (1, 2): {"ancestor": 50}})
    report = collect_nvml(fake)
    assert {k: value(v["kind"]) for k, v in report.links.items()} == {
        ("0000:18:00.0", "0000:3b:00.0"): "NODE",
        ("0000:18:00.0", "0000:86:00.0"): "SYS",
        ("0000:3b:00.0", "0000:86:00.0"): "SYS",
    }


def test_gpu_without_bus_id_has_no_links():
    report = collect_nvml(two_gpus(b={"bus_id": NVMLError_Unknown()}))
    assert isinstance(report.gpus[1]["pci_bus_id"], Missing)
    assert report.links == {}


# -- NVML unavailable ------------------------------------------------------------------
def test_init_failure_makes_the_report_unavailable():
    fake = two_gpus(init_error=NVMLError_LibraryNotFound())
    report = collect_nvml(fake)
    assert report.available is False
    assert report.reason == "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    assert report.status == "unavailable: " + report.reason
    assert report.gpus == [] and report.links == {}
    assert fake.called("nvmlShutdown") == []  # nothing to shut down


def test_device_count_failure_makes_the_report_unavailable_and_shuts_down():
    fake = two_gpus(count_error=NVMLError_Unknown("driver/library version mismatch"))
    report = collect_nvml(fake)
    assert report.available is False
    assert report.reason.startswith("nvmlDeviceGetCount failed:")
    assert "version mismatch" in report.reason
    assert fake.called("nvmlShutdown") == [()]


def test_zero_gpus_is_available_and_empty():
    report = collect_nvml(FakeNVML([]))
    assert report.available and report.gpus == [] and report.links == {}
    assert value(report.system["driver_version"]) == "570.124.06"


def test_system_queries_failing_are_missing():
    report = collect_nvml(two_gpus(driver_version=NVMLError_Unknown(),
                                   cuda_version=NVMLError_NotSupported()))
    assert report.available
    assert isinstance(report.system["driver_version"], Missing)
    assert isinstance(report.system["cuda_driver_version"], Missing)


def test_shutdown_failure_is_ignored():
    fake = two_gpus()

    def bad_shutdown():
        raise NVMLError_Unknown("shutdown")

    fake.nvmlShutdown = bad_shutdown
    assert collect_nvml(fake).available


def test_real_pynvml_without_a_driver_is_unavailable():
    pytest.importorskip("pynvml")
    report = collect_nvml()
    if report.available:  # pragma: no cover - only on a machine with a driver
        pytest.skip("this machine has a working NVML")
    assert report.name == "nvml" and report.reason


def test_a_gpu_that_cannot_be_opened_does_not_raise():
    # NVML_ERROR_NO_PERMISSION for a GPU outside the container's cgroup
    fake = two_gpus(handle_errors={1: NVMLError_NoPermission()},
                    a={"nvlinks": nvlinks_to(BUS_B, 4)})
    report = collect_nvml(fake)  # must not raise
    assert report.available
    assert [value(g["index"]) for g in report.gpus] == [0, 1]
    assert value(report.gpus[0]["pci_bus_id"]) == "0000:18:00.0"
    assert value(report.gpus[0]["name"]) == "NVIDIA H200"
    bad = report.gpus[1]["pci_bus_id"]
    assert isinstance(bad, Missing)
    assert "cannot open GPU 1" in bad.reason and "Insufficient Permissions" in bad.reason
    assert report.links == {}  # no pair without a bus id
    assert fake.called("nvmlShutdown") == [()]


def test_fake_rejects_unknown_clock_ids():
    # the fake must not answer a clock query NVML would refuse (guards the test double)
    fake = two_gpus()
    fake.nvmlInit()
    with pytest.raises(NVMLError_InvalidArgument):
        fake.nvmlDeviceGetClockInfo(fake.nvmlDeviceGetHandleByIndex(0), 7)
