"""Row fusion: which chains become one ``fused_rows`` node, that the rewrite keeps NumPy's
answer bit for bit, that ``explain()`` says what fused and why something did not, and
that every generated row-program kernel compiles (``nvcc``) and matches NumPy on the GPU
(``gpu``: float64 references, NaN/Inf/-0.0, odd and long rows, every float dtype, fused
against unfused)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyc_lab as pl
from pyc_lab.compiler import trace
from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.codegen.row_program import check_row_program, kind_in
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import DEFAULT_PIPELINE, PassManager
from tests.compiler.emulate import needs_gxx
from tests.compiler.test_codegen import compile_ptx, needs_nvcc
from tests.compiler.test_fuzz_emulated import _check_program

F16, F32, F64 = np.float16, np.float32, np.float64


# -- programs people write ------------------------------------------------------------------
def rms_norm(x, r, g):
    h = x + r
    return h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + x.dtype.type(1e-6)) * g


def residual_layer_norm(x, r, g, b):
    h = x + r
    mu = h.mean(axis=-1, keepdims=True)
    var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
    return (h - mu) / np.sqrt(var + h.dtype.type(1e-5)) * g + b


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def row_loss(x, onehot):
    m = x.max(axis=-1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return -(onehot * logp).sum(axis=-1)


def masked_softmax(x, mask):
    s = np.where(mask, x / x.dtype.type(0.7), -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def l2_normalize(x):
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + x.dtype.type(1e-12))


def row_std(x):
    return np.sqrt(((x - x.mean(-1, keepdims=True)) ** 2).mean(-1))


def bce_with_logits(x, target):
    # the math library inside a row program: log1p of exp(-|x|), averaged over the row
    loss = np.maximum(x, 0) - x * target + np.log1p(np.exp(-np.abs(x)))
    return loss.mean(axis=-1)


def centred_max(x, bias):
    return np.abs(x - bias).max(axis=-1) * x.dtype.type(0.5)


def scaled_row_sum(x, s):
    return (x * 2).sum(axis=-1, keepdims=True) / s


PROGRAMS = {
    "rms_norm": (rms_norm, lambda r, c, d: [_rand(r, (r_, c), d) for r_ in (7, 7)]
                 + [_rand(r, (c,), d)]),
    "residual_layer_norm": (residual_layer_norm,
                            lambda r, c, d: [_rand(r, (7, c), d), _rand(r, (7, c), d),
                                             _rand(r, (c,), d), _rand(r, (c,), d)]),
    "log_softmax": (log_softmax, lambda r, c, d: [_rand(r, (3, 5, c), d, 6.0)]),
    "row_loss": (row_loss, lambda r, c, d: [_rand(r, (9, c), d, 4.0), _onehot(r, 9, c, d)]),
    "bce_with_logits": (bce_with_logits,
                        lambda r, c, d: [_rand(r, (9, c), d, 8.0), _onehot(r, 9, c, d)]),
    "masked_softmax": (masked_softmax, lambda r, c, d: [_rand(r, (6, c), d, 5.0),
                                                        _mask(r, (6, c))]),
    "l2_normalize": (l2_normalize, lambda r, c, d: [_rand(r, (5, c), d)]),
    "row_std": (row_std, lambda r, c, d: [_rand(r, (4, c), d)]),
    "centred_max": (centred_max, lambda r, c, d: [_rand(r, (2, 3, c), d),
                                                  _rand(r, (3, 1), d)]),
    "scaled_row_sum": (scaled_row_sum, lambda r, c, d: [_rand(r, (6, c), d),
                                                        _rand(r, (6, 1), d)]),
}


def _rand(rng, shape, dtype, high=3.0):
    mag = rng.uniform(0.1, high, size=shape)
    return (mag * rng.choice([-1.0, 1.0], size=shape)).astype(dtype)


def _onehot(rng, rows, cols, dtype):
    out = np.zeros((rows, cols), dtype)
    out[np.arange(rows), rng.integers(0, cols, rows)] = 1
    return out


def _mask(rng, shape):
    m = rng.random(shape) < 0.7
    m[:, 0] = True  # every row keeps a value (a fully masked row is tested on its own)
    return m


def _optimised(fn, args, passes=None):
    graph, _ = trace(fn, tuple(args))
    return PassManager(passes).run(graph) if passes else PassManager().run(graph)


def _fused(result):
    return [n for n in result.graph if n.op == "fused_rows"]


def _notes(result, name="row_fusion"):
    return [note for rec in result.log if rec.name == name for note in rec.notes]


@pytest.fixture
def rng():
    return np.random.default_rng()


# -- what fuses ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_each_program_becomes_one_row_kernel_and_keeps_numpys_answer(rng, name, dtype):
    fn, make = PROGRAMS[name]
    args = make(rng, 37, dtype)
    res = _optimised(fn, args)
    computed = [n for n in res.graph if n.op not in ("input", "constant")]
    assert [n.op for n in computed] == ["fused_rows"], res.graph.text()
    node = computed[0]
    assert supports(node, res.graph) == (True, "")
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, args, np)
        want = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # the body is what was written, op for op
    (note,) = [n for n in _notes(res) if "fused into" in n]
    assert "reduction(s) over rows of 37" in note


def test_pass_places_row_fusion_after_split_and_before_elementwise_fusion():
    # (small reductions become elementwise work, argmax/argmin reductions, between the
    # split and row fusion)
    k = DEFAULT_PIPELINE.index("row_fusion")
    assert DEFAULT_PIPELINE[k - 3:k] == ["split_reduction", "small_reduction", "arg_reductions"]
    assert DEFAULT_PIPELINE[k + 1] == "elementwise_fusion"


def test_a_lone_softmax_keeps_its_own_kernel_and_a_prologue_joins_it(rng):
    x = _rand(rng, (4, 64), F32)

    def plain(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def scaled(x):
        return plain(x * np.float32(0.125))

    assert [n.op for n in _optimised(plain, [x]).graph if n.op != "input"] == ["softmax"]
    res = _optimised(scaled, [x])
    (node,) = _fused(res)
    assert node.attrs["ops"] == ("multiply", "max", "subtract", "exp", "sum", "divide")


def test_a_value_read_outside_the_program_is_computed_once_outside(rng):
    x, r = _rand(rng, (4, 64), F32), _rand(rng, (4, 64), F32)

    def norm_and_residual(x, r):
        h = x + r
        return h / np.sqrt((h * h).mean(-1, keepdims=True)), h

    res = _optimised(norm_and_residual, [x, r])
    ops = [n.op for n in res.graph if n.op not in ("input", "constant")]
    assert ops == ["fused", "fused_rows"]  # h is an output: its own kernel, read by the rows
    with np.errstate(all="ignore"):
        got = run_graph(res.graph, [x, r], np)
    for a, b in zip(got, norm_and_residual(x, r), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fn, why", [
    (lambda x: x.sum(axis=0) * 2, "not the last axis"),
    (lambda x: x - x.sum(axis=-1), "a row value without keepdims read as a per-column one"),
    (lambda x: (x * 2).sum(axis=-1, keepdims=True) * x.sum(axis=0),
     "a per-column value made inside"),
])
def test_chains_that_are_not_row_programs_stay_apart(rng, fn, why):
    x = _rand(rng, (16, 16), F32)
    res = _optimised(fn, [x])
    for node in _fused(res):  # whatever fused must still be a valid row program ...
        assert supports(node, res.graph) == (True, "")
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, [x], np)
    np.testing.assert_array_equal(got, fn(x))  # ... and the answer is unchanged
    if why == "not the last axis":
        assert not _fused(res)


def test_integer_reductions_are_left_to_the_row_kernels(rng):
    x = rng.integers(-50, 50, (8, 40)).astype(np.int32)
    res = _optimised(lambda x: (x * 3).sum(axis=-1), [x])
    assert not _fused(res)


def test_full_reductions_of_long_rows_are_not_one_block(rng):
    """One row of 131072 is never one block's program: split_reduction makes it rows of
    row maxima first, and those are what row fusion fuses."""
    x = _rand(rng, (1 << 17,), F32)
    res = _optimised(lambda x: (x * x).max(), [x])
    spaces = [tuple(n.attrs["space"]) for n in _fused(res)]
    assert spaces and all(len(s) == 2 and s[0] >= 2 for s in spaces), spaces


@pytest.mark.parametrize(("shape", "axis"), [((8, 64), -1), ((300, 40), 0),
                                             ((8, 50, 30), 1), ((8, 4, 6, 6), (0, 2, 3))])
@pytest.mark.parametrize("ddof", [0, 1])
def test_float16_np_var_joins_a_program_with_numpys_roundings(rng, shape, axis, ddof):
    """A float16 ``np.var`` (last axis with work around it, or any axes) is one program
    whose body rounds as NumPy does — each sum rounded to float16 before it is divided,
    the deviations and squares in float16 — bit for bit NumPy's answer, overflow to inf
    included; its float32 twin is one program too."""
    def fn(v):
        return np.sqrt(v.var(axis=axis, ddof=ddof)) * 2

    for scale in (1.0, 30.0, 300.0):  # 300: squares past float16's range
        x = _rand(rng, shape, F16, high=scale)
        res = _optimised(fn, [x])
        assert len(_fused(res)) == 1, res.graph.text()
        with np.errstate(all="ignore"):
            (got,) = run_graph(res.graph, [x], np)
            want = fn(x)
        assert got.dtype == want.dtype == F16
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert len(_fused(_optimised(fn, [x.astype(F32)]))) == 1


@needs_gxx
@pytest.mark.parametrize(("source", "shape"), [
    ("def f(x):\n    return x.var(axis=0)\n", (300, 40)),
    ("def f(x):\n    return np.sqrt(x.var(axis=1, ddof=1)) * 2\n", (8, 50, 30)),
    ("def f(x):\n    return np.sqrt(x.var(axis=-1, keepdims=True) + 1e-3) * x\n", (64, 100)),
    ("def f(x):\n    return (x - x.mean(axis=(0, 2, 3), keepdims=True)) / "
     "np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + 1e-5)\n", (8, 4, 16, 16)),
])
def test_float16_np_var_programs_generate_kernels_with_the_references_values(source, shape):
    """The generated row and column kernels of float16 ``np.var`` programs, run on the CPU
    with and without NaN and Inf in the data: the reference's values."""
    for special in (False, True):
        assert _check_program(source, [(shape, np.dtype(F16))], special, 3) == 1


def test_explain_names_the_row_program(rng):
    x, r, g = _rand(rng, (8, 64), F32), _rand(rng, (8, 64), F32), _rand(rng, (64,), F32)
    ex = pl.compile(rms_norm).explain(x, r, g)
    text = "\n".join(ex.notes) if hasattr(ex, "notes") else str(ex)
    assert "row_fusion" in text and "rows_0" in text
    assert "fused_rows" in ex.ir_after


def test_kind_in_row_spaces():
    assert kind_in((4, 8), (4, 8)) == "full"
    assert kind_in((4, 1), (4, 8)) == "row1"
    assert kind_in((4,), (4, 8)) == "row"
    assert kind_in((), (4, 8)) == "scalar"
    assert kind_in((8,), (4, 8)) is None
    assert kind_in((), (8,)) == "row1"  # one row: its 0-d value broadcasts back


def test_check_row_program_names_what_is_wrong(rng):
    x = _rand(rng, (4, 64), F32)
    res = _optimised(l2_normalize, [x])
    (node,) = _fused(res)
    body = node.attrs["body"]
    assert check_row_program(body, (4, 64), [(4, 64)], [F32]) == ""
    assert "inputs" in check_row_program(body, (4, 64), [], [])
    assert "is f32[4,64] but" in check_row_program(body, (4, 64), [(4, 32)], [F32])
    assert "neither a full nor a row value" in check_row_program(body, (4, 8, 8), [(4, 64)],
                                                                 [F32])


# -- random chains -------------------------------------------------------------------------
_PRO = [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: np.exp(x * 0.1),
        lambda x, y: np.maximum(x, y), lambda x, y: np.where(x > 0, x, y), lambda x, y: x]
_RED = ["sum", "mean", "max", "min"]
_EPI = [lambda v, r: v - r, lambda v, r: v / (r + 1), lambda v, r: v * np.tanh(r),
        lambda v, r: np.maximum(v, r)]


def _chain(pro, red, red2, epi, keep, axes=-1):
    """prologue -> reduction over ``axes`` -> epilogue [-> a second reduction]."""
    def fn(x, y):
        v = _PRO[pro](x, y)
        r = getattr(v, _RED[red])(axis=axes, keepdims=True)
        w = _EPI[epi](v, r)
        if red2 is None:
            return w
        return getattr(w, _RED[red2])(axis=axes, keepdims=keep)
    return fn


@settings(max_examples=150, deadline=None)
@given(pro=st.integers(0, len(_PRO) - 1), red=st.integers(0, 3),
       red2=st.one_of(st.none(), st.integers(0, 3)), epi=st.integers(0, len(_EPI) - 1),
       keep=st.booleans(), cols=st.sampled_from([3, 33, 64, 255]),
       dtype=st.sampled_from([F16, F32, F64]), seed=st.integers(0, 2**31))
def test_random_reduction_chains_fuse_and_keep_the_answer(pro, red, red2, epi, keep, cols,
                                                         dtype, seed):
    r = np.random.default_rng(seed)
    x, y = _rand(r, (5, cols), dtype), _rand(r, (5, cols), dtype)
    fn = _chain(pro, red, red2, epi, keep)
    res = _optimised(fn, [x, y])
    fused = _fused(res)
    assert len(fused) == 1, res.graph.text()
    assert supports(fused[0], res.graph) == (True, "")
    generate(fused[0], res.graph)  # every program the pass makes is generated
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, [x, y], np)
        want = fn(x, y)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# -- generated source ---------------------------------------------------------------------------
def _source(fn, args):
    res = _optimised(fn, args)
    (node,) = _fused(res)
    return generate(node, res.graph)


def test_sources_are_deterministic_and_name_their_phases(rng):
    args = PROGRAMS["log_softmax"][1](rng, 64, F32)
    a, b = _source(log_softmax, args), _source(log_softmax, args)
    assert a.source == b.source and a.kind == "rows"
    assert a.launch["phases"] == 2 and "2 reduction phase(s)" in a.source
    assert a.launch["vec_kernel"] == a.name + "_vec"


def test_long_rows_are_re_read_each_phase(rng):
    x = _rand(rng, (3, 20000), F32)
    src = _source(l2_normalize, [x])
    assert not src.launch["cached"] and "re-read each phase" in src.source
    assert src.launch["vec"] == 0


def test_float64_programs_accumulate_in_double(rng):
    src = _source(l2_normalize, [_rand(rng, (3, 64), F64)]).source
    kernel = src[src.index('extern "C"'):]
    assert "double a" in kernel and "float a" not in kernel


def test_float16_programs_accumulate_in_float_and_round_like_numpy(rng):
    args = PROGRAMS["rms_norm"][1](rng, 64, F16)
    src = _source(rms_norm, args).source
    kernel = src[src.index('extern "C"'):]
    assert "float a" in kernel and "pyc_round_f16(a" in kernel and "double" not in kernel


@needs_nvcc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype, cols", [(F32, 64), (F16, 1000), (F64, 37), (F32, 20000)])
def test_row_program_sources_compile(tmp_path, rng, name, dtype, cols):
    fn, make = PROGRAMS[name]
    compile_ptx(tmp_path, _source(fn, make(rng, cols, dtype)))


# -- on the GPU ------------------------------------------------------------------------------
def _specials(a, rng):
    """``a`` with NaN, +-Inf and -0.0 at random places of its first row."""
    a = a.copy()
    if a.dtype.kind == "f":
        idx = rng.choice(a.shape[-1], size=min(4, a.shape[-1]), replace=False)
        row = a.reshape(-1, a.shape[-1])[0]
        for i, v in zip(idx, [np.nan, np.inf, -np.inf, -0.0], strict=False):
            row[i] = v
    return a


_TOL = {"float16": (1e-2, 1e-2), "float32": (2e-5, 2e-6), "float64": (1e-11, 1e-12)}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("cols", [37, 1000, 4097, 20000])
def test_fused_rows_match_float64_numpy_on_the_gpu(rng, name, dtype, cols):
    import cupy as cp

    fn, make = PROGRAMS[name]
    args = make(rng, cols, dtype)
    f = pl.compile(fn, backend="cupy")
    dev = [cp.asarray(a) for a in args]
    assert "fused_rows" in f.explain(*dev).ir_after
    got = cp.asnumpy(f(*dev))
    with np.errstate(all="ignore"):
        want = fn(*[a.astype(F64) if a.dtype.kind == "f" else a for a in args])
        same_dtype = fn(*args)
    assert got.dtype == same_dtype.dtype and got.shape == same_dtype.shape
    rtol, atol = _TOL[got.dtype.name]
    np.testing.assert_allclose(got.astype(F64), want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16])
def test_fused_rows_with_nan_inf_and_signed_zero_match_numpy(rng, name, dtype):
    import cupy as cp

    fn, make = PROGRAMS[name]
    args = [_specials(a, rng) if k == 0 else a for k, a in enumerate(make(rng, 257, dtype))]
    f = pl.compile(fn, backend="cupy")
    got = cp.asnumpy(f(*[cp.asarray(a) for a in args]))
    with np.errstate(all="ignore"):
        want = fn(*args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(np.signbit(got[np.isinf(got)]), np.signbit(want[np.isinf(want)]))
    rtol, atol = {"float16": (2e-3, 5e-3), "float32": (1e-5, 3e-6)}[got.dtype.name]
    np.testing.assert_allclose(got[finite].astype(F64), want[finite].astype(F64), rtol=rtol,
                               atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_fused_and_unfused_agree_within_rounding(rng, name):
    import cupy as cp

    fn, make = PROGRAMS[name]
    args = make(rng, 1000, F32)
    unfused = [p for p in DEFAULT_PIPELINE if p != "row_fusion"]
    dev = [cp.asarray(a) for a in args]
    a = cp.asnumpy(pl.compile(fn, backend="cupy")(*dev))
    b = cp.asnumpy(pl.compile(fn, backend="cupy", passes=unfused)(*dev))
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, equal_nan=True)


@pytest.mark.gpu
def test_misaligned_views_take_the_scalar_row_program(rng):
    import cupy as cp

    x = _rand(rng, (8, 257), F32)
    f = pl.compile(l2_normalize, backend="cupy")
    base = cp.asarray(x)
    view = base[:, 1:]  # rows of 256 starting one element in: made contiguous, then aligned
    got = cp.asnumpy(f(view))
    np.testing.assert_allclose(got, l2_normalize(x[:, 1:].astype(F64)), rtol=2e-5, atol=2e-6)
    flat = cp.asarray(_rand(rng, (8 * 256 + 1,), F32))[1:].reshape(8, 256)  # misaligned
    got = cp.asnumpy(f(flat))
    np.testing.assert_allclose(got, l2_normalize(cp.asnumpy(flat).astype(F64)), rtol=2e-5,
                               atol=2e-6)


@pytest.mark.gpu
def test_a_fully_masked_row_is_nan_like_numpy(rng):
    import cupy as cp

    x = _rand(rng, (4, 300), F32)
    mask = _mask(rng, (4, 300))
    mask[2] = False
    f = pl.compile(masked_softmax, backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x), cp.asarray(mask)))
    with np.errstate(all="ignore"):
        want = masked_softmax(x, mask)
    assert np.isnan(got[2]).all() and np.isnan(want[2]).all()
    np.testing.assert_allclose(got[[0, 1, 3]], want[[0, 1, 3]], rtol=1e-5, atol=3e-6)


def test_a_full_sum_takes_its_prologue_into_the_first_stage(rng):
    x = _rand(rng, (1 << 18,), F32)
    res = _optimised(lambda x: (x * x).sum(), [x])
    ops = [n.op for n in res.graph if n.op not in ("input", "constant")]
    assert ops == ["reshape", "fused_rows", "sum"], res.graph.text()
    (node,) = _fused(res)
    assert node.attrs["ops"] == ("multiply", "sum")
    with np.errstate(all="ignore"):
        (got,) = run_graph(res.graph, [x], np)
    np.testing.assert_allclose(got, (x.astype(F64) ** 2).sum(), rtol=1e-5)


@pytest.mark.parametrize("dtype", [F32, F64, F16])
@pytest.mark.parametrize("shape, axis", [((40, 33), 1), ((40, 33), 0), ((4, 5, 6), (0, 2)),
                                         ((5, 7), None), ((3, 1), 1)])
@pytest.mark.parametrize("ddof", [1, 2])
@pytest.mark.parametrize("op", ["var", "std"])
@pytest.mark.filterwarnings("ignore:Degrees of freedom")  # NumPy's, where ddof >= count
def test_a_variance_with_ddof_is_a_row_program(rng, dtype, shape, axis, ddof, op):
    """np.var/np.std with ddof= over any axes: one row program (the sum of squares over
    max(count - ddof, 0): infinities or NaN where the count runs out, as NumPy gives),
    with NaN in the data, float16 with NumPy's roundings; one over rows of a single
    value keeps its own reduction."""
    x = _rand(rng, shape, dtype)
    x.reshape(-1)[0] = np.nan

    def program(a):
        return getattr(a, op)(axis=axis, ddof=ddof)

    result = _optimised(program, [x])
    graph = result.graph
    if shape != (3, 1):
        assert [n.op for n in graph if n.op not in ("input", "constant")] == ["fused_rows"]
        (node,) = _fused(result)
        assert supports(node, graph) == (True, "")
    else:
        assert "var" in [n.op for n in graph]
    with np.errstate(all="ignore"):
        got, want = pl.compile(program)(x), program(x)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_allclose(got, want, rtol=3e-3 if dtype == F16 else 1e-5,
                               equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "axis"), [((300, 4000), 0), ((64, 32, 28, 28), (0, 2, 3)),
                                             ((16, 96, 300), 1)])
def test_on_the_gpu_a_float16_np_var_program_is_one_kernel_with_numpys_answer(shape, axis):
    cp = pytest.importorskip("cupy")

    def fn(x):
        return (x - x.mean(axis=axis, keepdims=True)) / np.sqrt(
            x.var(axis=axis, keepdims=True) + 1e-5)

    x = _rand(np.random.default_rng(), shape, F16)
    f = pl.compile(fn, backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x)))
    with np.errstate(all="ignore"):
        want = pl.compile(fn, backend="numpy")(x)
    assert got.dtype == want.dtype == F16
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=4e-3,
                               atol=4e-3)
    assert len(f.explain(cp.asarray(x)).kernels) == 1
