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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_programs import copy_gbps, gpu_ms
from common import cupy_and_torch, environment, write_result
from programs import PROGRAMS, make_inputs

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
    import pyc_lab as pl
    from pyc_lab.compiler.backend import steps
    from pyc_lab.compiler.codegen import reduction, row_program

    row_config, launch_rows = reduction.row_config, steps.launch_rows  # the library's
    bw = copy_gbps(cp)
    variants = [("default", None, True), ("default, uncapped grid", None, False),
                ("8 per thread", 8, True), ("8 per thread, uncapped", 8, False),
                ("16 per thread", 16, True), ("16 per thread, uncapped", 16, False),
                ("32 per thread", 32, True), ("4 per thread", 4, True)]
    programs = {p.name: p for p in PROGRAMS}
    rows = []
    for name in NAMES:
        p = programs[name]
        host = make_inputs(p, 1.0)
        dev = [cp.asarray(a) for a in host]
        tdev = [torch.as_tensor(a, device="cuda") for a in dev]
        nbytes = sum(a.nbytes for a in dev)
        tc = torch.compile(p.torch_fn)
        tc(*tdev)
        tc_ms = gpu_ms(lambda tc=tc, tdev=tdev: tc(*tdev))
        ref = None
        row = {"program": name, "torch.compile ms": tc_ms, "variants": {}}
        for label, per, capped in variants:
            reduction.row_config = row_program.row_config = _config(per, row_config)
            steps.launch_rows = _launcher(capped, launch_rows)
            try:
                f = pl.compile(p.numpy_fn, backend="cupy")
                out = f(*dev)
                got = cp.asnumpy(out).astype(np.float64)
                nbytes_all = nbytes + out.nbytes
                if ref is None:
                    ref = got
                err = float(np.nanmax(np.abs(got - ref)))
                ms = gpu_ms(lambda f=f, dev=dev: f(*dev))
                row["variants"][label] = {"ms": ms, "vs_torch_compile": tc_ms / ms,
                                          "fraction_of_copy_bw": nbytes_all / (ms * 1e-3)
                                          / (bw * 1e9), "max_diff_vs_default": err}
                print(f"{name:24s} {label:26s} {ms:.4f} ms  x{tc_ms / ms:.2f} tc  "
                      f"{nbytes_all / (ms * 1e-3) / (bw * 1e9):.2f} of copy  diff {err:.2e}")
            except Exception as exc:  # one variant failing must not hide the rest
                row["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{name:24s} {label:26s} {type(exc).__name__}: {exc}")
        rows.append(row)
    reduction.row_config = row_program.row_config = row_config
    steps.launch_rows = launch_rows
    write_result(args.out, "row-kernels", {"environment": environment(),
                                           "copy_gbps": bw, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
