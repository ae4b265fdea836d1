"""Generated elementwise kernels run on the CPU (``tests/compiler/emulate.py``) against
the NumPy meaning of their bodies.

Each program's fused kernel is launched thread by thread — its general entry with the
launcher's grid and with one block (so the grid-stride loops wrap), on aligned and on
misaligned arrays, and its vectorised entry on aligned ones — into outputs poisoned
with NaN, and every output is compared with the body's NumPy reference on the same
inputs. The programs are the ones views, concatenations and several outputs were built
for: a rotary embedding, a GLU, transposed, reversed and strided reads, concatenations
of pieces of one and of different shapes, an Adam step, a momentum step, and a mask
returned beside the values it gates. Skipped, with the reason, without g++.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyc_lab.compiler.codegen import generate
from pyc_lab.compiler.ops import evaluate, run_graph
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import emulate, needs_gxx
from tests.compiler.test_codegen import compile_ptx, needs_nvcc
from tests.compiler.test_output_fusion import adam_step, gated, momentum
from tests.compiler.test_view_fusion import PROGRAMS as VIEW_PROGRAMS

F16, F32, F64 = np.float16, np.float32, np.float64
BF16 = np.dtype(ml_dtypes.bfloat16)

PROGRAMS = {
    **VIEW_PROGRAMS,
    "adam_step": (adam_step, lambda r, d, n: [_rand(r, (n,), d) for _ in range(3)]
                  + [np.abs(_rand(r, (n,), d))]),
    "momentum": (momentum, lambda r, d, n: [_rand(r, (n, 3), d) for _ in range(3)]),
    "gated": (gated, lambda r, d, n: [_rand(r, (n, 5), d), _rand(r, (n, 5), d)]),
}

# libm differs from NumPy's by an ulp or so (float16/bfloat16: one ulp of the result)
_TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-13}


def _rand(rng, shape, dtype):
    return (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _kernel(fn, args):
    graph, _ = trace(fn, tuple(args))
    graph = PassManager().run(graph).graph
    (node,) = [n for n in graph if n.op == "fused"]
    by_id = dict(zip(graph.inputs, args, strict=True))
    return node, generate(node, graph), [by_id[i] for i in node.inputs]


def _placed(arrays, aligned):
    """C-contiguous copies, 16-byte aligned or one element off."""
    out = []
    for a in arrays:
        a = np.asarray(a)
        buf = np.empty(a.size + 16, dtype=a.dtype)
        start = (-buf.__array_interface__["data"][0] // a.itemsize) % (16 // a.itemsize or 1)
        start += 0 if aligned else 1
        view = buf[start:start + a.size].reshape(a.shape)
        view[...] = a
        out.append(view)
    return out


def _poisoned(node):
    body = node.attrs["body"]
    outs = []
    for o in body.outputs:
        value = body.node(o)
        fill = np.nan if value.dtype.kind == "f" else 1
        outs.append(np.full(value.shape, fill, dtype=value.dtype))
    return outs


def _check(node, ins, outs):
    with np.errstate(all="ignore"):
        want = run_graph(node.attrs["body"], [np.asarray(a) for a in ins], np)
    for got, w in zip(outs, want, strict=True):
        assert got.dtype == w.dtype and got.shape == w.shape
        if got.dtype.kind == "f" or got.dtype == BF16:
            tol = _TOL[got.dtype.name]
            np.testing.assert_allclose(got.astype(F64), w.astype(F64), rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(got, w)


@needs_gxx
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, F64, BF16])
@pytest.mark.parametrize("n", [5, 131])
def test_general_entry_on_aligned_and_misaligned_arrays(name, dtype, n):
    rng = np.random.default_rng(n)
    fn, make = PROGRAMS[name]
    node, src, ins = _kernel(fn, make(rng, dtype, n))
    for aligned in (True, False):
        for grid in (None, 1):
            placed = _placed(ins, aligned)
            outs = _placed(_poisoned(node), aligned)
            emulate(src, src.name, placed + outs, grid)
            _check(node, placed, outs)


@needs_gxx
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_vector_entry_on_aligned_arrays(name, dtype):
    rng = np.random.default_rng(7)
    fn, make = PROGRAMS[name]
    node, src, ins = _kernel(fn, make(rng, dtype, 64))
    if not src.launch["vec_kernel"]:  # a strided or odd-width read: one entry only
        assert src.entries == (src.name,) and "scalar only" in src.notes
        assert f"{src.name}_vec" not in src.source
        return
    for grid in (None, 1):
        placed = _placed(ins, True)
        outs = _placed(_poisoned(node), True)
        emulate(src, src.launch["vec_kernel"], placed + outs, grid)
        _check(node, placed, outs)


@needs_gxx
def test_the_emulator_catches_a_wrong_offset():
    """The check is not vacuous: the same kernel with a piece's offset moved fails it."""
    rng = np.random.default_rng(3)
    fn, make = PROGRAMS["rotary"]
    node, src, ins = _kernel(fn, make(rng, F32, 4))
    broken = dataclasses.replace(src, source=src.source.replace("in0[40u + ", "in0[39u + "))
    assert broken.source != src.source
    placed, outs = _placed(ins, True), _placed(_poisoned(node), True)
    emulate(broken, broken.name, placed + outs)
    with pytest.raises(AssertionError):
        _check(node, placed, outs)


@needs_gxx
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 7), st.integers(1, 9), st.integers(-2, 2).filter(bool),
       st.integers(0, 3), st.booleans(), st.booleans(), st.sampled_from([F32, F16]))
def test_random_views_concatenations_and_outputs(rows, cols, step, start, flip, extra,
                                                 dtype):
    rng = np.random.default_rng(rows * 17 + cols)
    x = _rand(rng, (rows, cols + start), dtype)

    def fn(a):
        v = a[:, start:][::step]
        v = v.T if flip else v
        t = np.tanh(v) * 2
        joined = np.concatenate([t + 1, np.abs(v) - t], axis=0)
        return (joined, t) if extra else joined

    graph, _ = trace(fn, (x,))
    graph = PassManager().run(graph).graph
    values = {graph.inputs[0]: x}  # every value of the graph, by its NumPy reference
    for n in graph:
        if n.op != "input":
            values[n.id] = np.asarray(evaluate(n.op, np, [values[i] for i in n.inputs],
                                               n.attrs), dtype=n.dtype)
    for node in [n for n in graph if n.op == "fused"]:
        src = generate(node, graph)
        ins = [values[i] for i in node.inputs]
        for aligned in (True, False):
            placed = _placed(ins, aligned)
            outs = _placed(_poisoned(node), aligned)
            entry = src.launch["vec_kernel"] if aligned and src.launch["vec_kernel"] \
                else src.name
            emulate(src, entry, placed + outs)
            _check(node, placed, outs)


@needs_gxx
def test_bfloat16_conversions_round_as_ml_dtypes_bit_for_bit():
    """Casts into bfloat16 from float32, float64, int32 and int64 (ties, overflow, NaN of
    both signs, -0.0, subnormals) give ml_dtypes' bits exactly."""
    special = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, -3.4e38, np.inf,
                        -np.inf, np.nan, -np.nan, -0.0, 0.0, 1e-40, -1e-39, 65504.0,
                        1.0 + 2**-8 + 2**-30, 16842753.0, 0.1, 2.5], dtype=np.float64)
    for src_dtype in (F32, F64, np.int32, np.int64):
        with np.errstate(all="ignore"):
            x = special.astype(src_dtype) if src_dtype in (F32, F64) else \
                np.array([1, -7, 16842753, 2**31 - 1, -(2**31), 255, 257, 65537],
                         dtype=src_dtype)
        _, src, ins = _kernel(lambda a: a.astype(BF16), [x])
        out = np.zeros(x.shape, BF16)
        emulate(src, src.name, [*_placed(ins, True), out])
        with np.errstate(all="ignore"):
            want = x.astype(BF16)
        np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


_DIVMOD_SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 3.0, -7.0, 0.1, -0.3, 1e-30, 7e30, 1e300,
                   np.inf, -np.inf, np.nan]


@needs_gxx
@pytest.mark.parametrize("op", ["floor_divide", "remainder"])
@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, np.int32, np.int64])
def test_floor_division_and_remainder_are_numpys_bit_for_bit(op, dtype):
    """Every pairing of special values (zeros of both signs, infinities, NaN, huge and
    tiny, the integers' extremes and zero divisors) and fresh random ones: the generated
    kernel's bits are NumPy's (NaN for NaN)."""
    rng = np.random.default_rng()
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        special = np.array([0, 1, -1, 2, -2, 3, -7, 7, info.min, info.max, info.min + 1],
                           dtype=dtype)
        fresh = rng.integers(-50, 50, 400).astype(dtype)
    else:
        with np.errstate(all="ignore"):
            special = np.array(_DIVMOD_SPECIAL, dtype=np.float64).astype(dtype)
        fresh = (rng.standard_normal(400) * 10 ** rng.uniform(-3, 3, 400)).astype(dtype)
    a = np.concatenate([np.repeat(special, special.size), fresh])
    b = np.concatenate([np.tile(special, special.size), fresh[::-1]])
    fn = getattr(np, op)
    node, src, ins = _kernel(lambda x, y: fn(x, y), [a, b])
    assert node.attrs["ops"] == (op,)
    out = _placed(_poisoned(node), True)
    emulate(src, src.name, [*_placed(ins, True), *out])
    with np.errstate(all="ignore"):
        want = fn(a, b)
    got = out[0]
    assert got.dtype == want.dtype
    if want.dtype.kind == "i":
        np.testing.assert_array_equal(got, want)
    else:
        nan = np.isnan(want.astype(F64))
        assert np.array_equal(np.isnan(got.astype(F64)), nan)
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
        np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits))


@needs_nvcc
@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, np.int32, np.int64])
def test_floor_division_kernels_compile_for_sm_90(tmp_path, dtype):
    x = np.ones(33, dtype)
    _, src, _ = _kernel(lambda a, b: (a // b) * 2 + a % b, [x, x])
    assert "pyc_floor_divide" in src.source and "pyc_remainder" in src.source
    compile_ptx(tmp_path, src)


@needs_gxx
@pytest.mark.parametrize("op", ["left_shift", "right_shift"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_shifts_are_numpys_past_the_bit_width(op, dtype):
    """Shifts by 0..bits+2, by the width exactly and by negative amounts (NumPy's 0, or
    -1 for a negative value shifted right), of values of both signs and the extremes."""
    info = np.iinfo(dtype)
    bits = info.bits
    values = np.array([0, 1, -1, 5, -5, 123456, -123456, info.max, info.min], dtype=dtype)
    amounts = np.array([*range(bits + 3), -1, -bits, info.max, info.min], dtype=dtype)
    a = np.repeat(values, amounts.size)
    b = np.tile(amounts, values.size)
    fn = getattr(np, op)
    node, src, ins = _kernel(lambda x, y: fn(x, y), [a, b])
    assert node.attrs["ops"] == (op,)
    out = _placed(_poisoned(node), True)
    emulate(src, src.name, [*_placed(ins, True), *out])
    np.testing.assert_array_equal(out[0], fn(a, b))


@needs_nvcc
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_shift_kernels_compile_for_sm_90(tmp_path, dtype):
    x = np.ones(33, dtype)
    _, src, _ = _kernel(lambda a, b: (a << b) + (a >> 3), [x, x])
    assert "pyc_left_shift" in src.source and "pyc_right_shift" in src.source
    compile_ptx(tmp_path, src)


@needs_gxx
@pytest.mark.parametrize("act", [None, "relu", "tanh", "sigmoid", "gelu"])
@pytest.mark.parametrize("aligned", [True, False])
def test_bfloat16_matmul_epilogue_in_place_on_the_emulator(act, aligned):
    """The generated epilogue of a bfloat16 matmul (the epilogue pass folds bfloat16
    bias adds and activations): in place on the product, NumPy's bfloat16 answer — the
    add and the activation each rounded to bfloat16 — within one bfloat16 ulp (the CPU's
    libm and NumPy's may part by a float32 ulp before that rounding)."""
    from pyc_lab.compiler.codegen import generate_epilogue
    from tests.compiler.graphs import op_graph

    rng = np.random.default_rng()
    m, k, n = 37, 24, 40
    g, node = op_graph("matmul", [((m, k), BF16), ((k, n), BF16), ((n,), BF16)],
                       {"activation": act} if act else {})
    src = generate_epilogue(node, g)
    assert src.launch["inplace"]
    product = (rng.standard_normal((m, n)) * 3).astype(BF16)
    product.reshape(-1)[[0, 5, 9]] = [np.nan, np.inf, -0.0]
    bias = (rng.standard_normal(n) + 0.1).astype(BF16)
    placed, placed_bias = _placed([product, bias], aligned)
    entry = src.launch.get("vec_kernel") if aligned and src.launch.get("vec_kernel") \
        else src.name
    emulate(src, entry, [placed, placed_bias, placed])
    with np.errstate(all="ignore"):
        want = evaluate("add", np, [product, bias], {})
        if act:
            want = evaluate(act, np, [want], {})
    got, want = placed.astype(F64), np.asarray(want).astype(F64)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    # tanh-GELU far below zero is 0.5 x (1 + tanh(...)): 1 + tanh cancels in float32, so
    # values under ~1e-6 are float32 noise on both sides
    np.testing.assert_allclose(got[ok], want[ok], rtol=2.0**-7,
                               atol=2e-6 if act == "gelu" else 1e-30)


@needs_gxx
def test_bfloat16_cube_is_multiplied_in_the_kernel_as_numpy_rounds():
    """``x ** 3`` of bfloat16 (a GELU's cube) reaches the kernel as two multiplications
    (cheap_math takes bfloat16): the kernel's bits are the rewritten graph's on NumPy,
    which rounds each product to bfloat16 (the bound against the exact cube is
    test_cheap_math's)."""
    rng = np.random.default_rng()
    x = _rand(rng, (517,), BF16)
    x[[3, 9, 40]] = np.array([np.nan, -np.inf, -0.0], np.float32).astype(BF16)
    node, src, ins = _kernel(lambda v: v ** 3 * np.float32(0.5).astype(BF16) + v, [x])
    assert "pow" not in src.source
    outs = _poisoned(node)
    emulate(src, src.name, [*_placed(ins, True), *outs])
    with np.errstate(all="ignore"):
        (want,) = run_graph(node.attrs["body"], [np.asarray(a) for a in ins], np)
    np.testing.assert_array_equal(outs[0].view(np.uint16), want.view(np.uint16))
