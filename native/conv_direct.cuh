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

// The activation after the bias: 0 none, 1 relu (NaN kept), 2 gelu (tanh form), 3 silu.
template <int ACT>
__device__ __forceinline__ float pyc_direct_act(float a) {
  if constexpr (ACT == 1) {
    return a != a ? a : fmaxf(a, 0.f);
  } else if constexpr (ACT == 2) {
    return 0.5f * a * (1.f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)));
  } else if constexpr (ACT == 3) {
    return a / (1.f + expf(-a));
  } else {
    return a;
  }
}

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

// The block's filters (output channels k0 .. k0 + OT - 1, `taps` values each) into shared
// memory as float32, tap-major: ws[t * OT + o]. Every thread of the block takes part; the
// caller synchronises before reading.
template <int KIND, int OT>
__device__ __forceinline__ void pyc_direct_stage_weights(
    const typename pyc_guard_word<KIND>::type* __restrict__ wt, float* ws, int k0, int taps) {
  for (int i = threadIdx.x; i < OT * taps; i += blockDim.x) {
    const int o = i / taps, t = i - o * taps;
    ws[t * OT + o] = pyc_guard_load<KIND>(wt[(k0 + o) * taps + t]);
  }
}

// Per tap (c, r, s in the filter's order): its input offset from the window's first
// element and its window offsets along h and w, into shared memory.
__device__ __forceinline__ void pyc_direct_stage_taps(int4* tapat, int taps, int rs, int s,
                                                      int xs_c, int xs_h, int xs_w, int dh,
                                                      int dw) {
  for (int t = threadIdx.x; t < taps; t += blockDim.x) {
    const int cc = t / rs, rr = (t - cc * rs) / s, ss = t - cc * rs - rr * s;
    tapat[t] = make_int4(cc * xs_c + rr * dh * xs_h + ss * dw * xs_w, rr * dh, ss * dw, 0);
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
  pyc_direct_stage_weights<KIND, OT>(wt, ws, k0, taps);
  pyc_direct_stage_taps(tapat, taps, rs, s, xs_c, xs_h, xs_w, dh, dw);
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
      y[(nn * k + k0 + o) * pq + rest] = pyc_guard_store<KIND>(pyc_direct_act<ACT>(a));
    }
  }
}

// The longest reduction a row-kernel build of OT channels keeps in its 48 KiB of static
// shared memory: PYC_DIRECT_TAPS, or fewer for the wide builds (384 at OT = 32).
template <int OT>
constexpr int pyc_direct_row_taps() {
  return OT * PYC_DIRECT_TAPS * 4 <= 49152 ? PYC_DIRECT_TAPS : 49152 / (4 * OT);
}

// pyc_conv_direct_rows<KIND, OT, PT, ACT, S, SW>: the same convolution for filters at most
// S wide along the last axis (dilation 1 there) and a stride SW along it, each thread
// computing PT consecutive outputs of one output row: for every input channel and filter
// row it loads the (PT - 1) x SW + S input elements under its PT windows once, into
// registers, and forms all PT x S products from them (a thread of the generic kernel
// loads PT x S elements for the same work). Arguments as pyc_conv_direct's (dw must be
// 1, sw SW and s S); block x covers blockDim.x groups of PT outputs (an output row is
// ceil(q / PT) groups; the last one may be part-empty), block y the output channels
// y * OT .. y * OT + OT - 1. The filters sit in shared memory as in pyc_conv_direct;
// a wide build (OT of 16 or 32: each input element loaded once for that many channels)
// takes at most pyc_direct_row_taps<OT>() of them.
template <int KIND, int OT, int PT, int ACT, int S, int SW>
__global__ void pyc_conv_direct_rows(const typename pyc_guard_word<KIND>::type* __restrict__ x,
                                     const typename pyc_guard_word<KIND>::type* __restrict__ wt,
                                     const typename pyc_guard_word<KIND>::type* __restrict__ bias,
                                     typename pyc_guard_word<KIND>::type* __restrict__ y,
                                     int c, int h, int w, int k, int groups, int r, int s,
                                     int p, int q, int sh, int sw, int ph, int pw, int dh,
                                     int dw, int xs_n, int xs_c, int xs_h, int xs_w,
                                     int pixels) {
  typedef typename pyc_guard_word<KIND>::type T;
  constexpr int SPAN = (PT - 1) * SW + S;
  __align__(16) __shared__ float ws[OT * pyc_direct_row_taps<OT>()];
  const int cg = c / groups, kg = k / groups;
  const int k0 = blockIdx.y * OT;
  const int taps = cg * r * S;
  pyc_direct_stage_weights<KIND, OT>(wt, ws, k0, taps);
  __syncthreads();
  const int qg = (q + PT - 1) / PT;  // groups of PT outputs in an output row
  const int rows = pixels / q;       // n x p output rows
  const int g = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= rows * qg) return;        // after the barrier: no thread waits on it again
  const int row = g / qg, q0 = (g - row * qg) * PT;
  const int nn = row / p, pp = row - nn * p;
  const int h0 = pp * sh - ph, w0 = q0 * SW - pw;
  const T* xg = x + nn * xs_n + (k0 / kg) * cg * xs_c;
  float acc[OT][PT];
#pragma unroll
  for (int o = 0; o < OT; ++o) {
#pragma unroll
    for (int j = 0; j < PT; ++j) acc[o][j] = 0.f;
  }
  const float* wtap = ws;
  for (int cc = 0; cc < cg; ++cc) {
    for (int rr = 0; rr < r; ++rr, wtap += S * OT) {
      const int hh = h0 + rr * dh;
      const bool inrow = hh >= 0 && hh < h;  // else a padded filter row: zeros
      const T* src = xg + cc * xs_c + hh * xs_h;
      float e[SPAN];
#pragma unroll
      for (int u = 0; u < SPAN; ++u) {
        const int ww = w0 + u;
        e[u] = inrow && (unsigned)ww < (unsigned)w ? pyc_guard_load<KIND>(src[ww * xs_w])
                                                   : 0.f;
      }
#pragma unroll
      for (int ss = 0; ss < S; ++ss) {
        float f[OT];
        pyc_direct_weights<OT>(wtap + ss * OT, f);
#pragma unroll
        for (int o = 0; o < OT; ++o) {
#pragma unroll
          for (int j = 0; j < PT; ++j) acc[o][j] = fmaf(f[o], e[j * SW + ss], acc[o][j]);
        }
      }
    }
  }
  const int pq = p * q;
#pragma unroll
  for (int o = 0; o < OT; ++o) {
    const float b = bias != nullptr ? pyc_guard_load<KIND>(bias[k0 + o]) : 0.f;
    T* dst = y + (nn * k + k0 + o) * pq + pp * q + q0;
#pragma unroll
    for (int j = 0; j < PT; ++j) {
      if (q0 + j >= q) break;
      float a = acc[o][j];
      if (bias != nullptr) a += b;  // not + 0: a -0.0 sum stays -0.0
      dst[j] = pyc_guard_store<KIND>(pyc_direct_act<ACT>(a));
    }
  }
}

// pyc_conv_direct_split<KIND, OT, L, ACT>: the same convolution for problems with few
// outputs and a long reduction (batch 1 of a 32 -> 32 channel layer: a thousand outputs
// of 96 taps each), where a thread's serial sum over the taps is the kernel's whole
// latency, one dependent load a tap. Here L consecutive lanes of a warp (L a power of
// two, at most 32) share one output pixel: lane l sums the taps l, l + L, l + 2L, ... for
// OT output channels — every lane's loads independent, issued together — and the L
// partial sums are added by a butterfly of shuffles within the L lanes; lane o < OT then
// adds the bias, applies the activation and stores channel k0 + o. Arguments as
// pyc_conv_direct's; block x covers blockDim.x / L consecutive output pixels (blockDim.x
// a multiple of L), block y the output channels y * OT .. y * OT + OT - 1 (OT <= L). No
// thread returns before the shuffles: a lane past the last pixel sums zeros and stores
// nothing.
template <int KIND, int OT, int L, int ACT>
__global__ void pyc_conv_direct_split(const typename pyc_guard_word<KIND>::type* __restrict__ x,
                                      const typename pyc_guard_word<KIND>::type* __restrict__ wt,
                                      const typename pyc_guard_word<KIND>::type* __restrict__ bias,
                                      typename pyc_guard_word<KIND>::type* __restrict__ y,
                                      int c, int h, int w, int k, int groups, int r, int s,
                                      int p, int q, int sh, int sw, int ph, int pw, int dh,
                                      int dw, int xs_n, int xs_c, int xs_h, int xs_w,
                                      int pixels) {
  typedef typename pyc_guard_word<KIND>::type T;
  static_assert(OT <= L && (L & (L - 1)) == 0 && L <= 32, "OT <= L, L a power of two");
  __align__(16) __shared__ float ws[OT * PYC_DIRECT_TAPS];
  __align__(16) __shared__ int4 tapat[PYC_DIRECT_TAPS];
  const int cg = c / groups, kg = k / groups;
  const int k0 = blockIdx.y * OT;
  const int rs = r * s;
  const int taps = cg * rs;
  const int pq = p * q;
  pyc_direct_stage_weights<KIND, OT>(wt, ws, k0, taps);
  pyc_direct_stage_taps(tapat, taps, rs, s, xs_c, xs_h, xs_w, dh, dw);
  __syncthreads();
  const int lane = (int)(threadIdx.x % L);
  const int i = (int)((blockIdx.x * blockDim.x + threadIdx.x) / L);
  const bool live = i < pixels;
  const int ii = live ? i : 0;
  const int nn = ii / pq, rest = ii - nn * pq;
  const int pp = rest / q, qq = rest - pp * q;
  const int h0 = pp * sh - ph, w0 = qq * sw - pw;
  const T* xg = x + (k0 / kg) * cg * xs_c;
  const int at = nn * xs_n + h0 * xs_h + w0 * xs_w;  // the window's first element
  float acc[OT];
#pragma unroll
  for (int o = 0; o < OT; ++o) acc[o] = 0.f;
#pragma unroll 4
  for (int t = lane; t < taps; t += L) {
    const int4 tap = tapat[t];
    const int hh = h0 + tap.y, ww = w0 + tap.z;
    const float v = (live && hh >= 0 && hh < h && ww >= 0 && ww < w)
                        ? pyc_guard_load<KIND>(xg[at + tap.x])
                        : 0.f;
    float f[OT];
    pyc_direct_weights<OT>(ws + t * OT, f);
#pragma unroll
    for (int o = 0; o < OT; ++o) acc[o] = fmaf(f[o], v, acc[o]);
  }
#pragma unroll
  for (int off = L / 2; off > 0; off /= 2) {
#pragma unroll
    for (int o = 0; o < OT; ++o) acc[o] += __shfl_xor_sync(0xffffffffu, acc[o], off, L);
  }
  if (!live || lane >= OT) return;
  float a = acc[0];
#pragma unroll
  for (int o = 1; o < OT; ++o) {
    if (lane == o) a = acc[o];
  }
  if (bias != nullptr) a += pyc_guard_load<KIND>(bias[k0 + lane]);
  y[(nn * k + k0 + lane) * pq + rest] = pyc_guard_store<KIND>(pyc_direct_act<ACT>(a));
}
