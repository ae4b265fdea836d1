"""Cold builds of pyc_lab's attention kernel: nvcc seconds per configuration.

Builds the untuned default (the persistent ``attn_n128_s2_w2_o_p``) for bfloat16 and
float16 at head dimensions 64 and 128 into an empty kernel cache, ``--workers`` at a time
(the tuner's default on this machine), then builds them again to show the cache hit.
No GPU is needed: kernels are built where nvcc is and carried to the GPU. Writes
``attention-build.json`` to ``--out``.

    python benchmarks/bench_attention_build.py --out benchmarks/results/cpu
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass.attention import AttnConfig, AttnKernel, build_attention
from pyc_lab.kernels.cutlass.nvcc import build_parallel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if shutil.which("nvcc") is None:
        print("skipped: bench_attention_build needs nvcc")
        return 0
    config = AttnConfig(persistent=True)
    kernels = [AttnKernel(dt, d) for dt in ("bf16", "f16") for d in (128, 64)]
    rows, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pyc-attn-build-") as tmp:
        cache = KernelCache(tmp)
        futures = build_parallel(kernels, lambda k: build_attention(config, k, cache=cache),
                                 args.workers, None, "bench-attn")
        for kernel, fut in futures.items():
            res = fut.result()
            rows.append({"kernel": f"{kernel.dtype} D={kernel.head_dim}", "config": config.id,
                         "status": res.status, "seconds": round(res.seconds, 1),
                         "message": res.message[:300]})
        wall = time.perf_counter() - t0
        again = [build_attention(config, k, cache=cache) for k in kernels]
    built = [r["seconds"] for r in rows if r["status"] == "built"]
    summary = {"kernels": len(rows), "built": len(built),
               "median_s_per_kernel": statistics.median(built) if built else None,
               "max_s_per_kernel": max(built) if built else None,
               "wall_s": round(wall, 1), "cpu_count": os.cpu_count(),
               "cached_again": [r.status for r in again]}
    write_result(args.out, "attention-build", {
        "method": "cold nvcc builds of the default configuration into an empty kernel "
                  "cache, each kernel's build timed by the build itself; then the same "
                  "builds again (cache hits)",
        "results": rows, "summary": summary})
    print(summary)
    return 0 if len(built) == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
