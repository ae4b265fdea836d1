"""Experiment: where the time goes in the suite's hand-written attention and rotary
embedding (``benchmarks/programs.py``), step by step, against CuPy and torch.

Attention (16 x 16 heads x 1024 x 64, float16): the batched ``q @ k^T`` and ``p @ v``
through ``cupy.matmul`` (4-D and as 3-D views), ``torch.matmul`` and ``pl.matmul``; the
scaled softmax row kernel alone; the whole compiled program. Rotary (8 x 4096 x 32 x
128, float16): the compiled program, its two halves on strided slices and on contiguous
copies, the slice copies, the concatenation, and torch eager. Medians of CUDA-event
timings (``benchmarks/common.gpu_time``); writes ``attention-rotary.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from common import cupy_and_torch, environment, gpu_time, write_result


def _attention(cp: Any, torch: Any, pl: Any) -> dict[str, float]:
    from programs import attention

    rng = np.random.default_rng(0)
    shape = (16, 16, 1024, 64)
    q, k, v = (cp.asarray(rng.standard_normal(shape).astype(np.float16)) for _ in range(3))
    kt = cp.swapaxes(k, -1, -2)
    q3, kt3, v3 = q.reshape(256, 1024, 64), kt.reshape(256, 64, 1024), v.reshape(256, 1024, 64)
    s = cp.matmul(q, kt)
    tq, tk = torch.as_tensor(q, device="cuda"), torch.as_tensor(k, device="cuda")
    tkt = tk.transpose(-1, -2)
    soft = pl.compile(lambda s: np.exp(s * np.float16(0.125) - (s * np.float16(0.125)).max(
        axis=-1, keepdims=True)), backend="cupy")
    full = pl.compile(attention, backend="cupy")
    out: dict[str, float] = {}
    runs = {
        "cupy.matmul q @ k^T (4-D)": lambda: cp.matmul(q, kt),
        "cupy.matmul q @ k^T (3-D views)": lambda: cp.matmul(q3, kt3),
        "cupy.matmul q @ contiguous k^T (4-D)": lambda: cp.matmul(q, cp.ascontiguousarray(kt)),
        "torch.matmul q @ k^T": lambda: torch.matmul(tq, tkt),
        "pl.matmul q @ k^T (3-D views)": lambda: pl.matmul(q3, kt3),
        "cupy.matmul p @ v (4-D)": lambda: cp.matmul(s, v),
        "pl.matmul p @ v (3-D)": lambda: pl.matmul(s.reshape(256, 1024, 1024), v3),
        "pl.compile scaled exp row program": lambda: soft(s),
        "pl.compile attention": lambda: full(q, k, v),
    }
    for name, fn in runs.items():
        try:
            out[name] = gpu_time(fn, repeats=10) * 1e3
        except Exception as exc:  # one failing variant must not hide the others
            out[name] = float("nan")
            print(f"{name}: {type(exc).__name__}: {exc}")
        print(f"{name:42s} {out[name]:.4f} ms")
    print(full.explain(q, k, v).summary())
    return out


def _rotary(cp: Any, torch: Any, pl: Any) -> dict[str, float]:
    from programs import rotary, rotary_t

    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((8, 4096, 32, 128)).astype(np.float16))
    cos, sin = (cp.asarray(rng.standard_normal((4096, 1, 64)).astype(np.float16))
                for _ in range(2))
    x1, x2 = x[..., :64], x[..., 64:]
    c1, c2 = cp.ascontiguousarray(x1), cp.ascontiguousarray(x2)
    half = pl.compile(lambda a, b, c, s: a * c - b * s, backend="cupy")
    full = pl.compile(rotary, backend="cupy")
    tx, tc, ts = (torch.as_tensor(a, device="cuda") for a in (x, cos, sin))
    out: dict[str, float] = {}
    runs = {
        "pl.compile rotary": lambda: full(x, cos, sin),
        "pl.compile half on strided slices": lambda: half(x1, x2, cos, sin),
        "pl.compile half on contiguous halves": lambda: half(c1, c2, cos, sin),
        "cupy.ascontiguousarray(x[..., :64])": lambda: cp.ascontiguousarray(x1),
        "cupy.concatenate two halves": lambda: cp.concatenate([c1, c2], axis=-1),
        "cupy elementwise x * 2 (copy-like)": lambda: x * 2,
        "torch eager rotary": lambda: rotary_t(tx, tc, ts),
    }
    for name, fn in runs.items():
        try:
            out[name] = gpu_time(fn, repeats=10) * 1e3
        except Exception as exc:
            out[name] = float("nan")
            print(f"{name}: {type(exc).__name__}: {exc}")
        print(f"{name:42s} {out[name]:.4f} ms")
    print(full.explain(x, cos, sin).summary())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("exp_attention_rotary")
    if libs is None:
        return 0
    cp, torch = libs
    import pyc_lab as pl

    payload = {"environment": environment(), "attention_ms": _attention(cp, torch, pl),
               "rotary_ms": _rotary(cp, torch, pl)}
    write_result(args.out, "attention-rotary", payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
