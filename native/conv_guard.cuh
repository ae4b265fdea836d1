// The guard around a CUTLASS 2 few- or fixed-channels convolution (kernels/conv_cutlass.py).
// Those iterators fold the filter window into the reduction and round it up to the K
// tile; CUTLASS masks the extra taps' filter values to zero but still reads their pixels,
// so a NaN or an infinity there turns an output NaN whose window does not hold it
// (0 * NaN = NaN). Finite inputs are exact. Two kernels keep every answer exact without
// the host waiting for anything:
//
// pyc_conv_pad_check<KIND> copies the channels-last input x[n, h, w, c] (element strides
//   xs_n, xs_h, xs_w, 1) into out[n, h, w, 0..cp) with zeros past c (out == nullptr: only
//   the check), as raw bits, and sets *flag = 1 if any element is NaN or infinite (an
//   all-ones exponent). The CUTLASS kernel then reads out. cp is at most 16 bytes of
//   elements (what a padded configuration reads: fewer channels than one access).
// pyc_conv_fixup<KIND> runs after the CUTLASS kernel: it returns at once when *flag is 0
//   (the common case: one tiny launch), else recomputes every output directly, in
//   float32 from the same operands — x as the CUTLASS kernel read it (n, h, w, c
//   contiguous), the filter wt[k, r, s, c] — plus the bias and the activation (NaN kept,
//   as torch's), so a non-finite input gets IEEE's answer everywhere.
//
// KIND: 0 float16, 1 bfloat16 (both 16-bit words), 2 float32 (TF32 kernels). The f16
// and bf16 helpers (f16.cuh, bf16.cuh) come before this text. Grid-stride loops: any
// grid is correct.

template <int KIND>
struct pyc_guard_word {
  typedef unsigned short type;
};
template <>
struct pyc_guard_word<2> {
  typedef unsigned int type;
};

template <int KIND>
__device__ __forceinline__ bool pyc_guard_nonfinite(typename pyc_guard_word<KIND>::type v) {
  if constexpr (KIND == 0) return (v & 0x7C00u) == 0x7C00u;
  else if constexpr (KIND == 1) return (v & 0x7F80u) == 0x7F80u;
  else return (v & 0x7F800000u) == 0x7F800000u;
}

template <int KIND>
__device__ __forceinline__ float pyc_guard_load(typename pyc_guard_word<KIND>::type v) {
  if constexpr (KIND == 0) return pyc_f16_to_float(static_cast<pyc_f16>(v));
  else if constexpr (KIND == 1) return pyc_bf16_to_float(static_cast<pyc_bf16>(v));
  else return __uint_as_float(v);
}

template <int KIND>
__device__ __forceinline__ typename pyc_guard_word<KIND>::type pyc_guard_store(float f) {
  if constexpr (KIND == 0) return pyc_float_to_f16(f);
  else if constexpr (KIND == 1) return pyc_float_to_bf16(f);
  else return __float_as_uint(f);
}

template <int KIND>
__global__ void pyc_conv_pad_check(const typename pyc_guard_word<KIND>::type* __restrict__ x,
                                   typename pyc_guard_word<KIND>::type* __restrict__ out,
                                   int* __restrict__ flag, int n, int h, int w, int c, int cp,
                                   long long xs_n, long long xs_h, long long xs_w) {
  // one thread per pixel: c loads, cp stores (one 8- or 16-byte store where cp fills it);
  // 32-bit index arithmetic (the CUTLASS kernels take fewer than 2^31 pixels)
  typedef typename pyc_guard_word<KIND>::type T;
  const unsigned hw = (unsigned)h * w;
  const unsigned pixels = (unsigned)n * hw;
  const bool packed = xs_w == c && xs_h == (long long)w * c && xs_n == (long long)hw * c;
  bool bad = false;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels;
       i += gridDim.x * blockDim.x) {
    const T* src;
    if (packed) {
      src = x + (long long)i * c;
    } else {
      const unsigned nn = i / hw, rest = i - nn * hw;
      const unsigned hh = rest / w, ww = rest - hh * w;
      src = x + nn * xs_n + hh * xs_h + ww * xs_w;
    }
    if (out == nullptr) {
      for (int j = 0; j < c; ++j) bad |= pyc_guard_nonfinite<KIND>(src[j]);
      continue;
    }
    union {
      uint4 v;
      T e[16 / sizeof(T)];
    } u;
    u.v = make_uint4(0u, 0u, 0u, 0u);
    for (int j = 0; j < c; ++j) {
      u.e[j] = src[j];
      bad |= pyc_guard_nonfinite<KIND>(u.e[j]);
    }
    T* dst = out + (long long)i * cp;
    const int bytes = cp * (int)sizeof(T);
    if (bytes == 16) {
      *reinterpret_cast<uint4*>(dst) = u.v;
    } else if (bytes == 8) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(u.v.x, u.v.y);
    } else {
      for (int j = 0; j < cp; ++j) dst[j] = u.e[j];
    }
  }
  if (bad) *flag = 1;  // every writer stores the same value
}

template <int KIND>
__global__ void pyc_conv_fixup(const int* __restrict__ flag,
                               const typename pyc_guard_word<KIND>::type* __restrict__ x,
                               const typename pyc_guard_word<KIND>::type* __restrict__ wt,
                               const typename pyc_guard_word<KIND>::type* __restrict__ bias,
                               typename pyc_guard_word<KIND>::type* __restrict__ y, int n,
                               int h, int w, int c, int k, int r, int s, int p, int q,
                               int sh, int sw, int ph, int pw, int dh, int dw, int act) {
  if (*flag == 0) return;
  const long long total = (long long)n * p * q * k;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const int kk = (int)(i % k);
    const long long pixel = i / k;
    const int qq = (int)(pixel % q);
    const long long t = pixel / q;
    const int pp = (int)(t % p);
    const long long nn = t / p;
    float acc = 0.f;
    for (int rr = 0; rr < r; ++rr) {
      const int hh = pp * sh - ph + rr * dh;
      if (hh < 0 || hh >= h) continue;  // the convolution's zero padding
      for (int ss = 0; ss < s; ++ss) {
        const int ww = qq * sw - pw + ss * dw;
        if (ww < 0 || ww >= w) continue;
        const long long xo = ((nn * h + hh) * w + ww) * c;
        const long long wo = (((long long)kk * r + rr) * s + ss) * c;
        for (int cc = 0; cc < c; ++cc) {
          acc += pyc_guard_load<KIND>(x[xo + cc]) * pyc_guard_load<KIND>(wt[wo + cc]);
        }
      }
    }
    if (bias != nullptr) acc += pyc_guard_load<KIND>(bias[kk]);
    if (act == 1) {  // relu, NaN kept
      acc = acc != acc ? acc : fmaxf(acc, 0.f);
    } else if (act == 2) {  // gelu, tanh form (the kernels' GELU_taylor)
      acc = 0.5f * acc * (1.f + tanhf(0.7978845608028654f * (acc + 0.044715f * acc * acc * acc)));
    } else if (act == 3) {  // silu
      acc = acc / (1.f + expf(-acc));
    }
    y[i] = pyc_guard_store<KIND>(acc);
  }
}
