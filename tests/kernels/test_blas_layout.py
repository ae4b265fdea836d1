"""The column-major description of a row-major GEMM, checked by running it as cuBLAS would.

:func:`blas_model` is a NumPy model of ``cublasGemmStridedBatchedEx``: it reads ``A``,
``B`` and writes ``C`` from flat buffers through (op, leading dimension, batch stride)
exactly as the library does. For operands of every layout cuBLAS can take — row-major,
transposed views, padded rows, column slices, M/N/K of 1, batched, a 2-D ``b``
broadcast over a batch — the description must make the model compute ``a @ b``; for the
rest (no unit stride, negative strides, mismatched extents) it must say why not.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.kernels.blas_layout import OP_N, BlasGemm, describe


def _stored(buf: np.ndarray, off: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major ``rows x cols`` matrix at element ``off`` with leading dim ``ld``."""
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return buf[off + i + j * ld]


def blas_model(g: BlasGemm, a_buf: np.ndarray, a_off: int, b_buf: np.ndarray, b_off: int,
               c_buf: np.ndarray, c_off: int) -> None:
    """``C = op(A) @ op(B)`` per batch, with cuBLAS's A = the ``b`` buffer, B = ``a``."""
    for p in range(g.batch):
        big_a = _stored(b_buf, b_off + p * g.stride_a, g.rows_a, g.cols_a, g.lda)
        big_b = _stored(a_buf, a_off + p * g.stride_b, g.rows_b, g.cols_b, g.ldb)
        op_a = big_a if g.op_a == OP_N else big_a.T
        op_b = big_b if g.op_b == OP_N else big_b.T
        assert op_a.shape == (g.m, g.k) and op_b.shape == (g.k, g.n)
        assert g.lda >= max(1, g.rows_a) and g.ldb >= max(1, g.rows_b)
        c = op_a @ op_b
        i, j = np.meshgrid(np.arange(g.m), np.arange(g.n), indexing="ij")
        c_buf[c_off + p * g.stride_c + i + j * g.ldc] = c


def _elements(x: np.ndarray) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


def _base(x: np.ndarray) -> tuple[np.ndarray, int]:
    """The flat base buffer of a view and the view's first element's offset in it."""
    base = x
    while base.base is not None:
        base = base.base
    flat = base.reshape(-1)
    off = (x.__array_interface__["data"][0] - flat.__array_interface__["data"][0])
    return flat, off // x.itemsize


def run_described(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.full((*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2],
                   b.shape[-1]), np.nan)
    g = describe(a.shape, _elements(a), b.shape, _elements(b), _elements(out))
    assert isinstance(g, BlasGemm), g
    a_buf, a_off = _base(a)
    b_buf, b_off = _base(b)
    c_buf, c_off = _base(out)
    blas_model(g, a_buf, a_off, b_buf, b_off, c_buf, c_off)
    return out


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1, 1, shape)


LAYOUTS = ["row", "transposed", "padded", "column-slice", "transposed-padded"]


def operand(rng: np.random.Generator, rows: int, cols: int, how: str) -> np.ndarray:
    if how == "row":
        return _rand(rng, rows, cols)
    if how == "transposed":
        return _rand(rng, cols, rows).T
    if how == "padded":
        return _rand(rng, rows, cols + 3)[:, :cols]
    if how == "column-slice":
        return _rand(rng, rows, cols + 5)[:, 2:cols + 2]
    return _rand(rng, cols, rows + 4)[:, 1:rows + 1].T


@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("lb", LAYOUTS)
@pytest.mark.parametrize("mnk", [(7, 5, 3), (1, 9, 4), (6, 1, 5), (4, 6, 1), (1, 1, 7)])
def test_two_dimensional_products_of_every_layout(la, lb, mnk):
    m, n, k = mnk
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a = operand(rng, m, k, la)
    b = operand(rng, k, n, lb)
    np.testing.assert_allclose(run_described(a, b), a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("b_batched", [True, False])
@pytest.mark.parametrize("transposed", [False, True])
def test_batched_products_and_a_broadcast_b(b_batched, transposed):
    rng = np.random.default_rng(3)
    a = _rand(rng, 4, 5, 6)
    if transposed:
        a = _rand(rng, 4, 6, 5).swapaxes(-1, -2)
    b = _rand(rng, 4, 6, 3) if b_batched else _rand(rng, 3, 6).T
    got = run_described(a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)
    g = describe(a.shape, _elements(a), b.shape, _elements(b), _elements(got))
    if b_batched or transposed:
        assert g.batch == 4 and (g.stride_a == 0) == (not b_batched)
    else:  # a stack of row-major rows times one b: one product of all 20 rows
        assert (g.batch, g.n, g.m, g.k) == (1, 20, 3, 6)


@pytest.mark.parametrize("how", ["contiguous", "padded-rows", "one-row", "k1",
                                 "gap-between-batches", "out-padded"])
def test_a_stack_over_one_b_is_one_product_where_its_rows_continue(how):
    """``(B, M, K) @ (K, N)`` is the 2-D product of the ``B * M`` rows where a's rows (and
    the output's) are one fixed stride apart across batches too; else a strided batch
    with ``b`` broadcast. Either way the described GEMM computes ``a @ b``."""
    rng = np.random.default_rng(5)
    b = _rand(rng, 6, 4)
    out_pad = 0
    if how == "contiguous":
        a, folded = _rand(rng, 5, 3, 6), True
    elif how == "padded-rows":  # rows 9 apart, batches 27 apart: still one matrix
        a, folded = _rand(rng, 5, 3, 9)[:, :, :6], True
    elif how == "one-row":
        a, folded = _rand(rng, 5, 1, 6), True
    elif how == "k1":
        a, b, folded = _rand(rng, 5, 3, 1), _rand(rng, 1, 4), True
    elif how == "gap-between-batches":  # a batch's rows then a gap: no one row stride
        a, folded = _rand(rng, 5, 4, 6)[:, :3], False
    else:
        a, folded, out_pad = _rand(rng, 5, 3, 6), False, 2
    m = a.shape[1]
    out = np.full((5, m + out_pad, b.shape[1]), np.nan)[:, :m]
    g = describe(a.shape, _elements(a), b.shape, _elements(b), _elements(out))
    assert isinstance(g, BlasGemm)
    assert (g.batch == 1) == folded and g.n == (5 * m if folded else m)
    a_buf, a_off = _base(a)
    b_buf, b_off = _base(b)
    c_buf, c_off = _base(out)
    blas_model(g, a_buf, a_off, b_buf, b_off, c_buf, c_off)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case, why", [
    ("every-other-column", "no unit stride"),
    ("negative", "negative stride"),
    ("mismatch", "inner extents differ"),
    ("2d-a-3d-b", "a 2-D a with a batched b"),
    ("empty", "empty operand"),
])
def test_operands_that_are_not_blas_matrices_say_why(case, why):
    rng = np.random.default_rng(0)
    a, b = _rand(rng, 4, 6), _rand(rng, 6, 3)
    if case == "every-other-column":
        a = _rand(rng, 4, 12)[:, ::2]
    elif case == "negative":
        b = b[::-1]
    elif case == "mismatch":
        b = _rand(rng, 5, 3)
    elif case == "2d-a-3d-b":
        b = _rand(rng, 2, 6, 3)
    elif case == "empty":
        a = np.zeros((0, 6))
    out_strides = (3, 1) if case != "2d-a-3d-b" else (12, 3, 1)
    got = describe(a.shape, _elements(a), b.shape, _elements(b), out_strides)
    assert isinstance(got, str) and why in got, got


def test_an_output_with_padded_rows_is_written_in_place():
    rng = np.random.default_rng(1)
    a, b = _rand(rng, 5, 4), _rand(rng, 4, 3)
    big = np.full((5, 7), np.nan)
    out = big[:, 2:5]
    g = describe(a.shape, _elements(a), b.shape, _elements(b), _elements(out))
    assert g.ldc == 7
    c_buf, c_off = _base(out)
    a_buf, a_off = _base(a)
    b_buf, b_off = _base(b)
    blas_model(g, a_buf, a_off, b_buf, b_off, c_buf, c_off)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    assert np.isnan(big[:, :2]).all() and np.isnan(big[:, 5:]).all()  # nothing else written


def test_float8_scales_on_other_arrays_are_refused_with_what_to_do():
    import pyc_lab as pl

    a, b = np.ones((4, 16)), np.ones((16, 8))
    with pytest.raises(pl.PycLabError, match="two torch float8 tensors"):
        pl.matmul(a, b, scale_a=1.0, scale_b=1.0)


def test_an_evicted_workspace_waits_for_the_device_not_its_possibly_destroyed_stream(
        monkeypatch):
    """More streams than MAX_STREAMS: the oldest workspace is freed after a device-wide
    synchronise; its stream (a capture or side stream destroyed since) is never touched,
    since synchronising a destroyed stream crashes the process."""
    from pyc_lab.kernels import blas_direct as bd

    made, device_syncs, stream_syncs = [], [], []

    class FakeMemory:
        def __init__(self, size):
            self.size, self.ptr = size, 4096 * (len(made) + 1)
            made.append(self)

    import cupy as cp

    monkeypatch.setattr(cp.cuda, "Memory", FakeMemory)
    monkeypatch.setattr(bd, "_capturing", lambda stream: False)
    monkeypatch.setattr(bd, "_synchronise_device", device_syncs.append)
    monkeypatch.setattr(bd, "_synchronise", lambda d, s: stream_syncs.append((d, s)))
    monkeypatch.setattr(bd, "_WORKSPACES", bd.OrderedDict())
    for stream in range(1, bd.MAX_STREAMS + 3):
        _ptr, size = bd.workspace(0, stream)
        assert size >= bd.WORKSPACE_BYTES
    assert device_syncs == [0, 0] and stream_syncs == []
    assert list(bd._WORKSPACES) == [(0, s) for s in range(3, bd.MAX_STREAMS + 3)]
    # growing a stream's own workspace waits for that (live) stream
    bd.workspace(0, 5, need=bd.WORKSPACE_BYTES * 2)
    assert stream_syncs == [(0, 5)]


def test_merged_stride_walks_dimensions_as_one_where_a_single_stride_does():
    from pyc_lab.kernels.blas_layout import merged_stride

    assert merged_stride((4, 3), (3, 1)) == 1          # contiguous
    assert merged_stride((4, 3), (27, 9)) == 9         # padded rows at one stride
    assert merged_stride((4, 1, 3), (99, 7, 9)) is None  # a gap between the fours
    assert merged_stride((1, 5), (0, 6)) == 6          # extents of 1 are skipped
    assert merged_stride((1, 1), (3, 1)) == 0          # nothing to walk
