"""Compiler benchmarks (GPU lane), each against baselines measured in the same run.

1. ``tanh(a*b+c)*0.5+a`` over 2**28 float32: pyc_lab (cupy backend) vs CuPy eager vs
   ``cupy.fuse``; achieved bandwidth vs a device-to-device copy measured here.
2. MLP fp16 4096x2048 -> 8192 -> 2048 with bias and GELU (tanh): pyc_lab (with and
   without CUDA-graph replay) vs torch eager vs torch.compile.
3. softmax and layer norm over (8192, 8192) fp16: pyc_lab vs torch vs CuPy eager.
4. Compile latency: cold trace + compile + first run of the MLP in a fresh
   CompiledFunction, and the warm per-call host time of a small compiled function.

Times are medians of CUDA-event timings after warm-up; every result is checked against
a float32/float64 reference first. Writes ``compiler.json`` to ``--out``.

    python benchmarks/bench_compiler.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import gpu_time, host_us, write_result

import pyc_lab as pl
from pyc_lab.hardware.device import cupy_status


def rel_err(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def bench_elementwise(cp) -> dict:
    n = 1 << 28
    rng = cp.random.default_rng()
    a, b, c = (rng.standard_normal(n, dtype=cp.float32) for _ in range(3))

    def chain(a, b, c):
        return np.tanh(a * b + c) * 0.5 + a

    compiled = pl.compile(chain)

    @cp.fuse
    def fused(a, b, c):  # cupy.fuse needs CuPy's own ufuncs
        return cp.tanh(a * b + c) * 0.5 + a

    # correctness on a slice, float64 reference
    out = compiled(a, b, c)
    k = 1 << 20
    ref = chain(*(cp.asnumpy(v[:k]).astype(np.float64) for v in (a, b, c)))
    err = rel_err(cp.asnumpy(out[:k]), ref)
    assert err < 1e-6, f"pyc_lab elementwise chain wrong: rel err {err}"
    src = cp.empty(2 * n, dtype=cp.float32)
    dst = cp.empty_like(src)
    bytes_moved = 4 * n * 4

    def copy() -> None:  # cudaMemcpyAsync device to device, 2 GiB read + 2 GiB written
        dst.data.copy_from_device_async(src.data, src.nbytes)

    candidates = {"copy": copy, "pyc_lab": lambda: compiled(a, b, c),
                  "cupy_eager": lambda: chain(a, b, c), "cupy_fuse": lambda: fused(a, b, c)}
    # Interleaved rounds: the copy and every candidate are timed side by side in each
    # round, so clock drift between them does not bias the ratio.
    per_round: dict[str, list[float]] = {k: [] for k in candidates}
    for _ in range(7):
        for name, fn in candidates.items():
            per_round[name].append(gpu_time(fn, repeats=5, warmup=1))
    t_copy = statistics.median(per_round["copy"])
    copy_tbps = 2 * src.nbytes / t_copy / 1e12
    rows = {}
    for name in ("pyc_lab", "cupy_eager", "cupy_fuse"):
        t = statistics.median(per_round[name])
        ratios = [bytes_moved / ti / (2 * src.nbytes / tc)
                  for ti, tc in zip(per_round[name], per_round["copy"], strict=True)]
        rows[name] = {"ms": t * 1e3, "tbps": bytes_moved / t / 1e12,
                      "pct_of_copy": 100 * statistics.median(ratios),
                      "pct_of_copy_per_round": [round(100 * r, 1) for r in ratios]}
    return {"n": n, "dtype": "float32", "bytes_moved": bytes_moved, "copy_tbps": copy_tbps,
            "copy": "cudaMemcpyAsync device to device of 2**29 float32, read + write bytes",
            "method": "7 interleaved rounds (copy, pyc_lab, eager, fuse), each the median "
                      "of 5 CUDA-event timings; pct_of_copy is the median per-round ratio",
            "rel_err_vs_f64": err, "results": rows,
            "kernels": [k["name"] for k in compiled.explain().kernels]}


def mlp_np(x, w1, b1, w2, b2):
    return pl.compiler.gelu(x @ w1 + b1) @ w2 + b2


def bench_mlp(cp) -> dict:
    import torch

    m, d, h = 4096, 2048, 8192
    rng = cp.random.default_rng()
    x = rng.uniform(-1, 1, (m, d), dtype=cp.float32).astype(cp.float16)
    w1 = (rng.uniform(-1, 1, (d, h), dtype=cp.float32) / np.sqrt(d)).astype(cp.float16)
    b1 = rng.uniform(-1, 1, (h,), dtype=cp.float32).astype(cp.float16)
    w2 = (rng.uniform(-1, 1, (h, d), dtype=cp.float32) / np.sqrt(h)).astype(cp.float16)
    b2 = rng.uniform(-1, 1, (d,), dtype=cp.float32).astype(cp.float16)
    args = (x, w1, b1, w2, b2)

    t0 = time.perf_counter()
    plain = pl.compile(mlp_np)
    out = plain(*args)
    cp.cuda.Device().synchronize()
    cold_s = time.perf_counter() - t0
    graphed = pl.compile(mlp_np, cuda_graph=True)
    out_g = graphed(*args)
    tuned = pl.compile(mlp_np, mode="utilization_first")
    t0 = time.perf_counter()
    out_u = tuned(*args)
    cp.cuda.Device().synchronize()
    tuned_first_s = time.perf_counter() - t0
    ref = mlp_np(*(cp.asnumpy(v).astype(np.float32) for v in args))
    err = rel_err(cp.asnumpy(out), ref)
    err_g = rel_err(cp.asnumpy(graphed(*args)), ref)
    err_u = rel_err(cp.asnumpy(out_u), ref)
    assert err < 1e-2 and err_g < 1e-2 and err_u < 1e-2, (err, err_g, err_u)
    del out_g, out_u

    tx = [torch.as_tensor(v, device="cuda") for v in args]

    def torch_mlp(x, w1, b1, w2, b2):
        return torch.nn.functional.gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2

    t1 = time.perf_counter()
    compiled_torch = torch.compile(torch_mlp)
    compiled_torch(*tx)
    torch.cuda.synchronize()
    torch_compile_first_s = time.perf_counter() - t1
    err_t = rel_err(torch_mlp(*tx).float().cpu().numpy(), ref)
    flops = 2 * m * d * h * 2
    # The two GEMMs alone, through each library, to attribute any gap to GEMM or epilogue.
    hid = plain(*args)  # warm
    hx = cp.matmul(x, w1)
    gemm = {"cupy_matmul_x_w1": lambda: cp.matmul(x, w1),
            "cupy_matmul_h_w2": lambda: cp.matmul(hx, w2),
            "torch_matmul_x_w1": lambda: tx[0] @ tx[1],
            "torch_matmul_h_w2": lambda: torch.as_tensor(hx, device="cuda") @ tx[3]}
    th = torch.as_tensor(hx, device="cuda")
    gemm["torch_matmul_h_w2"] = lambda: th @ tx[3]
    gemm_rows = {name: {"ms": gpu_time(fn, repeats=30, warmup=5) * 1e3}
                 for name, fn in gemm.items()}
    for row in gemm_rows.values():
        row["tflops"] = flops / 2 / (row["ms"] / 1e3) / 1e12
    del hid
    rows = {}
    for name, fn in (("pyc_lab", lambda: plain(*args)),
                     ("pyc_lab_cuda_graph", lambda: graphed(*args)),
                     ("pyc_lab_utilization_first", lambda: tuned(*args)),
                     ("torch_eager", lambda: torch_mlp(*tx)),
                     ("torch_compile", lambda: compiled_torch(*tx))):
        t = gpu_time(fn, repeats=30, warmup=5)
        rows[name] = {"ms": t * 1e3, "tflops": flops / t / 1e12}
    return {"shape": [m, d, h], "dtype": "float16", "activation": "gelu (tanh)",
            "rel_err_vs_f32": {"pyc_lab": err, "pyc_lab_cuda_graph": err_g,
                               "pyc_lab_utilization_first": err_u, "torch": err_t},
            "results": rows, "gemm_only": gemm_rows, "pyc_lab_cold_first_call_s": cold_s,
            "pyc_lab_utilization_first_first_call_s": tuned_first_s,
            "torch_compile_first_call_s": torch_compile_first_s,
            "kernels": [{k: v for k, v in kern.items() if k != "source"}
                        for kern in plain.explain().kernels]}


def bench_norms(cp) -> dict:
    import torch

    shape = (8192, 8192)
    rng = cp.random.default_rng()
    x = rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)
    g = rng.standard_normal(shape[1], dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal(shape[1], dtype=cp.float32).astype(cp.float16)
    sm = pl.compile(lambda x: pl.compiler.softmax(x, axis=-1))
    ln = pl.compile(lambda x, g, b: pl.compiler.layer_norm(x, g, b, eps=1e-5))
    rows_ref = slice(0, 256)
    x64 = cp.asnumpy(x[rows_ref]).astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    err_sm = rel_err(cp.asnumpy(sm(x)[rows_ref]), e / e.sum(-1, keepdims=True))
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    ln_ref = (x64 - mu) / np.sqrt(var + 1e-5) * cp.asnumpy(g).astype(np.float64) + \
        cp.asnumpy(b).astype(np.float64)
    err_ln = rel_err(cp.asnumpy(ln(x, g, b)[rows_ref]), ln_ref)
    assert err_sm < 5e-3 and err_ln < 5e-3, (err_sm, err_ln)
    tx, tg, tb = (torch.as_tensor(v, device="cuda") for v in (x, g, b))
    nbytes = 2 * x.nbytes
    out = {}
    for name, fn in (
        ("softmax/pyc_lab", lambda: sm(x)),
        ("softmax/torch", lambda: torch.softmax(tx, dim=-1)),
        ("softmax/cupy_eager", lambda: pl.compiler.softmax(x)),
        ("layer_norm/pyc_lab", lambda: ln(x, g, b)),
        ("layer_norm/torch", lambda: torch.nn.functional.layer_norm(tx, (shape[1],), tg, tb,
                                                                   1e-5)),
        ("layer_norm/cupy_eager", lambda: pl.compiler.layer_norm(x, g, b)),
    ):
        t = gpu_time(fn)
        out[name] = {"ms": t * 1e3, "tbps": nbytes / t / 1e12}
    return {"shape": list(shape), "dtype": "float16", "rel_err": {"softmax": err_sm,
                                                                  "layer_norm": err_ln},
            "results": out}


def small_block(x, g, b):
    """Five kernels on a (64, 256) float32 block: softmax, fused, layer norm, fused, sum."""
    h = pl.compiler.softmax(x * 2.0, axis=-1) + x
    h = pl.compiler.layer_norm(h, g, b)
    return np.sum(np.tanh(h) * h, axis=-1)


def bench_dispatch(cp) -> dict:
    rng = cp.random.default_rng()
    x = rng.standard_normal(1024, dtype=cp.float32)
    rows: dict[str, dict] = {}
    for name, cuda_graph in (("pyc_lab", False), ("pyc_lab_cuda_graph", True)):
        fn = pl.compile(lambda x: np.tanh(x) * 2.0 + 1.0, cuda_graph=cuda_graph)
        rows[name] = {"host_us_per_call": host_us(cp, lambda fn=fn: fn(x))}
    raw = cp.ElementwiseKernel("float32 x", "float32 y", "y = tanh(x) * 2.0f + 1.0f", "raw_k")
    rows["cupy_elementwise_kernel_baseline"] = {"host_us_per_call": host_us(cp,
                                                                            lambda: raw(x))}
    xb = rng.standard_normal((64, 256), dtype=cp.float32)
    gb, bb = (rng.standard_normal(256, dtype=cp.float32) for _ in range(2))
    block = {}
    for name, cuda_graph in (("pyc_lab", False), ("pyc_lab_cuda_graph", True)):
        fn = pl.compile(small_block, cuda_graph=cuda_graph)
        ref = small_block(*(cp.asnumpy(v).astype(np.float64) for v in (xb, gb, bb)))
        err = rel_err(cp.asnumpy(fn(xb, gb, bb)), ref)
        assert err < 1e-4, (name, err)
        block[name] = {"host_us_per_call": host_us(cp, lambda fn=fn: fn(xb, gb, bb)),
                       "gpu_us_per_call": gpu_time(lambda fn=fn: fn(xb, gb, bb),
                                                   repeats=50) * 1e6,
                       "kernels": len(fn.explain().kernels)}
    block["cupy_eager"] = {
        "host_us_per_call": host_us(cp, lambda: small_block(xb, gb, bb), calls=50),
        "gpu_us_per_call": gpu_time(lambda: small_block(xb, gb, bb), repeats=50) * 1e6}
    return {"what": "host time per call of a 1024-element tanh*2+1, median of 7 x 200 calls",
            "results": rows,
            "block": {"what": "softmax, layer norm, elementwise and a sum on (64, 256) "
                              "float32: host and GPU time per call",
                      "results": block}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    args = parser.parse_args()
    cp, reason = cupy_status()
    if cp is None:
        print(f"skipped: the compiler benchmarks need a CUDA device ({reason})")
        return
    results = {}
    for name, fn in (("elementwise_chain", bench_elementwise), ("dispatch", bench_dispatch),
                     ("norms", bench_norms), ("mlp", bench_mlp)):
        try:
            results[name] = fn(cp)
            print(name, results[name].get("results"))
        except Exception as exc:  # one failing benchmark must not lose the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(name, "FAILED", results[name]["error"])
        cp.get_default_memory_pool().free_all_blocks()
    method = ("CUDA events (pyc_lab.profiling.benchmark: a spin kernel ahead of the start "
              "event keeps host launch gaps out), median of repeats after warm-up")
    path = write_result(args.out, "compiler", {"method": method, **results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
