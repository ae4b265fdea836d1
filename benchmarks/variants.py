"""Time one suite program under several variants of the library, against torch.compile.

The experiments ``exp_row_kernels``, ``exp_elementwise_grid`` and ``exp_row_alu`` each
replace a piece of pyc_lab (a launch shape, a grid cap, a rewritten source) in turn and
ask how a program of ``programs.py`` fares. :func:`time_variants` is the loop they share:
the program's inputs on the GPU, its ``torch.compile`` baseline timed once, then for each
variant a fresh ``pl.compile`` after the variant is installed, its answer compared with
the first variant's, its median CUDA-event time and its fraction of copy bandwidth. A
variant that fails is recorded and the others still run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from bench_programs import gpu_ms
from programs import Program, make_inputs

__all__ = ["time_variants"]


def _outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple) else [out]


def time_variants(cp: Any, torch: Any, program: Program,
                  variants: Sequence[tuple[str, Callable[[], None]]],
                  copy_gbps: float) -> dict[str, Any]:
    """``{"program", "torch.compile ms", "variants": {label: {"ms", "vs_torch_compile",
    "fraction_of_copy_bw", "max_diff_vs_default"} or {"error"}}}`` for ``program``, each
    variant installed by its callable before the program is compiled (the caller puts
    the library back afterwards)."""
    import pyc_lab as pl

    dev = [cp.asarray(a) for a in make_inputs(program, 1.0)]
    tdev = [torch.as_tensor(a, device="cuda") for a in dev]
    tc = torch.compile(program.torch_fn)
    tc(*tdev)
    tc_ms = gpu_ms(lambda: tc(*tdev))
    row: dict[str, Any] = {"program": program.name, "torch.compile ms": tc_ms, "variants": {}}
    ref = None
    for label, install in variants:
        install()
        try:
            f = pl.compile(program.numpy_fn, backend="cupy")
            outs = _outputs(f(*dev))
            got = [cp.asnumpy(o).astype(np.float64) for o in outs]
            ref = got if ref is None else ref
            diff = max(float(np.nanmax(np.abs(g - r))) for g, r in zip(got, ref, strict=True))
            ms = gpu_ms(lambda f=f: f(*dev))
            nbytes = sum(a.nbytes for a in dev) + sum(o.nbytes for o in outs)
            frac = nbytes / (ms * 1e-3) / (copy_gbps * 1e9)
            row["variants"][label] = {"ms": ms, "vs_torch_compile": tc_ms / ms,
                                      "fraction_of_copy_bw": frac,
                                      "max_diff_vs_default": diff}
            print(f"{program.name:26s} {label:26s} {ms:.4f} ms  x{tc_ms / ms:.2f} tc  "
                  f"{frac:.2f} of copy  diff {diff:.2e}")
        except Exception as exc:  # one variant failing must not hide the rest
            row["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{program.name:26s} {label:26s} {type(exc).__name__}: {exc}")
    return row
