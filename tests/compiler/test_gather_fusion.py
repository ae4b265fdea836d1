"""Reads at integer indices (``compiler/gathers.py``) traced as ``gather`` ops and fused.

``x[idx]``, ``x[:, idx]``, ``x[..., idx]``, ``np.take``, ``np.take_along_axis`` and the
pick ``x[np.arange(n), y]`` compile without a graph break, give NumPy's answers on the
NumPy backend (an index out of range raises NumPy's ``IndexError`` there), and fuse with
the elementwise work around them into one kernel. The generated kernels run on the CPU
(``tests/compiler/emulate.py``) into NaN-poisoned outputs against NumPy on fresh random
data: negative indices, indices out of range (wrapped modulo the axis, as CuPy's take
does), reversed and transposed sources, strided index views, every float dtype,
int32/int64 indices, odd sizes, and a lone gather. The sources compile with nvcc for
sm_90. The same programs on a GPU: ``backend/test_gather_gpu.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.codegen import generate
from pyc_lab.compiler.ops import evaluate
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.tracer import trace
from pyc_lab.compiler.views import same_position_inputs
from tests.compiler.emulate import emulate, needs_gxx
from tests.compiler.test_codegen import compile_ptx, needs_nvcc
from tests.compiler.test_emulated_kernels import _check as check_against_body
from tests.compiler.test_emulated_kernels import _placed as place

F16, F32, F64 = np.float16, np.float32, np.float64
BF16 = np.dtype(ml_dtypes.bfloat16)


def _embed(w, tokens, scale):
    return w[tokens] * scale


def _columns(x, cols, b):
    return x[:, cols] + b


def _last_axis(x, cols):
    return np.tanh(x[..., cols])


def _take_rows(x, idx):
    return np.take(x, idx, axis=0) - 1


def _take_flat(x, idx):
    return np.take(x, idx) * 2


def _along(x, idx):
    return np.take_along_axis(x, idx, axis=1) * 3


def _pick(x, y):
    return -x[np.arange(x.shape[0]), y]


def _reversed_source(x, idx):
    return x[::-1][idx] + x[::-1][idx[::-1]]


def _transposed_source(x, idx):
    return x.T[idx] * 2


def _strided_index(x, idx):
    return x[idx[::2]] - x[0]


def _lone(x, idx):
    return x[idx]


def _upper(x):  # constant positions: a gather at the flattened (row, column) pairs
    return x[np.triu_indices(x.shape[0], 1, x.shape[1])] * 2


def _every_third_column(x):  # a constant mask: its np.nonzero positions
    return x[:, np.arange(x.shape[1]) % 3 == 0] + 1


def _pairs(x):
    return x[[0, 2, -1], [1, 0, 2]] * x[[[1], [3]], [0, 1, 2]]


def _ints(rng, n, size, lo=None):
    return rng.integers(-n if lo is None else lo, n, size=size)


# name -> (fn, make(rng, dtype, n) -> args)
PROGRAMS = {
    "embed": (_embed, lambda r, d, n: [_rand(r, (n, 7), d), _ints(r, n, (5, 3)),
                                       np.asarray(0.5, dtype=d)]),
    "columns": (_columns, lambda r, d, n: [_rand(r, (5, n), d), _ints(r, n, (9,)),
                                           _rand(r, (9,), d)]),
    "last_axis": (_last_axis, lambda r, d, n: [_rand(r, (2, 3, n), d), _ints(r, n, (4,))]),
    "take_rows": (_take_rows, lambda r, d, n: [_rand(r, (n, 6), d), _ints(r, n, (11,))]),
    "take_flat": (_take_flat, lambda r, d, n: [_rand(r, (n, 3), d), _ints(r, 3 * n, (13,))]),
    "along": (_along, lambda r, d, n: [_rand(r, (6, n), d), _ints(r, n, (6, 4))]),
    "along_broadcast": (_along, lambda r, d, n: [_rand(r, (6, n), d), _ints(r, n, (1, 3))]),
    "pick": (_pick, lambda r, d, n: [_rand(r, (9, n), d), _ints(r, n, (9,), lo=0)]),
    "reversed_source": (_reversed_source, lambda r, d, n: [_rand(r, (n, 5), d),
                                                           _ints(r, n, (7,))]),
    "transposed_source": (_transposed_source, lambda r, d, n: [_rand(r, (4, n), d),
                                                               _ints(r, n, (3,))]),
    "strided_index": (_strided_index, lambda r, d, n: [_rand(r, (n, 5), d),
                                                       _ints(r, n, (10,))]),
    "lone": (_lone, lambda r, d, n: [_rand(r, (n, 4), d), _ints(r, n, (6,)).astype(np.int32)]),
    "upper_triangle": (_upper, lambda r, d, n: [_rand(r, (6, n), d)]),
    "constant_mask": (_every_third_column, lambda r, d, n: [_rand(r, (5, n), d)]),
    "constant_pairs": (_pairs, lambda r, d, n: [_rand(r, (4, n), d)]),
}


def _rand(rng, shape, dtype):
    x = (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)
    flat = x.reshape(-1)
    if flat.size > 4:  # special values travel through the gather as they are
        flat[:4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
    return x


def _optimised(fn, args):
    graph, _ = trace(fn, tuple(args))
    return PassManager().run(graph).graph


def _reference_values(graph, args):
    values = dict(zip(graph.inputs, args, strict=True))
    for n in graph:
        if n.op != "input":
            with np.errstate(all="ignore"):
                values[n.id] = np.asarray(evaluate(n.op, np, [values[i] for i in n.inputs],
                                                   n.attrs), dtype=n.dtype)
    return values


# -- tracing and the NumPy backend ------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_numpy_backend_gives_numpy_answers_without_graph_breaks(name):
    rng = np.random.default_rng(len(name))
    fn, make = PROGRAMS[name]
    args = make(rng, F32, 17)
    f = pl.compile(fn, backend="numpy")
    with np.errstate(all="ignore"):
        want = fn(*args)
        got = f(*args)
    assert np.asarray(got).dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), want)
    assert f.explain(*args).graph_breaks == []


def test_gathers_fuse_with_their_elementwise_consumers():
    rng = np.random.default_rng(1)
    for name in ("embed", "columns", "take_rows", "along", "pick", "reversed_source"):
        fn, make = PROGRAMS[name]
        graph = _optimised(fn, make(rng, F32, 17))
        fused = [n for n in graph if n.op == "fused"]
        assert len(fused) == 1, name
        assert "gather" in fused[0].attrs["ops"], name
        assert not [n for n in graph if n.op in ("gather", "eager")], name


def test_explain_says_why_a_gathered_value_is_computed_apart():
    rng = np.random.default_rng(12)
    x = _rand(rng, (6, 5), F32)
    idx = np.array([4, 0, 5])
    fn = lambda x, i: pl.compiler.softmax(x, axis=0)[i] * 2  # noqa: E731
    f = pl.compile(fn, backend="numpy")
    log = f.explain(x, idx).pass_log.set_index("pass")
    notes = [n for n in log.loc["elementwise_fusion", "notes"].split("; ")
             if "gathers from" in n]
    # the softmax over axis 0 is a column program: one fused_rows node
    assert len(notes) == 1 and "fused_rows" in notes[0] and "never computed inside" in notes[0]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(f(x, idx), fn(x, idx))


def test_an_index_out_of_range_raises_numpy_s_index_error_on_the_numpy_backend():
    x = np.arange(12.0).reshape(4, 3)
    f = pl.compile(lambda x, i: x[i] + 1, backend="numpy")
    assert np.array_equal(f(x, np.array([3, -4])), x[[3, -4]] + 1)
    with pytest.raises(IndexError, match="out of bounds"):
        f(x, np.array([0, 4]))


def test_a_traced_0d_index_reads_as_numpy_s_integer_index():
    rng = np.random.default_rng(15)
    x, m, s = rng.standard_normal(7), rng.standard_normal((5, 3)), rng.standard_normal(5)
    for fn, args, scalar in [(lambda x, s: x[np.argmax(s)] * 2, (x, s), True),
                             (lambda m, s: m[np.argmax(s)] + 1, (m, s), False),
                             (lambda m, s: m[:, np.argmin(s) % 3], (m, s), False),
                             (lambda x, s: x[np.array(2)], (x, s), True)]:
        f = pl.compile(fn, backend="numpy")
        got, want = f(*args), fn(*args)
        assert isinstance(got, np.ndarray) != scalar and np.ndim(got) == np.ndim(want)
        np.testing.assert_array_equal(got, want)
        assert f.explain(*args).graph_breaks == []

    def write_through(m, s):  # NumPy writes into m through the view
        row = m[np.argmax(s)]
        row[0] = 5.0
        return m

    with pytest.raises(pl.PycLabError, match="cannot follow a write"):
        pl.compile(write_through, backend="numpy")(m.copy(), s)


def test_other_advanced_indices_stay_graph_breaks_with_numpy_s_answer():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 5))
    i, j = np.array([0, 2, 4]), np.array([1, 1, 4])
    for fn in (lambda x: x[i, j], lambda x: x[x > 0], lambda x: x[i[:, None], j],
               lambda x: x[None, i], lambda x: x[1:, i],
               lambda x: x[[np.argmax(x[:, 0]), 0]]):  # a list holding a traced value
        f = pl.compile(fn, backend="numpy")
        np.testing.assert_array_equal(f(x), fn(x))
        assert f.explain(x).graph_breaks


def test_constant_positions_are_numpys_and_out_of_range_is_numpys_error():
    x = np.random.default_rng(3).standard_normal((6, 5, 4))
    for fn in (lambda a: a[np.ix_([0, 2], [1, 3, 4])], lambda a: a[:, [0, 2], [1, 3]],
               lambda a: a[..., [0, 2], [1, 3]],
               lambda a: a[np.array([True, False, True, False, True, False])] + 1,
               lambda a: a[np.triu(np.ones((6, 5), bool))],
               lambda a: a[..., np.array([True, False, True, True])],
               lambda a: a[[-1, -6], [-5, 4]], lambda a: a[:, np.zeros(5, bool)],
               lambda a: a[np.array([], np.intp), np.array([], np.intp)]):
        f = pl.compile(fn, backend="numpy")
        np.testing.assert_array_equal(f(x), fn(x))
        assert not f.explain(x).graph_breaks
    for fn in (lambda a: a[[0, 9], [1, 2]], lambda a: a[np.array([True, False])],
               lambda a: a[:, np.ones(4, bool)]):
        with pytest.raises(IndexError):
            fn(x)
        with pytest.raises(IndexError):
            pl.compile(fn, backend="numpy")(x)


def test_float_indices_are_numpy_s_error():
    x = np.arange(6.0)
    f = pl.compile(lambda x, i: x[i], backend="numpy")
    with pytest.raises(IndexError):
        f(x, np.array([1.0]))
    with pytest.raises(IndexError, match="integer"):  # NumPy's own, raised while tracing
        pl.compile(lambda x, i: np.take_along_axis(x, i, 0), backend="numpy")(
            x, np.array([1.0]))


def test_gathered_inputs_are_never_written_in_place():
    rng = np.random.default_rng(3)
    x, idx = _rand(rng, (8, 8), F32), rng.permutation(8)
    graph = _optimised(lambda x, i: x[i] * 2, [x, idx])
    (node,) = [n for n in graph if n.op == "fused"]
    assert same_position_inputs(node.attrs["body"]) == set()
    # memory_first writes an elementwise kernel over its dying same-shape input (the
    # control) but never over an input it gathers from (a permutation of its rows)
    control = pl.compile(lambda x, i: np.exp(np.sin(x + 1) @ x) @ x, mode="memory_first",
                         backend="numpy")
    gathered = pl.compile(lambda x, i: np.exp((np.sin(x + 1) @ x)[i]) @ x,
                          mode="memory_first", backend="numpy")
    assert "in-place" in set(control.explain(x, idx).memory["reuse"])
    assert "in-place" not in set(gathered.explain(x, idx).memory["reuse"])
    with np.errstate(all="ignore"):  # sin of the infinities _rand plants
        want = np.exp((np.sin(x + 1) @ x)[idx]) @ x
        np.testing.assert_allclose(gathered(x, idx), want, rtol=1e-5)


# -- gather sinking ----------------------------------------------------------------------------
def _loss(x, y):
    z = x - x.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(x.shape[0]), y].mean()


def _sinking_notes(fn, args):
    result = PassManager().run(trace(fn, tuple(args))[0])
    return result.graph, [n for rec in result.log for n in rec.notes
                          if n.startswith("gather_sinking")]


def test_the_pick_of_a_loss_never_materialises_logp():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((64, 33)).astype(F32), rng.integers(0, 33, 64)
    graph, notes = _sinking_notes(_loss, (x, y))
    assert len(notes) == 2  # through logp = z - lse, then through z = x - max
    assert not [n for n in graph if tuple(n.shape) == (64, 33) and n.op != "input"]
    f = pl.compile(_loss, backend="numpy")
    np.testing.assert_allclose(f(x, y), _loss(x.astype(F64), y), rtol=1e-6)


@pytest.mark.parametrize("case", ["scaled_rows", "exp_columns", "broadcast_scale"])
def test_sinking_keeps_numpy_s_values(case):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 4)).astype(F32)
    scale = rng.standard_normal((1, 4)).astype(F32)
    i = np.array([1, -2, 3])
    fn = {"scaled_rows": lambda x, i: (x * scale + 1)[i],
          "exp_columns": lambda x, i: np.exp(x - x[:, :1])[:, i],
          "broadcast_scale": lambda x, i: (x * x[:, 1:2])[:, i]}[case]
    _, notes = _sinking_notes(fn, (x, i))
    assert notes
    f = pl.compile(fn, backend="numpy")
    np.testing.assert_array_equal(f(x, i), fn(x, i))


@pytest.mark.parametrize("case", ["rows", "row_grid", "columns", "biased_tanh"])
def test_a_gathered_matmul_computes_only_what_is_read(case):
    rng = np.random.default_rng(13)
    x, w = rng.standard_normal((64, 16)), rng.standard_normal((16, 32))
    b = rng.standard_normal(32)
    idx = {"rows": rng.integers(-64, 64, 5), "row_grid": rng.integers(0, 64, (3, 2)),
           "columns": rng.integers(-32, 32, 4), "biased_tanh": rng.integers(0, 64, 6)}[case]
    fn = {"rows": lambda x, w, b, i: (x @ w)[i],
          "row_grid": lambda x, w, b, i: (x @ w)[i] * 2,
          "columns": lambda x, w, b, i: (x @ w)[:, i],
          "biased_tanh": lambda x, w, b, i: np.tanh(x @ w + b)[i]}[case]
    graph, notes = _sinking_notes(fn, (x, w, b, idx))
    assert any("of matmul" in n for n in notes)
    (mm,) = [n for n in graph if n.op == "matmul"]
    assert int(np.prod(mm.shape)) < 64 * 32  # the GEMM's output is only what is read
    np.testing.assert_allclose(pl.compile(fn, backend="numpy")(x, w, b, idx),
                               fn(x, w, b, idx), rtol=1e-12, atol=1e-12)


def test_a_matmul_gathered_along_columns_by_a_grid_of_indices_is_left_as_it_is():
    rng = np.random.default_rng(14)
    x, w, idx = rng.standard_normal((8, 4)), rng.standard_normal((4, 6)), np.array([[1, 2]])
    fn = lambda x, w, i: (x @ w)[:, i]  # noqa: E731  (w[:, i] would be a batch of stacks)
    _, notes = _sinking_notes(fn, (x, w, idx))
    assert not any("of matmul" in n for n in notes)
    np.testing.assert_array_equal(pl.compile(fn, backend="numpy")(x, w, idx), fn(x, w, idx))


def test_sinking_keeps_numpy_s_index_error():
    x = np.arange(20.0, dtype=F32).reshape(5, 4)
    f = pl.compile(lambda x, i: (x * 2)[i], backend="numpy")
    with pytest.raises(IndexError):
        f(x, np.array([0, 5]))
    # every operand broadcast along the axis: not sunk, so a gather still checks the range
    g = lambda x, i: (x[:, :1] * 2)[:, i]  # noqa: E731
    _, notes = _sinking_notes(g, (x, np.array([0])))
    assert not notes
    with pytest.raises(IndexError):
        pl.compile(g, backend="numpy")(x, np.array([5]))


def test_sinking_only_where_fewer_elements_are_computed():
    x = np.arange(12.0, dtype=F32).reshape(4, 3)
    _, notes = _sinking_notes(lambda x, i: (x * 2)[i], (x, np.arange(10) % 4))
    assert not notes  # 30 gathered elements from 12 computed: gathering after is cheaper
    fn = lambda x, i: (x * 2).sum() + (x * 2)[i].sum()  # noqa: E731
    _, notes = _sinking_notes(fn, (x, np.array([1])))
    assert notes  # the product stays for the sum; the pick recomputes one row of it
    assert pl.compile(fn, backend="numpy")(x, np.array([1])) == fn(x, np.array([1]))


# -- generated kernels, run on the CPU ---------------------------------------------------------
@needs_gxx
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64, BF16])
def test_generated_gathers_match_numpy(name, dtype):
    rng = np.random.default_rng(7)
    fn, make = PROGRAMS[name]
    args = make(rng, dtype, 13)
    graph = _optimised(fn, args)
    values = _reference_values(graph, args)
    for node in [n for n in graph if n.op == "fused"]:
        src = generate(node, graph)
        assert "gather" in src.notes
        ins = [np.ascontiguousarray(values[i]) for i in node.inputs]
        for grid in (None, 1):
            out = np.full(node.shape, np.nan, dtype=node.dtype)
            emulate(src, src.name, [*ins, out], grid)
            check_against_body(node, ins, [out])


@needs_gxx
@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64])
@pytest.mark.parametrize("width", [16, 40])
def test_gathered_rows_are_read_a_vector_at_a_time(dtype, width):
    """An embedding lookup reads each row in 16-byte vectors (the index is the same for a
    whole vector); the general entry serves misaligned arrays and the tail."""
    rng = np.random.default_rng(width)
    w, pos = _rand(rng, (50, width), dtype), _rand(rng, (3, width), dtype)
    tokens = np.array([[0, -1, 49], [51, -51, 7], [3, 3, 2**33 + 5]])  # wrapped ones too
    fn = PROGRAMS["embed"][0]
    scale = np.asarray(0.5, dtype=dtype)
    # traced on valid indices (NumPy raises on the others); run on both
    graph = _optimised(lambda w, t, s, p: fn(w, t, s) + p, [w, tokens % 50, scale, pos])
    (node,) = [n for n in graph if n.op == "fused"]
    src = generate(node, graph)
    vec = src.launch["vec"]
    assert src.launch["vec_kernel"] == f"{src.name}_vec" and width % vec == 0
    by_id = dict(zip(graph.inputs, [w, tokens, scale, pos], strict=True))
    ins = [by_id[i] for i in node.inputs]
    want = np.take(w, tokens, axis=0, mode="wrap") * scale + pos  # CuPy's wrap
    for entry, aligned in ((src.launch["vec_kernel"], True), (src.name, False)):
        for grid in (None, 1):
            placed = place(ins, aligned)
            out = place([np.full(node.shape, np.nan, dtype=node.dtype)], aligned)[0]
            emulate(src, entry, [*placed, out], grid)
            np.testing.assert_array_equal(out.astype(F64), want.astype(F64))  # (NaN too)


def test_a_gather_whose_index_changes_within_a_vector_is_read_element_by_element():
    rng = np.random.default_rng(17)
    x, cols = _rand(rng, (4, 64), F32), rng.integers(0, 64, 16)
    graph = _optimised(lambda x, c: x[:, c] * 2, [x, cols])
    (node,) = [n for n in graph if n.op == "fused"]
    src = generate(node, graph)
    assert src.entries == (src.name,) and "scalar only" in src.notes


@needs_gxx
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1])
def test_out_of_range_indices_wrap_as_cupy_s_take(index_dtype, axis):
    rng = np.random.default_rng(11)
    x = _rand(rng, (5, 7), F32)
    idx = np.array([0, -1, 5, -6, 12, -13, 2**30 + 3], dtype=index_dtype)
    graph = _optimised(lambda x, i: np.take(x, i, axis=axis) + 0, [x, idx])
    (node,) = [n for n in graph if n.op == "fused"]
    src = generate(node, graph)
    want = np.take(x, idx, axis=axis, mode="wrap")
    out = np.full(want.shape, np.nan, dtype=F32)
    emulate(src, src.name, [x, idx, out])
    np.testing.assert_array_equal(out, want)


@needs_gxx
def test_the_emulator_catches_a_wrong_gather():
    """The check is not vacuous: the same kernel reading the next index is caught."""
    import dataclasses

    rng = np.random.default_rng(5)
    x, idx = _rand(rng, (6, 3), F32), np.array([-1, 2, -6])
    graph = _optimised(lambda x, i: x[i] * 1, [x, idx])
    (node,) = [n for n in graph if n.op == "fused"]
    src = generate(node, graph)
    broken = dataclasses.replace(src, source=src.source.replace(
        "long long j0 = static_cast<long long>(", "long long j0 = 1 + static_cast<long long>("))
    assert broken.source != src.source
    out = np.full((3, 3), np.nan, dtype=F32)
    emulate(broken, broken.name, [x, idx, out])
    assert not np.array_equal(out, x[idx])


@needs_nvcc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_gather_sources_compile(tmp_path, name):
    rng = np.random.default_rng(9)
    fn, make = PROGRAMS[name]
    graph = _optimised(fn, make(rng, F16, 13))
    for node in [n for n in graph if n.op == "fused"]:
        compile_ptx(tmp_path, generate(node, graph))


@needs_nvcc
def test_the_vectorised_gather_compiles(tmp_path):
    rng = np.random.default_rng(18)
    w, pos = _rand(rng, (50, 64), F16), _rand(rng, (3, 64), F16)
    tokens = rng.integers(0, 50, (4, 3))
    graph = _optimised(lambda w, t, p: w[t] * F16(32.0) + p, [w, tokens, pos])
    (node,) = [n for n in graph if n.op == "fused"]
    src = generate(node, graph)
    assert src.launch["vec_kernel"]
    ptx = compile_ptx(tmp_path, src)
    assert "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx  # 16-byte row reads
