"""Column programs: row fusion over reduced axes that end before the last axis (a
normalisation over a middle axis, statistics over the batch, an instance norm over
``(H, W)`` of NHWC) as one kernel whose lanes take neighbouring rows.

The pass (what fuses, what stays column kernels and why), the NumPy backend (the body is
what was written, op for op), and the generated kernels run on the CPU with real threads
per block (``tests/compiler/emulate.py``) against float64 NumPy, on fresh random data
with NaN, infinities and -0.0, in every float dtype, for odd extents (a last group of
lanes past the last row), rows kept in registers and rows re-read, into NaN-poisoned
outputs. The GPU side: ``tests/compiler/backend/test_column_programs_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.codegen.row_program import column_config, kind_in
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.passes.row_fusion import MAX_SPARSE_COLUMNS
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_codegen import compile_ptx, needs_nvcc
from tests.compiler.test_emulated_reductions import _TOL, _aligned, _rows
from tests.compiler.test_row_fusion import _EPI, _PRO, _chain

F16, F32, F64 = np.float16, np.float32, np.float64


def channel_norm(x, g):
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + x.dtype.type(1e-5)) * g


def batch_stats_norm(x):
    return (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + x.dtype.type(1e-5))


def softmax_axis0(x):
    e = np.exp(x - x.max(axis=0))
    return e / e.sum(axis=0)


def min_max_scale(x):
    lo = x.min(axis=0)
    return (x - lo) / (x.max(axis=0) - lo)


def instance_norm_nhwc(x):
    mu = x.mean(axis=(1, 2), keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=(1, 2), keepdims=True)
                              + x.dtype.type(1e-5))


def middle_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def mean_abs_middle(x):
    return np.abs(x).mean(axis=1)


def column_l2(x):
    return np.sqrt((x * x).sum(axis=0))


#: name -> (function, shapes of its inputs at a given row length ``r``)
PROGRAMS = {
    "channel_norm": (channel_norm, lambda r: [(3, r, 45), (r, 1)]),
    "batch_stats_norm": (batch_stats_norm, lambda r: [(r, 70)]),
    "softmax_axis0": (softmax_axis0, lambda r: [(r, 33)]),
    "min_max_scale": (min_max_scale, lambda r: [(r, 5)]),
    "instance_norm_nhwc": (instance_norm_nhwc, lambda r: [(2, r // 7 + 1, 7, 40)]),
    "middle_softmax": (middle_softmax, lambda r: [(2, r, 40)]),
    "mean_abs_middle": (mean_abs_middle, lambda r: [(4, r, 37)]),
    "column_l2": (column_l2, lambda r: [(r, 70)]),
}


def _data(rng, shape, dtype, specials=True):
    x = rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    if specials and x.size > 8:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, 4, replace=False)
        flat[idx] = [np.nan, np.inf, -np.inf, -0.0]
    return x.astype(dtype)


def _fused(fn, args):
    graph, _ = trace(fn, tuple(args))
    res = PassManager().run(graph)
    return res, [n for n in res.graph if n.op not in ("input", "constant")]


@pytest.fixture
def rng():
    return np.random.default_rng()


# -- the pass ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_each_program_is_one_column_program_and_keeps_numpys_answer(rng, name, dtype):
    fn, shapes = PROGRAMS[name]
    args = [_data(rng, s, dtype) for s in shapes(21)]
    res, computed = _fused(fn, args)
    # (a float16 np.var too: its body rounds each sum to float16 before dividing)
    assert [n.op for n in computed] == ["fused_rows"], res.graph.text()
    node = computed[-1]
    space, axes = tuple(node.attrs["space"]), tuple(node.attrs["axes"])
    assert axes[-1] < len(space) - 1  # rows across memory
    assert supports(node, res.graph) == (True, "")
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, args, np)
        want = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # the body is what was written, op for op
    notes = [n for rec in res.log if rec.name == "row_fusion" for n in rec.notes]
    assert any(f"over axes {axes}" in n and "lanes take neighbouring rows" in n
               for n in notes), notes


def test_a_reduction_without_full_work_stays_a_column_kernel(rng):
    # x.sum(axis=0) * s reads x once either way; the column kernel splits it across the GPU
    x, s = _data(rng, (300, 64), F32), _data(rng, (64,), F32)
    res, computed = _fused(lambda x, s: x.sum(axis=0) * s, [x, s])
    assert [n.op for n in computed] == ["sum", "fused"]
    notes = [n for rec in res.log for n in rec.notes]
    assert any("stay column kernels" in n and "no pass over memory" in n for n in notes)


def test_long_rows_in_too_few_blocks_are_left_to_the_column_kernels(rng):
    rows = MAX_SPARSE_COLUMNS + 1
    x = _data(rng, (rows, 64), F32)  # 64 rows of 1025: 2 blocks
    res, computed = _fused(batch_stats_norm, [x])
    assert "fused_rows" not in [n.op for n in computed]
    notes = [n for rec in res.log for n in rec.notes]
    assert any("too few for the GPU" in n for n in notes), notes
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, [x], np)
        want = batch_stats_norm(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def batch_norm_nchw(x):
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return (x - mu) / np.sqrt(var + x.dtype.type(1e-5))


def centre_n_and_h(x):  # axes 0 and 2 of NCHW: rows (c, w) across memory
    return x - x.mean(axis=(0, 2), keepdims=True)


#: programs over axes apart: name -> (function, shapes at a row count ``r``, its axes)
APART = {
    "batch_norm_nchw": (batch_norm_nchw, lambda r: [(3, r, 5, 9)], (0, 2, 3)),
    "centre_n_and_h": (centre_n_and_h, lambda r: [(3, r, 5, 9)], (0, 2)),
}


@pytest.mark.parametrize("fn, axes", [(f, a) for f, _, a in APART.values()])
def test_axes_apart_make_one_program(rng, fn, axes):
    x = _data(rng, (4, 6, 5, 7), F32)
    res, computed = _fused(fn, [x])
    assert [n.op for n in computed] == ["fused_rows"], res.graph.text()
    assert tuple(computed[0].attrs["axes"]) == axes
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, [x], np)
        want = fn(x)
    np.testing.assert_array_equal(got, want)


@needs_gxx
@pytest.mark.parametrize("fn", [batch_norm_nchw, centre_n_and_h])
@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_axes_apart_run_on_the_cpu(rng, fn, dtype):
    x = _data(rng, (3, 37, 5, 9), dtype)
    _, _, outs = _emulated(fn, [x])
    with np.errstate(all="ignore"):
        want = fn(x.astype(F64))
    rtol, atol = _TOL[np.dtype(dtype).name]
    for out in outs:
        assert np.array_equal(np.isnan(out), np.isnan(want))
        np.testing.assert_allclose(out.astype(F64), want, rtol=rtol, atol=atol)


def test_a_batch_norm_over_few_channels_of_long_rows_is_left_apart(rng):
    x = _data(rng, (32, 64, 48, 48), F32, specials=False)  # 64 rows of 73728 values
    res, computed = _fused(batch_norm_nchw, [x])
    assert "fused_rows" not in [n.op for n in computed]
    notes = [n for rec in res.log for n in rec.notes]
    assert any("too few rows for the GPU" in n for n in notes), notes


def test_kinds_in_a_column_space():
    space = (4, 8, 16)
    assert kind_in((4, 1, 16), space, (1,)) == "row1"
    assert kind_in((4, 16), space, (1,)) == "row"  # no keepdims: not a broadcast of x
    assert kind_in((16,), (8, 16), (0,)) == "row1"  # leading axes: NumPy broadcasts it
    assert kind_in((1, 16), (8, 16), (0,)) == "row1"
    assert kind_in((8,), (8, 16), (0,)) is None


@pytest.mark.parametrize("inner, cols, tx, ty, cached", [
    (64, 256, 32, 16, True), (3, 1000, 4, 64, True), (1, 40, 1, 256, True),
    (40, 900, 32, 32, False), (524288, 19, 128, 2, True), (45, 12, 256, 1, True)])
def test_column_launch_shapes(inner, cols, tx, ty, cached):
    cfg = column_config(1000, inner, cols)
    assert cfg["tx"] == tx and cfg["rows_per_block"] == tx and cfg["threads"] == ty
    assert cfg["block"] == tx * cfg["threads"] <= 1024
    assert cfg["cached"] is cached
    assert cfg["per_thread"] * cfg["threads"] >= cols


# -- generated kernels on the CPU -----------------------------------------------------------
def _emulated(fn, args):
    res, computed = _fused(fn, args)
    (node,) = [n for n in computed if n.op == "fused_rows"]
    graph = res.graph
    by_id = dict(zip(graph.inputs, args, strict=True))
    src = generate(node, graph)
    outs = []
    for entry in src.entries:
        out = np.full(node.shape, np.nan, dtype=node.dtype)  # poisoned
        _rows(src, [_aligned(by_id[i]) for i in node.inputs], out, entry)
        outs.append(out)
    return src, node, outs


# a float16 np.var is its own kernel, so batch_stats_norm's float16 program reads it
_EMULATED = [(name, dtype, r) for name in sorted(PROGRAMS)
             for dtype, r in [(F32, 21), (F64, 37), (F16, 64), (F32, 700), (F32, 12)]
             if not (name == "batch_stats_norm" and dtype == F16)]


@needs_gxx
@pytest.mark.parametrize("name, dtype, r", _EMULATED)
def test_column_programs_on_the_cpu_match_float64_numpy(name, dtype, r):
    rng = np.random.default_rng(r)
    fn, shapes = PROGRAMS[name]
    args = [_data(rng, s, dtype) for s in shapes(r)]
    src, node, outs = _emulated(fn, args)
    assert src.entries == (src.name,)  # no vectorised entry across memory
    assert src.launch["mode"] == "column"
    with np.errstate(all="ignore"):
        want = np.asarray(fn(*[a.astype(F64) for a in args])).reshape(node.shape)
    rtol, atol = _TOL[np.dtype(dtype).name]
    for out in outs:
        assert np.array_equal(np.isnan(out), np.isnan(want))
        np.testing.assert_allclose(out.astype(F64), want, rtol=rtol, atol=atol)


@needs_gxx
def test_rows_re_read_each_phase_and_a_partial_last_group(rng):
    # 2 x 47 positions (not a multiple of 32 lanes), rows of 900: past a thread's register
    # share, so each phase reads the row again
    x = _data(rng, (2, 900, 47), F32)
    src, _node, (out,) = _emulated(middle_softmax, [x])
    assert not src.launch["cached"] and src.launch["rows"] % src.launch["rows_per_block"]
    with np.errstate(all="ignore"):
        want = middle_softmax(x.astype(F64))
    assert np.array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_allclose(out.astype(F64), want, rtol=2e-5, atol=2e-6)


@needs_gxx
def test_bfloat16_column_program(rng):
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = _data(rng, (4, 33, 40), F32, specials=False).astype(bf16)
    fn = lambda x: x - x.mean(axis=1, keepdims=True)  # noqa: E731
    src, _node, (out,) = _emulated(fn, [x])
    assert out.dtype == bf16 and "pyc_bf16" in src.source
    want = fn(x.astype(F64))
    np.testing.assert_allclose(out.astype(F64), want, rtol=2e-2, atol=2e-2)


@needs_gxx
def test_results_do_not_change_from_run_to_run(rng):
    x = _data(rng, (3, 300, 50), F32, specials=False)
    _, _, (a,) = _emulated(mean_abs_middle, [x])
    _, _, (b,) = _emulated(mean_abs_middle, [x])
    assert np.array_equal(a, b)


@needs_nvcc
@pytest.mark.parametrize("fn, shape", [(channel_norm, None), (batch_norm_nchw, (32, 256, 28, 28))])
def test_column_and_apart_programs_compile_for_sm90(tmp_path, rng, fn, shape):
    args = ([_data(rng, s, F16) for s in PROGRAMS["channel_norm"][1](256)] if shape is None
            else [np.ones(shape, F32)])  # the shape is what matters here
    res, computed = _fused(fn, args)
    (node,) = computed
    compile_ptx(tmp_path, generate(node, res.graph), cubin=True)


# -- random chains over any block of axes ---------------------------------------------------
#: axes of a rank-3 array: across memory (column programs), along it (rows of several
#: axes) and apart
_AXES = [(0,), (1,), (0, 1), (1, 2), (0, 1, 2), (0, 2)]


_CHAINS = dict(pro=st.integers(0, len(_PRO) - 1), red=st.integers(0, 3),
               red2=st.one_of(st.none(), st.integers(0, 3)),
               epi=st.integers(0, len(_EPI) - 1), keep=st.booleans(),
               axes=st.sampled_from(_AXES),
               shape=st.tuples(*[st.sampled_from([2, 3, 7, 31]) for _ in range(3)]),
               dtype=st.sampled_from([F16, F32, F64]), seed=st.integers(0, 2**31))


def _chain_case(pro, red, red2, epi, keep, axes, shape, dtype, seed):
    r = np.random.default_rng(seed)
    return (_chain(pro, red, red2, epi, keep, axes), _data(r, shape, dtype),
            _data(r, shape, dtype))


@settings(max_examples=150, deadline=None)
@given(**_CHAINS)
def test_random_chains_over_any_block_of_axes_fuse_and_keep_the_answer(
        pro, red, red2, epi, keep, axes, shape, dtype, seed):
    fn, x, y = _chain_case(pro, red, red2, epi, keep, axes, shape, dtype, seed)
    res, computed = _fused(fn, [x, y])
    fused = [n for n in computed if n.op == "fused_rows"]
    assert len(fused) == 1, res.graph.text()
    assert supports(fused[0], res.graph) == (True, "")
    generate(fused[0], res.graph)  # every program the pass makes is generated
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, [x, y], np)
        want = fn(x, y)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@needs_gxx
@settings(max_examples=12, deadline=None)
@given(**_CHAINS)
def test_random_chains_over_any_block_of_axes_run_on_the_cpu(
        pro, red, red2, epi, keep, axes, shape, dtype, seed):
    fn, x, y = _chain_case(pro, red, red2, epi, keep, axes, shape, dtype, seed)
    _, node, outs = _emulated(fn, [x, y])
    with np.errstate(all="ignore"):
        # float16 rounds after every op, as NumPy does: NumPy's own float16 answer is the
        # reference there (float64 elsewhere)
        wide = [a.astype(F64) for a in (x, y)] if dtype != F16 else [x, y]
        want = np.asarray(fn(*wide)).astype(F64).reshape(node.shape)
    rtol, atol = _TOL[np.dtype(dtype).name]
    finite = np.isfinite(want)
    if dtype == F16 and finite.any():
        atol *= max(1.0, float(np.abs(want[finite]).max()))
    for out in outs:
        got = out.astype(F64)
        assert np.array_equal(np.isfinite(got), finite)
        assert np.array_equal(got[~finite], want[~finite], equal_nan=True)
        np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)


@needs_gxx
@pytest.mark.parametrize("y_shape", [(1, 21, 40), (21, 1), (3, 1, 1), (40,)])
def test_broadcast_inputs_of_a_column_program(rng, y_shape):
    x, y = _data(rng, (3, 21, 40), F32), _data(rng, y_shape, F32)

    def fn(x, y):
        v = x * y
        return v - v.mean(axis=1, keepdims=True)

    _, _, (out,) = _emulated(fn, [x, y])
    with np.errstate(all="ignore"):
        want = fn(x.astype(F64), y.astype(F64))
    assert np.array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_allclose(out.astype(F64), want, rtol=2e-5, atol=2e-5)


@needs_gxx
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_a_bfloat16_variance_joins_the_program_in_float32(rng, axis):
    # np.var of bfloat16 computes in float32 and rounds once; inside a program it is
    # expanded with the casts that keep that
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = _data(rng, (6, 40, 35), F32, specials=False).astype(bf16)

    def fn(x):
        return (x - x.mean(axis=axis, keepdims=True)) / np.sqrt(
            x.var(axis=axis, keepdims=True) + bf16.type(1e-5))

    res, computed = _fused(fn, [x])
    assert [n.op for n in computed] == ["fused_rows"], res.graph.text()
    unfused, _ = trace(fn, (x,))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run_graph(res.graph, [x], np)[0],
                                      run_graph(unfused, [x], np)[0])
    _, _, outs = _emulated(fn, [x])
    x64 = x.astype(F64)
    want = fn(x64)
    # each bfloat16 rounding (unit roundoff 2**-8) of the mean moves a result by
    # |mean| / std of it, those of the centring, variance, root and quotient by |result|
    mean, std = x64.mean(axis=axis, keepdims=True), x64.std(axis=axis, keepdims=True)
    bound = 2 * 2.0**-8 * (np.abs(mean) / std + 3 * np.abs(want))
    for out in outs:
        assert out.dtype == bf16
        err = np.abs(out.astype(F64) - want)
        assert np.all(err <= bound), float(np.max(err / bound))
