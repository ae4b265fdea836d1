"""Experiment: does writing a GEMM's product into its planned buffer (``out=``) cost more?

The compiled MLP's GEMMs (cuBLAS through ``cupy.matmul``) write a fresh product; with a
memory plan they could write into the planned buffer with ``out=`` instead. This times,
on the MLP's shapes (fp16), CUDA events, median of 30 after warm-up:

1. a lone ``cupy.matmul`` three ways: a fresh product, ``out=`` a plain array, ``out=``
   a typed view of a ``uint8`` buffer (how planned buffers are viewed);
2. the compiled MLP (``bench_compiler.mlp_np``), its launch list run with the GEMMs as
   cuBLAS steps (``cupy.matmul`` + generated epilogue): with fresh products, as the
   library runs them, and with each product written into its planned buffer. The
   library has no switch for the second form: this script replaces
   ``pyc_lab.compiler.backend.steps._MatmulStep._product`` with a one-line monkeypatch
   (``out=`` the step's planned view) for that measurement only, and restores it.

Writes ``matmul_out.json`` to ``--out``.

    python benchmarks/exp_matmul_out.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compiler import gpu_time, mlp_np, rel_err
from common import write_result

import pyc_lab as pl
from pyc_lab.compiler.backend.steps import _MatmulStep


def _product_into_plan(self, exe, a, b):
    """The form under test: the product written into the step's planned buffer."""
    return exe._cp.matmul(a, b, out=self._planned_product(exe))


def compiled_mlp(cp, x, w1, d, h) -> dict:
    """The compiled MLP's launch list with its GEMMs as cuBLAS steps (``cupy.matmul`` +
    generated epilogue, whatever the policy chose), timed (ms) with fresh products and
    with ``out=`` planned buffers, each checked against a float32 reference first."""
    import numpy as np

    from pyc_lab.compiler.backend.executable import CupyExecutable

    rng = cp.random.default_rng()
    b1 = rng.uniform(-1, 1, (h,), dtype=cp.float32).astype(cp.float16)
    w2 = (rng.uniform(-1, 1, (h, d), dtype=cp.float32) / np.sqrt(h)).astype(cp.float16)
    b2 = rng.uniform(-1, 1, (d,), dtype=cp.float32).astype(cp.float16)
    args = (x, w1, b1, w2, b2)
    ref = mlp_np(*(cp.asnumpy(v).astype(np.float32) for v in args))
    compiled = pl.compile(mlp_np)
    compiled(*args)
    art = compiled._last  # the graph, decisions and memory plan built for these shapes
    impl = {dec.node: "cublas" if dec.choice in ("cublaslt", "cutlass") else dec.choice
            for dec in art.decisions}
    rows, impls = {}, {}
    original = _MatmulStep._product
    try:
        for name in ("compiled_mlp_fresh_product", "compiled_mlp_product_into_plan"):
            if name.endswith("into_plan"):
                _MatmulStep._product = _product_into_plan  # the experiment's monkeypatch
            exe = CupyExecutable(art.graph, impl, art.plan)
            err = rel_err(cp.asnumpy(exe(list(args))[0]), ref)
            assert err < 1e-2, (name, err)
            rows[name] = gpu_time(lambda exe=exe: exe(list(args)), repeats=30, warmup=5) * 1e3
            impls[name] = [k["implementation"] for k in exe.kernels]
    finally:
        _MatmulStep._product = original
    return {"results": rows, "implementations": impls}


def main() -> None:
    import cupy as cp

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/local")
    args = parser.parse_args()
    rng = cp.random.default_rng()
    m, d, h = 4096, 2048, 8192
    x = rng.standard_normal((m, d), dtype=cp.float32).astype(cp.float16)
    w1 = rng.standard_normal((d, h), dtype=cp.float32).astype(cp.float16)
    raw = cp.empty(m * h * 2 + 256, dtype=cp.uint8)
    view = raw[: m * h * 2].view(cp.float16).reshape(m, h)
    plain = cp.empty((m, h), dtype=cp.float16)
    rows = {
        "matmul_fresh": gpu_time(lambda: cp.matmul(x, w1), repeats=30) * 1e3,
        "matmul_out_plain_array": gpu_time(lambda: cp.matmul(x, w1, out=plain),
                                           repeats=30) * 1e3,
        "matmul_out_uint8_view": gpu_time(lambda: cp.matmul(x, w1, out=view),
                                          repeats=30) * 1e3,
    }
    x_mlp = rng.uniform(-1, 1, (m, d), dtype=cp.float32).astype(cp.float16)
    w1_mlp = (rng.uniform(-1, 1, (d, h), dtype=cp.float32) / d ** 0.5).astype(cp.float16)
    mlp = compiled_mlp(cp, x_mlp, w1_mlp, d, h)
    rows.update(mlp["results"])
    print(rows)
    write_result(args.out, "matmul_out", {"shape": [m, d, h], "dtype": "float16",
                                          "unit": "ms", "results": rows,
                                          "implementations": mlp["implementations"]})


if __name__ == "__main__":
    main()
