"""The Nsight Compute summary of ``benchmarks/exp_profile_programs.py`` on the CPU: an
ncu ``--csv --page details`` report (as ncu writes it, messages before the header) is read
in launch order and split into programs' sides by the marker kernels."""

from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "exp_profile_programs.py"
_spec = importlib.util.spec_from_file_location("pyc_lab_exp_profile_programs", _PATH)
prof = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prof)

HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
          "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name",
          "Metric Name", "Metric Unit", "Metric Value"]
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def _report(kernels):
    buf = io.StringIO()
    buf.write("==PROF== Connected to process 4242 (python3)\nprofiled 1 programs\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(HEADER)
    for kid, name, metrics in kernels:
        for metric, unit, value in metrics:
            w.writerow([kid, 4242, "python3", "h", name, 1, 7, "(256, 1, 1)", "(64, 1, 1)",
                        0, "9.0", "GPU Speed Of Light Throughput", metric, unit, value])
    return buf.getvalue().splitlines()


WINDOWS = [{"mark": "pyc_mark_0", "program": "layer_norm_f16", "side": "pl.compile"},
           {"mark": "pyc_mark_1", "program": "layer_norm_f16", "side": "torch.compile"}]


def test_kernels_are_read_in_order_and_split_by_the_markers():
    lines = _report([
        (0, "pyc_mark_0()", [("Duration", "nsecond", "1,024")]),
        (1, "fused_rows_3", [("Duration", "usecond", "87.5"), ("DRAM Throughput", "%", "73.1"),
                             ("Registers Per Thread", "register/thread", "40"),
                             (STALL.format("long_scoreboard"), "", "11.5"),
                             (STALL.format("wait"), "", "2.25")]),
        (2, "pyc_mark_1()", [("Duration", "nsecond", "900")]),
        (3, "triton_red_fused_0", [("Duration", "msecond", "0.05")]),
        (4, "triton_poi_fused_1", [("Duration", "usecond", "30"),
                                   ("Achieved Occupancy", "%", "n/a")]),
    ])
    kernels = prof.read_report(lines)
    assert [k["id"] for k in kernels] == [0, 1, 2, 3, 4]
    rows = prof.summarize(kernels, WINDOWS)
    pl_side, tc_side = rows
    assert [k["kernel"] for k in pl_side["kernels"]] == ["fused_rows_3"]
    (k,) = pl_side["kernels"]
    assert k["duration_us"] == pytest.approx(87.5) and k["dram_pct"] == pytest.approx(73.1)
    assert k["registers"] == 40.0
    assert list(k["stalls"]) == [STALL.format("long_scoreboard"), STALL.format("wait")]
    assert [k["kernel"] for k in tc_side["kernels"]] == ["triton_red_fused_0",
                                                        "triton_poi_fused_1"]
    assert tc_side["total_us"] == pytest.approx(80.0)  # 50 us + 30 us
    assert tc_side["kernels"][1]["achieved_occupancy_pct"] == "n/a"  # kept as printed


def test_a_report_without_kernels_gives_empty_windows():
    assert prof.read_report(["==ERROR== the profiler could not start", ""]) == []
    rows = prof.summarize([], WINDOWS)
    assert [r["kernels"] for r in rows] == [[], []] and rows[0]["total_us"] == 0
