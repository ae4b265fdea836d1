"""The compiler's benchmark suite (``benchmarks/programs.py``) on the CPU: every program
compiles with ``pl.compile`` and gives NumPy's answer (float64 reference) at a small size.

The same programs are timed on the GPU by ``benchmarks/bench_programs.py``; this keeps
the suite honest where no GPU is (a program the compiler gets wrong fails here first).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import pyc_lab as pl

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "programs.py"
_spec = importlib.util.spec_from_file_location("pyc_lab_bench_programs", _PATH)
programs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = programs  # dataclasses look their module up there
_spec.loader.exec_module(programs)

TOL = {np.dtype(np.float16): 2e-2, np.dtype(np.float32): 2e-5, programs.BF16: 4e-2}


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("program", programs.PROGRAMS, ids=[p.name for p in programs.PROGRAMS])
def test_every_program_compiles_and_matches_numpy(program):
    args = programs.make_inputs(program, 1 / 256, seed=3)
    fn = pl.compile(program.numpy_fn, backend="numpy")
    with np.errstate(all="ignore"):
        got = _as_tuple(fn(*args))
        want = _as_tuple(program.numpy_fn(*args))  # NumPy itself, same dtypes
        ref = _as_tuple(program.numpy_fn(*[a.astype(np.float64) if a.dtype.kind == "f"
                                           or a.dtype == programs.BF16 else a
                                           for a in args]))
    assert len(got) == len(want) == len(ref)
    for g, w, r in zip(got, want, ref, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        want_dtype = w.dtype
        if program.dtype == programs.BF16 and w.dtype == np.float32:
            # ml_dtypes' NumPy matmul returns float32; pl.compile's bfloat16 matmul gives
            # bfloat16, as np.dot, torch and JAX do (the README's stated difference)
            want_dtype = programs.BF16
        assert g.dtype == want_dtype and g.shape == w.shape, program.name
        tol = TOL[np.dtype(program.dtype)]
        err = np.linalg.norm(g.astype(np.float64) - r) / max(np.linalg.norm(r), 1e-30)
        assert err < tol, (program.name, err)


def test_the_suite_is_the_size_the_issue_asks_for():
    names = [p.name for p in programs.PROGRAMS]
    assert len(names) >= 20 and len(set(names)) == len(names)


def test_the_benchmark_summary_reads_its_rows():
    """bench_programs' summary over made-up rows (what the GPU run writes): medians,
    the programs below 0.90x, wrong, failed, not run, slow to compile or to call, and
    the median the copy-bandwidth ceilings allow."""
    sys.path.insert(0, str(_PATH.parent))
    try:
        import bench_programs
    finally:
        sys.path.remove(str(_PATH.parent))
    rows = [
        {"program": "a", "vs_torch_compile": 1.2, "vs_torch_eager": 2.0, "correct": True,
         "pl_compile_s": 0.5, "pl_host_us_small": 20.0, "fraction_of_copy_bw": 0.9,
         "torch_compile_host_us_small": 40.0, "vs_torch_compile_at_copy_bw": 1.05},
        {"program": "b", "vs_torch_compile": 0.5, "vs_torch_eager": 1.0, "correct": False,
         "pl_compile_s": 2.5, "pl_host_us_small": 45.0, "fraction_of_copy_bw": 0.4,
         "torch_compile_host_us_small": 60.0, "vs_torch_compile_at_copy_bw": 1.25},
        {"program": "c", "vs_torch_compile": 0.95, "vs_torch_eager": 1.5, "correct": True,
         "pl_compile_s": 0.1},
        {"program": "d", "error": "RuntimeError: boom"},
        {"program": "e", "not_run": "time budget spent"},
    ]
    s = bench_programs.summary(rows)
    assert s["programs_timed"] == 3 and s["median_vs_torch_compile"] == 0.95
    assert s["min_vs_torch_compile"] == 0.5 and s["below_0_90"] == ["b"]
    assert s["median_vs_torch_eager"] == 1.5 and s["wrong"] == ["b"]
    assert s["failed"] == ["d"] and s["not_run"] == ["e"]
    assert s["memory_bound_below_85pct_copy"] == ["b"]
    assert s["compile_over_2s"] == ["b"] and s["host_over_30us"] == ["b"]
    assert s["median_host_us_small"] == 32.5
    assert s["median_torch_compile_host_us_small"] == 50.0
    # "c" is not memory-bound: no ceiling, counted as unbounded
    assert s["median_vs_torch_compile_ceiling_at_copy_bw"] == 1.25


def test_the_bfloat16_program_lowers_to_one_generated_kernel():
    """On the cupy backend (lowered here without a device) the bfloat16 sigmoid gate is
    one generated elementwise kernel, not CuPy calls."""
    from pyc_lab.compiler.backend.lowering import lower
    from pyc_lab.compiler.codegen import supports
    from pyc_lab.compiler.passes import PassManager
    from pyc_lab.compiler.policy import choose
    from pyc_lab.compiler.tracer import trace

    (program,) = [p for p in programs.PROGRAMS if p.name == "sigmoid_gate_bf16"]
    graph, _ = trace(program.numpy_fn, tuple(programs.make_inputs(program, 1 / 256)))
    graph = PassManager().run(graph).graph
    decisions = choose(graph, "cupy", supports=supports)
    launch = lower(graph, {d.node: d.choice for d in decisions})
    assert [k["kind"] for k in launch.kernels] == ["elementwise"]
    assert "pyc_round_bf16" in launch.kernels[0]["source"]
