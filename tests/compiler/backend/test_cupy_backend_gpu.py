"""The CuPy backend on a GPU: generated kernels, cuBLAS epilogues and memory plans
against NumPy references (float64 where that is the meaningful reference).

Every test is marked ``gpu`` (skipped, with the reason, where no CUDA device is usable).
Inputs are fresh random values on every run (never zeros); output memory is poisoned with
NaN (0xFF bytes) before calls wherever the test controls allocation (see
:mod:`tests.compiler.backend.support`), so a kernel that skips an element cannot pass by
accident. CUDA-graph replays are tested in ``test_graphs_gpu.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyc_lab.compiler import Graph
from pyc_lab.compiler.backend.executable import CupyExecutable
from pyc_lab.compiler.codegen import cache, generate
from pyc_lab.compiler.ops import evaluate
from pyc_lab.compiler.tracer import trace
from tests.compiler.backend.support import (
    BOOL,
    F16,
    F32,
    F64,
    I32,
    I64,
    TIGHT,
    TOL,
    assert_close,
    auto_impl,
    block_graph,
    block_inputs,
    check_block,
    cp,
    f64,
    mix,
    numpy_ref,
    poison_buffers,
    poison_pool,
    rand,
    run,
)
from tests.compiler.graphs import fused_graph, op_graph

pytestmark = pytest.mark.gpu


# -- fused elementwise ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("shape", [(1000,), (1003,), (37, 129), (2, 3, 5, 7), (3 * 4096 + 5,),
                                   ()])
def test_fused_same_shape_against_float64(rng, dtype, shape):
    g, node = fused_graph(mix, [(shape, dtype), (shape, dtype)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    x, y = rand(rng, shape, dtype), rand(rng, shape, dtype)
    (got,) = run(exe, [x, y])
    with np.errstate(all="ignore"):
        assert_close(got, mix(*f64([x, y])), dtype)
        assert_close(got, mix(x, y), dtype, TIGHT)
    n = math.prod(shape)
    vec = 16 // np.dtype(dtype).itemsize
    assert exe.launched[node.id] == ("fused_0_vec" if n >= vec else "fused_0")


@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_arithmetic_rounds_every_op_as_numpy_does_bit_for_bit(rng, dtype):
    """No fused multiply-add (``-fmad=false``) and no flushed subnormals (``-ftz=false``):
    ``a * b + c`` is NumPy's two roundings and ``a * b - a * b`` is exactly 0; operands
    near the smallest normal float32 keep their subnormal products."""
    shape = (4099,)
    ins = [rand(rng, shape, dtype, low=0.01, high=7.0) for _ in range(3)]
    programs = (lambda a, b, c: a * b + c,
                lambda a, b, c: a * b - a * b,  # two multiplies: a contraction would show
                lambda a, b, c: (a * 1e-37) * b + c * 1e-38)
    for fn in programs:
        g, node = fused_graph(fn, [(shape, dtype)] * 3)
        exe = CupyExecutable(g, {node.id: "fused_kernel"})
        (got,) = run(exe, ins)
        with np.errstate(all="ignore"):
            want = fn(*ins)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    if dtype == F32:  # the subnormal results were there to be kept
        assert ((got != 0) & (np.abs(got) < np.finfo(F32).tiny)).any()


BROADCAST = [
    ("row_bias", lambda x, b: np.maximum(x + b, 0.0), [(64, 1000), (1000,)]),
    ("row_bias_odd", lambda x, b: x * b - 1.0, [(9, 13), (13,)]),
    ("column", lambda x, c: x - c, [(33, 17), (33, 1)]),
    ("outer", lambda x, y: x * y, [(4, 1, 32), (1, 17, 32)]),
    ("scalar", lambda x, s: x / s + s, [(1001,), ()]),
    ("leading", lambda x, y: x + y, [(6, 5, 4), (5, 4)]),
    ("three", lambda x, b, s: x * b + s, [(64, 1000), (1000,), (64, 1)]),
    ("keepdims_like", lambda x, m: np.exp(x - m), [(16, 40), (16, 1)]),
]


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("case", BROADCAST, ids=[c[0] for c in BROADCAST])
def test_fused_broadcasting(rng, case, dtype):
    _, fn, shapes = case
    g, node = fused_graph(fn, [(s, dtype) for s in shapes])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    arrays = [rand(rng, s, dtype) for s in shapes]
    (got,) = run(exe, arrays)
    with np.errstate(all="ignore"):
        assert_close(got, fn(*f64(arrays)), node.dtype)
        assert_close(got, fn(*arrays), node.dtype, TIGHT)


@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_misaligned_views_take_the_scalar_kernel(rng, dtype):
    n = 4099
    g, node = fused_graph(mix, [((n,), dtype), ((n,), dtype)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    base = cp.asarray(rand(rng, (n + 1,), dtype))
    y = cp.asarray(rand(rng, (n,), dtype))
    x = base[1:]  # contiguous, one element past a 16-byte boundary
    assert x.flags.c_contiguous and x.data.ptr % 16 != 0
    poison_pool()
    (got,) = exe([x, y])
    assert exe.launched[node.id] == "fused_0"
    want = mix(*f64([cp.asnumpy(x), cp.asnumpy(y)]))
    assert_close(cp.asnumpy(got), want, dtype)
    # the same executable with aligned arrays takes the vectorised kernel
    x2 = x.copy()  # a fresh, aligned allocation
    (got2,) = exe([x2, y])
    assert exe.launched[node.id] == "fused_0_vec"
    np.testing.assert_array_equal(cp.asnumpy(got2), cp.asnumpy(got))


def test_non_contiguous_inputs_are_made_contiguous(rng):
    g, node = fused_graph(lambda x, y: x * y + 1.0, [((32, 50), F32), ((32, 50), F32)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    big = cp.asarray(rand(rng, (32, 100), F32))
    x = big[:, ::2]
    yt = cp.asarray(rand(rng, (50, 32), F32)).T
    (got,) = exe([x, yt])
    want = cp.asnumpy(x).astype(F64) * cp.asnumpy(yt) + 1.0
    assert_close(cp.asnumpy(got), want, F32)


def test_large_arrays_use_64_bit_indices(rng):
    n = 2**31 + 5
    g, node = fused_graph(lambda x: x * 2.0 + 1.0, [((n,), F16)])
    src = generate(node, g)
    assert "unsigned long long" in src.source
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    x = cp.empty(n, dtype=cp.float16)
    x[:] = 0.5
    x[-7:] = cp.asarray(np.arange(1, 8, dtype=F16))
    (got,) = exe([x])
    assert exe.launched[node.id] == "fused_0_vec"
    tail = cp.asnumpy(got[-7:])
    np.testing.assert_array_equal(tail, np.arange(1, 8, dtype=F16) * 2 + 1)
    assert float(got[0]) == 2.0 and float(got[n // 2]) == 2.0
    assert int(cp.count_nonzero(got != 2.0)) == 7
    del x, got


def test_zero_size_output_launches_nothing():
    g, node = fused_graph(lambda x: x + 1.0, [((0, 5), F32)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    (got,) = exe([cp.empty((0, 5), cp.float32)])
    assert got.shape == (0, 5) and exe.launched[node.id] is None


# -- single ops: values, NaN/Inf, integers, bools --------------------------------------------
UNARY = ["exp", "log", "tanh", "sqrt", "rsqrt", "abs", "negative", "relu", "gelu", "sigmoid",
         "silu"]


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("op", UNARY)
def test_unary_ops(rng, op, dtype):
    positive = op in ("log", "sqrt", "rsqrt")
    g, node = op_graph(op, [((2053,), dtype)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    x = rand(rng, (2053,), dtype, signed=not positive)
    (got,) = run(exe, [x])
    if dtype != F16:  # NumPy rounds float16 gelu/silu/sigmoid to float16 at every step
        (same,) = numpy_ref(g, [x])
        assert_close(got, same, node.dtype, TIGHT)
    with np.errstate(all="ignore"):
        want = evaluate(op, np, [x.astype(F64)], {})
    assert_close(got, want, node.dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_exp_of_16_bit_results_is_within_one_ulp_of_numpy(rng, dtype):
    # codegen's exp_function: a 16-bit result takes __expf (2 + 1.173|x| float32 ulps):
    # the rounded result is NumPy's or one ulp from it wherever exp(x) is a normal
    # float32; below 2**-126 it is zero (CUDA's accurate expf flushes there too), which
    # only bfloat16's subnormals can tell apart
    dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if dtype == "bfloat16" \
        else np.dtype(F16)
    lo, hi = (-18.0, 11.0) if dt == F16 else (-100.0, 88.0)  # zero .. overflow, and past
    x = rng.uniform(lo - 4, hi, 100_003).astype(dt)
    x[:6] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]).astype(dt)
    g, node = op_graph("exp", [((x.size,), dt)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    (got,) = run(exe, [x])
    assert got.dtype == dt
    want = np.exp(x.astype(F64)).astype(dt)  # the correctly rounded answer
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tiny = np.abs(want.astype(F64)) < 2.0**-126
    assert np.all(np.abs(got[tiny].astype(F64)) < 2.0**-126)
    ok = ~np.isnan(want) & ~tiny
    gap = np.abs(got[ok].view(np.int16).astype(np.int64) - want[ok].view(np.int16).astype(np.int64))
    assert gap.max() <= 1  # positive results: adjacent bit patterns are adjacent values
    assert (gap == 0).mean() > 0.99


def test_bfloat16_rounding_on_the_gpu_is_ml_dtypes_bit_for_bit(rng):
    # native/bf16.cuh: sm_80+ rounds with cvt.rn.bf16.f32 (a NaN through the bit path):
    # float32 bit patterns of every kind (ties, overflow, subnormals, NaN of both signs)
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    bits = rng.integers(0, 2**32, 200_003, dtype=np.uint64).astype(np.uint32)
    bits[:8] = [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7FC00001, 0xFFC00001,
                0x80000000, 0x00000001]  # ties to even both ways, overflow, NaNs, -0, tiny
    x = bits.view(F32)
    g, node = op_graph("astype", [((x.size,), F32)], {"dtype": bf16})
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    (got,) = run(exe, [x])
    with np.errstate(all="ignore"):
        want = x.astype(bf16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "var"])
def test_bfloat16_row_reductions_on_the_gpu(rng, op):
    # generated bfloat16 row kernels: float32 inside, one rounding (the reference's rule)
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = (rng.uniform(0.5, 2.0, (300, 4097))).astype(np.float32).astype(bf16)
    g, node = op_graph(op, [(x.shape, bf16)], {"axis": (1,), "keepdims": False})
    exe = CupyExecutable(g, {node.id: "reduction_kernel"})
    (got,) = run(exe, [x])
    assert got.dtype == bf16
    want = getattr(np, op)(x.astype(F64), axis=1)
    np.testing.assert_allclose(got.astype(F64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_bfloat16_column_reductions_on_the_gpu(rng, op):
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = (rng.uniform(0.5, 2.0, (4099, 200))).astype(np.float32).astype(bf16)
    g, node = op_graph(op, [(x.shape, bf16)], {"axis": (0,), "keepdims": False})
    exe = CupyExecutable(g, {node.id: "reduction_kernel"})
    (got,) = run(exe, [x])
    assert got.dtype == bf16
    want = getattr(np, op)(x.astype(F64), axis=0)
    np.testing.assert_allclose(got.astype(F64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("shape, axis", [((16384, 4096), (0,)), ((6, 3001, 515), (1,)),
                                         ((1 << 20, 64), (0,))])
def test_split_column_reductions_combine_in_one_launch_or_two(rng, op, shape, axis):
    """Tall columns split across the GPU: up to 64 chunks the last chunk of each tile adds
    the partial results (one launch), more go to the _combine kernel; float64's answer,
    and the same bits at every call and replay (the arrival counters reset themselves)."""
    from pyc_lab.compiler.backend.launch import INLINE_COMBINE_PARTS

    x = rand(rng, shape, F32, high=2.0)
    x.reshape(-1)[[7, 5000]] = [np.nan, -0.0] if op in ("max", "min") else [1.5, -0.0]
    g, node = op_graph(op, [(shape, F32)], {"axis": axis, "keepdims": False})
    exe = CupyExecutable(g, {node.id: "reduction_kernel"}, cuda_graph=True)
    (first,) = run(exe, [x])
    want = getattr(np, op)(x.astype(F64), axis=axis)
    if op in ("max", "min"):
        np.testing.assert_array_equal(first.astype(F64), want)
    else:  # float32 additions: within a few float32 ulps of the column's sum of |x|
        scale = np.abs(x.astype(F64)).sum(axis=axis) / (x.size // want.size if op == "mean"
                                                         else 1)
        assert (np.abs(first.astype(F64) - want) <= 1e-5 * np.abs(want) + 1e-7 * scale).all()
    (step,) = exe._steps
    parts = max(step.columns.splits.values())
    assert parts > 1
    assert (step.columns.arrivals is not None) == (parts <= INLINE_COMBINE_PARTS)
    dx = cp.asarray(x)
    for _ in range(4):  # capture, replays
        poison_pool()
        (again,) = exe([dx])
        np.testing.assert_array_equal(cp.asnumpy(again), first)
    if step.columns.arrivals is not None:
        assert not cp.asnumpy(step.columns.arrivals).any()


def test_bfloat16_row_program_on_the_gpu(rng):
    import pyc_lab as pl

    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = rng.standard_normal((512, 1024)).astype(np.float32).astype(bf16)
    f = pl.compile(lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True)), backend="cupy")
    got = cp.asnumpy(f(cp.asarray(x)))
    want = x.astype(F64) / np.sqrt((x.astype(F64) ** 2).sum(-1, keepdims=True))
    assert got.dtype == bf16
    np.testing.assert_allclose(got.astype(F64), want, rtol=2e-2, atol=2e-2)
    impls = [k["impl"] for k in f.explain(cp.asarray(x)).kernels]
    assert impls == ["reduction_kernel"]  # one generated row-program kernel


BINARY = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "less",
          "less_equal", "greater", "greater_equal", "equal", "not_equal"]


@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("op", BINARY)
def test_binary_ops(rng, op, dtype):
    g, node = op_graph(op, [((300, 7), dtype), ((7,), dtype)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    a = rand(rng, (300, 7), dtype, signed=op != "power")
    b = rand(rng, (7,), dtype, signed=op != "power")
    if op in ("equal", "not_equal", "less_equal", "greater_equal"):
        a[::3] = b  # some ties
    (got,) = run(exe, [a, b])
    (same,) = numpy_ref(g, [a, b])
    assert_close(got, same, node.dtype, TIGHT)


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_maximum_minimum_propagate_nan_like_numpy(rng, op, dtype):
    specials = np.array([np.nan, np.inf, -np.inf, 1.0, -2.0, np.nan, 0.5, np.inf], dtype)
    a = np.repeat(specials, 8)
    b = np.tile(specials, 8)
    a = np.concatenate([a, rand(rng, (37,), dtype)])
    b = np.concatenate([b, rand(rng, (37,), dtype)])
    g, node = op_graph(op, [(a.shape, dtype), (b.shape, dtype)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    (got,) = run(exe, [a, b])
    np.testing.assert_array_equal(got, getattr(np, op)(a, b))


def _maximum_zero(shape, dtype):
    """``maximum(x, 0)`` as one generated kernel: (graph, impl)."""
    g, node = fused_graph(lambda v: np.maximum(v, np.asarray(0, dtype)), [(shape, dtype)])
    return g, {node.id: "fused_kernel"}


@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_relu_and_where_with_nan_and_inf(rng, dtype):
    x = np.concatenate([np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype),
                        rand(rng, (100,), dtype)])
    g, node = op_graph("relu", [(x.shape, dtype)])
    (got,) = run(CupyExecutable(g, {node.id: "fused_kernel"}), [x])
    want = np.maximum(x, np.asarray(0, dtype))
    np.testing.assert_array_equal(got, want)
    # relu(-0.0) is +0.0, as the generated maximum(x, 0) kernel gives (the epilogue
    # fusion turns one into the other); NumPy's own sign there varies by dtype and CPU
    # (its float16 loop keeps -0.0, its SIMD float32 loops give +0.0)
    assert not np.signbit(got[3]) and np.isnan(got[0])
    (mx,) = run(CupyExecutable(*_maximum_zero(x.shape, dtype)), [x])
    np.testing.assert_array_equal(np.signbit(got), np.signbit(mx))
    fn = lambda x, y: np.where(x > y, x, y * 2.0)  # noqa: E731
    y = np.flip(x).copy()
    g, node = fused_graph(fn, [(x.shape, dtype), (x.shape, dtype)])
    (got,) = run(CupyExecutable(g, {node.id: "fused_kernel"}), [x, y])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, fn(x, y))


INTS = [
    ("int_arith", lambda a, b: (a + b) * a - np.abs(b), [((9, 50), I32), ((50,), I32)]),
    ("int_pow", lambda a, b: a ** b, [((200,), I64), ((200,), I64)]),
    ("int_div", lambda a, b: a / b, [((300,), I32), ((300,), I32)]),
    ("int_max", lambda a, b: np.maximum(a, b) - np.minimum(a, -b), [((64,), I64), ((64,), I64)]),
    ("mixed", lambda a, x: a * x + 1, [((40,), I32), ((40,), F32)]),
    ("cmp_where", lambda a, b: np.where(a > b, a, b), [((33, 3), I32), ((33, 3), I32)]),
    ("bool_where", lambda c, x: np.where(c, x, -x), [((100,), BOOL), ((100,), F32)]),
    ("bool_logic", lambda c, d: (c * d) + c, [((77,), BOOL), ((77,), BOOL)]),
    ("to_int", lambda x: (x * 10.0).astype(np.int32), [((129,), F32)]),
    ("to_half", lambda a: a.astype(np.float16) * 3.0, [((129,), I32)]),
    ("f64_to_half", lambda x: x.astype(np.float16), [((513,), F64)]),
    ("to_bool", lambda x: x.astype(np.bool_), [((50,), F32)]),
    ("neg_int", lambda a: -a, [((20,), I64)]),
]


@pytest.mark.parametrize("case", INTS, ids=[c[0] for c in INTS])
def test_integer_bool_and_cast_ops_match_numpy_exactly(rng, case):
    _, fn, specs = case
    g, node = fused_graph(fn, specs)
    arrays = [rand(rng, s, d) for s, d in specs]
    if case[0] == "int_pow":
        arrays = [rng.integers(-5, 6, size=s[0]).astype(d) for s, d in specs]
        arrays[1] = np.abs(arrays[1])  # NumPy refuses negative integer exponents
    if case[0] == "to_bool":
        arrays[0][::4] = 0.0
    if case[0] == "f64_to_half":
        arrays[0] = rng.standard_normal(513) * 1e-3  # exercises double->half rounding
    (got,) = run(CupyExecutable(g, {node.id: "fused_kernel"}), arrays)
    with np.errstate(all="ignore"):
        want = fn(*arrays)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


def test_float16_overflow_rounds_after_every_op_like_numpy(rng):
    fn = lambda x: (x * x) / x  # noqa: E731  # 300*300 overflows float16 to inf
    x = np.array([300.0, 2.0, -500.0, 1e-4], F16)
    g, node = fused_graph(fn, [(x.shape, F16)])
    (got,) = run(CupyExecutable(g, {node.id: "fused_kernel"}), [x])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, fn(x))
    assert np.isinf(got[0])


# -- softmax -------------------------------------------------------------------------------------
def softmax64(x, axis=-1):
    x = x.astype(F64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape, dtype", [
    ((4, 7), F32), ((33, 1000), F32), ((16, 3000), F16), ((16, 3000), F32),
    ((2, 5000), F32), ((3, 20000), F32), ((3, 20000), F16), ((2, 3, 50), F64), ((5, 1), F32),
    ((1000,), F64), ((257, 96), F16), ((6, 8192), F16), ((9, 1000), F32), ((7, 256), F64),
])
def test_softmax(rng, shape, dtype):
    g, node = op_graph("softmax", [(shape, dtype)], {"axis": -1})
    exe = CupyExecutable(g, {node.id: "reduction_kernel"})
    x = rand(rng, shape, dtype, high=8.0)
    (got,) = run(exe, [x])
    src = generate(node, g)  # fresh arrays are aligned: the vectorised entry when there is one
    assert exe.launched[node.id] == (src.launch["vec_kernel"] or src.name)
    assert_close(got, softmax64(x), dtype)
    np.testing.assert_allclose(got.astype(F64).sum(-1), 1.0,
                               rtol=5e-3 if dtype == F16 else 1e-4)


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "sum"])
def test_misaligned_rows_take_the_scalar_row_kernel(rng, op):
    rows, cols = 5, 1024
    specs = [((rows, cols), F16)] + ([((cols,), F16), ((cols,), F16)]
                                     if op == "layer_norm" else [])
    attrs = {"softmax": {"axis": -1}, "layer_norm": {"eps": 1e-5},
             "sum": {"axis": (1,), "keepdims": False}}[op]
    g, node = op_graph(op, specs, attrs)
    src = generate(node, g)
    assert src.launch["vec"] == 8
    exe = CupyExecutable(g, {node.id: "reduction_kernel"})
    base = cp.asarray(rand(rng, (rows * cols + 1,), F16))
    x = base[1:].reshape(rows, cols)  # contiguous, 2 bytes past a 16-byte boundary
    extras = [cp.asarray(rand(rng, s, d)) for s, d in specs[1:]]
    poison_pool()
    (got,) = exe([x, *extras])
    assert exe.launched[node.id] == src.name
    (want,) = numpy_ref(g, [cp.asnumpy(x), *(cp.asnumpy(e) for e in extras)])
    assert_close(cp.asnumpy(got), want, F16)
    (got2,) = exe([x.copy(), *extras])  # aligned: the vectorised kernel, same answer
    assert exe.launched[node.id] == src.launch["vec_kernel"]
    assert_close(cp.asnumpy(got2), want, F16)
    # the two kernels sum in different orders: equal up to float16 rounding (2 ulps),
    # not bit for bit (the H200 lane saw 1-ulp differences on fresh random inputs)
    np.testing.assert_allclose(cp.asnumpy(got2).astype(np.float64),
                               cp.asnumpy(got).astype(np.float64), rtol=2**-9, atol=2**-24)


def test_softmax_of_integers_is_float64(rng):
    g, node = op_graph("softmax", [((5, 7), I32)], {"axis": -1})
    x = rand(rng, (5, 7), I32)
    (got,) = run(CupyExecutable(g, {node.id: "reduction_kernel"}), [x])
    assert_close(got, softmax64(x), F64)


@pytest.mark.parametrize("cols", [50, 3000, 20000])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_softmax_nan_and_inf_rows_match_numpy(rng, cols, dtype):
    x = rand(rng, (5, cols), dtype)
    x[0, 3] = np.nan  # NaN anywhere: the row is NaN
    x[1, cols - 1] = np.inf  # +inf: NaN where inf - inf, 0 elsewhere... as NumPy
    x[2, :] = -np.inf  # all -inf: NaN
    x[3, 7] = -np.inf  # one -inf: exp gives 0 there
    g, node = op_graph("softmax", [(x.shape, dtype)], {"axis": -1})
    (got,) = run(CupyExecutable(g, {node.id: "reduction_kernel"}), [x])
    with np.errstate(all="ignore"):
        (want,) = numpy_ref(g, [x])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want, dtype, TOL)
    assert got[3, 7] == 0


def test_softmax_over_axis_0_falls_back_to_cupy(rng):
    g, node = op_graph("softmax", [((40, 30), F32)], {"axis": 0})
    exe = CupyExecutable(g, {node.id: "reduction_kernel"})
    assert "non-last axis" in exe.kernels[0]["notes"]
    x = rand(rng, (40, 30), F32)
    (got,) = run(exe, [x])
    assert_close(got, softmax64(x, axis=0), F32)


# -- layer norm --------------------------------------------------------------------------------
def layer_norm64(x, gamma=None, beta=None, eps=1e-5):
    x = x.astype(F64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma.astype(F64)
    if beta is not None:
        y = y + beta.astype(F64)
    return y


@pytest.mark.parametrize("shape, dtype, extras", [
    ((64, 768), F32, None),
    ((64, 768), F32, (F32, F32)),
    ((8, 4096), F16, (F16, F16)),
    ((8, 5000), F16, (F32,)),
    ((4, 20000), F32, (F32, F32)),
    ((2, 3, 9), F64, (((), F64), F64)),
    ((300, 64), F64, None),
    ((16, 2048), F16, None),
])
def test_layer_norm(rng, shape, dtype, extras):
    cols = shape[-1]
    specs = [(shape, dtype)]
    arrays = [rand(rng, shape, dtype, high=4.0)]
    for e in extras or ():
        eshape, edtype = ((), e[1]) if isinstance(e, tuple) else ((cols,), e)
        specs.append((eshape, edtype))
        arrays.append(rand(rng, eshape, edtype, low=0.5, high=1.5))
    g, node = op_graph("layer_norm", specs, {"eps": 1e-5})
    exe = CupyExecutable(g, {node.id: "reduction_kernel"})
    (got,) = run(exe, arrays)
    want = layer_norm64(arrays[0], *(arrays[1:] + [None] * (3 - len(arrays))))
    # float16 x: NumPy normalises in float16 before any float32 gamma, so the float16
    # tolerance applies whatever the result dtype
    tol = {name: (2e-2, 2e-2) if dtype == F16 else TOL[name] for name in TOL}
    assert_close(got, want, node.dtype, tol)


# -- reductions -------------------------------------------------------------------------------
RED = [
    ((128, 513), F32), ((10, 70000), F32), ((7, 2048), F16), ((3, 4, 5), F64), ((1000,), F32),
    ((4096, 3), F32), ((2, 9000), F16),
]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "var"])
@pytest.mark.parametrize("shape, dtype", RED)
def test_last_axis_reductions(rng, op, shape, dtype, keepdims):
    axis = (len(shape) - 1,) if len(shape) > 1 or op in ("max", "min") else None
    g, node = op_graph(op, [(shape, dtype)], {"axis": axis, "keepdims": keepdims})
    exe = CupyExecutable(g, {node.id: "reduction_kernel"})
    assert exe.kernels[0]["impl"] == "reduction_kernel"
    x = rand(rng, shape, dtype, signed=op in ("max", "min", "var"))
    (got,) = run(exe, [x])
    want = getattr(np, op)(x.astype(F64), axis=-1, keepdims=keepdims)
    tol = dict(TOL)
    tol["float32"] = (2e-5, 1e-6)
    if op in ("max", "min"):
        np.testing.assert_array_equal(got, getattr(np, op)(x, axis=-1, keepdims=keepdims))
    else:
        assert_close(got, want, node.dtype, tol)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", [I32, I64, BOOL])
def test_integer_and_bool_reductions_are_exact(rng, op, dtype):
    x = rand(rng, (37, 1500), dtype)
    g, node = op_graph(op, [(x.shape, dtype)], {"axis": (1,), "keepdims": False})
    (got,) = run(CupyExecutable(g, {node.id: "reduction_kernel"}), [x])
    want = getattr(np, op)(x, axis=1)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


@pytest.mark.parametrize("op", ["max", "min", "sum", "mean", "var"])
@pytest.mark.parametrize("cols", [20, 5000])
def test_reductions_propagate_nan_and_inf(rng, op, cols):
    x = rand(rng, (4, cols), F32)
    x[0, cols // 2] = np.nan
    x[1, 0] = np.inf
    x[2, -1] = -np.inf
    g, node = op_graph(op, [(x.shape, F32)], {"axis": (1,), "keepdims": False})
    (got,) = run(CupyExecutable(g, {node.id: "reduction_kernel"}), [x])
    with np.errstate(all="ignore"):
        want = getattr(np, op)(x, axis=1)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    if op == "sum":  # its rounding scales with the magnitudes added, not a cancelled sum
        scale = np.abs(x).sum(axis=1)[finite]
        np.testing.assert_array_less(np.abs(got[finite] - want[finite]),
                                     1e-5 * np.abs(want[finite]) + 1e-6 * scale)
    else:
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5)


def test_row_kernels_are_deterministic(rng):
    x = cp.asarray(rand(rng, (64, 30000), F32))
    for op, attrs in [("sum", {"axis": (1,), "keepdims": False}), ("softmax", {"axis": -1}),
                      ("layer_norm", {"eps": 1e-5})]:
        g, node = op_graph(op, [((64, 30000), F32)], attrs)
        exe = CupyExecutable(g, {node.id: "reduction_kernel"})
        (a,) = exe([x])
        (b,) = exe([x])
        assert bool(cp.all(a == b)), op


# -- matmul + epilogue --------------------------------------------------------------------------
@pytest.mark.parametrize("act", [None, "relu", "gelu", "sigmoid", "silu", "tanh"])
@pytest.mark.parametrize("bias", [None, (48,), (1, 48)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_matmul_epilogue(rng, act, bias, dtype):
    specs = [((32, 64), dtype), ((64, 48), dtype)] + ([(bias, dtype)] if bias else [])
    attrs = {"activation": act} if act else {}
    g, node = op_graph("matmul", specs, attrs)
    exe = CupyExecutable(g, {node.id: "cublas"})
    arrays = [rand(rng, s, d, high=1.0) for s, d in specs]
    (got,) = run(exe, arrays)
    with np.errstate(all="ignore"):
        want = evaluate("matmul", np, f64(arrays), attrs)
    tol = {"float32": (1e-4, 1e-5), "float16": (2e-2, 2e-2)}
    assert_close(got, want, node.dtype, tol)
    (step,) = (s for s in exe._steps if s.node.id == node.id)
    if step.small.use:  # the small GEMM won the first call's race: it ran, alone
        assert exe.launched[node.id] == step.small.choice
    elif bias or act:
        assert exe.launched[node.id] in (f"matmul_{node.id}_epilogue",
                                         f"matmul_{node.id}_epilogue_vec")


@pytest.mark.parametrize("ta, tb", [(False, True), (True, False), (True, True)])
def test_matmul_transposes_and_batches(rng, ta, tb):
    a_shape = (3, 40, 24) if ta else (3, 24, 40)
    b_shape = (56, 40) if tb else (40, 56)
    attrs = {"transpose_a": ta, "transpose_b": tb, "activation": "gelu"}
    specs = [(a_shape, F32), (b_shape, F32), ((56,), F32)]
    g, node = op_graph("matmul", specs, attrs)
    arrays = [rand(rng, s, d, high=1.0) for s, d in specs]
    (got,) = run(CupyExecutable(g, {node.id: "cublas"}), arrays)
    want = evaluate("matmul", np, f64(arrays), attrs)
    assert_close(got, want, F32, {"float32": (1e-4, 1e-5)})


@pytest.mark.parametrize("dtype", [F16, F32])
@pytest.mark.parametrize("b_batched", [True, False])
def test_batched_matmul_runs_as_one_strided_batch(rng, dtype, b_batched):
    import pyc_lab as pl

    def scores(q, k):
        return q @ np.swapaxes(k, -1, -2) if k.ndim == 4 else q @ k.T

    q = rand(rng, (2, 3, 33, 24), dtype, high=1.0)
    k = rand(rng, (2, 3, 40, 24) if b_batched else (40, 24), dtype, high=1.0)
    f = pl.compile(scores, backend="cupy")
    dq, dk = cp.asarray(q), cp.asarray(k)
    got = cp.asnumpy(f(dq, dk))
    want = scores(q.astype(F64), k.astype(F64))
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, want, dtype, {"float16": (2e-3, 2e-3), "float32": (1e-4, 1e-5)})
    (kernel,) = [k_ for k_ in f.explain(dq, dk).kernels if "matmul" in k_["ops"]]
    assert "pl.matmul" in kernel["implementation"]
    for _ in range(3):  # warm-up, capture, replays: the same answer each time
        assert np.array_equal(cp.asnumpy(f(dq, dk)), got)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_compiled_2d_gemms_take_pl_matmuls_library_path(rng, monkeypatch, dtype, cuda_graph):
    """A SwiGLU MLP's three plain GEMMs (weights stored K x N and N x K) run through
    pl.matmul — bfloat16 through cuBLASLt — with the answer float64's within the dtype
    through warm-up, capture and replays (the generated small GEMM kept out of the race)."""
    import ml_dtypes

    import pyc_lab as pl
    from pyc_lab.compiler.backend import small_gemm
    from pyc_lab.kernels import matmul as matmul_module

    monkeypatch.setattr(small_gemm, "ENABLED", False)
    real, ran = matmul_module.matmul, []

    def spy(a, b, **kwargs):
        y = real(a, b, **kwargs)
        ran.append((a.dtype.name, matmul_module.last_choice["impl"]))
        return y

    monkeypatch.setattr(matmul_module, "matmul", spy)

    def swiglu(x, w1, w3, w2t):
        a = x @ w1
        return (a / (1 + np.exp(-a)) * (x @ w3)) @ w2t.T

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    shapes = [(37, 64), (64, 96), (64, 96), (64, 96)]
    host = [rng.uniform(-1.0, 1.0, s).astype(dt) for s in shapes]
    dev = [cp.asarray(h) for h in host]
    f = pl.compile(swiglu, backend="cupy", cuda_graph=cuda_graph)
    want = swiglu(*[h.astype(F64) for h in host])
    # relative to the result's norm: every op rounds to the dtype (bfloat16: 8 bits), and
    # the last GEMM sums 96 such products
    tol = {"float16": 3e-3, "bfloat16": 2e-2, "float32": 1e-5}[dtype]
    for _ in range(4):  # warm-up, capture, replays
        poison_pool()
        got = f(*dev)
        assert got.dtype == dt and got.shape == want.shape
        err = cp.asnumpy(got).astype(F64) - want
        assert np.isfinite(err).all() and np.linalg.norm(err) < tol * np.linalg.norm(want)
    kernels = [k for k in f.explain(*dev).kernels if k["ops"][0] == "matmul"]
    assert len(kernels) == 3 and all(
        k["implementation"].startswith("library GEMM (pl.matmul's path") for k in kernels)
    assert len(ran) >= 3 and {d for d, _ in ran} == {dtype}  # each GEMM went through it
    if dtype == "bfloat16":
        assert {impl for _, impl in ran} == {"cublaslt"}


def test_integer_matmul_with_float_activation_is_not_in_place(rng):
    specs = [((8, 16), I32), ((16, 12), I32), ((12,), F32)]
    attrs = {"activation": "tanh"}
    g, node = op_graph("matmul", specs, attrs)
    assert node.dtype == F64
    exe = CupyExecutable(g, {node.id: "cublas"})
    arrays = [rand(rng, s, d) for s, d in specs]
    arrays = [a if a.dtype.kind == "f" else np.sign(a) * (np.abs(a) % 3) for a in arrays]
    arrays = [a.astype(d) for a, (_, d) in zip(arrays, specs, strict=True)]
    (got,) = run(exe, arrays)
    want = evaluate("matmul", np, arrays, attrs)
    assert_close(got, want, F64)


# -- whole graphs and memory plans ------------------------------------------------------------
@pytest.mark.parametrize("mode", [None, "balanced", "memory_first"])
def test_block_graph_with_memory_plans(rng, mode):
    from pyc_lab.compiler.memory import plan_memory

    g = block_graph()
    plan = plan_memory(g, mode) if mode else None
    exe = CupyExecutable(g, auto_impl(g), plan)
    impls = {k["name"]: k["impl"] for k in exe.kernels}
    assert impls["fused_1"] == "fused_kernel" and impls["fused_3"] == "fused_kernel"
    if mode == "memory_first" and plan.inplace:
        assert any("in place" in k["implementation"] for k in exe.kernels)
    first_in = block_inputs(rng, g)
    poison_buffers(exe)
    first = [cp.asnumpy(o) for o in exe([cp.asarray(a) for a in first_in])]
    check_block(g, first, first_in)
    kept = exe([cp.asarray(a) for a in first_in])
    for _ in range(2):
        arrays = block_inputs(rng, g)
        poison_buffers(exe)
        poison_pool()
        got = exe([cp.asarray(a) for a in arrays])
        check_block(g, [cp.asnumpy(o) for o in got], arrays)
    # outputs of an earlier call are the caller's: later calls did not overwrite them
    for o, ref in zip(kept, first, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(o), ref)


def test_views_of_planned_buffers_are_not_clobbered(rng):
    """transpose(a) is a view in CuPy but its own buffer in the plan: a later kernel may
    reuse a's buffer while the transpose is still read."""
    from pyc_lab.compiler.memory import plan_memory

    m = 48
    g = Graph(name="views")
    x = g.add("input", shape=(m, m), dtype=F32)
    body, _ = trace(lambda v: v + 1.0, [np.zeros((m, m), F32)])
    a = g.add("fused", [x.id], {"body": body, "ops": ("add",), "name": "fa"})
    t = g.add("transpose", [a.id], {"axes": (1, 0)})
    body_b, _ = trace(lambda v: v * 3.0, [np.zeros((m, m), F32)])
    b = g.add("fused", [x.id], {"body": body_b, "ops": ("multiply",), "name": "fb"})
    body_c, _ = trace(lambda u, v: u - v, [np.zeros((m, m), F32)] * 2)
    c = g.add("fused", [t.id, b.id], {"body": body_c, "ops": ("subtract",), "name": "fc"})
    g.outputs = [c.id]
    g.verify()
    for mode in ("balanced", "memory_first"):
        exe = CupyExecutable(g, auto_impl(g), plan_memory(g, mode))
        arr = rand(rng, (m, m), F32)
        poison_buffers(exe)
        (got,) = run(exe, [arr])
        want = (arr.astype(F64) + 1.0).T - arr.astype(F64) * 3.0
        assert_close(got, want, F32)


def test_identity_outputs_are_fresh_copies(rng):
    g = Graph(name="ident")
    x = g.add("input", shape=(10,), dtype=F32)
    c = g.add("constant", (), {"value": np.asarray(2.5, F32)})
    g.outputs = [x.id, c.id]
    exe = CupyExecutable(g, {})
    arg = cp.asarray(rand(rng, (10,), F32))
    out, const = exe([arg])
    assert out.data.ptr != arg.data.ptr
    np.testing.assert_array_equal(cp.asnumpy(out), cp.asnumpy(arg))
    const[...] = 0
    (_, const2) = exe([arg])
    assert float(const2) == 2.5


def test_kernel_cache_hits_for_identical_sources(rng):
    g1, n1 = fused_graph(lambda x: x * 3.0 - 1.0, [((999,), F32)], name="cached_k")
    g2, n2 = fused_graph(lambda x: x * 3.0 - 1.0, [((999,), F32)], name="cached_k")
    before = cache.cache_stats()
    e1 = CupyExecutable(g1, {n1.id: "fused_kernel"})
    e2 = CupyExecutable(g2, {n2.id: "fused_kernel"})
    x = rand(rng, (999,), F32)
    (a,) = run(e1, [x])
    (b,) = run(e2, [x])
    np.testing.assert_array_equal(a, b)
    after = cache.cache_stats()
    assert after["misses"] - before["misses"] <= 1
    assert after["hits"] - before["hits"] >= 2  # the vec and scalar entries of e2, at least
    assert cache.compile_kernel(generate(n1, g1)) is not None


def test_argument_checks(rng):
    g, node = fused_graph(lambda x: x + 1.0, [((8,), F32)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    from pyc_lab.errors import PycLabError

    with pytest.raises(PycLabError, match="built for f32"):
        exe([cp.zeros(9, cp.float32)])
    with pytest.raises(PycLabError, match="takes 1"):
        exe([])


def test_float16_division_on_the_gpu_is_numpy_bit_for_bit(rng):
    # native/f16.cuh's pyc_div_f16 (approximate reciprocal, one Markstein correction)
    # against NumPy's float16 division: every float16 dividend, special and random
    # divisors (tests/compiler/test_f16_division.py runs the argument on the CPU)
    from tests.compiler.test_f16_division import SPECIAL_DIVISORS, _all_dividends, _same

    random_bits = rng.integers(0, 1 << 16, 500, dtype=np.uint32).astype(np.uint16)
    divisors = np.concatenate([SPECIAL_DIVISORS, random_bits.view(np.float16)])
    x = np.tile(_all_dividends(), divisors.size)
    y = np.repeat(divisors, 1 << 16)
    g, node = fused_graph(lambda p, q: p / q, [(x.shape, np.float16), (y.shape, np.float16)])
    exe = CupyExecutable(g, {node.id: "fused_kernel"})
    assert "pyc_div_f16" in exe.kernels[0]["source"]
    (got,) = run(exe, [x, y])
    with np.errstate(all="ignore"):
        want = x / y
    _same(got, want)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("shape, axes", [((32, 256, 14, 14), (2, 3)), ((8, 3, 224, 224), (1, 2, 3)),
                                         ((2, 512, 512), (1, 2))])
def test_reductions_over_the_last_axes_on_the_gpu(rng, dtype, shape, axes):
    import pyc_lab as pl

    x = rand(rng, shape, dtype)
    f = pl.compile(lambda a: a.mean(axis=axes), backend="cupy")
    dx = cp.asarray(x)
    poison_pool()
    got = cp.asnumpy(f(dx))
    assert_close(got, x.astype(F64).mean(axis=axes), dtype)
    (k,) = f.explain(dx).kernels
    assert k["impl"] == "reduction_kernel", k  # rows of the reduced axes' values


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("shape, axis", [((4096, 1000), -1), ((512, 4096), 0),
                                         ((8, 300, 50), 1)])
def test_argmax_is_numpys_index_on_the_gpu(rng, dtype, shape, axis):
    import pyc_lab as pl
    from tests.compiler.test_arg_reductions import _hard

    x = _hard(rng, shape, dtype, axis)
    labels = rng.integers(0, shape[axis], np.delete(np.array(shape), axis % len(shape)))

    def accuracy(x, y):
        return x.argmax(axis=axis), (x.argmin(axis=axis) == y).mean()

    f = pl.compile(accuracy, backend="cupy")
    got = [cp.asnumpy(g) for g in f(cp.asarray(x), cp.asarray(labels))]
    want = accuracy(x, labels)
    np.testing.assert_array_equal(got[0], want[0])
    assert float(got[1]) == float(want[1])
    assert all(k["impl"] != "cupy" or "mean" in k["name"]
               for k in f.explain(cp.asarray(x), cp.asarray(labels)).kernels)
