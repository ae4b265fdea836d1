"""On a real GPU (GPU lane): topology, bandwidth probe and widget against the device."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.profiling.bandwidth import bandwidth_summary
from pyc_lab.widgets import TopologyWidget

pytestmark = pytest.mark.gpu


def test_detect_hardware_finds_every_cuda_device_with_sources():
    import cupy as cp

    hw = pl.detect_hardware()
    assert len(hw.gpus) == cp.cuda.runtime.getDeviceCount()
    assert hw.cuda_status == f"{len(hw.gpus)} CUDA device(s)"
    for g in hw.gpus:
        props = cp.cuda.runtime.getDeviceProperties(g.index)
        assert g.sm_count == props["multiProcessorCount"]
        assert g.compute_capability == f"{props['major']}.{props['minor']}"
        # NVML (first in the chain) counts memory the driver reserves; CUDA's total does
        # not: on the H200 they differ by 0.4 %.
        assert abs(g.memory_total_bytes - props["totalGlobalMem"]) <= 0.01 * g.memory_total_bytes
        assert g.name and g.uuid and g.pci_bus_id
        # Every known value says where it came from.
        for field, source in g.sources.items():
            assert getattr(g, field) is not None, field
            assert source
        # The fallback chain lands on a NUMA node (cuda.core on the H200 VM).
        assert g.numa_node is not None and g.numa_node >= 0
        assert g.sources["numa_node"] in {"nvml", "cuda.core", "sysfs"}
        assert g.pcie_bandwidth_gbps and g.pcie_bandwidth_gbps > 0
        assert g.memory_bandwidth_gbps and g.memory_bandwidth_gbps > 0


def test_profile_round_trips_through_json():
    hw = pl.detect_hardware()
    again = pl.HardwareProfile.from_json(hw.to_json())
    assert again == hw


def test_probe_bandwidth_measures_every_kind_with_events():
    sizes = [4096, 1 << 20, 64 << 20]
    kinds = ["h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned", "d2d"]
    df = pl.probe_bandwidth(kinds=kinds, sizes=sizes, min_time_s=0.005)
    ok = df[df["status"] == "ok"]
    assert len(ok) == len(kinds) * len(sizes)
    assert set(ok["timer"]) == {"cuda events"}
    assert (ok["gbps"] > 0).all() and np.isfinite(ok["gbps"]).all()
    assert (ok["repeats"] >= 3).all()
    # Theoretical figures come from the profile: PCIe for host copies, HBM for D2D.
    hw = pl.detect_hardware()
    host = ok[ok["kind"].str.startswith(("h2d", "d2h"))]
    assert (host["theoretical_gbps"] == hw.gpu(0).pcie_bandwidth_gbps).all()
    d2d = ok[ok["kind"] == "d2d"]
    assert (d2d["theoretical_gbps"] == hw.gpu(0).memory_bandwidth_gbps).all()
    summary = bandwidth_summary(df)
    assert set(kinds) <= set(summary["kind"])


def test_probe_bandwidth_rejects_a_missing_device():
    import cupy as cp

    n = cp.cuda.runtime.getDeviceCount()
    with pytest.raises(pl.PycLabError, match=f"no CUDA device {n}"):
        pl.probe_bandwidth(device=n, sizes=[4096])


def test_peer_rows_say_why_with_one_gpu_or_measure_with_several():
    import cupy as cp

    df = pl.probe_bandwidth(kinds=["peer"], sizes=[1 << 20], min_time_s=0.002)
    if cp.cuda.runtime.getDeviceCount() < 2:
        assert list(df["status"]) == ["needs two or more GPUs"]
    else:
        assert (df["status"] == "ok").any()


def test_widget_renders_the_live_machine_with_bandwidth():
    hw = pl.detect_hardware()
    df = pl.probe_bandwidth(sizes=[1 << 20], min_time_s=0.002)
    w = TopologyWidget(hw, df)
    fig = w.figure()
    gpu_trace = next(t for t in fig.data if t.name == "GPUs")
    assert len(gpu_trace.x) == len(hw.gpus)
    assert "GB/s measured" in gpu_trace.hovertext[0]
    assert "h2d_pinned" in w.to_text()
    assert hw.gpus[0].name in w.to_html()
