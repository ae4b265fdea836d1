"""Make the convolution tuning recording pyc_lab ships from a ``bench_conv_cutlass`` run.

    python scripts/refresh_conv_recording.py benchmarks/results/h200/<run>/conv-cutlass.json [DEST]

Keeps, per layer and dtype that was tuned, the problem (shapes, stride, padding), every
candidate's recorded outcome (status, median ms, error against float32, message) and
cuDNN's time from the same run, with the run's device, driver, date and commit; then
re-execute ``notebooks/07_convolution.ipynb`` (``scripts/run-notebooks``): its replay
comes from the recording. Nothing is written when the run holds no tuned layer (exit
status 1, with the reason).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyc_lab.errors import PycLabError
from pyc_lab.kernels.tuning.conv_replay import CONV_RECORDING, recorded_conv_layers
from pyc_lab.paths import data_path

DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "tf32"}


def convert(run: dict, source: str) -> dict:
    """The recording of a ``bench_conv_cutlass`` result: its tuned layers only."""
    layers = []
    for r in run["results"]:
        tune = r.get("tune") or {}
        cands = tune.get("candidates") or []
        if not cands:
            continue
        pad = r["kernel"] // 2
        layers.append({
            "layer": r["layer"], "dtype": DTYPES[r["dtype"]],
            "x_shape": [r["n"], r["c"], r["size"], r["size"]],
            "w_shape": [r["k"], r["c"], r["kernel"], r["kernel"]],
            "stride": r["stride"], "padding": pad, "cudnn_ms": tune["cudnn_ms"],
            "candidates": [{"tile": c["tile"], "cluster": c["cluster"],
                            "status": c["status"], "ms": c["ms"], "error": c["error"],
                            "message": c.get("message", "")} for c in cands]})
    if not layers:
        raise PycLabError(f"{source} holds no tuned convolution layer; not writing it")
    env = run["environment"]
    return {"recorded_by": "benchmarks/bench_conv_cutlass.py", "source": source,
            "device": env["device"], "compute_capability": "9.0",
            "driver": env["driver"], "cuda": env["cuda_driver"], "date": env["date"],
            "git_sha": env["git_sha"], "method": run["method"], "layers": layers}


def refresh(src: str | Path, dest: str | Path | None = None) -> int:
    """Write the recording of ``src`` to ``dest`` (default: the shipped one); the layer
    count."""
    recording = convert(json.loads(Path(src).read_text()), str(src))
    target = Path(dest) if dest is not None else data_path("tuning", CONV_RECORDING)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(recording, indent=1) + "\n")
    layers = recorded_conv_layers(target)
    print(layers.to_string(index=False))
    print(f"wrote {target} ({len(layers)} tuned layers)")
    return len(layers)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    try:
        refresh(*sys.argv[1:])
    except PycLabError as exc:
        sys.exit(str(exc))
