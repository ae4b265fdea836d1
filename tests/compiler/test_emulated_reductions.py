"""Generated row and column kernels run on the CPU with real threads per block
(``tests/compiler/emulate.py``: barriers, warp shuffles, shared memory), against
float64 NumPy.

Row kernels (softmax, layer norm, last-axis sum/mean/max/var) in warp and block mode,
cached and re-read rows, scalar and vectorised entries; row programs (RMS norm,
log-softmax, a masked softmax, a loss...); column kernels unsplit and split across
blocks with their combine kernel. Outputs are poisoned with NaN first. Launch shapes
follow the launchers (one block per row group; the column split for a GPU of a few
SMs, so that small arrays split too). Skipped, with the reason, without g++.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.codegen.column_reduction import split_count
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import emulate_threads, needs_gxx
from tests.compiler.graphs import op_graph
from tests.compiler.test_row_fusion import PROGRAMS as ROW_PROGRAMS

F16, F32, F64 = np.float16, np.float32, np.float64
I32 = np.int32
_TOL = {"float16": (1e-2, 1e-2), "float32": (2e-5, 2e-6), "float64": (1e-11, 1e-12),
        "bfloat16": (2e-2, 2e-2)}
BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


def _rand(rng, shape, dtype):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-100, 100, shape).astype(dtype)
    return (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _aligned(a, aligned=True):
    buf = np.empty(a.size + 16, dtype=a.dtype)
    start = (-buf.__array_interface__["data"][0] // a.itemsize) % max(1, 16 // a.itemsize)
    view = buf[start + (0 if aligned else 1):][:a.size].reshape(a.shape)
    view[...] = a
    return view


def _rows(src, ins, out, entry):
    launch = src.launch
    grid = -(-launch["rows"] // launch["rows_per_block"])
    emulate_threads(src, entry, [*ins, out], (grid, 1), launch["block"])


def _close(got, want):
    rtol, atol = _TOL[np.dtype(got.dtype).name]
    np.testing.assert_allclose(got.astype(F64), want, rtol=rtol, atol=atol)


@needs_gxx
@pytest.mark.parametrize("op, attrs", [
    ("softmax", {"axis": -1}), ("sum", {"axis": (1,), "keepdims": False}),
    ("mean", {"axis": (1,), "keepdims": True}), ("max", {"axis": (1,), "keepdims": False}),
    ("var", {"axis": (1,), "keepdims": False, "form": "np.var"})])
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("cols", [37, 1024, 4097])
def test_row_kernels(op, attrs, dtype, cols):
    rng = np.random.default_rng(cols)
    x = _rand(rng, (5, cols), dtype)
    g, node = op_graph(op, [(x.shape, dtype)], attrs)
    src = generate(node, g)
    with np.errstate(all="ignore"):
        ref = x.astype(F64)
        want = {"softmax": lambda: np.exp(ref - ref.max(-1, keepdims=True))
                / np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True),
                "sum": lambda: ref.sum(-1), "mean": lambda: ref.mean(-1, keepdims=True),
                "max": lambda: ref.max(-1), "var": lambda: ref.var(-1)}[op]()
    for entry in src.entries:
        out = np.full(node.shape, np.nan, dtype=node.dtype)
        _rows(src, [_aligned(x)], out, entry)
        _close(out, want)


@needs_gxx
@pytest.mark.parametrize("op, attrs", [
    ("sum", {"axis": (1,), "keepdims": False}), ("mean", {"axis": (1,), "keepdims": True}),
    ("max", {"axis": (1,), "keepdims": False}), ("min", {"axis": (1,), "keepdims": False}),
    ("var", {"axis": (1,), "keepdims": False, "form": "np.var"})])
@pytest.mark.parametrize("cols", [37, 1024, 4097])
def test_bfloat16_row_reductions_accumulate_in_float32(op, attrs, cols):
    # the reference (float32 inside, one rounding), not NumPy's bfloat16 loop, which
    # stops counting at 256: these rows sum to far more than 256 ulps of their values
    rng = np.random.default_rng(cols)
    x = (rng.uniform(0.5, 2.0, (5, cols))).astype(BF16)
    g, node = op_graph(op, [(x.shape, BF16)], attrs)
    src = generate(node, g)
    assert node.dtype == BF16 and "pyc_bf16" in src.source
    want = getattr(np, op)(x.astype(F64), axis=1, keepdims=attrs["keepdims"])
    for entry in src.entries:
        out = np.full(node.shape, np.nan, dtype=BF16)
        _rows(src, [_aligned(x)], out, entry)
        _close(out, want)


def _bf16_l2(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True))


def _bf16_centre(x):
    return x - x.mean(-1, keepdims=True)


def _bf16_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@needs_gxx
@pytest.mark.parametrize("fn", [_bf16_l2, _bf16_centre, _bf16_softmax])
@pytest.mark.parametrize("cols", [64, 1000])
def test_bfloat16_row_programs(fn, cols):
    rng = np.random.default_rng(cols)
    x = _rand(rng, (70, cols), F32).astype(BF16)
    graph, _ = trace(fn, (x,))
    graph = PassManager().run(graph).graph
    (node,) = [n for n in graph if n.op == "fused_rows"]
    src = generate(node, graph)
    with np.errstate(all="ignore"):
        want = fn(x.astype(F64))
    for entry in src.entries:
        out = np.full(node.shape, np.nan, dtype=BF16)
        _rows(src, [_aligned(x)], out, entry)
        _close(out, want)


@needs_gxx
@pytest.mark.parametrize("dtype", [F32, F16])
def test_layer_norm_row_kernel(dtype):
    rng = np.random.default_rng(1)
    x, gamma, beta = _rand(rng, (6, 300), dtype), _rand(rng, (300,), dtype), \
        _rand(rng, (300,), dtype)
    g, node = op_graph("layer_norm", [(x.shape, dtype), (gamma.shape, dtype),
                                      (beta.shape, dtype)], {"axis": -1, "eps": 1e-5})
    src = generate(node, g)
    ref = x.astype(F64)
    mu = ref.mean(-1, keepdims=True)
    want = (ref - mu) / np.sqrt(((ref - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * gamma \
        + beta
    for entry in src.entries:
        out = np.full(x.shape, np.nan, dtype=dtype)
        _rows(src, [_aligned(a) for a in (x, gamma, beta)], out, entry)
        _close(out, want)


@needs_gxx
@pytest.mark.parametrize("name", sorted(ROW_PROGRAMS))
@pytest.mark.parametrize("dtype, cols", [(F32, 1000), (F16, 64), (F64, 37), (F32, 4097)])
def test_row_programs(name, dtype, cols):
    rng = np.random.default_rng(cols)
    fn, make = ROW_PROGRAMS[name]
    args = make(rng, cols, dtype)
    graph, _ = trace(fn, tuple(args))
    graph = PassManager().run(graph).graph
    (node,) = [n for n in graph if n.op == "fused_rows"]
    assert [graph.node(i).op for i in node.inputs] == ["input"] * len(node.inputs)
    by_id = dict(zip(graph.inputs, args, strict=True))
    ins = [_aligned(by_id[i]) for i in node.inputs]
    src = generate(node, graph)
    with np.errstate(all="ignore"):
        want = fn(*[a.astype(F64) if a.dtype.kind == "f" else a for a in args])
        shaped = np.asarray(want).reshape(node.shape)
    for entry in src.entries:
        out = np.full(node.shape, np.nan, dtype=node.dtype)
        _rows(src, ins, out, entry)
        rtol, atol = _TOL[np.dtype(node.dtype).name]
        np.testing.assert_allclose(out.astype(F64), shaped, rtol=rtol, atol=atol,
                                   equal_nan=True)


@needs_gxx
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype, shape, axis", [
    (F32, (3000, 40), (0,)), (F16, (5, 700, 24), (1,)), (I32, (3000, 3), (0,)),
    (F64, (2, 30, 50, 7), (1, 2)), (BF16, (3000, 24), (0,))])
def test_column_kernels_split_and_combined(op, dtype, shape, axis):
    rng = np.random.default_rng(len(shape))
    x = _aligned(_rand(rng, shape, dtype))
    g, node = op_graph(op, [(shape, dtype)], {"axis": axis, "keepdims": False})
    src = generate(node, g)
    launch = src.launch
    entries = [(src.name, launch["config"], False)]
    if launch["vec_kernel"]:
        entries.append((launch["vec_kernel"], launch["vec_config"], True))
    with np.errstate(all="ignore"):
        want = getattr(np, op)(x.astype(F64) if x.dtype.kind == "f" or x.dtype == BF16
                               else x, axis=axis)
    for entry, cfg, vectorised in entries:
        parts = split_count(launch, 2, vectorised)  # a GPU of 2 SMs: small arrays split
        assert parts > 1 or vectorised  # the scalar entry splits here
        n = launch["outer"] * launch["inner"]
        blocks = launch["outer"] * cfg["tiles"]
        chunk = -(-launch["r"] // parts)
        results = []
        # two launches (the _combine kernel), then one (the last chunk of a tile combines)
        for inline in (False, True):
            out = np.full(node.shape, np.nan if node.dtype.kind == "f" or node.dtype == BF16
                          else 7, node.dtype)
            partial = np.full(max(parts, 1) * n, np.nan, np.dtype(launch["acc_dtype"])) \
                if np.dtype(launch["acc_dtype"]).kind == "f" \
                else np.zeros(max(parts, 1) * n, np.dtype(launch["acc_dtype"]))
            arrivals = np.zeros(blocks, np.uint32) if inline and parts > 1 else None
            emulate_threads(src, entry, [x, out, partial if parts > 1 else out,
                                         ctypes.c_longlong(chunk), arrivals],
                            (blocks, parts), launch["block"])
            if parts > 1 and not inline:
                emulate_threads(src, launch["combine_kernel"],
                                [partial, out, ctypes.c_int(parts)], (2, 1), launch["block"])
            if arrivals is not None:  # every tile's counter is zero for the next launch
                assert not arrivals.any()
            if node.dtype.kind == "f" or node.dtype == BF16:
                _close(out, want)
            else:
                np.testing.assert_array_equal(out, want)
            results.append(out)
        np.testing.assert_array_equal(results[0], results[1])  # the same order, bit for bit


@needs_gxx
@pytest.mark.parametrize("op, axes, keepdims", [
    ("mean", (2, 3), False), ("sum", (1, 2, 3), True), ("max", (2, 3), True),
    ("min", (3,), False)])
@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_reductions_over_the_last_axes_are_row_kernels(op, axes, keepdims, dtype):
    # a global average pool, x.mean(axis=(2, 3)) of NCHW: rows of H * W values
    rng = np.random.default_rng(len(axes))
    x = _rand(rng, (3, 5, 7, 9), dtype)
    x.reshape(-1)[[4, 50, 300]] = [np.nan, np.inf, -0.0]
    g, node = op_graph(op, [(x.shape, dtype)], {"axis": axes, "keepdims": keepdims})
    assert supports(node, g) == (True, "")
    src = generate(node, g)
    cols = int(np.prod([x.shape[a] for a in axes]))
    assert src.launch["cols"] == cols and src.launch["rows"] == x.size // cols
    with np.errstate(all="ignore"):
        want = getattr(np, op)(x.astype(F64), axis=axes, keepdims=keepdims)
    for entry in src.entries:
        out = np.full(node.shape, np.nan, dtype=node.dtype)
        _rows(src, [_aligned(x)], out, entry)
        assert np.array_equal(np.isnan(out), np.isnan(want))
        _close(out, want)


def test_one_long_row_is_left_to_cupy():
    # one block would leave the GPU idle: a float16 full sum (not split in two stages,
    # its partial sums would round), of a 1-D array or over every axis alike
    for shape, attrs in [((1 << 20,), {"axis": None}), ((2, 512, 512), {"axis": None})]:
        g, node = op_graph("sum", [(shape, F16)], {**attrs, "keepdims": False})
        ok, why = supports(node, g)
        assert not ok and "leave most of the GPU idle" in why
    g, node = op_graph("sum", [((2, 512, 512), F16)], {"axis": (1, 2), "keepdims": False})
    assert supports(node, g) == (True, "")  # two rows: a block each, as before
