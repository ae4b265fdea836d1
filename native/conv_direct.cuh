// A convolution computed directly (no patch matrix, no GEMM), for the small problems of
// scientific models: few channels, short filters, many positions (a 1-D CNN over a
// particle's hits, a stem over a few input planes). Their reduction per output
// (C / groups x R x S) is too short for a GEMM's tiles and their patch matrix costs more
// memory traffic than the arithmetic; here each thread keeps an OT x PT block of outputs
// (OT output channels of one group, PT output pixels) in float32 registers and reads each
// input element once per tap for all OT channels. The block's filters are first copied
// into shared memory as float32, tap-major (ws[t][o]), with each tap's input offset: a
// tap's OT weights are then one or two 16-byte shared loads that every thread of a warp
// reads at once (a broadcast), and one flat, unrolled loop over the taps issues PT
// global loads and OT x PT fused multiply-adds a tap, several taps' loads in flight.
//
// pyc_conv_direct<KIND, OT, PT, ACT>: x[n, c, h, w] at element strides (xs_n, xs_c, xs_h,
//   xs_w) — channels first, channels last or any view — filter wt[k, c / groups, r, s]
//   contiguous, bias[k] or nullptr, y[n, k, p, q] contiguous. A 1-D convolution is the
//   2-D one of height 1. Zero padding reads zero (so 0 x a filter's NaN is NaN, as the
//   patch matrix's product is); the bias is added after the sum, then the activation
//   (ACT: 0 none, 1 relu with NaN kept, 2 gelu in the tanh form, 3 silu), all in float32,
//   rounded once to the element type. Block x covers blockDim.x * PT consecutive output
//   pixels (thread t takes pixels t, t + blockDim.x, ...: consecutive threads read and
//   write consecutive addresses), block y the output channels y * OT .. y * OT + OT - 1
//   (OT divides k / groups, so they share a group). The filters of a block take
//   OT x PYC_DIRECT_TAPS floats of shared memory and the taps' offsets PYC_DIRECT_TAPS
//   int4s: the caller keeps C / groups x R x S at most PYC_DIRECT_TAPS. 32-bit index arithmetic: the caller keeps every offset of x and
//   y below 2^31.
//
// KIND: 0 float16, 1 bfloat16, 2 float32, through conv_guard.cuh's word helpers
// (pyc_guard_word, pyc_guard_load, pyc_guard_store), which come before this text with
// f16.cuh and bf16.cuh.

#ifndef PYC_DIRECT_TAPS
#define PYC_DIRECT_TAPS 512
#endif

template <int OT>
__device__ __forceinline__ void pyc_direct_weights(const float* ws, float (&f)[OT]) {
  if constexpr (OT % 4 == 0) {
#pragma unroll
    for (int o = 0; o < OT; o += 4) {
      const float4 v = *reinterpret_cast<const float4*>(ws + o);
      f[o] = v.x;
      f[o + 1] = v.y;
      f[o + 2] = v.z;
      f[o + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int o = 0; o < OT; ++o) f[o] = ws[o];
  }
}

template <int KIND, int OT, int PT, int ACT>
__global__ void pyc_conv_direct(const typename pyc_guard_word<KIND>::type* __restrict__ x,
                                const typename pyc_guard_word<KIND>::type* __restrict__ wt,
                                const typename pyc_guard_word<KIND>::type* __restrict__ bias,
                                typename pyc_guard_word<KIND>::type* __restrict__ y,
                                int c, int h, int w, int k, int groups, int r, int s, int p,
                                int q, int sh, int sw, int ph, int pw, int dh, int dw,
                                int xs_n, int xs_c, int xs_h, int xs_w, int pixels) {
  typedef typename pyc_guard_word<KIND>::type T;
  __align__(16) __shared__ float ws[OT * PYC_DIRECT_TAPS];
  // per tap (c, r, s in the filter's order): its input offset and its window offsets
  __align__(16) __shared__ int4 tapat[PYC_DIRECT_TAPS];
  const int cg = c / groups, kg = k / groups;
  const int k0 = blockIdx.y * OT;
  const int rs = r * s;
  const int taps = cg * rs;
  const int pq = p * q;
  // the block's filters, tap-major, in float32, and the taps' offsets
  for (int i = threadIdx.x; i < OT * taps; i += blockDim.x) {
    const int o = i / taps, t = i - o * taps;
    ws[t * OT + o] = pyc_guard_load<KIND>(wt[(k0 + o) * taps + t]);
  }
  for (int t = threadIdx.x; t < taps; t += blockDim.x) {
    const int cc = t / rs, rr = (t - cc * rs) / s, ss = t - cc * rs - rr * s;
    tapat[t] = make_int4(cc * xs_c + rr * dh * xs_h + ss * dw * xs_w, rr * dh, ss * dw, 0);
  }
  __syncthreads();
  const T* xg = x + (k0 / kg) * cg * xs_c;
  // per pixel: its window's first element (an offset from the group's channel 0; it may
  // lie in the padding), and whether the whole window is inside the input (then no tap
  // is checked)
  int at[PT], h0[PT], w0[PT];
  bool live[PT], inside[PT];
#pragma unroll
  for (int j = 0; j < PT; ++j) {
    const int i = (int)(blockIdx.x * blockDim.x * PT + j * blockDim.x + threadIdx.x);
    live[j] = i < pixels;
    const int ii = live[j] ? i : 0;
    const int nn = ii / pq, rest = ii - nn * pq;
    const int pp = rest / q, qq = rest - pp * q;
    h0[j] = pp * sh - ph;
    w0[j] = qq * sw - pw;
    at[j] = nn * xs_n + h0[j] * xs_h + w0[j] * xs_w;
    inside[j] = live[j] && h0[j] >= 0 && h0[j] + (r - 1) * dh < h && w0[j] >= 0 &&
                w0[j] + (s - 1) * dw < w;
  }
  float acc[OT][PT];
#pragma unroll
  for (int o = 0; o < OT; ++o) {
#pragma unroll
    for (int j = 0; j < PT; ++j) acc[o][j] = 0.f;
  }
  // one flat loop over the taps: unrolled, so that the loads of several taps are in
  // flight together
#pragma unroll 4
  for (int t = 0; t < taps; ++t) {
    const int4 tap = tapat[t];
    float v[PT];
#pragma unroll
    for (int j = 0; j < PT; ++j) {
      if (inside[j]) {
        v[j] = pyc_guard_load<KIND>(xg[at[j] + tap.x]);
      } else {
        const int hh = h0[j] + tap.y, ww = w0[j] + tap.z;
        v[j] = (live[j] && hh >= 0 && hh < h && ww >= 0 && ww < w)
                   ? pyc_guard_load<KIND>(xg[at[j] + tap.x])
                   : 0.f;
      }
    }
    float f[OT];
    pyc_direct_weights<OT>(ws + t * OT, f);
#pragma unroll
    for (int o = 0; o < OT; ++o) {
#pragma unroll
      for (int j = 0; j < PT; ++j) acc[o][j] = fmaf(f[o], v[j], acc[o][j]);
    }
  }
#pragma unroll
  for (int j = 0; j < PT; ++j) {
    if (!live[j]) continue;
    const int i = (int)(blockIdx.x * blockDim.x * PT + j * blockDim.x + threadIdx.x);
    const int nn = i / pq, rest = i - nn * pq;
#pragma unroll
    for (int o = 0; o < OT; ++o) {
      float a = acc[o][j];
      if (bias != nullptr) a += pyc_guard_load<KIND>(bias[k0 + o]);
      if (ACT == 1) {  // relu, NaN kept
        a = a != a ? a : fmaxf(a, 0.f);
      } else if (ACT == 2) {  // gelu, tanh form
        a = 0.5f * a * (1.f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)));
      } else if (ACT == 3) {  // silu
        a = a / (1.f + expf(-a));
      }
      y[(nn * k + k0 + o) * pq + rest] = pyc_guard_store<KIND>(a);
    }
  }
}
