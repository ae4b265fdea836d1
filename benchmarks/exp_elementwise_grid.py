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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_programs import copy_gbps
from common import cupy_and_torch, environment, write_result
from programs import PROGRAMS
from variants import time_variants

NAMES = ("gelu_tanh_f32", "polynomial_f32", "sigmoid_gate_f16", "batch_norm_inference_f32",
         "rotary_f16", "adam_step_f32")


def _launcher(factor: float | None, original: Any):
    """``launch_elementwise`` with its SM count scaled so that the cap is ``factor``
    times the library's (None: no cap)."""

    def launch(sm_count, kernels, src, ins, out):
        scaled = 1 << 24 if factor is None else int(sm_count * factor)
        return original(scaled, kernels, src, ins, out)

    return launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("exp_elementwise_grid")
    if libs is None:
        return 0
    cp, torch = libs
    from pyc_lab.compiler.backend import steps

    launch_elementwise = steps.launch_elementwise  # the library's
    bw = copy_gbps(cp)
    variants = [("capped (default)", 1.0), ("cap x4", 4.0), ("uncapped", None)]
    programs = {p.name: p for p in PROGRAMS}

    def install(factor: float | None) -> Callable[[], None]:
        def apply() -> None:
            steps.launch_elementwise = _launcher(factor, launch_elementwise)
        return apply

    rows = [time_variants(cp, torch, programs[name],
                          [(label, install(factor)) for label, factor in variants], bw)
            for name in NAMES]
    steps.launch_elementwise = launch_elementwise
    write_result(args.out, "elementwise-grid", {"environment": environment(),
                                                "copy_gbps": bw, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
