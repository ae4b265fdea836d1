"""Experiment: are the float16 row kernels bound by arithmetic rather than memory?

The PTX of the suite's float16 softmax kernel (32768 x 1024) has about 27 instructions
per element, a fifth of them the NaN-propagating maximum of ``native/reduce.cuh`` (two
NaN tests, a compare, two predicate ops and a select), and ``exp``/IEEE division
expand further in SASS: at the H200's issue rate that is about as long as the kernel
takes. This times the suite's row programs with the generated sources rewritten three
ways — the maximum as one ``max.NaN.f32`` instruction (sm_80+; the same result but for
the sign of a zero maximum, which is order-dependent already), ``exp`` as ``__expf``
(relative error about 1e-6 for softmax's arguments, far below float16's 2**-11), and
both — checks each answer against the library's (``max_diff_vs_default``), and reports
median CUDA-event times against torch.compile. Writes ``row-alu.json`` to ``--out``.
Nothing here changes the library.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_programs import copy_gbps
from common import cupy_and_torch, environment, write_result
from programs import PROGRAMS
from variants import time_variants

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

    def install(fast_max: bool, fast_exp: bool) -> Any:
        def apply() -> None:
            lowering.generate = patched(fast_max, fast_exp)
        return apply

    rows = [time_variants(cp, torch, programs[name],
                          [(label, install(m, e)) for label, m, e in variants], bw)
            for name in NAMES]
    lowering.generate = generate
    write_result(args.out, "row-alu", {"environment": environment(), "copy_gbps": bw,
                                       "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
