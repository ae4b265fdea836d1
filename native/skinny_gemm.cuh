// pyc_skinny_gemm: out[M, N] = a[M, K] @ w[N, K]^T for few rows of `a` (M <= 64), the
// shape of a linear layer at decode time. Such a GEMM is bound by reading the weights
// once (N * K elements), so the kernel is written to keep HBM busy, not the tensor cores:
//
// * operands swapped: the tensor cores' A operand is 16 weight rows, their B operand
//   the (at most 8 * NT) rows of `a`, so M = 1 wastes 7/8 of an mma, never a weight load;
// * every lane loads 16 contiguous bytes per instruction (two per row and 64-wide k
//   chunk), streamed past L1; within a chunk the k order is permuted the same way for
//   both operands (a dot product does not depend on the order of its terms), so the
//   loaded words are the mma fragments as they are, with no shuffles;
// * a block owns 16 * RT weight rows; its WARPS warps split the block's k range
//   (interleaved chunks of 64), each warp with RT * 4 * KU loads in flight, and their
//   partial sums meet in a fixed-order tree in shared memory (deterministic);
// * gridDim.y > 1 splits k across blocks as well: each block writes its partial tile to
//   `work`, and the last block of a row tile to arrive (counted in `counters`, which it
//   resets to zero for the next launch) adds the partials in split order and stores.
//
// Requirements (the launcher checks them): K % 8 == 0, lda and ldw multiples of 8,
// `a` and `w` 16-byte aligned, M <= 8 * NT. Rows of `w` past N and rows of `a` past M
// read as zeros and are never stored. k_per_split is a multiple of 64.
// Elements are 16-bit words (`unsigned short`) and BF16 selects their format, so that
// the source needs no CUDA headers under NVRTC.

namespace pyc_skinny {

template <int BF16> struct mma;

template <> struct mma<0> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1,
                                             unsigned a2, unsigned a3, unsigned b0,
                                             unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned short out(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    return h;
  }
};

template <> struct mma<1> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1,
                                             unsigned a2, unsigned a3, unsigned b0,
                                             unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned short out(float v) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    return h;
  }
};

// 16 bytes of weights, read once: not kept in L1, the next 256 bytes fetched into L2.
__device__ __forceinline__ uint4 load_stream(const void* p, bool ok) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (ok) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
  }
  return r;
}

// 16 bytes of `a`, which every block of the grid reads: through L1.
__device__ __forceinline__ uint4 load_shared_operand(const void* p, bool ok) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (ok) r = __ldg(reinterpret_cast<const uint4*>(p));
  return r;
}

__device__ __forceinline__ unsigned word(const uint4 (&q)[2], int i) {
  const uint4& v = q[i >> 2];
  switch (i & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
  }
}

}  // namespace pyc_skinny

template <int BF16, int NT, int RT, int WARPS, int KU>
__global__ void __launch_bounds__(WARPS * 32)
pyc_skinny_gemm(const unsigned short* __restrict__ a, long long lda,
                const unsigned short* __restrict__ w, long long ldw,
                unsigned short* __restrict__ out, long long ldo, int M, int N, int K,
                int k_per_split, float* __restrict__ work, int* __restrict__ counters) {
  using namespace pyc_skinny;
  using T = unsigned short;
  constexpr int REGS = RT * NT * 4;  // accumulators per lane
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;    // mma group: weight row g and g + 8, row g of `a`
  const int tig = lane & 3;   // thread in group: which 16 bytes of a 64-wide chunk
  const int row0 = blockIdx.x * (16 * RT);
  const int kb = blockIdx.y * k_per_split;
  const int ke = min(K, kb + k_per_split);

  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.f;

  // Row pointers (clamped to a valid row; the predicate keeps the load off).
  const T* wrow[RT][2];
  bool wok[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = row0 + r * 16 + g + h * 8;
      wok[r][h] = n < N;
      wrow[r][h] = w + (long long)(n < N ? n : 0) * ldw;
    }
  const T* arow[NT];
  bool aok[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int m = t * 8 + g;
    aok[t] = m < M;
    arow[t] = a + (long long)(m < M ? m : 0) * lda;
  }

  for (int c = warp * KU; kb + c * 64 < ke; c += WARPS * KU) {
    uint4 wq[KU][RT][2][2];
    uint4 aq[KU][NT][2];
#pragma unroll
    for (int u = 0; u < KU; ++u) {
      const int k0 = kb + (c + u) * 64 + tig * 8;  // this lane's first 8 elements
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int k = k0 + q * 32;
        const bool kin = k < ke;
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            wq[u][r][h][q] = load_stream(wrow[r][h] + k, kin && wok[r][h]);
#pragma unroll
        for (int t = 0; t < NT; ++t)
          aq[u][t][q] = load_shared_operand(arow[t] + k, kin && aok[t]);
      }
    }
#pragma unroll
    for (int u = 0; u < KU; ++u)
#pragma unroll
      for (int s = 0; s < 4; ++s)  // four k16 steps of the 64-wide chunk
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int t = 0; t < NT; ++t)
            mma<BF16>::run(acc[r][t], word(wq[u][r][0], 2 * s), word(wq[u][r][1], 2 * s),
                        word(wq[u][r][0], 2 * s + 1), word(wq[u][r][1], 2 * s + 1),
                        word(aq[u][t], 2 * s), word(aq[u][t], 2 * s + 1));
  }

  // The block's warps: a fixed-order tree in shared memory, warp 0 ends with the sum.
  if (WARPS > 1) {
    extern __shared__ float pyc_skinny_smem[];  // [WARPS / 2][REGS][32]
#pragma unroll
    for (int half = WARPS / 2; half >= 1; half /= 2) {
      if (warp >= half && warp < 2 * half) {
        float* dst = pyc_skinny_smem + (warp - half) * REGS * 32 + lane;
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) dst[((r * NT + t) * 4 + i) * 32] = acc[r][t][i];
      }
      __syncthreads();
      if (warp < half) {
        const float* src = pyc_skinny_smem + warp * REGS * 32 + lane;
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][t][i] += src[((r * NT + t) * 4 + i) * 32];
      }
      __syncthreads();
    }
  }
  if (warp != 0) return;

  if (gridDim.y > 1) {  // k split across blocks: the last block of this row tile adds up
    const int splits = gridDim.y;
    float* mine = work + ((long long)blockIdx.x * splits + blockIdx.y) * REGS * 32 + lane;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[((r * NT + t) * 4 + i) * 32] = acc[r][t][i];
    __threadfence();
    __syncwarp();
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(counters + blockIdx.x, 1);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != splits - 1) return;
    __threadfence();
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float* part = work + ((long long)blockIdx.x * splits + s) * REGS * 32 + lane;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc[r][t][i] += __ldcg(part + ((r * NT + t) * 4 + i) * 32);
    }
    if (lane == 0) counters[blockIdx.x] = 0;  // ready for the next launch
  }

  // D fragment: rows are weight rows (n), columns rows of `a` (m).
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = row0 + r * 16 + g + (i >> 1) * 8;
        const int m = t * 8 + tig * 2 + (i & 1);
        if (n < N && m < M) out[(long long)m * ldo + n] = mma<BF16>::out(acc[r][t][i]);
      }
}
