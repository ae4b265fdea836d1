"""NumPy functions that are other ops in disguise — ``np.flip`` (a reversed view),
``np.vstack``/``np.hstack`` (concatenations), ``np.<ufunc>.reduce`` (reductions),
``np.diff``/``np.gradient``/``np.trapezoid`` (arithmetic on slices) — traced
as those ops, with NumPy's results bit for bit and no graph break; forms they do not
cover stay graph breaks that still give NumPy's answer."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.emulate import emulate, needs_gxx


def _same(fn, *args, breaks=0):
    f = pl.compile(fn)
    got, want = f(*args), fn(*args)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert f"graph breaks: {breaks}" in str(f.explain()), str(f.explain())


@pytest.fixture
def x():
    x = np.random.default_rng(11).standard_normal((7, 13)).astype(np.float32)
    x[0, :3] = [np.nan, -0.0, np.inf]
    return x


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
def test_flip_is_a_reversed_view(x, axis):
    _same(lambda a: np.flip(a, axis) * 2 + a, x)


def test_fliplr_and_flipud(x):
    _same(lambda a: np.fliplr(a) - np.flipud(a), x)


def test_vstack_and_hstack_are_concatenations(x):
    _same(lambda a: np.vstack([a, a * 2, a[0]]), x)
    _same(lambda a: np.vstack((a[0], a[1])), x)
    _same(lambda a: np.hstack([a, a[:, :2] + 1]), x)
    _same(lambda a: np.hstack([a[0], a[1]]), x)
    _same(lambda a: np.hstack([a.astype(np.float64), a]), x)  # promoted as NumPy does


def test_stacking_an_array_is_a_graph_break(x):
    _same(lambda a: np.vstack(a), x, breaks=1)


@pytest.mark.parametrize("ufunc, kw", [
    (np.add, {}), (np.add, {"axis": 1}), (np.add, {"axis": None}),
    (np.add, {"axis": 1, "keepdims": True}), (np.maximum, {"axis": 1}),
    (np.minimum, {}), (np.multiply, {"axis": 0}),
])
def test_ufunc_reduce_is_the_reduction(x, ufunc, kw):
    _same(lambda a: ufunc.reduce(a, **kw), x)


def test_ufunc_reduce_of_integers_and_bools_follows_numpy():
    b = np.random.default_rng(2).standard_normal((6, 9)) > 0
    _same(lambda m: np.add.reduce(m.astype(np.int32), axis=0), b)  # int32 sums to int64
    _same(lambda m: np.logical_and.reduce(m, axis=1), b)
    _same(lambda m: np.logical_or.reduce(m), b)


def test_other_ufunc_methods_stay_graph_breaks(x):
    _same(lambda a: np.maximum.accumulate(a, axis=1), x, breaks=1)
    _same(lambda a: np.add.outer(a[0], 2.0), x, breaks=1)  # NumPy's 0-d array, not weak


def test_add_and_multiply_accumulate_are_scans(x):
    _same(lambda a: np.add.accumulate(a, axis=1), x)
    _same(lambda a: np.multiply.accumulate(a), x)


EINSUMS = [
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 6)]), ("bij,bjk,kl->bil", [(3, 4, 5), (3, 5, 6), (6, 2)]),
    ("ij->ji", [(7, 9)]), ("ij->i", [(7, 9)]), ("ij->", [(7, 9)]), ("ij", [(7, 9)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 7, 8), (2, 3, 9, 8)]),
    ("...qd,...kd->...qk", [(2, 3, 7, 8), (2, 3, 9, 8)]), ("ijk,j->ik", [(3, 4, 5), (4,)]),
    ("i,i->", [(5,)]), ("i,j->ij", [(5,), (6,)]), ("bij,bjk->kib", [(3, 4, 5), (3, 5, 6)]),
    ("ij,ij->i", [(7, 9), (7, 9)]), ("ij,ij->ji", [(7, 9), (7, 9)]), ("i,i", [(5,), (5,)]),
    ("ij,kj->ik", [(7, 9), (3, 9)]), ("bij,bk->bijk", [(3, 4, 5), (3, 2)]),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
@pytest.mark.parametrize("subscripts, shapes", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_is_sums_transposes_and_matmuls(subscripts, shapes, dtype):
    rng = np.random.default_rng(len(subscripts))
    if subscripts == "i,i->" or len(shapes) < subscripts.count(",") + 1:
        shapes = shapes * (subscripts.split("->")[0].count(",") + 1)
    arrays = [(rng.standard_normal(s) * 4).astype(dtype) for s in shapes]
    fn = {1: lambda a: np.einsum(subscripts, a),
          2: lambda a, b: np.einsum(subscripts, a, b),
          3: lambda a, b, c: np.einsum(subscripts, a, b, c)}[len(arrays)]
    f = pl.compile(fn)
    got, want = f(*arrays), fn(*arrays)
    assert got.shape == want.shape and got.dtype == want.dtype
    if dtype == np.int32:  # integer sums are exact in any order
        np.testing.assert_array_equal(got, want)
    else:
        tol = 1e-5 if dtype == np.float32 else 1e-12  # of the largest term: cancellation
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))
    assert "graph breaks: 0" in str(f.explain())


def test_einsum_forms_not_covered_are_graph_breaks_with_numpys_answer():
    x = np.random.default_rng(0).standard_normal((5, 5))
    _same(lambda a: np.einsum("ii->i", a), x, breaks=1)  # a diagonal
    _same(lambda a: np.einsum("ij,j->i", a, np.ones(1)), x, breaks=1)  # size-1 broadcast


def test_outer(x):
    _same(lambda a: np.outer(a[0], a[1, :5]) + 1, x)


@pytest.mark.parametrize("k", [-2, 0, 3])
def test_tril_and_triu_are_selects(x, k):
    _same(lambda a: np.tril(a, k) - np.triu(a, k), x)


@pytest.mark.parametrize("shift, axis", [(1, 1), (-2, 0), (3, None), ((1, 2), (0, 1)),
                                         (0, 1), (27, 1)])
def test_roll_is_a_concatenation_of_slices(x, shift, axis):
    _same(lambda a: np.roll(a, shift, axis) * 2, x)


@pytest.mark.parametrize("reps", [2, (2, 1), (2, 1, 3), (1, 1), (3, 2)])
def test_tile_is_concatenated_copies(x, reps):
    _same(lambda a: np.tile(a, reps) + 1, x)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_repeat_by_a_constant_is_a_flattened_broadcast(x, axis):
    _same(lambda a: np.repeat(a, 3, axis=axis) * 2, x)
    _same(lambda a: a.repeat(2, axis=axis), x)


def test_tile_and_repeat_forms_not_covered_are_graph_breaks(x):
    _same(lambda a: np.tile(a, (0, 1)), x, breaks=1)  # empty
    _same(lambda a: np.repeat(a[:3], [1, 2, 1], axis=0), x, breaks=1)  # per-row counts


PAD_WIDTHS = [1, 2, ((0, 3), (2, 1)), ((3, 3), (4, 4)), ((0, 0), (5, 15))]


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric", "wrap"])
@pytest.mark.parametrize("k", range(len(PAD_WIDTHS)))
def test_pad_is_a_concatenation_of_views(x, mode, k):
    widths = PAD_WIDTHS[k]
    beyond = mode in ("reflect", "symmetric") and k == 4  # past one reflection: NumPy's loop
    _same(lambda a: np.pad(a, widths, mode=mode) * 2, x, breaks=int(beyond))


def test_pad_constant_values_and_integers(x):
    _same(lambda a: np.pad(a, 2, constant_values=7.5), x)
    ints = np.arange(20, dtype=np.int32).reshape(4, 5)
    _same(lambda a: np.pad(a, ((1, 0), (2, 3)), mode="reflect"), ints)
    _same(lambda a: np.pad(a, 1, mode="linear_ramp"), np.nan_to_num(x), breaks=1)  # not views


@pytest.mark.parametrize("n, axis", [(1, -1), (2, 0), (3, 1), (0, 1)])
def test_diff_is_differences_of_slices(x, n, axis):
    _same(lambda a: np.diff(a, n=n, axis=axis), x)


def test_diff_prepend_append_and_dtypes(x):
    _same(lambda a: np.diff(a, prepend=0.0), x)
    _same(lambda a: np.diff(a, axis=0, append=a[-1:]), x)
    _same(lambda a: np.diff(a > 0), x)  # booleans: !=
    _same(lambda a: np.diff(a, 2), np.arange(12, dtype=np.int32) ** 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
@pytest.mark.parametrize("axis", [-1, 0])
def test_trapezoid_is_numpys_arithmetic_on_slices(x, dtype, axis):
    """Spacing ``dx`` (default and given), sample points as a 1-d array along the axis
    and as an array of ``y``'s shape; integers give float64, as NumPy's do."""
    a = x.astype(dtype) if dtype != np.int32 else np.arange(91, dtype=dtype).reshape(7, 13)
    t = np.cumsum(np.abs(x[0]) + 0.5).astype(np.float32)
    with np.errstate(all="ignore"):
        _same(lambda v: np.trapezoid(v, axis=axis), a)
        _same(lambda v: np.trapezoid(v, dx=0.25, axis=axis) * 2, a)
        _same(lambda v, s: np.trapezoid(v, s, axis=axis),
              a, t if axis == -1 else t[:7])
        _same(lambda v, s: np.trapezoid(v, s, axis=axis), a, np.abs(x) + 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
def test_gradient_is_numpys_arithmetic_on_slices(x, dtype):
    a = x.astype(dtype) if dtype != np.int32 else np.arange(91, dtype=dtype).reshape(7, 13) ** 2
    f = pl.compile(lambda v: np.gradient(v))
    got, want = f(a), np.gradient(a)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert "graph breaks: 0" in str(f.explain())
    _same(lambda v: np.gradient(v, axis=1, edge_order=2), a)
    _same(lambda v: np.gradient(v, 0.5, axis=0), a)
    _same(lambda v: np.gradient(v, np.float64(0.3), 2.0)[1], a)  # a strong float64 spacing


def test_gradient_with_coordinates_is_a_graph_break(x):
    _same(lambda v: np.gradient(v[0], np.arange(13.0) ** 2), x, breaks=1)


def test_stack_family_is_concatenation(x):
    _same(lambda a: np.stack([a, a * 2], axis=1), x)
    _same(lambda a: np.stack((a, a), axis=-1) + 1, x)
    _same(lambda a: np.column_stack([a[0], a[1]]), x)
    _same(lambda a: np.column_stack([a, a[:, :2]]), x)
    _same(lambda a: np.dstack([a, a * 3]), x)
    _same(lambda a: np.atleast_3d(a[0]) + np.atleast_2d(a[1])[..., None], x)
    _same(lambda a: np.atleast_1d(a, a[0])[1] + 1, x)


@pytest.mark.parametrize("split, arg", [
    (lambda a: np.split(a, [2, 5], axis=0), None), (lambda a: np.array_split(a, 3, axis=1), None),
    (lambda a: np.array_split(a, 5, axis=0), None), (lambda a: np.hsplit(a[:, :12], 4), None),
    (lambda a: np.vsplit(a[:6], 2), None)])
def test_splits_are_slices(x, split, arg):
    f = pl.compile(lambda a: tuple(p * 2 for p in split(a)))
    got, want = f(x), tuple(p * 2 for p in split(x))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert "graph breaks: 0" in str(f.explain())


def test_uneven_split_stays_numpys_error(x):
    with pytest.raises(Exception, match="equal division"):
        pl.compile(lambda a: np.split(a, 5, axis=1)[0] + 1)(x)


def _close(fn, *args):
    """Products summed in another order than NumPy's BLAS call: equal to rounding."""
    f = pl.compile(fn)
    got, want = f(*args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    assert "graph breaks: 0" in str(f.explain())


def test_tensordot_inner_broadcast_arrays_rollaxis(x):
    y = np.nan_to_num(x, posinf=1.0, neginf=-1.0)
    _close(lambda a: np.tensordot(a, a, axes=([1], [1])), y)
    _close(lambda a: np.tensordot(a[:6].reshape(2, 3, 13), a[:6].reshape(3, 2, 13),
                                  axes=([1, 2], [0, 2])), y)
    _close(lambda a: np.inner(a, a[:4]), y)
    _same(lambda a: np.broadcast_arrays(a, a[0])[1] + 0, x)
    _same(lambda a: np.rollaxis(a[:6].reshape(2, 3, 13), 2) * 1, x)
    _same(lambda a: np.rollaxis(a[:6].reshape(2, 3, 13), 0, 2) * 1, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("name", ["nansum", "nanmean", "nanmax", "nanmin"])
def test_nan_reductions_skip_nan_as_numpy_does(x, dtype, name):
    a = x.astype(dtype)
    a[3, :] = np.nan  # an all-NaN row: NaN (max/min/mean), 0 (sum)
    fn = getattr(np, name)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "all-NaN slice"
        _same(lambda v: fn(v, axis=1), a)
        _same(lambda v: fn(v, axis=0, keepdims=True), a)
        _same(lambda v: fn(v), a)


def test_ptp_and_count_nonzero(x):
    _same(lambda a: np.ptp(a, axis=1), x)
    _same(lambda a: np.count_nonzero(a > 0, axis=1), x)
    _same(lambda a: np.count_nonzero(a, axis=0, keepdims=True), x)


# -- the generated kernels of these forms, run on the CPU ----------------------------------
FORMS = {
    "pad_reflect": lambda a: np.pad(a, ((2, 3), (4, 1)), mode="reflect") * 2,
    "pad_symmetric": lambda a: np.pad(a, ((2, 3), (4, 1)), mode="symmetric") + 1,
    "pad_edge": lambda a: np.pad(a, ((2, 3), (4, 1)), mode="edge") * 2,
    "pad_wrap": lambda a: np.pad(a, ((2, 9), (4, 15)), mode="wrap") * 2,
    "pad_constant": lambda a: np.pad(a, 2, constant_values=7.5) * 2,
    "roll": lambda a: np.roll(a, (2, -3), (0, 1)) * 2,
    "tile": lambda a: np.tile(a, (2, 3)) * 2,
    "repeat": lambda a: np.repeat(a, 3, axis=1) * 2,
    "diff": lambda a: np.diff(a, n=2, axis=1) * 2,
    "gradient": lambda a: np.gradient(a, axis=0, edge_order=2) * 2,
    "flip": lambda a: np.flip(a) * 2,
    "stack": lambda a: np.stack([a, a * 2], axis=1) + 1,
    "tril": lambda a: np.tril(a, 1) * 2,
    "outer": lambda a: np.outer(a[0], a[1]) + 1,
    "split": lambda a: np.array_split(a, 3, axis=1)[1] * 2,
    "dstack": lambda a: np.dstack([a, a + 1]) * 2,
}


@needs_gxx
@pytest.mark.parametrize("name", sorted(FORMS))
def test_generated_kernels_of_the_forms_give_numpys_answers(x, name):
    """Each fused node the GPU backend generates (every one of these forms' fused groups
    is generated) runs on the CPU (the g++ emulator) on the real inputs, the other nodes
    through their NumPy reference: the result must be NumPy's bit for bit — reversed,
    offset and repeated views, constant pieces and concatenations included."""
    from pyc_lab.compiler.codegen import generate, supports
    from pyc_lab.compiler.ops import evaluate
    from pyc_lab.compiler.passes import PassManager
    from pyc_lab.compiler.tracer import trace

    fn = FORMS[name]
    graph, breaks = trace(fn, (x,))
    assert not breaks
    graph = PassManager().run(graph).graph
    values: dict[int, np.ndarray] = {graph.inputs[0]: x}
    generated = 0
    for n in graph:
        if n.op == "input":
            continue
        ins = [values[i] for i in n.inputs]
        if n.op == "fused":
            ok, why = supports(n, graph)
            assert ok, why  # every fused group of these forms is generated
            src = generate(n, graph)
            body = n.attrs["body"]
            outs = [np.full(body.node(o).shape, np.nan, body.node(o).dtype)
                    for o in body.outputs]
            emulate(src, src.name, [np.ascontiguousarray(i) for i in ins] + outs)
            values[n.id] = outs[0]
            generated += 1
        else:
            values[n.id] = np.asarray(evaluate(n.op, np, ins, n.attrs))
    assert generated
    np.testing.assert_array_equal(values[graph.outputs[0]], fn(x))


@pytest.mark.parametrize("kw", [{}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0},
                                {"atol": 1}])
def test_isclose_is_numpys_comparison(x, kw):
    rng = np.random.default_rng(5)
    y = (x + rng.standard_normal(x.shape).astype(np.float32) * 1e-6).astype(np.float32)
    y[0, :4] = [np.nan, np.inf, np.inf, -0.0]
    ints = np.arange(91, dtype=np.int32).reshape(7, 13) % 5
    _same(lambda a, b: np.isclose(a, b, **kw), x, y)
    _same(lambda a, b: np.isclose(a, b, **kw), x.astype(np.float16), y)
    _same(lambda a, b: np.isclose(a, b, **kw), ints, ints.astype(np.float32) + 1e-9)
    _same(lambda a: np.isclose(a, 0.0, **kw), x)
    _same(lambda a: np.isclose(a, 2, **kw), ints)


@pytest.mark.parametrize("kw", [{}, {"axis": 1}, {"axis": 0, "keepdims": True},
                                {"axis": (0, 1)}])
def test_average_without_weights_is_the_mean(x, kw):
    _same(lambda a: np.average(a, **kw), x)
    ints = np.arange(91).reshape(7, 13) % 5
    _same(lambda a: np.average(a, **kw), ints)


def test_average_with_constant_weights_is_numpys_steps(x):
    # NumPy raises when the weights sum to zero: constants are checked while tracing;
    # weights that are inputs — arguments, or arrays the function closes over, which
    # may change between calls — and returned= run as written
    _same(lambda a: np.average(a, axis=1, weights=np.linspace(0.5, 1.5, 13)), x)
    w = np.linspace(0.5, 1.5, 13)
    _same(lambda a: np.average(a, axis=1, weights=w), x, breaks=1)
    _same(lambda a: np.average(a, axis=1, returned=True)[1], x, breaks=2)  # (a pair)
