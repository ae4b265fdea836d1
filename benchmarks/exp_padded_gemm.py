"""Experiment: GEMMs whose rows are not 16-byte aligned, run on aligned copies.

cuBLAS and cuBLASLt take their fast Hopper kernels (TMA loads, warpgroup MMA) only when
every matrix's contiguous extent, leading dimension and pointer are 16-byte aligned. A
linear layer with an odd vocabulary (50257 outputs) or an odd hidden size falls back to
kernels several times slower. :class:`pyc_lab.kernels.padded.PaddedGemm` copies what is
unaligned into zero-padded scratch, runs the aligned library GEMM(s) and copies the
product out; ``pl.matmul`` races it against the direct call on a problem's first call.

Per problem (``a`` row-major M x K, ``b = w.T`` with ``w`` row-major N x K: a linear
layer), timed with :func:`pyc_lab.kernels.blas_direct.race` (interleaved rounds, L2
flushed before every run):

- ``cublas`` / ``cublaslt``: the direct library call on the operands as they are (what
  ``cupy.matmul`` and nvmath-python run); ``torch``: ``torch.matmul`` on the same memory;
- ``ld_<lib>``: the GEMM alone on copies whose lines are padded to 16 bytes with the
  extents unchanged (the pad never read): does aligning the leading dimensions suffice?
- ``padded_<lib>``: :class:`PaddedGemm` with that library, copies included;
- ``padded_gemms_<lib>``: its GEMM parts alone, without the copies (the floor);
- ``pl.matmul``: what ``pl.matmul`` runs after its first-call race (``pl_padded`` says
  whether it kept the padded GEMM).

``cublas``, ``padded_*`` and ``pl.matmul`` are checked first against ``torch.matmul`` in
float32 (NaN-poisoned output). Writes ``padded-gemm.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cupy_and_torch, write_result

PROBLEMS = [  # (m, n, k, dtype)
    # the matmul sweep's unaligned problems
    (4095, 4097, 1023, "f16"), (1000, 4100, 4100, "bf16"), (127, 11009, 4096, "f16"),
    (2047, 2049, 2047, "bf16"), (7, 4099, 4096, "bf16"),
    # others a user brings: LM heads with odd vocabularies, odd hidden sizes, M odd only
    (1, 50257, 768, "f16"), (512, 50257, 768, "bf16"), (2048, 32001, 4096, "bf16"),
    (16, 32001, 4096, "f16"), (3000, 3000, 3000, "f16"), (4096, 4096, 4095, "bf16"),
    (4097, 4096, 4096, "f16"), (1024, 1000, 1000, "f16"), (8192, 1027, 8192, "bf16"),
    (64, 50257, 2048, "bf16"), (333, 4096, 1234, "f16"),
]


def _el(x: Any) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


def one(pl: Any, cp: Any, torch: Any, m: int, n: int, k: int, dt: str, rounds: int,
        stream: int) -> dict[str, Any]:
    """Every variant of one problem, checked and timed."""
    from pyc_lab.kernels import blas_direct, blas_layout, padded

    dtype = {"f16": "float16", "bf16": "bfloat16"}[dt]
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    a_t = (torch.rand(m, k, device="cuda", generator=gen) * 2 - 1).to(tdt)
    w_t = (torch.rand(n, k, device="cuda", generator=gen) * 2 - 1).to(tdt)
    a, w = cp.from_dlpack(a_t), cp.from_dlpack(w_t)
    b = w.T
    out = cp.empty((m, n), dtype=a.dtype)
    v = 8
    k8, n8 = -(-k // v) * v, -(-n // v) * v
    a_ld = cp.empty((m, k8), dtype=a.dtype)
    w_ld = cp.empty((n, k8), dtype=a.dtype)
    o_ld = cp.empty((m, n8), dtype=a.dtype)
    a_ld[:, :k] = a
    w_ld[:, :k] = w
    plan = padded.pad_plan(a.shape, _el(a), b.shape, _el(b), (n, 1), a.itemsize)
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": dt,
                           "plan": None if plan is None else plan.why}
    runs: dict[str, Any] = {"torch": lambda: torch.matmul(a_t, w_t.T)}
    for lib in ("cublas", "cublaslt"):
        make = blas_direct.CublasGemm if lib == "cublas" else blas_direct.LtGemm
        direct = make(blas_layout.describe(a.shape, _el(a), b.shape, _el(b), (n, 1)), dtype)
        runs[lib] = lambda g=direct: g(a.data.ptr, w.data.ptr, out.data.ptr, stream)
        av, bv, ov = a_ld[:, :k], w_ld[:, :k].T, o_ld[:, :n]
        ld = make(blas_layout.describe(av.shape, _el(av), bv.shape, _el(bv), _el(ov)), dtype)
        runs[f"ld_{lib}"] = lambda g=ld: g(a_ld.data.ptr, w_ld.data.ptr, o_ld.data.ptr,
                                           stream)
        if plan is not None:
            pg = padded.PaddedGemm(plan, dtype, lib)
            runs[f"padded_{lib}"] = lambda g=pg: g(a.data.ptr, w.data.ptr, out.data.ptr,
                                                   stream)
            runs[f"padded_gemms_{lib}"] = lambda g=pg: _gemms_only(g, cp, a, w, out, stream)
    pl.kernels.matmul.forget()
    runs["pl.matmul"] = lambda: pl.matmul(a, b, out=out)
    ref = torch.matmul(a_t.float(), w_t.float().T)
    scale = float(ref.abs().max()) or 1.0
    errors: dict[str, float] = {}
    for name in [r for r in runs if r in ("cublas", "pl.matmul") or r.startswith("padded_c")]:
        out.view(cp.uint16).fill(0x7FFF)  # NaN in f16 and bf16
        try:
            runs[name]()
            cp.cuda.runtime.deviceSynchronize()
            errors[name] = float((torch.from_dlpack(out).float() - ref).abs().max()) / scale
        except Exception as exc:
            errors[name] = float("nan")
            print(f"  {name}: {type(exc).__name__}: {exc}")
    choice = dict(pl.kernels.matmul.last_choice)
    row["pl_impl"] = choice.get("impl")
    row["pl_padded"] = choice.get("padded")
    names = list(runs)
    times = blas_direct.race([runs[x] for x in names], stream, rounds=rounds)
    ms = dict(zip(names, times, strict=True))
    flop = 2.0 * m * n * k
    best_lib = min(ms["cublas"], ms["cublaslt"], ms["torch"])
    row.update(ms=ms, max_rel_err=errors, tflops_best_library=flop / best_lib / 1e9,
               ratio_pl_vs_best_library=best_lib / ms["pl.matmul"])
    path = "padded" if str(row["pl_padded"]).startswith("ran") else "direct"
    print(f"{dt:4} {m:5}x{n:6}x{k:5} best lib {best_lib:.4f} ms "
          f"({flop / best_lib / 1e9:6.1f} TFLOP/s)  pl.matmul {ms['pl.matmul']:.4f} ms "
          f"x{best_lib / ms['pl.matmul']:.2f} ({path})  "
          + " ".join(f"{x}={t:.4f}" for x, t in ms.items()), flush=True)
    return row


def _gemms_only(g: Any, cp: Any, a: Any, w: Any, out: Any, stream: int) -> None:
    """A :class:`PaddedGemm`'s GEMM parts alone, on its scratch as it stands."""
    from pyc_lab.kernels import blas_direct

    base, _ = blas_direct.scratch(cp.cuda.runtime.getDevice(), stream, g.plan.scratch_bytes)
    ptrs = {"a": a.data.ptr, "b": w.data.ptr, "out": out.data.ptr}
    for part, gemm in g._gemms:
        def at(ref: tuple[str, int]) -> int:
            return base + ref[1] if ref[0] == "scratch" else ptrs[ref[0]] + ref[1] * a.itemsize
        gemm(at(part.a), at(part.b), at(part.out), stream)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    got = cupy_and_torch("exp_padded_gemm")
    if got is None:
        return 0
    cp, torch = got
    import pyc_lab as pl

    stream = cp.cuda.get_current_stream().ptr
    rows = []
    for m, n, k, dt in PROBLEMS:
        rows.append(one(pl, cp, torch, m, n, k, dt, args.rounds, stream))
        cp.get_default_memory_pool().free_all_blocks()
    ratios = sorted(r["ratio_pl_vs_best_library"] for r in rows)
    path = write_result(args.out, "padded-gemm", {
        "method": "blas_direct.race: interleaved rounds, L2 flushed before each run, "
                  "median of rounds", "rounds": args.rounds,
        "operands": "a row-major M x K, b = w.T with w row-major N x K, uniform [-1, 1]",
        "summary": {"pl_vs_best_library_min": ratios[0],
                    "pl_vs_best_library_median": ratios[len(ratios) // 2],
                    "pl_vs_best_library_max": ratios[-1]},
        "rows": rows})
    print(f"pl.matmul vs best library: min {ratios[0]:.3f} median "
          f"{ratios[len(ratios) // 2]:.3f} max {ratios[-1]:.3f}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
