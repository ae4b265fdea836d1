"""Experiment: where the warm host time of a ``pl.compile`` call goes, on the GPU.

The program suite's warm host time per call (inputs at 1/256 of the benchmark size, so
that issuing the call is what costs) is over the 30 us target on most programs. This
takes a few of the suite's programs apart: the host microseconds per call of the
compiled function, of its executable alone (the launch list, no signature lookup), of
torch eager and torch.compile on the same inputs, and of the pieces every call is made
of (a bare CuPy RawKernel launch, ``cupy.empty``, a CUDA-graph replay of the same
launch list), and a cProfile of the compiled call (the functions with the most own
time). Writes ``host-time.json`` to ``--out``. Nothing here changes the library.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_programs import SMALL_SCALE
from common import cupy_and_torch, host_us, write_result
from programs import PROGRAMS, make_inputs

import pyc_lab as pl

NAMES = ("gelu_tanh_f32", "residual_rms_norm_f16", "layer_norm_f16", "colsum_scale_f32",
         "swiglu_f16", "adam_step_f32", "cross_entropy_f32", "attention_f16")


def _profile(fn: Any, calls: int = 3000, top: int = 25) -> list[dict[str, Any]]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}:{func}", "calls_per_call": nc / calls,
                     "own_us_per_call": tt / calls * 1e6, "cum_us_per_call": ct / calls * 1e6})
    rows.sort(key=lambda r: -r["own_us_per_call"])
    return rows[:top]


def _pieces(cp: Any) -> dict[str, float]:
    kernel = cp.RawKernel(r'''extern "C" __global__ void touch(float* x, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }''', "touch")
    x = cp.zeros(1024, dtype=cp.float32)
    n = cp.int32(1024)
    out = {"rawkernel_launch_us": host_us(cp, lambda: kernel((4,), (256,), (x, n))),
           "cupy_empty_us": host_us(cp, lambda: cp.empty((1024,), dtype=cp.float32)),
           "cupy_empty_2d_us": host_us(cp, lambda: cp.empty((64, 16), dtype=cp.float16))}
    return out


def _program_row(p: Any, cp: Any, torch: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"program": p.name}
    try:
        small = [cp.asarray(a) for a in make_inputs(p, SMALL_SCALE, seed=2)]
        tins = [torch.from_dlpack(a) for a in small]
        fn = pl.compile(p.numpy_fn)
        graphed = pl.compile(p.numpy_fn, cuda_graph=True)
        tc = torch.compile(p.torch_fn)
        fn(*small)
        row["pl_compile_us"] = host_us(cp, lambda: fn(*small))
        art, arrays = fn._artifact(small, {})
        runner = art.runner
        row["executable_only_us"] = host_us(cp, lambda: runner(list(arrays)))
        row["signature_lookup_us"] = host_us(cp, lambda: fn._artifact(small, {}))
        row["steps"] = [type(s).__name__ for s in getattr(runner, "_steps", [])]
        row["pl_cuda_graph_us"] = host_us(cp, lambda: graphed(*small))
        row["torch_eager_us"] = host_us(cp, lambda: p.torch_fn(*tins))
        tc(*tins)
        row["torch_compile_us"] = host_us(cp, lambda: tc(*tins))
        row["profile"] = _profile(lambda: fn(*small))
    except Exception as exc:  # one program failing is recorded, the others go on
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def _torch_interop(cp: Any, torch: Any) -> dict[str, float]:
    """Host microseconds of the ways a CuPy array and a torch tensor change hands (what
    the attention lowering's call into torch's SDPA is made of)."""
    from pyc_lab.kernels import arrays

    x = cp.ones((1, 16, 64, 64), dtype=cp.float16)
    t = torch.from_dlpack(x)
    stream = arrays.torch_stream_of_cupy()
    f = torch.nn.functional.scaled_dot_product_attention

    def in_context() -> None:
        with torch.cuda.stream(stream):
            pass

    return {
        "torch_from_dlpack_us": host_us(cp, lambda: torch.from_dlpack(x)),
        "cupy_from_dlpack_us": host_us(cp, lambda: cp.from_dlpack(t)),
        "torch_as_tensor_cai_us": host_us(cp, lambda: torch.as_tensor(x, device="cuda")),
        "cupy_asarray_cai_us": host_us(cp, lambda: cp.asarray(t)),
        "torch_stream_context_us": host_us(cp, in_context),
        "torch_stream_of_cupy_us": host_us(cp, arrays.torch_stream_of_cupy),
        "sdpa_on_tensors_us": host_us(cp, lambda: f(t, t, t, scale=0.125)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/local")
    parser.add_argument("--only", nargs="*", default=None,
                        help=f"suite programs to take apart (default: {' '.join(NAMES)})")
    args = parser.parse_args(argv)
    names = set(args.only) if args.only else set(NAMES)
    gate = cupy_and_torch("the host-time experiment")
    if gate is None:
        return 0
    cp, torch = gate
    rows = []
    for p in PROGRAMS:
        if p.name in names:
            row = _program_row(p, cp, torch)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "profile"}, flush=True)
    result = {"pieces": {**_pieces(cp), **_torch_interop(cp, torch)}, "rows": rows,
              "method": "host_us: median of 7 rounds of 200 calls, not synchronised inside "
                        "a round; inputs at 1/256 of the suite's size; cProfile over 3000 "
                        "calls (its own overhead inflates the absolute figures)"}
    print(result["pieces"])
    write_result(args.out, "host-time", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
