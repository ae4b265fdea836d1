"""Experiment: row-kernel launch shapes on the suite's row programs (softmax, layer norm,
residual RMS norm, masked softmax, L2 normalisation, log-softmax), against torch.compile
and a device copy, on the H200.

The row kernels' shape comes from :func:`pyc_lab.compiler.codegen.reduction.row_config`
(threads per row, block size, whether the row is kept in registers) and the launcher's
grid cap (:func:`pyc_lab.compiler.backend.steps.launch_rows`: a grid-stride loop over
rows with at most ``sm_count * 2048 / block`` blocks). This replaces both in turn with
variants — fewer values per thread (more threads per row), an uncapped grid — compiles
each program afresh under each, checks it against the default's answer, and reports the
median CUDA-event time and the fraction of copy bandwidth. Writes ``row-kernels.json``
to ``--out``.
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

NAMES = ("softmax_rows_f16", "layer_norm_f16", "residual_rms_norm_f16",
         "masked_softmax_f32", "l2_normalize_f32", "log_softmax_f32")


def _config(values_per_thread: int | None, original: Any):
    """A ``row_config`` giving each thread about ``values_per_thread`` values of a row
    (None: the library's own, ``original``)."""

    def config(cols: int, acc_itemsize: int = 4) -> dict[str, Any]:
        if values_per_thread is None:
            return original(cols, acc_itemsize)
        threads = 32
        while threads < 1024 and threads * values_per_thread < cols:
            threads *= 2
        mode = "warp" if threads == 32 else "block"
        block = 256 if mode == "warp" else threads
        per = -(-cols // threads)
        limit = (32 if mode == "warp" else 16) * 4 // max(acc_itemsize, 4)
        return {"threads": threads, "block": block, "mode": mode, "per_thread": per,
                "cached": per <= limit, "rows_per_block": block // threads}

    return config


def _launcher(capped: bool, original: Any):
    """``launch_rows`` as it is, or with the grid uncapped (one block per row group)."""

    def launch(sm_count, kernels, src, ins, out):
        if capped:
            return original(sm_count, kernels, src, ins, out)
        return original(1 << 20, kernels, src, ins, out)  # one block per row group

    return launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("exp_row_kernels")
    if libs is None:
        return 0
    cp, torch = libs
    from pyc_lab.compiler.backend import steps
    from pyc_lab.compiler.codegen import reduction, row_program

    row_config, launch_rows = reduction.row_config, steps.launch_rows  # the library's
    bw = copy_gbps(cp)
    variants = [("default", None, True), ("default, uncapped grid", None, False),
                ("8 per thread", 8, True), ("8 per thread, uncapped", 8, False),
                ("16 per thread", 16, True), ("16 per thread, uncapped", 16, False),
                ("32 per thread", 32, True), ("4 per thread", 4, True)]
    programs = {p.name: p for p in PROGRAMS}

    def install(per: int | None, capped: bool) -> Callable[[], None]:
        def apply() -> None:
            reduction.row_config = row_program.row_config = _config(per, row_config)
            steps.launch_rows = _launcher(capped, launch_rows)
        return apply

    rows = [time_variants(cp, torch, programs[name],
                          [(label, install(per, capped)) for label, per, capped in variants],
                          bw) for name in NAMES]
    reduction.row_config = row_program.row_config = row_config
    steps.launch_rows = launch_rows
    write_result(args.out, "row-kernels", {"environment": environment(),
                                           "copy_gbps": bw, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
