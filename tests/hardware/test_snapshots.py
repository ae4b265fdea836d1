"""The shipped snapshots: the recorded H200 and the DGX H100 built from public facts."""

from __future__ import annotations

import itertools

import pytest

import pyc_lab as pl


def test_shipped_snapshots_are_listed():
    assert pl.hardware.list_snapshots() == ["dgx-h100", "h200"]


def test_dgx_has_eight_gpus_nv18_everywhere_and_the_numa_split():
    hw = pl.detect_hardware(snapshot="dgx-h100")
    assert [g.index for g in hw.gpus] == list(range(8))
    for a, b in itertools.combinations(range(8), 2):
        link = hw.link(a, b)
        assert link.kind == "NV18" and link.nvlinks == 18 and link.p2p
    assert [g.numa_node for g in hw.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    node0, node1 = hw.host.numa_nodes
    assert hw.gpus[0].cpu_affinity == node0.cpus and hw.gpus[7].cpu_affinity == node1.cpus
    assert len(node0.cpus) == len(node1.cpus) == 112
    assert not set(node0.cpus) & set(node1.cpus)
    assert hw.link(3, 3).kind == "X"
    assert hw.numa_frame().loc[1, "gpus"] == "4,5,6,7"
    # 18 NVLink-4 links x 25 GB/s = 450 GB/s per direction is what the picture implies.
    assert hw.gpus[0].nvlink_version == 4
    assert "public facts" in hw.description


def test_dgx_snapshot_is_what_the_script_builds():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "make_dgx_h100_snapshot.py"
    spec = importlib.util.spec_from_file_location("make_dgx", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    built = mod.build()
    shipped = pl.detect_hardware(snapshot="dgx-h100")
    shipped.origin = built.origin
    assert shipped == built


def test_h200_snapshot_was_recorded_live_and_shows_the_numa_fallback():
    hw = pl.detect_hardware(snapshot="h200")
    assert hw.recorded_at and hw.driver_version
    assert set(hw.providers) == {"nvml", "cuda.core", "sysfs"}
    (gpu,) = hw.gpus
    assert gpu.name == "NVIDIA H200" and gpu.compute_capability == "9.0"
    assert gpu.sm_count == 132
    assert gpu.numa_node == 0 and gpu.sources["numa_node"] == "cuda.core"
    assert any("NotSupported" in reason for reason in gpu.fallbacks["numa_node"])
    assert gpu.pcie_bandwidth_gbps == pytest.approx(63.0, abs=0.1)


def test_snapshot_origin_names_the_file():
    hw = pl.detect_hardware(snapshot="h200")
    assert hw.origin == "snapshot h200.json"
