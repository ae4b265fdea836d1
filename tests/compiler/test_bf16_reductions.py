"""bfloat16 reductions that no generated kernel takes as written — ``np.std``,
``argmax``/``argmin``, ``sum``/``mean``/``max``/``min`` with ``where=`` or ``initial=`` —
computed on a float32 copy (the simplify pass), so that they join row programs as their
float32 twins do instead of running through CuPy: the rewrite keeps the reference's
answer bit for bit (NaN, Inf and -0.0 included), ``explain()`` says so, and the generated
row kernel, run on the CPU, matches float64 NumPy within bfloat16 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler import trace
from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassManager
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_emulated_reductions import _rows

BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)

PROGRAMS = {  # name: (function of x (and a mask), reduced over the last axis)
    "std": (lambda x, m: np.std(x, axis=-1), True),
    "std_ddof_keepdims": (lambda x, m: np.std(x, axis=-1, ddof=1, keepdims=True), True),
    "std_columns": (lambda x, m: np.std(x, axis=0), False),
    "argmax": (lambda x, m: np.argmax(x, axis=-1), True),
    "argmin_columns": (lambda x, m: np.argmin(x, axis=0), False),
    "masked_sum": (lambda x, m: np.sum(x, axis=-1, where=m), True),
    "masked_mean": (lambda x, m: np.mean(x, axis=-1, where=m, keepdims=True), True),
    "masked_max": (lambda x, m: np.max(x, axis=-1, where=m, initial=-np.inf), True),
    "min_initial": (lambda x, m: np.min(x, axis=-1, initial=BF16.type(0.5)), True),
    "softmax_masked_max": (lambda x, m: np.exp(x - np.max(x, axis=-1, keepdims=True,
                                                          where=m, initial=-np.inf)), True),
}


def _inputs(rng: np.random.Generator, rows: int, cols: int, special: bool) -> tuple:
    x = (rng.uniform(0.25, 4.0, (rows, cols)) * rng.choice([-1.0, 1.0], (rows, cols)))
    x = x.astype(np.float32).astype(BF16)
    if special:  # NaN, Inf, -0.0 in some rows
        x[1, 3] = np.nan
        x[2, 0] = np.inf
        x[2, 5] = -np.inf
        x[3, :] = BF16.type(-0.0)
    mask = rng.random((rows, cols)) < 0.6
    mask[:, 0] = True
    return x, mask


def _optimised(fn, args):
    graph, _ = trace(fn, args)
    reference = graph.copy()
    return PassManager().run(graph), reference


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == BF16:
        g, w = got.view(np.uint16), want.view(np.uint16)
        nan = np.isnan(want.astype(np.float32))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
        np.testing.assert_array_equal(g[~nan], w[~nan])  # bit for bit, -0.0 included
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("special", [False, True])
def test_a_bfloat16_reduction_joins_a_row_program_with_the_references_answer(name, special):
    rng = np.random.default_rng()
    fn, _ = PROGRAMS[name]
    x, mask = _inputs(rng, 6, 37, special)
    res, reference = _optimised(fn, (x, mask))
    computed = [n for n in res.graph if n.op not in ("input", "constant")]
    assert [n.op for n in computed] == ["fused_rows"], res.graph.text()
    assert supports(computed[0], res.graph) == (True, "")
    notes = [note for rec in res.log for note in rec.notes]
    assert any("bfloat16" in n and "float32 copy" in n for n in notes), notes
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, [x, mask], np)
        (want,) = run_graph(reference, [x, mask], np)  # the ops as written, unrewritten
    _same(np.asarray(got), np.asarray(want))


def test_float32_and_plain_bfloat16_reductions_are_left_as_they_were():
    x = np.ones((4, 8), np.float32)
    graph, _ = trace(lambda x: np.argmax(x, axis=-1), (x,))
    notes = [n for rec in PassManager().run(graph).log for n in rec.notes]
    assert not any("float32 copy" in n for n in notes)
    graph, _ = trace(lambda x: np.sum(x, axis=-1), (x.astype(BF16),))
    res = PassManager().run(graph)
    assert not any("float32 copy" in n for rec in res.log for n in rec.notes)


def test_adding_negative_zero_to_bfloat16_is_the_identity():
    x = np.array([1.5, -0.0, 0.0, np.nan, -np.inf], dtype=BF16)
    graph, _ = trace(lambda x: x + BF16.type(-0.0), (x,))
    res = PassManager().run(graph)
    assert any("add by its identity" in n for rec in res.log for n in rec.notes)
    (got,) = run_graph(res.graph, [x], np)
    _same(np.asarray(got), x + BF16.type(-0.0))
    graph, _ = trace(lambda x: x + BF16.type(0.0), (x,))  # +0.0 is not: -0.0 + 0.0 = +0.0
    res = PassManager().run(graph)
    assert not any("add by its identity" in n for rec in res.log for n in rec.notes)
    (got,) = run_graph(res.graph, [x], np)
    _same(np.asarray(got), x + BF16.type(0.0))


@needs_gxx
@pytest.mark.parametrize("name", sorted(k for k, (_, rows) in PROGRAMS.items() if rows))
def test_the_generated_row_kernel_matches_float64(name):
    rng = np.random.default_rng()
    fn, _ = PROGRAMS[name]
    x, mask = _inputs(rng, 5, 300, special=False)
    res, _ = _optimised(fn, (x, mask))
    graph = res.graph
    (node,) = [n for n in graph if n.op == "fused_rows"]
    by_id = dict(zip(graph.inputs, (x, mask), strict=True))
    ins = [np.ascontiguousarray(by_id[i] if i in by_id else graph.node(i).attrs["value"])
           for i in node.inputs]  # an argmax's indices are a constant
    src = generate(node, graph)
    with np.errstate(all="ignore"):
        want = np.asarray(fn(x.astype(np.float64), mask)).reshape(node.shape)
    for entry in src.entries:
        out = np.full(node.shape, np.nan if node.dtype.kind != "i" else -7,
                      dtype=node.dtype)
        _rows(src, ins, out, entry)
        if node.dtype.kind == "i":
            np.testing.assert_array_equal(out, want)
        else:
            np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_on_the_gpu_one_generated_kernel_gives_the_references_answer(name):
    cp = pytest.importorskip("cupy")
    import pyc_lab as pl

    rng = np.random.default_rng()
    fn, _ = PROGRAMS[name]
    x, mask = _inputs(rng, 300, 1031, special=True)
    f = pl.compile(fn, backend="cupy")
    dx, dmask = cp.asarray(x), cp.asarray(mask)
    got = f(dx, dmask)
    got = cp.asnumpy(got) if hasattr(got, "device") else np.asarray(got)
    with np.errstate(all="ignore"):
        want = np.asarray(pl.compile(fn, backend="numpy")(x, mask))
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=1e-2, atol=1e-2, equal_nan=True)
    assert len(f.explain(dx, dmask).kernels) == 1  # one generated row or column kernel
