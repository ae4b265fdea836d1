// Gathers a convolution's patches from a channels-last input into a row-major matrix for
// one GEMM (kernels/conv_gemm.py). Row m is an output pixel (n, p, q), m = (n * P + p) * Q
// + q; its columns are the window's (r, s, c) in that order, then zeros up to the row's
// width (a multiple of 16 bytes, so that cuBLAS takes its aligned kernels; zeros in the
// padded columns of both operands leave every sum unchanged). A window position outside
// the input (the convolution's zero padding) reads zero.
//
// The input is x[n, h, w, c] at element strides (xs_n, xs_h, xs_w, 1): torch's NCHW
// tensor in channels-last memory. Elements move as raw bits (T an unsigned integer of
// the element's size), so NaN payloads, infinities and signed zeros arrive unchanged.
// One thread fills V = 16 / sizeof(T) consecutive columns of one row and writes them
// with one 16-byte store: consecutive threads write consecutive 16 bytes. Grid-stride:
// any grid is correct.

template <typename T>
union pyc_patch_vec {
  uint4 v;
  T e[16 / sizeof(T)];
};

template <typename T>
__global__ void pyc_conv_patches(const T* __restrict__ x, T* __restrict__ out, int n, int h,
                                 int w, int c, int p, int q, int kh, int kw, int sh, int sw,
                                 int ph, int pw, int dh, int dw, long long xs_n,
                                 long long xs_h, long long xs_w, int width) {
  constexpr int V = 16 / sizeof(T);
  // 32-bit index arithmetic (64-bit division costs several times more): the caller
  // keeps rows * chunks and every row's offset below 2^31 (MAX_PATCH_BYTES)
  const unsigned chunks = (unsigned)width / V;
  const unsigned total = (unsigned)n * p * q * chunks;
  const int k = kh * kw * c;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += gridDim.x * blockDim.x) {
    const unsigned m = i / chunks;
    const int col0 = (int)(i - m * chunks) * V;
    const unsigned t = m / q;
    const int qq = (int)(m - t * q);
    const unsigned nn = t / p;
    const int pp = (int)(t - nn * p);
    const int h0 = pp * sh - ph, w0 = qq * sw - pw;
    const T* xn = x + nn * xs_n;
    int rs = col0 / c;
    int cc = col0 - rs * c;
    int r = rs / kw;
    int s = rs - r * kw;
    pyc_patch_vec<T> u;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      T value = T(0);
      if (col0 + j < k) {
        const int hh = h0 + r * dh, ww = w0 + s * dw;
        if (hh >= 0 && hh < h && ww >= 0 && ww < w) value = xn[hh * xs_h + ww * xs_w + cc];
      }
      u.e[j] = value;
      if (++cc == c) {
        cc = 0;
        if (++s == kw) {
          s = 0;
          ++r;
        }
      }
    }
    *reinterpret_cast<uint4*>(out + (long long)m * width + col0) = u.v;
  }
}
