"""FP8 GEMMs: pl.matmul on float8 torch tensors against torch._scaled_mm and bf16.

Linear layers of common transformer sizes at decode (M = 1..64) and prefill (M = 512 and
up), plus squares: the operands are real tensors uniform in [-1, 1] quantised per tensor
to float8_e4m3fn (scale = absmax / 448), ``a`` row-major M x K and ``b = w.T`` with ``w``
row-major N x K (the one layout cuBLASLt's FP8 kernels take). Per problem, interleaved
rounds of :func:`pyc_lab.profiling.timing.benchmark` (CUDA events, L2 flushed) time

* ``pl.matmul(a8, w8.T, scale_a=, scale_b=)`` (bfloat16 out),
* ``torch._scaled_mm`` on the same operands and scales (the call a user would make),
* ``torch.matmul`` on the bfloat16 operands (what FP8 is meant to beat),

and the error of both FP8 results against the dequantised operands multiplied in
float32. Writes ``matmul-fp8.json`` to ``--out``.

    python benchmarks/bench_matmul_fp8.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_matmul_sweep import distribution, interleaved_ms
from common import write_result

#: (M, N, K, what): decode and prefill linear layers, squares; not chosen for any kernel.
PROBLEMS = [
    (1, 4096, 4096, "llama-3-8b attn out, decode"),
    (16, 14336, 4096, "llama-3-8b mlp up, decode"),
    (64, 4096, 14336, "llama-3-8b mlp down, decode"),
    (32, 12288, 4096, "llama-2-7b qkv, decode"),
    (512, 12288, 4096, "llama-2-7b qkv, prefill"),
    (2048, 4096, 4096, "llama-3-8b attn out, prefill"),
    (4096, 28672, 8192, "llama-3-70b mlp up, prefill"),
    (8192, 8192, 28672, "llama-3-70b mlp down, prefill"),
    (16384, 5120, 13824, "13b mlp down, prefill"),
    (4096, 4096, 4096, "square"),
    (8192, 8192, 8192, "square"),
    (1000, 4000, 4096, "M, N not multiples of 16"),
]


def _quantised(torch: Any, shape: tuple[int, int], seed: int) -> tuple[Any, float, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(shape, device="cuda", generator=g) * 2 - 1
    scale = float(x.abs().max()) / 448.0
    return (x / scale).to(torch.float8_e4m3fn), scale, x.to(torch.bfloat16)


def measure(pl: Any, torch: Any, m: int, n: int, k: int, rounds: int, repeats: int
            ) -> dict[str, Any]:
    from pyc_lab.units import gemm_flops, tflops

    a8, sa, a16 = _quantised(torch, (m, k), m + k)
    w8, sb, w16 = _quantised(torch, (n, k), n + 7)
    ta, tb = torch.tensor([sa], device="cuda"), torch.tensor([sb], device="cuda")
    row: dict[str, Any] = {"m": m, "n": n, "k": k}
    ref = (a8.float() * sa) @ (w8.float() * sb).T
    top = float(ref.abs().max()) or 1.0
    impls = {
        "pl.matmul fp8": lambda: pl.matmul(a8, w8.T, scale_a=ta, scale_b=tb),
        "torch._scaled_mm fp8": lambda: torch._scaled_mm(a8, w8.T, scale_a=ta, scale_b=tb,
                                                         out_dtype=torch.bfloat16),
        "torch.matmul bf16": lambda: torch.matmul(a16, w16.T),
    }
    for name, fn in list(impls.items()):
        try:
            y = fn()
            if "fp8" in name:
                row[f"{name} max_rel_err"] = float((y.float() - ref).abs().max()) / top
        except Exception as exc:  # a baseline that cannot run is left out, and said
            row[f"{name} error"] = f"{type(exc).__name__}: {exc}"[:300]
            del impls[name]
    ms = interleaved_ms(impls, rounds, repeats)
    row["ms"] = ms
    row["tflops"] = {name: tflops(gemm_flops(m, n, k), v) for name, v in ms.items()}
    if "pl.matmul fp8" in ms and "torch._scaled_mm fp8" in ms:
        row["ratio_vs_scaled_mm"] = ms["torch._scaled_mm fp8"] / ms["pl.matmul fp8"]
    if "pl.matmul fp8" in ms and "torch.matmul bf16" in ms:
        row["speedup_vs_bf16"] = ms["torch.matmul bf16"] / ms["pl.matmul fp8"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5 (default 5 of 10)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("skipped: FP8 operands are torch float8 tensors; install torch")
        return 0
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("skipped: FP8 tensor cores need a CUDA device of compute capability 8.9+")
        return 0
    import pyc_lab as pl

    rounds, repeats = (3, 5) if args.quick else (5, 10)
    rows = []
    for i, (m, n, k, what) in enumerate(PROBLEMS):
        try:
            row = {"what": what, **measure(pl, torch, m, n, k, rounds, repeats)}
        except Exception as exc:  # one failing problem must not lose the others
            row = {"m": m, "n": n, "k": k, "what": what,
                   "error": f"{type(exc).__name__}: {exc}"[:400]}
        rows.append(row)
        print(f"[{i + 1}/{len(PROBLEMS)}] {m}x{n}x{k} {what}: "
              + ", ".join(f"{name} {v:.4f} ms" for name, v in row.get("ms", {}).items()),
              flush=True)
    ratios = [r["ratio_vs_scaled_mm"] for r in rows if "ratio_vs_scaled_mm" in r]
    speedups = [r["speedup_vs_bf16"] for r in rows if "speedup_vs_bf16" in r]
    path = write_result(args.out, "matmul-fp8", {
        "method": (f"per problem {rounds} interleaved rounds, each pyc_lab.profiling.timing."
                   f"benchmark (CUDA events, L2 flushed, median of {repeats}); the figure is "
                   "the median of the rounds"),
        "operands": "a row-major M x K, b = w.T (w row-major N x K), float8_e4m3fn per-tensor "
                    "scales, bfloat16 out",
        "results": rows,
        "summary": {"ratio_vs_scaled_mm": distribution(ratios),
                    "speedup_vs_bf16": distribution(speedups),
                    "failed": [r for r in rows if "error" in r]}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
