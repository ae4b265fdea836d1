"""Experiment: the compiler's generated kernels against the CuPy call each replaced.

The never-slower rule: where ``pl.compile`` now generates a kernel for work that ran
through CuPy before — floor division and remainder, shifts, ``any``/``all``, a variance
with ``ddof``, a sum with ``dtype=``, counts of booleans, reductions with ``where=``,
``np.median``/``np.quantile`` around their sort, full reductions in two stages (a sum,
maximum, mean or ``any`` over a whole array past one block's reach), reductions over
axes apart (pooling written with a reshape, unrolled; sums over ``(0, 2)`` and
``(1, 3)``, row programs) — this times the
compiled function and the CuPy twin a user would call instead (the same arithmetic
written with CuPy's own functions) on the same arrays, checks that both agree, and
reports median CUDA-event times and the ratio (above 1: the compiled function is
faster). A ratio below 1 names a path that must fall back to the library. The ``rows3_*`` cases
time a reduction over a last axis of three values (a row kernel: a warp per row)
against the same sum written as elementwise work on the three columns, compiled too:
whether such rows should be unrolled as well; ``softmax_rows4`` and ``normalise_rows3``
time row programs over such rows (a thread per row). Writes ``library-twins.json`` to
``--out``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, environment, gpu_time, write_result

import pyc_lab as pl

ROWS, COLS = 8192, 4096


def _cases(cp: Any) -> list[tuple[str, Callable[..., Any], Callable[..., Any], list[Any]]]:
    """(name, NumPy-style program, CuPy twin, arguments) — arguments made on the GPU."""
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((ROWS, COLS), dtype=cp.float32)
    y = rng.standard_normal((ROWS, COLS), dtype=cp.float32) + cp.float32(3)
    n = (x * 1000).astype(cp.int32)
    m = x > 0.5
    mid = rng.standard_normal((33, 4097), dtype=cp.float32)  # past one block, under 2**18
    square = rng.standard_normal((1000, 1000), dtype=cp.float32)

    def floordiv(a, b):
        return a // b, a % b

    def shift(a):
        return (a >> 2) + (a << 1)

    def any_rows(a):
        return np.isnan(a).any(axis=-1)

    def var_ddof(a):
        return a.var(axis=-1, ddof=1)

    def sum_f64(a):
        return a.sum(axis=-1, dtype=np.float64)

    def count(a):
        return (a > 0.5).sum(axis=-1)

    def masked_max(a, mask):
        return np.max(a, axis=-1, where=mask, initial=-np.inf)

    def masked_mean(a, mask):
        return np.mean(a, axis=-1, where=mask)

    def median(a):
        return np.median(a, axis=-1)

    def quantile(a):
        return np.quantile(a, 0.9, axis=-1)

    def any_nan(a):
        return np.isnan(a).any()

    def full_max(a):
        return a.max()

    def full_sum(a):
        return a.sum()

    def full_mean(a):
        return a.mean()

    def max_pool(a):
        n, c, h, w = a.shape
        return np.maximum(a, 0).reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))

    def avg_pool(a):
        n, c, h, w = a.shape
        return a.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))

    def cupy_pool(a, op):
        n, c, h, w = a.shape
        return getattr(a.reshape(n, c, h // 2, 2, w // 2, 2), op)(axis=(3, 5))

    def sum_02(a):
        return a.sum(axis=(0, 2))

    def sum_13(a):
        return a.sum(axis=(1, 3))

    def norms3(d):
        return np.sqrt((d * d).sum(axis=-1))

    def norms3_unrolled(d):
        return np.sqrt(d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2])

    images = rng.standard_normal((32, 64, 112, 112), dtype=cp.float32)
    half = images.astype(cp.float16)
    cube = rng.standard_normal((64, 512, 256), dtype=cp.float32)
    maps = rng.standard_normal((32, 256, 56, 56), dtype=cp.float32)
    points = rng.standard_normal((1 << 24, 3), dtype=cp.float32)
    classes4 = rng.standard_normal((1 << 22, 4), dtype=cp.float32)

    def softmax(a):
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def cupy_softmax(a):
        e = cp.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def normalise(d):
        return d / np.sqrt((d * d).sum(axis=-1, keepdims=True))

    rows8 = rng.standard_normal((1 << 22, 8), dtype=cp.float32)
    rows16 = rng.standard_normal((1 << 21, 16), dtype=cp.float32)
    cube2 = rng.standard_normal((16, 2048, 256), dtype=cp.float32)

    return [
        ("floor_divide_remainder", floordiv, lambda a, b: (cp.floor_divide(a, b),
                                                           cp.remainder(a, b)), [x, y]),
        ("shifts_int32", shift, lambda a: cp.right_shift(a, 2) + cp.left_shift(a, 1), [n]),
        ("any_nan_rows", any_rows, lambda a: cp.isnan(a).any(axis=-1), [x]),
        ("var_ddof1_rows", var_ddof, lambda a: a.var(axis=-1, ddof=1), [x]),
        ("sum_dtype_float64", sum_f64, lambda a: a.sum(axis=-1, dtype=cp.float64), [x]),
        ("count_rows", count, lambda a: cp.count_nonzero(a > 0.5, axis=-1), [x]),
        ("masked_max_rows", masked_max,
         lambda a, mask: cp.where(mask, a, -cp.inf).max(axis=-1), [x, m]),
        ("masked_mean_rows", masked_mean,
         lambda a, mask: cp.where(mask, a, 0).sum(axis=-1) / mask.sum(axis=-1), [x, m]),
        ("median_rows", median, lambda a: cp.median(a, axis=-1), [x[:1024]]),
        ("quantile_rows", quantile, lambda a: cp.quantile(a, 0.9, axis=-1), [x[:1024]]),
        ("any_nan_full_135k", any_nan, lambda a: cp.isnan(a).any(), [mid]),
        ("max_full_135k", full_max, lambda a: a.max(), [mid]),
        ("sum_full_135k", full_sum, lambda a: a.sum(), [mid]),
        ("mean_full_1m", full_mean, lambda a: a.mean(), [square]),
        ("any_nan_full_32m", any_nan, lambda a: cp.isnan(a).any(), [x]),
        ("max_full_32m", full_max, lambda a: a.max(), [x]),
        ("relu_max_pool_2x2", max_pool,
         lambda a: cupy_pool(cp.maximum(a, 0), "max"), [images]),
        ("avg_pool_2x2_f16", avg_pool, lambda a: cupy_pool(a, "mean"), [half]),
        ("sum_axes_0_2", sum_02, lambda a: a.sum(axis=(0, 2)), [cube]),
        ("sum_axes_1_3", sum_13, lambda a: a.sum(axis=(1, 3)), [maps]),
        ("rows3_norms_vs_cupy", norms3, lambda d: cp.sqrt((d * d).sum(axis=-1)), [points]),
        ("rows3_norms_vs_unrolled", norms3, pl.compile(norms3_unrolled), [points]),
        ("rows8_sums", lambda a: a.sum(axis=-1), lambda a: a.sum(axis=-1), [rows8]),
        ("rows16_max", lambda a: a.max(axis=-1), lambda a: a.max(axis=-1), [rows16]),
        ("sum_axes_0_2_2048_rows", sum_02, lambda a: a.sum(axis=(0, 2)), [cube2]),
        ("softmax_rows4", softmax, cupy_softmax, [classes4]),
        ("normalise_rows3", normalise,
         lambda d: d / cp.sqrt((d * d).sum(axis=-1, keepdims=True)), [points]),
    ]


def _agree(cp: Any, got: Any, want: Any) -> bool:
    """Within rtol 1e-4, and an absolute 1e-5 of the largest magnitude (a sum of many
    values that cancels to near zero differs by the summation order's rounding)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return all(cp.allclose(g.astype(cp.float64), w.astype(cp.float64), rtol=1e-4,
                           atol=1e-5 * max(1.0, float(cp.abs(w).max())),
                           equal_nan=True).item() for g, w in zip(got, want, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--only", nargs="*", default=None, help="these cases only")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("exp_library_twins")
    if libs is None:
        return 0
    cp, _ = libs
    rows = []
    for name, program, twin, arrays in _cases(cp):
        if args.only and name not in args.only:
            continue
        row: dict[str, Any] = {"case": name, "shapes": [list(a.shape) for a in arrays]}
        try:
            f = pl.compile(program)
            row["agree"] = bool(_agree(cp, f(*arrays), twin(*arrays)))
            row["kernels"] = [k["name"] for k in f.explain(*arrays).kernels]
            ms_pl = gpu_time(lambda f=f, arrays=arrays: f(*arrays)) * 1e3
            ms_cupy = gpu_time(lambda twin=twin, arrays=arrays: twin(*arrays)) * 1e3
            row.update(ms={"pl.compile": ms_pl, "cupy": ms_cupy}, vs_cupy=ms_cupy / ms_pl)
        except Exception as exc:  # one case failing is recorded; the others go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    slower = [r["case"] for r in rows if r.get("vs_cupy", 1.0) < 1.0]
    write_result(args.out, "library-twins", {
        "environment": environment(),
        "method": "median CUDA-event time of 20 repeats after 3 warm-ups, each side on the "
                  "same arrays; agreement within rtol 1e-4 and 1e-5 of the largest magnitude",
        "rows": rows, "slower_than_cupy": slower})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
