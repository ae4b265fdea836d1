"""HardwareProfile: JSON round trip, snapshot errors and the pandas views."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pyc_lab.errors import PycLabError, SnapshotError
from pyc_lab.hardware import (
    GPUInfo,
    HardwareProfile,
    HostInfo,
    LinkInfo,
    NumaNode,
    merge_reports,
    pcie_bandwidth_gbps,
)
from pyc_lab.hardware.providers import collect_cuda, collect_nvml, collect_sysfs
from tests.fakes.fake_nvml import (
    FakeCudaCore,
    FakeCudaDevice,
    FakeDriver,
    FakeNVML,
    NVMLError_NotSupported,
    nvlinks_to,
    nvml_gpu,
)
from tests.fakes.sysfs_tree import GPU_A, GPU_B, NODE_CPUS, two_gpu_tree

GIB = 2**30


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> HardwareProfile:
    """Two H200s on NUMA node 0 of a two-socket host, NV4 between them, merged from fakes.

    Shared by the module's tests, none of which changes it.
    """
    nvml = FakeNVML([
        nvml_gpu(b"00000000:18:00.0", numa=NVMLError_NotSupported(),
                 nvlinks=nvlinks_to(b"00000000:3B:00.0", 4), cpu_affinity=[0x0F0F]),
        nvml_gpu(b"00000000:3B:00.0", numa=NVMLError_NotSupported(),
                 nvlinks=nvlinks_to(b"00000000:18:00.0", 4), cpu_affinity=[0x0F0F],
                 mig=NVMLError_NotSupported()),
    ])
    core = FakeCudaCore([FakeCudaDevice(0, GPU_A, peers=[1]),
                         FakeCudaDevice(1, GPU_B, peers=[0])])
    root = tmp_path_factory.mktemp("machine")
    two_gpu_tree(root, "same_numa", numa_a=-1, numa_b=-1)
    return merge_reports([
        collect_nvml(nvml),
        collect_cuda(core, FakeDriver({0: 141 * GIB, 1: 141 * GIB})),
        collect_sysfs(root, [GPU_A, GPU_B]),
    ])


# -- round trip ---------------------------------------------------------------------------
def test_round_trip_through_json_text_is_exact(profile):
    text = profile.to_json()
    again = HardwareProfile.from_json(text)
    assert again == profile
    assert again.to_json() == text
    # the profile really carries data, so equality is not vacuous
    assert len(again.gpus) == 2 and again.gpus[0].sources["numa_node"] == "cuda.core"
    assert again.gpus[0].fallbacks["numa_node"] == profile.gpus[0].fallbacks["numa_node"]
    assert isinstance(again.host.numa_nodes[0], NumaNode)
    assert isinstance(again.links[0], LinkInfo)


def test_round_trip_through_a_file(profile, tmp_path):
    path = tmp_path / "snap.json"
    text = profile.to_json(path)
    assert path.read_text() == text
    assert HardwareProfile.from_json(path) == profile
    assert HardwareProfile.from_json(str(path)) == profile
    assert HardwareProfile.from_json(json.loads(text)) == profile


def test_round_trip_detects_a_difference(profile):
    data = json.loads(profile.to_json())
    data["gpus"][1]["numa_node"] = 1
    assert HardwareProfile.from_json(data) != profile


def test_to_dict_writes_cpu_sets_as_cpulists(profile):
    d = profile.to_dict()
    assert d["schema"] == 1
    assert d["host"]["numa_nodes"][0]["cpus"] == "0-3,8-11"
    assert d["gpus"][0]["cpu_affinity"] == "0-3,8-11"
    assert d["host"]["process_affinity"] is None  # not a live profile
    assert d["links"][0] == {"a": 0, "b": 1, "kind": "NV4", "nvlinks": 4, "p2p": True,
                             "sources": {"kind": "nvml", "nvlinks": "nvml", "p2p": "nvml"}}
    json.dumps(d)  # plain data
    # to_dict does not change the profile itself
    assert profile.host.numa_nodes[0].cpus == NODE_CPUS[0]


def test_round_trip_of_empty_and_default_profiles():
    for p in (HardwareProfile(),
              HardwareProfile(host=HostInfo(threads=4, process_affinity=[0, 2],
                                            numa_nodes=[NumaNode(0, [])]),
                              cuda_status="no CUDA device: x")):
        assert HardwareProfile.from_json(p.to_json()) == p


def test_round_trip_keeps_empty_and_unknown_cpu_sets():
    p = HardwareProfile(gpus=[GPUInfo(0, cpu_affinity=[]), GPUInfo(1, cpu_affinity=None)])
    again = HardwareProfile.from_json(p.to_json())
    assert again.gpus[0].cpu_affinity == [] and again.gpus[1].cpu_affinity is None


def test_schema_is_optional_in_old_files(profile):
    data = profile.to_dict()
    del data["schema"]
    assert HardwareProfile.from_dict(data) == profile


# -- snapshot errors ----------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(SnapshotError, match="does not exist") as info:
        HardwareProfile.from_json(tmp_path / "nope.json")
    assert "nope.json" in str(info.value) and "to_json" in str(info.value)
    with pytest.raises(SnapshotError, match="does not exist"):
        HardwareProfile.from_json(str(tmp_path / "nope.json"))


def test_invalid_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"host": ')
    with pytest.raises(SnapshotError, match="is not valid JSON") as info:
        HardwareProfile.from_json(path)
    assert str(path) in str(info.value)
    with pytest.raises(SnapshotError, match="the given string is not valid JSON"):
        HardwareProfile.from_json('{"host": }')


@pytest.mark.parametrize("content", ["[1, 2]", '{"gpus": []}', '{"host": {}}', "3", '"x"'])
def test_not_a_profile(tmp_path, content):
    path = tmp_path / "other.json"
    path.write_text(content)
    with pytest.raises(SnapshotError, match="not a pyc_lab hardware profile") as info:
        HardwareProfile.from_json(path)
    assert "detect_hardware().to_json(path)" in str(info.value)


def test_not_a_profile_from_a_json_string():
    with pytest.raises(SnapshotError, match="not a pyc_lab hardware profile"):
        HardwareProfile.from_json('{"cpus": 4}')


@pytest.mark.parametrize("schema", [2, 99, "2", None])
def test_newer_or_unreadable_schema(profile, schema):
    data = profile.to_dict()
    data["schema"] = schema
    with pytest.raises(SnapshotError, match="newer than this pyc_lab understands") as info:
        HardwareProfile.from_json(json.dumps(data))
    assert "upgrade pyc_lab" in str(info.value)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d["gpus"][0].pop("index"),
        lambda d: d["host"]["numa_nodes"][0].pop("id"),
        lambda d: d.update(host=[1, 2]),
    ],
)
def test_malformed_profile(profile, damage):
    data = profile.to_dict()
    damage(data)
    with pytest.raises(SnapshotError, match="hardware profile is malformed") as info:
        HardwareProfile.from_json(json.dumps(data))
    assert "pyc-lab hw --save PATH" in str(info.value)


def test_bad_cpulist_in_snapshot_is_a_snapshot_error(profile):
    data = profile.to_dict()
    data["host"]["numa_nodes"][0]["cpus"] = "0-x"
    with pytest.raises(SnapshotError, match="malformed") as info:
        HardwareProfile.from_json(data)
    assert "0-x" in str(info.value)


def test_number_for_a_cpulist_is_a_snapshot_error(profile):
    data = profile.to_dict()
    data["gpus"][0]["cpu_affinity"] = 5
    with pytest.raises(SnapshotError, match="malformed"):
        HardwareProfile.from_json(data)


# -- tables -------------------------------------------------------------------------------
def test_to_frame(profile):
    frame = profile.to_frame()
    assert frame.index.name == "gpu" and list(frame.index) == [0, 1]
    assert list(frame.columns) == [
        "name", "cc", "sms", "memory_gib", "free_gib", "mem_bw_gbps", "sm_clock_max_mhz",
        "pcie", "pcie_max", "pcie_gbps", "numa_node", "numa_source", "cpu_affinity", "mig",
        "pci_bus_id", "uuid",
    ]
    assert frame.shape == (2, 16)
    row = frame.loc[0]
    assert row["name"] == "NVIDIA H200" and row["cc"] == "9.0" and row["sms"] == 132
    assert row["memory_gib"] == round(nvml_gpu()["memory_total"] / GIB, 1) == 140.4
    assert row["mem_bw_gbps"] == 4916.7  # 6144 bit / 8 x 3201 MHz x 2
    assert row["pcie"] == "Gen1 x16" and row["pcie_max"] == "Gen5 x16"
    assert row["pcie_gbps"] == 63.02
    assert row["numa_node"] == 0 and row["numa_source"] == "cuda.core"
    assert row["cpu_affinity"] == "0-3,8-11"
    assert row["pci_bus_id"] == GPU_A and frame.loc[1, "pci_bus_id"] == GPU_B
    assert list(frame["mig"]) == ["disabled", "not supported"]


def test_to_frame_without_gpus():
    frame = HardwareProfile().to_frame()
    assert frame.empty and frame.index.name == "gpu" and list(frame.columns) == ["name"]


def test_link_matrix(profile):
    m = profile.link_matrix()
    assert list(m.index) == ["GPU0", "GPU1"]
    assert list(m.columns) == ["GPU0", "GPU1", "CPU Affinity", "NUMA Affinity"]
    assert m.loc["GPU0", "GPU0"] == "X" and m.loc["GPU1", "GPU1"] == "X"
    assert m.loc["GPU0", "GPU1"] == "NV4" and m.loc["GPU1", "GPU0"] == "NV4"
    assert list(m["CPU Affinity"]) == ["0-3,8-11", "0-3,8-11"]
    assert list(m["NUMA Affinity"]) == [0, 0]


def test_link_matrix_unknowns():
    p = HardwareProfile(gpus=[GPUInfo(0), GPUInfo(1, numa_node=1, cpu_affinity=[4, 5])],
                        links=[LinkInfo(0, 1)])
    m = p.link_matrix()
    assert m.loc["GPU0", "GPU1"] == "?"
    assert list(m["CPU Affinity"]) == ["?", "4-5"]
    assert list(m["NUMA Affinity"]) == ["?", 1]
    assert HardwareProfile().link_matrix().shape == (0, 2)


def test_numa_frame(profile):
    f = profile.numa_frame()
    assert f.index.name == "node" and list(f.index) == [0, 1]
    assert list(f.columns) == ["cpus", "n_cpus", "memory_gib", "gpus"]
    assert f.loc[0].tolist() == ["0-3,8-11", 8, 64.0, "0,1"]
    assert f.loc[1].tolist() == ["4-7,12-15", 8, 32.0, ""]


def test_sources_frame(profile):
    f = profile.sources_frame()
    assert list(f.columns) == ["scope", "field", "value", "source", "fallbacks"]
    assert set(f["scope"]) == {"host", "GPU0", "GPU1"}
    numa = f[(f.scope == "GPU0") & (f.field == "numa_node")].iloc[0]
    assert numa["value"] == "0" and numa["source"] == "cuda.core"
    assert numa["fallbacks"] == ("nvml: NVMLError_NotSupported: Not Supported; "
                                 "sysfs: numa_node is -1 (firmware gave no affinity)")
    nodes = f[(f.scope == "host") & (f.field == "numa_nodes")].iloc[0]
    assert (nodes["value"], nodes["source"]) == ("[2 item(s)]", "sysfs")
    aff = f[(f.scope == "GPU0") & (f.field == "cpu_affinity")].iloc[0]
    assert aff["value"] == "0-3,8-11" and aff["source"] == "nvml"
    assert "index" not in set(f["field"])
    # one row per GPU field that has a source or a fallback
    expected = sum(len(set(g.sources) | set(g.fallbacks)) for g in profile.gpus)
    assert (f.scope != "host").sum() == expected


def test_sources_frame_of_an_empty_profile():
    f = HardwareProfile().sources_frame()
    assert isinstance(f, pd.DataFrame) and f.empty and f.shape[1] == 5


# -- queries and small helpers --------------------------------------------------------------
def test_gpu_lookup_and_errors(profile):
    assert profile.has_gpu and profile.gpu(1).pci_bus_id == GPU_B
    with pytest.raises(PycLabError, match=r"no GPU 5 in this profile; it has 2 GPU\(s\) \(0, 1\)"):
        profile.gpu(5)
    with pytest.raises(PycLabError, match=r"it has 0 GPU\(s\)$"):
        HardwareProfile().gpu(0)


@pytest.mark.parametrize(
    ("gen", "width", "gbps"),
    [(5, 16, 63.02), (4, 16, 31.51), (3, 16, 15.75), (6, 16, 121.0), (1, 1, 0.25),
     (None, 16, None), (5, None, None), (7, 16, None), (0, 16, None)],
)
def test_pcie_bandwidth(gen, width, gbps):
    assert pcie_bandwidth_gbps(gen, width) == gbps


def test_gpu_bandwidth_properties():
    g = GPUInfo(0, pcie_gen=1, pcie_width=16, pcie_gen_max=5, pcie_width_max=16,
                memory_bus_width_bits=5120, clock_mem_max_mhz=2619)
    assert g.pcie_bandwidth_gbps == 63.02
    assert g.pcie_bandwidth_current_gbps == 4.0
    assert g.memory_bandwidth_gbps == 3352.3  # H100 SXM: 5120 bit HBM3 at 2619 MHz
    assert GPUInfo(0).memory_bandwidth_gbps is None


def test_text_and_html_views(profile):
    text = profile.to_text()
    assert text.splitlines()[0] == "HardwareProfile (live)"
    assert "2 socket(s), 8 cores, 16 threads" in text
    assert "NUMA 0: CPUs 0-3,8-11, 64.0 GiB, GPUs 0,1" in text
    assert "GPU0: NVIDIA H200 (cc 9.0, 132 SMs, 140.4 GiB) | PCIe Gen5 x16 = 63.02 GB/s" in text
    assert "NUMA 0 (from cuda.core)" in text
    assert "NV4" in text  # the link matrix
    assert repr(profile) == text
    html = profile._repr_html_()
    assert html.startswith("<div class='pyc-lab-hw'>") and html.endswith("</div>")
    assert "<table" in html


def test_html_escapes(tmp_path):
    p = HardwareProfile(host=HostInfo(cpu_model="<script>"), cuda_status="no CUDA device: <x>")
    html = p._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_snapshot_files_are_text(profile, tmp_path):
    path = Path(tmp_path / "x.json")
    profile.to_json(path, indent=None)
    assert len(path.read_text().splitlines()) == 1
