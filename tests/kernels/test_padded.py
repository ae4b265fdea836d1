"""Unaligned GEMMs on aligned, zero-padded copies: the plans and the copy kernels, on the CPU.

A plan (:func:`pyc_lab.kernels.padded.pad_plan`) is run here as the GPU runs it, with
every piece replaced by a model that reads raw memory: the copies write a NaN-poisoned
flat scratch buffer from the operands' own buffers (lines, leading dimensions, element
offsets), each GEMM part is described for cuBLAS (:func:`describe`) and executed by the
NumPy model of ``cublasGemmStridedBatchedEx`` from ``test_blas_layout`` on those flat
buffers, and the product is copied out into a NaN-poisoned ``out``. The result must be
``a @ b`` in float64 for every layout, odd extents (below and above one vector), leading
dimensions that are not multiples of 16 bytes, element sizes 2, 4 and 8, and special
values in the operands. The copy kernels of ``native/pad_copy.cuh`` themselves are
compiled with g++ and checked bit for bit against NumPy slicing.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pyc_lab.kernels.blas_layout import describe
from pyc_lab.kernels.padded import VEC_BYTES, PadPlan, pad_plan
from pyc_lab.paths import native_source
from tests.compiler.emulate import _INTRINSICS, _KEYWORDS, _build, needs_gxx
from tests.kernels.test_blas_layout import blas_model


def _operand(rng: np.random.Generator, rows: int, cols: int, order: str, pad: int,
             dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, int]:
    """A ``rows x cols`` matrix in ``order`` ("row" or "col") inside a flat buffer whose
    lines are ``pad`` elements longer than needed, starting ``pad`` elements in; returns
    the view, the buffer and the view's element offset."""
    lines, length = (rows, cols) if order == "row" else (cols, rows)
    ld = length + pad
    buf = rng.uniform(-1, 1, pad + lines * ld + pad).astype(dtype)
    off = pad
    view = np.lib.stride_tricks.as_strided(
        buf[off:], shape=(rows, cols),
        strides=tuple(s * buf.itemsize for s in ((ld, 1) if order == "row" else (1, ld))))
    return view, buf, off


def _lines(buf: np.ndarray, off: int, lines: int, length: int, ld: int) -> np.ndarray:
    """``lines`` lines of ``length`` elements at element ``off`` of ``buf``, stride ``ld``."""
    i, j = np.meshgrid(np.arange(lines), np.arange(length), indexing="ij")
    return off + i * ld + j


def run_plan(plan: PadPlan, a_buf: np.ndarray, a_off: int, b_buf: np.ndarray, b_off: int,
             out_buf: np.ndarray, out_off: int) -> None:
    """What :class:`~pyc_lab.kernels.padded.PaddedGemm` launches, on flat buffers."""
    size = plan.itemsize
    scratch = np.full(plan.scratch_bytes // size, np.nan, dtype=a_buf.dtype)
    bufs = {"a": (a_buf, a_off), "b": (b_buf, b_off), "out": (out_buf, out_off)}
    for c in plan.copies:
        assert c.at % VEC_BYTES == 0 and (c.dst_length * size) % VEC_BYTES == 0
        src, base = bufs[c.source]
        dst = np.zeros((c.dst_lines, c.dst_length), dtype=a_buf.dtype)
        dst[:c.lines, :c.length] = src[_lines(src, base + c.offset, c.lines, c.length, c.ld)]
        scratch[_lines(scratch, c.at // size, c.dst_lines, c.dst_length, c.dst_length)] = dst

    def where(ref: tuple[str, int]) -> tuple[np.ndarray, int]:
        if ref[0] == "scratch":
            assert ref[1] % size == 0
            return scratch, ref[1] // size
        buf, base = bufs[ref[0]]
        return buf, base + ref[1]

    for part in plan.parts:
        g = describe(part.a_shape, part.a_strides, part.b_shape, part.b_strides,
                     part.out_strides)
        assert not isinstance(g, str), g
        for rows, ld in ((g.rows_a, g.lda), (g.rows_b, g.ldb), (g.m, g.ldc)):
            assert (rows * size) % VEC_BYTES == 0 and (ld * size) % VEC_BYTES == 0, g
        a_b, a_o = where(part.a)
        b_b, b_o = where(part.b)
        o_b, o_o = where(part.out)
        blas_model(g, a_b, a_o, b_b, b_o, o_b, o_o)
    u = plan.unpad
    if u is not None:
        src = scratch[_lines(scratch, u.at // size, u.lines, u.length, u.ld)]
        out_buf[_lines(out_buf, out_off, u.lines, u.length, u.out_ld)] = src


pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

LAYOUTS = [("row", "col"), ("row", "row"), ("col", "row"), ("col", "col")]
SHAPES = [(7, 4099, 64), (33, 50, 77), (5, 3, 40), (16, 24, 13), (1, 11, 24), (9, 64, 32),
          (40, 1, 9), (64, 40, 8)]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: t[0][0] + t[1][0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pad", [0, 3])
def test_a_plan_computes_the_product(dtype, layout, shape, pad):
    rng = np.random.default_rng(hash((shape, layout, pad)) % 2**32)
    m, n, k = shape
    a, a_buf, a_off = _operand(rng, m, k, layout[0], pad, dtype)
    b, b_buf, b_off = _operand(rng, k, n, layout[1], pad, dtype)
    size = np.dtype(dtype).itemsize
    a_buf[a_off] = np.inf if m * k > 1 else a_buf[a_off]  # special values reach the sum
    b_buf[b_off + 1] = -0.0
    out_ld = n + pad
    out_buf = np.full(out_ld * m + pad, np.nan, dtype=dtype)
    el = lambda x: tuple(s // size for s in x.strides)  # noqa: E731
    plan = pad_plan(a.shape, el(a), b.shape, el(b), (out_ld, 1), size)
    v = VEC_BYTES // size
    aligned = (pad == 0 and n % v == 0 and (k % v == 0 if layout[0] == "row" else m % v == 0)
               and (k % v == 0 if layout[1] == "col" else True))
    if aligned and (m == 1 or out_ld % v == 0):
        assert plan is None
        return
    assert plan is not None
    run_plan(plan, a_buf, a_off, b_buf, b_off, out_buf, 0)
    got = np.lib.stride_tricks.as_strided(out_buf, shape=(m, n),
                                          strides=(out_ld * size, size))
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    rest = out_buf.copy()
    rest[_lines(out_buf, 0, m, n, out_ld)] = 0
    assert np.isnan(rest[np.arange(rest.size) % out_ld >= n]).all()  # nothing else written


def test_a_linear_layer_with_an_odd_vocabulary_reads_its_weights_in_place():
    """a @ w.T with N % 8 != 0 and K aligned: the weights are not copied; their last
    N % 8 rows go to a tail of 8 rows (zeros beyond) that a second GEMM multiplies."""
    plan = pad_plan((2048, 4096), (4096, 1), (4096, 32001), (1, 4096), (32001, 1), 2)
    assert plan is not None and (plan.m_pad, plan.n_pad, plan.k_pad) == (2048, 32008, 4096)
    assert [c.source for c in plan.copies] == ["b"]
    tail = plan.copies[0]
    assert (tail.offset, tail.lines, tail.dst_lines) == (32000 * 4096, 1, 8)
    assert [p.b[0] for p in plan.parts] == ["b", "scratch"]
    assert plan.parts[0].b_shape == (4096, 32000) and plan.unpad is not None
    assert plan.scratch_bytes < 2048 * 32008 * 2 + 8 * 4096 * 2 + 1024
    assert "N 32001 not a multiple of 8" in plan.why


def test_an_odd_reduction_extent_pads_both_operands_with_zeros():
    plan = pad_plan((4096, 4095), (4095, 1), (4095, 4096), (1, 4095), (4096, 1), 2)
    assert plan is not None and plan.k_pad == 4096 and plan.unpad is None
    assert sorted(c.source for c in plan.copies) == ["a", "b"]
    assert all(c.dst_length == 4096 and c.length == 4095 for c in plan.copies)


@pytest.mark.parametrize("args", [
    ((64, 64), (64, 1), (64, 64), (1, 64), (64, 1), 2),    # aligned
    ((4097, 4096), (4096, 1), (4096, 4096), (1, 4096), (4096, 1), 2),  # M odd, row-major a
    ((2, 8, 8), (64, 8, 1), (8, 8), (8, 1), (64, 8, 1), 2),  # batched
    ((3, 5), (5, 1), (5, 7), (7, 1), (7, 1), 1),  # no copy kernel for 1-byte elements
    ((3, 5), (5, 1), (6, 7), (7, 1), (7, 1), 2),  # extents differ
    ((3, 5), (10, 2), (5, 7), (7, 1), (7, 1), 2),  # no unit stride
])
def test_nothing_to_pad_or_no_plan(args):
    assert pad_plan(*args) is None


# -- the copy kernels, compiled with g++ ---------------------------------------------------

_DRIVER = r"""
#include <cstring>
#include <cstdint>
struct pyc_dim3 { unsigned int x, y, z; };
static pyc_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct uint4 { unsigned int x, y, z, w; };
""" + _INTRINSICS + _KEYWORDS + "__SOURCE__" + r"""
#define PYC_GRID(call) \
  blockDim = {bx, 1, 1}; gridDim = {gx, gy, 1}; \
  for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x) \
    for (unsigned t = 0; t < bx; ++t) { \
      blockIdx = {x, y, 0}; threadIdx = {t, 0, 0}; call; }
extern "C" void pad_T(const T* src, long long src_ld, int src_lines, int src_len, T* dst,
                      long long dst_ld, int dst_lines, int dst_len, unsigned gx, unsigned gy,
                      unsigned bx) {
  PYC_GRID(pyc_pad_lines<T>(src, src_ld, src_lines, src_len, dst, dst_ld, dst_lines, dst_len))
}
extern "C" void unpad_T(const T* src, long long src_ld, T* dst, long long dst_ld, int lines,
                        int len, unsigned gx, unsigned gy, unsigned bx) {
  PYC_GRID(pyc_unpad_lines<T>(src, src_ld, dst, dst_ld, lines, len))
}
extern "C" void flat_T(const T* src, long long src_ld, T* dst, int lines, int len,
                       unsigned gx, unsigned gy, unsigned bx) {
  PYC_GRID(pyc_unpad_flat<T>(src, src_ld, dst, lines, len))
}
"""

_UNSIGNED = {2: (np.uint16, "unsigned short"), 4: (np.uint32, "unsigned int"),
             8: (np.uint64, "unsigned long long")}


def _kernels(size: int) -> ctypes.CDLL:
    text = _DRIVER.replace("__SOURCE__", native_source("pad_copy.cuh")).replace(
        "T*", _UNSIGNED[size][1] + "*").replace("<T>", f"<{_UNSIGNED[size][1]}>")
    return _build(text, f"pad_copy_{size}", ["-std=c++17"])


def _bits(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """Random raw elements, with NaN, infinity and -0.0 patterns among them."""
    dt = {2: np.float16, 4: np.float32, 8: np.float64}[size]
    x = rng.uniform(-1, 1, n).astype(dt)
    x[::7] = np.nan
    x[1::11] = -np.inf
    x[2::13] = -0.0
    return x.view(_UNSIGNED[size][0])


def _ptr(x: np.ndarray, elements: int = 0) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.__array_interface__["data"][0] + elements * x.itemsize)


def _aligned(n: int, dtype: np.dtype) -> np.ndarray:
    """``n`` elements of ``dtype`` starting 16-byte aligned, poisoned."""
    raw = np.full(n * np.dtype(dtype).itemsize + 16, 0xA5, dtype=np.uint8)
    start = (-raw.__array_interface__["data"][0]) % 16
    return raw[start:start + n * np.dtype(dtype).itemsize].view(dtype)


@needs_gxx
@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize("grid", [(1, 1, 32), (2, 3, 32), (5, 64, 64)])
def test_the_copy_kernels_move_bits_exactly(size, grid):
    lib = _kernels(size)
    rng = np.random.default_rng(size * 100 + grid[1])
    v = 16 // size
    gx, gy, bx = grid
    for lines, length, src_ld, off in ((5, 13, 17, 3), (3, 2 * v, 2 * v + 1, 1),
                                       (9, 1, 1, 0), (4, v + 1, v + 5, 2)):
        src = _bits(rng, off + lines * src_ld + 4, size)
        dst_lines, dst_length = lines + 2, -(-length // v) * v + v
        dst = _aligned(dst_lines * dst_length, src.dtype)
        lib.pad_T(_ptr(src, off), ctypes.c_longlong(src_ld), lines, length, _ptr(dst),
                  ctypes.c_longlong(dst_length), dst_lines, dst_length, gx, gy, bx)
        want = np.zeros((dst_lines, dst_length), dtype=src.dtype)
        want[:lines, :length] = src[_lines(src, off, lines, length, src_ld)]
        np.testing.assert_array_equal(dst.reshape(dst_lines, dst_length), want)
        # back out: into a strided destination, and into a contiguous one
        back = np.full(off + lines * src_ld + 4, 0x5A, dtype=src.dtype)
        lib.unpad_T(_ptr(dst), ctypes.c_longlong(dst_length), _ptr(back, off),
                    ctypes.c_longlong(src_ld), lines, length, gx, gy, bx)
        idx = _lines(back, off, lines, length, src_ld)
        np.testing.assert_array_equal(back[idx], src[idx])
        rest = np.ones(back.size, bool)
        rest[idx.ravel()] = False
        assert (back[rest] == 0x5A).all()
        flat = _aligned(lines * length + v, src.dtype)
        flat[:] = 0x5A
        lib.flat_T(_ptr(dst), ctypes.c_longlong(dst_length), _ptr(flat), lines, length,
                   gx * gy, 1, bx)
        np.testing.assert_array_equal(flat[:lines * length], src[idx].ravel())
        assert (flat[lines * length:] == 0x5A).all()
