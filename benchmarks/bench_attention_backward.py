"""The backward pass of pl.attention against every torch SDPA backend's.

On the attention issue's shapes (4x16x4096x128, 8x16x2048x64, 16x32x1024x128,
1x32x16384x128), bfloat16 and float16, causal and not: the gradients of ``q``, ``k``
and ``v`` through ``pl.attention`` on tensors that require them (pyc_lab's kernel or
SDPA forward, whichever won its race; a library backward, chosen by
:mod:`pyc_lab.kernels.attention_grad`) and through torch's
``scaled_dot_product_attention`` with its default choice and with each backend forced.

Every candidate's gradients are first checked against float32 math-backend autograd on
the first batch entry's first two heads. Two times per candidate, CUDA-event medians
(:func:`common.gpu_time`): the backward alone (``torch.autograd.grad`` on a kept graph)
and a training step's whole attention (forward, then backward). TFLOP/s count the
backward's ``10 B H S^2 D`` (2.5 forwards), halved for causal. The first backward of
``pl.attention`` on a problem (which checks and races the library backwards) is timed
on the host as ``first_backward_s``. Writes ``attention_backward.json`` to ``--out``.

    python benchmarks/bench_attention_backward.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_attention import BACKENDS, problems
from common import cupy_and_torch, gpu_time, write_result

import pyc_lab as pl

TOL = {"float16": 2e-2, "bfloat16": 6e-2}  # of the largest reference gradient


def _reference(torch: Any, q: Any, k: Any, v: Any, do: Any, causal: bool) -> Any:
    """float32 math-backend gradients of batch entry 0, heads 0 and 1."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [x[:1, :2].detach().float().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    return torch.autograd.grad(out, leaves, do[:1, :2].float())


def _error(grads: Any, ref: Any) -> float:
    """The largest gradient error relative to the largest reference gradient."""
    worst = 0.0
    for g, r in zip(grads, ref, strict=True):
        err = float((g[:1, :2].float() - r).abs().max())
        worst = max(worst, err / float(r.abs().max()))
    return worst


def one_problem(torch: Any, shape: tuple[int, ...], dtype: str, causal: bool,
                repeats: int) -> dict[str, Any]:
    """Every candidate's backward on one problem: ms, TFLOP/s, step ms, error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from pyc_lab.kernels import attention_grad

    b, h, s, d = shape
    tdt = getattr(torch, dtype)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=tdt, requires_grad=True)
               for _ in range(3))
    do = torch.randn(b, h, s, d, device="cuda", dtype=tdt)
    ref = _reference(torch, q, k, v, do, causal)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    forwards: dict[str, Any] = {
        "pl.attention": lambda: pl.attention(q, k, v, causal=causal),
        "sdpa default": lambda: sdpa(q, k, v, is_causal=causal)}
    for name in BACKENDS:
        backend = getattr(SDPBackend, name)

        def forced(backend: Any = backend) -> Any:
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal)

        forwards[f"sdpa {name.lower()}"] = forced
    flop = 10 * b * h * s * s * d / (2 if causal else 1)
    rows: dict[str, Any] = {}
    attention_grad.clear()
    for name, fwd in forwards.items():
        try:
            out = fwd()
            t0 = time.perf_counter()
            grads = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            err = _error(grads, ref)
            if not err <= TOL[dtype]:
                rows[name] = {"error": f"gradient error {err:.3g} of the largest"}
                continue
            ms = gpu_time(lambda out=out: torch.autograd.grad(out, (q, k, v), do,
                                                              retain_graph=True),
                          repeats=repeats) * 1e3
            step = gpu_time(lambda fwd=fwd: torch.autograd.grad(fwd(), (q, k, v), do),
                            repeats=repeats) * 1e3
            rows[name] = {"backward_ms": ms, "tflops": flop / ms / 1e9, "step_ms": step,
                          "rel_err": err, "first_backward_s": first_s}
            del out, grads
        except Exception as exc:  # one refusing backend must not end the run
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    chosen = [c.why for c in attention_grad._CHOICES.values()]
    libs = {n: r["backward_ms"] for n, r in rows.items()
            if n.startswith("sdpa") and "backward_ms" in r}
    steps = {n: r["step_ms"] for n, r in rows.items() if n.startswith("sdpa") and
             "step_ms" in r}
    best = min(libs, key=libs.get) if libs else None
    best_step = min(steps, key=steps.get) if steps else None
    mine = rows.get("pl.attention", {})
    return {"shape": list(shape), "dtype": dtype, "causal": causal, "candidates": rows,
            "pl_backward_choice": chosen, "best_library": best,
            "backward_ratio_vs_best": libs[best] / mine["backward_ms"]
            if best and "backward_ms" in mine else None,
            "step_ratio_vs_best": steps[best_step] / mine["step_ms"]
            if best_step and "step_ms" in mine else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=170.0,
                        help="stop starting new problems after this many seconds")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("bench_attention_backward")
    if libs is None:
        return 0
    _, torch = libs
    t0 = time.perf_counter()
    results, not_run = [], []
    for shape, dtype, causal in problems(args.budget_s, t0, not_run):
        row = one_problem(torch, shape, dtype, causal, args.repeats)
        results.append(row)
        print(shape, dtype, "causal" if causal else "full", row["best_library"],
              "backward pl/best", row["backward_ratio_vs_best"], "step pl/best",
              row["step_ratio_vs_best"], flush=True)
        torch.cuda.empty_cache()
    back = [r["backward_ratio_vs_best"] for r in results if r["backward_ratio_vs_best"]]
    step = [r["step_ratio_vs_best"] for r in results if r["step_ratio_vs_best"]]
    summary = {"problems": len(results), "not_run": not_run,
               "backward_median_vs_best_library": statistics.median(back) if back else None,
               "backward_min_vs_best_library": min(back) if back else None,
               "step_median_vs_best_library": statistics.median(step) if step else None,
               "step_min_vs_best_library": min(step) if step else None,
               "failed": [[r["shape"], r["dtype"], r["causal"]] for r in results
                          if "backward_ms" not in r["candidates"].get("pl.attention", {})]}
    write_result(args.out, "attention_backward", {
        "method": "backward: torch.autograd.grad on a kept graph; step: forward then "
                  "backward; CUDA-event medians (common.gpu_time) of --repeats rounds; "
                  "gradients checked against float32 math autograd on batch entry 0, "
                  "heads 0-1, before timing",
        "results": results, "summary": summary, "wall_s": time.perf_counter() - t0})
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
