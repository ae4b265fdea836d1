"""The patch-gather kernel of the GEMM-form convolution (native/conv_patches.cuh), run
on the CPU: compiled as C++ with g++ (CUDA's keywords defined away, the block and thread
indices as globals a loop sets, threads run one after another: the kernel has no
barriers), against the same patches made by NumPy's strided view of the padded input.
NaN payloads, infinities and -0.0 must arrive bit for bit; padded positions and columns
must be zeros; every grid must give the same matrix."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from pyc_lab.paths import native_dir

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

_HARNESS = r"""
#include <cstdint>
struct uint4 { unsigned int x, y, z, w; };
struct dim3 { unsigned int x = 1, y = 1, z = 1; };
static dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#include "conv_patches.cuh"
template <typename T>
static void run(const void* x, void* out, const int* g, const long long* strides, int width,
                int blocks, int threads) {
  gridDim.x = blocks; blockDim.x = threads;
  for (unsigned b = 0; b < (unsigned)blocks; ++b)
    for (unsigned t = 0; t < (unsigned)threads; ++t) {
      blockIdx.x = b; threadIdx.x = t;
      pyc_conv_patches<T>((const T*)x, (T*)out, g[0], g[1], g[2], g[3], g[4], g[5], g[6],
                          g[7], g[8], g[9], g[10], g[11], g[12], g[13], strides[0],
                          strides[1], strides[2], width);
    }
}
extern "C" void patches(int element, const void* x, void* out, const int* g,
                        const long long* strides, int width, int blocks, int threads) {
  if (element == 2) run<unsigned short>(x, out, g, strides, width, blocks, threads);
  else run<unsigned int>(x, out, g, strides, width, blocks, threads);
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    folder = tmp_path_factory.mktemp("conv_patches")
    src = folder / "harness.cpp"
    src.write_text(_HARNESS)
    lib = folder / "harness.so"
    subprocess.run(["g++", "-O1", "-std=c++17", "-shared", "-fPIC", f"-I{native_dir()}",
                    str(src), "-o", str(lib)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


def _expected(x_nhwc, kernel, stride, pads, dilation, width):
    n, h, w, c = x_nhwc.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, pads, dilation
    padded = np.zeros((n, h + 2 * ph, w + 2 * pw, c), x_nhwc.dtype)
    padded[:, ph:ph + h, pw:pw + w] = x_nhwc
    p = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    q = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    es = padded.strides
    win = np.lib.stride_tricks.as_strided(
        padded, (n, p, q, kh, kw, c),
        (es[0], sh * es[1], sw * es[2], dh * es[1], dw * es[2], es[3]))
    out = np.zeros((n * p * q, width), x_nhwc.dtype)
    out[:, :kh * kw * c] = win.reshape(n * p * q, -1)
    return out, p, q


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize(("shape", "kernel", "stride", "pads", "dilation"), [
    ((2, 13, 11, 3), (7, 7), (2, 2), (3, 3), (1, 1)),     # a stem: C = 3
    ((1, 9, 10, 5), (3, 2), (1, 2), (1, 0), (2, 1)),
    ((3, 6, 7, 16), (3, 3), (1, 1), (1, 1), (1, 1)),      # rows already 16-byte wide
    ((2, 1, 17, 4), (1, 3), (1, 1), (0, 1), (1, 2)),      # a conv1d as height 1
])
def test_the_gather_kernel_matches_the_strided_view(library, dtype, shape, kernel, stride,
                                                    pads, dilation):
    rng = np.random.default_rng()
    x = rng.standard_normal(shape).astype(dtype)
    x.flat[[0, 5, 7]] = [np.nan, np.inf, -0.0]
    bits = np.uint16 if dtype == np.float16 else np.uint32
    x.view(bits).flat[11] = bits(0x7C01 if dtype == np.float16 else 0x7F800123)  # a NaN payload
    k = kernel[0] * kernel[1] * shape[3]
    per = 16 // np.dtype(dtype).itemsize
    width = -(-k // per) * per
    want, p, q = _expected(x, kernel, stride, pads, dilation, width)
    n, h, w, c = shape
    geometry = (ctypes.c_int * 14)(n, h, w, c, p, q, *kernel, *stride, *pads, *dilation)
    strides = (ctypes.c_longlong * 3)(*(s // x.itemsize for s in x.strides[:3]))
    for blocks, threads in [(1, 32), (3, 64), (1000, 256)]:  # any grid: the same matrix
        out = np.full((n * p * q, width), np.nan, dtype)  # poisoned
        library.patches(x.itemsize, x.ctypes.data_as(ctypes.c_void_p),
                        out.ctypes.data_as(ctypes.c_void_p), geometry, strides, width,
                        blocks, threads)
        np.testing.assert_array_equal(out.view(bits), want.view(bits))
