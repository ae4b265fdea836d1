"""Experiment: Nsight Compute's view of suite programs, pl.compile against torch.compile.

The issue asks for the programs under 85 % of copy bandwidth to be explained "from
profiling, not a guess". Run under ``ncu --profile-from-start off``, this warms each
chosen program up (``pl.compile`` and ``torch.compile`` of its twin, two calls each,
outside the profiled region), then runs each side once inside it, a marker kernel
(``pyc_mark_<n>``, empty) launched before each side so that the report's kernels can be
told apart by order. ``--summarize`` reads the report ncu wrote as CSV (``--csv --page
details``) with the windows' record and writes ``programs-profile.json``: per program
and side, each kernel's duration, DRAM and SM throughput (% of peak), achieved and
theoretical occupancy, registers, grid and block, and the warp-stall figures ncu
printed, largest first.

    ncu --profile-from-start off --clock-control none --csv --page details \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats --log-file OUT/ncu-programs.csv \\
        python3 benchmarks/exp_profile_programs.py --only layer_norm_f16 --out OUT
    python3 benchmarks/exp_profile_programs.py --summarize OUT/ncu-programs.csv --out OUT

(``scripts/gpu-lane`` does both with ``LANE_PROFILE="name ..."``.)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The marker kernels' name prefix (one per profiled side of a program).
MARK = "pyc_mark_"
#: Metric names (as ncu's details page prints them) kept per kernel, under short keys.
KEEP = {
    "Duration": "duration",
    "DRAM Throughput": "dram_pct",
    "Memory Throughput": "memory_pct",
    "Compute (SM) Throughput": "sm_pct",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Registers Per Thread": "registers",
    "Block Size": "block",
    "Grid Size": "grid",
    "Waves Per SM": "waves_per_sm",
    "Warp Cycles Per Issued Instruction": "warp_cycles_per_issue",
    "Shared Memory Configuration Size": "shared_config",
    "Dynamic Shared Memory Per Block": "dynamic_shared",
}
#: ncu prints durations in "ns"/"us"/"ms" (its details page) or spelled out (older pages)
_TIME_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
            "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def _number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def read_report(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The kernels of an ncu ``--csv --page details`` report, in launch order: ``{"id",
    "name", "metrics": {metric name: (value, unit)}}``. Lines before the CSV header
    (ncu's and the program's own messages) are skipped."""
    rows = list(lines)
    start = next((i for i, line in enumerate(rows) if line.startswith('"ID"')), None)
    if start is None:
        return []
    kernels: dict[int, dict[str, Any]] = {}
    for rec in csv.DictReader(rows[start:]):
        try:
            kid = int(rec["ID"])
        except (KeyError, TypeError, ValueError):
            continue
        k = kernels.setdefault(kid, {"id": kid, "name": rec.get("Kernel Name", ""),
                                     "metrics": {}})
        name = rec.get("Metric Name") or ""
        if name:
            k["metrics"][name] = (_number(rec.get("Metric Value") or ""),
                                  rec.get("Metric Unit") or "")
    return [kernels[i] for i in sorted(kernels)]


def _kernel_row(k: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"kernel": k["name"][:160]}
    for metric, key in KEEP.items():
        if metric in k["metrics"]:
            value, unit = k["metrics"][metric]
            if key == "duration" and isinstance(value, float):
                out["duration_us"] = value * _TIME_US.get(unit, float("nan"))
            else:
                out[key] = value
    stalls = {m: v for m, (v, _) in k["metrics"].items()
              if "stall" in m.lower() and isinstance(v, float)}
    out["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:8])
    return out


def summarize(kernels: list[dict[str, Any]], windows: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """Each window (a program's side) with the kernels launched after its marker."""
    by_mark = {w["mark"]: dict(w, kernels=[]) for w in windows}
    current = None
    for k in kernels:
        if k["name"].startswith(MARK):
            current = by_mark.get(k["name"].split("(")[0])
            continue
        if current is not None:
            current["kernels"].append(_kernel_row(k))
    out = list(by_mark.values())
    for w in out:
        w["total_us"] = sum(k.get("duration_us", 0.0) for k in w["kernels"])
    return out


def _profile(names: list[str], out: Path) -> int:
    from bench_programs import _tuple
    from common import cupy_and_torch
    from programs import PROGRAMS, make_inputs

    import pyc_lab as pl

    gate = cupy_and_torch("the profile of the program suite")
    if gate is None:
        return 0
    cp, torch = gate
    chosen = [p for p in PROGRAMS if p.name in names] if names else list(PROGRAMS)
    windows: list[dict[str, Any]] = []
    ready = []
    for p in chosen:  # compile and warm up everything outside the profiled region
        dev = [cp.asarray(a) for a in make_inputs(p, 1.0, seed=1)]
        tins = [torch.from_dlpack(a) for a in dev]
        fn, tc = pl.compile(p.numpy_fn), torch.compile(p.torch_fn)
        for _ in range(2):
            _tuple(fn(*dev))
            _tuple(tc(*tins))
        for side in ("pl.compile", "torch.compile"):
            mark = f"{MARK}{len(windows)}"
            kernel = cp.RawKernel(f'extern "C" __global__ void {mark}() {{}}', mark)
            kernel((1,), (1,), ())
            windows.append({"mark": mark, "program": p.name, "side": side,
                            "kernels_explained": [k["name"] for k in
                                                  fn.explain(*dev).kernels]
                            if side == "pl.compile" else None})
        ready.append(((fn, dev), (tc, tins), windows[-2:]))
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    for pl_side, tc_side, marks in ready:
        for w, (call, ins) in zip(marks, (pl_side, tc_side), strict=True):
            cp.RawKernel(f'extern "C" __global__ void {w["mark"]}() {{}}', w["mark"])(
                (1,), (1,), ())
            call(*ins)
            cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile-windows.json").write_text(json.dumps(windows, indent=1) + "\n")
    print(f"profiled {len(ready)} programs; windows in {out / 'profile-windows.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--only", nargs="*", default=[], help="program names (default: all)")
    parser.add_argument("--summarize", metavar="CSV",
                        help="read ncu's CSV report and the windows; write the summary")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.summarize:
        return _profile(args.only, out)
    from common import write_result

    kernels = read_report(Path(args.summarize).read_text(errors="replace").splitlines())
    windows = json.loads((out / "profile-windows.json").read_text())
    rows = summarize(kernels, windows)
    print(write_result(out, "programs-profile", {
        "method": "Nsight Compute (--clock-control none, kernel replay) of one call of each "
                  "side after two warm-up calls; kernels told apart by empty marker kernels",
        "kernels_in_report": len(kernels), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
