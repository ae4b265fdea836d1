"""Experiment: the elementwise kernels' grid on the suite's elementwise programs (GELU,
polynomial, sigmoid gate, batch norm, rotary embedding, Adam step), against
torch.compile and a device copy, on the H200.

:func:`pyc_lab.compiler.backend.steps.launch_elementwise` caps the grid of its
grid-stride kernels at one device of resident blocks (``sm_count * 2048 / 256``). This
runs each program with that cap, with the cap times 4, and with no cap (one thread per
element or vector), checks each against the default's answer, and reports the median
CUDA-event time and the fraction of copy bandwidth. Writes ``elementwise-grid.json`` to
``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_programs import copy_gbps, gpu_ms
from common import cupy_and_torch, environment, write_result
from programs import PROGRAMS, make_inputs

NAMES = ("gelu_tanh_f32", "polynomial_f32", "sigmoid_gate_f16", "batch_norm_inference_f32",
         "rotary_f16", "adam_step_f32")


def _launcher(factor: float | None, original: Any):
    """``launch_elementwise`` with its SM count scaled so that the cap is ``factor``
    times the library's (None: no cap)."""

    def launch(sm_count, kernels, src, ins, out):
        scaled = 1 << 24 if factor is None else int(sm_count * factor)
        return original(scaled, kernels, src, ins, out)

    return launch


def _outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple) else [out]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("exp_elementwise_grid")
    if libs is None:
        return 0
    cp, torch = libs
    import pyc_lab as pl
    from pyc_lab.compiler.backend import steps

    launch_elementwise = steps.launch_elementwise  # the library's
    bw = copy_gbps(cp)
    variants = [("capped (default)", 1.0), ("cap x4", 4.0), ("uncapped", None)]
    programs = {p.name: p for p in PROGRAMS}
    rows = []
    for name in NAMES:
        p = programs[name]
        dev = [cp.asarray(a) for a in make_inputs(p, 1.0)]
        tdev = [torch.as_tensor(a, device="cuda") for a in dev]
        tc = torch.compile(p.torch_fn)
        tc(*tdev)
        tc_ms = gpu_ms(lambda tc=tc, tdev=tdev: tc(*tdev))
        ref = None
        row = {"program": name, "torch.compile ms": tc_ms, "variants": {}}
        for label, factor in variants:
            steps.launch_elementwise = _launcher(factor, launch_elementwise)
            try:
                f = pl.compile(p.numpy_fn, backend="cupy")
                outs = _outputs(f(*dev))
                got = [cp.asnumpy(o).astype(np.float64) for o in outs]
                nbytes = sum(a.nbytes for a in dev) + sum(o.nbytes for o in outs)
                ref = ref or got
                err = max(float(np.nanmax(np.abs(g - r))) for g, r in zip(got, ref,
                                                                          strict=True))
                ms = gpu_ms(lambda f=f, dev=dev: f(*dev))
                frac = nbytes / (ms * 1e-3) / (bw * 1e9)
                row["variants"][label] = {"ms": ms, "vs_torch_compile": tc_ms / ms,
                                          "fraction_of_copy_bw": frac,
                                          "max_diff_vs_default": err}
                print(f"{name:26s} {label:18s} {ms:.4f} ms  x{tc_ms / ms:.2f} tc  "
                      f"{frac:.2f} of copy  diff {err:.1e}")
            except Exception as exc:  # one variant failing must not hide the rest
                row["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{name:26s} {label:18s} {type(exc).__name__}: {exc}")
        rows.append(row)
    steps.launch_elementwise = launch_elementwise
    write_result(args.out, "elementwise-grid", {"environment": environment(),
                                                "copy_gbps": bw, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
