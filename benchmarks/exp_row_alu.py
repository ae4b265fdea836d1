"""Experiment: are the float16 row kernels bound by arithmetic rather than memory?

The PTX of the suite's float16 softmax kernel (32768 x 1024) has about 27 instructions
per element, a fifth of them the NaN-propagating maximum of ``native/reduce.cuh`` (two
NaN tests, a compare, two predicate ops and a select), and ``exp``/IEEE division
expand further in SASS: at the H200's issue rate that is about as long as the kernel
takes. This times the suite's row programs with the generated sources rewritten three
ways — the maximum as one ``max.NaN.f32`` instruction (sm_80+; the same result but for
the sign of a zero maximum, which is order-dependent already), ``exp`` as ``__expf``
(relative error about 1e-6 for softmax's arguments, far below float16's 2**-11), and
both — checks each answer against the library's, and reports median CUDA-event times
against torch.compile. Writes ``row-alu.json`` to ``--out``. Nothing here changes the
library.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_programs import copy_gbps, gpu_ms
from common import cupy_and_torch, environment, write_result
from programs import PROGRAMS, make_inputs

NAMES = ("softmax_rows_f16", "layer_norm_f16", "residual_rms_norm_f16",
         "masked_softmax_f32", "log_softmax_f32")

GENERIC_MAX = "return a != a ? a : (b != b ? b : (a > b ? a : b));"
PTX_MAX = ("""if constexpr (sizeof(T) == 4 && T(0.5) != T(0)) {
            T r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
        } else { """ + GENERIC_MAX + " }")


def _rewrite(source: str, fast_max: bool, fast_exp: bool) -> str:
    if fast_max:
        source = source.replace(GENERIC_MAX, PTX_MAX, 1)  # the first: pyc_max_op
    if fast_exp:
        source = source.replace(" exp(", " __expf(").replace("(exp(", "(__expf(")
    return source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    libs = cupy_and_torch("exp_row_alu")
    if libs is None:
        return 0
    cp, torch = libs
    import dataclasses

    import pyc_lab as pl
    from pyc_lab.compiler.backend import lowering

    generate = lowering.generate  # the library's

    def patched(fast_max: bool, fast_exp: bool) -> Any:
        def gen(node: Any, graph: Any, **kw: Any) -> Any:
            src = generate(node, graph, **kw)
            if src.kind != "rows":
                return src
            return dataclasses.replace(src, source=_rewrite(src.source, fast_max, fast_exp))
        return gen

    bw = copy_gbps(cp)
    variants = [("library", False, False), ("max.NaN", True, False),
                ("__expf", False, True), ("both", True, True)]
    programs = {p.name: p for p in PROGRAMS}
    rows = []
    for name in NAMES:
        p = programs[name]
        dev = [cp.asarray(a) for a in make_inputs(p, 1.0)]
        tdev = [torch.as_tensor(a, device="cuda") for a in dev]
        tc = torch.compile(p.torch_fn)
        tc(*tdev)
        tc_ms = gpu_ms(lambda tc=tc, tdev=tdev: tc(*tdev))
        ref = None
        row = {"program": name, "torch.compile ms": tc_ms, "variants": {}}
        for label, fast_max, fast_exp in variants:
            lowering.generate = patched(fast_max, fast_exp)
            try:
                f = pl.compile(p.numpy_fn, backend="cupy")
                out = f(*dev)
                got = cp.asnumpy(out).astype(np.float64)
                ref = got if ref is None else ref
                diff = float(np.nanmax(np.abs(got - ref)))
                ms = gpu_ms(lambda f=f, dev=dev: f(*dev))
                nbytes = sum(a.nbytes for a in dev) + out.nbytes
                row["variants"][label] = {"ms": ms, "vs_torch_compile": tc_ms / ms,
                                          "fraction_of_copy_bw": nbytes / (ms * 1e-3)
                                          / (bw * 1e9), "max_diff_vs_library": diff}
                print(f"{name:24s} {label:8s} {ms:.4f} ms  x{tc_ms / ms:.2f} tc  "
                      f"diff {diff:.2e}")
            except Exception as exc:  # one variant failing must not hide the rest
                row["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{name:24s} {label:8s} {type(exc).__name__}: {exc}")
        rows.append(row)
    lowering.generate = generate
    write_result(args.out, "row-alu", {"environment": environment(), "copy_gbps": bw,
                                       "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
