"""Experiment: does cupy.matmul(a, b, out=planned_view) cost more than cupy.matmul(a, b)?

The compiled MLP ran 0.25 ms slower than its two GEMMs alone; the GEMMs write into
memory-planned buffers with ``out=``. This times both forms on the MLP's shapes (fp16),
CUDA events, median of 30 after warm-up, and writes ``matmul_out.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compiler import gpu_time
from common import write_result


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
        "matmul_fresh": gpu_time(cp, lambda: cp.matmul(x, w1), repeats=30) * 1e3,
        "matmul_out_plain_array": gpu_time(cp, lambda: cp.matmul(x, w1, out=plain),
                                           repeats=30) * 1e3,
        "matmul_out_uint8_view": gpu_time(cp, lambda: cp.matmul(x, w1, out=view),
                                          repeats=30) * 1e3,
    }
    print(rows)
    write_result(args.out, "matmul_out", {"shape": [m, d, h], "dtype": "float16",
                                          "unit": "ms", "results": rows})


if __name__ == "__main__":
    main()
