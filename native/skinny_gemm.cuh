// pyc_skinny_gemm: out[M, N] = alpha * a[M, K] @ w[N, K]^T + beta * out for few rows of `a` (M <= 64), the
// shape of a linear layer at decode time. Such a GEMM is bound by reading the weights
// once (N * K elements), so the kernel is written to keep HBM busy, not the tensor cores:
//
// * operands swapped: the tensor cores' A operand is 16 weight rows, their B operand
//   the (at most 8 * NT) rows of `a`, so M = 1 wastes 7/8 of an mma, never a weight load;
// * every lane copies 16 contiguous bytes per instruction (two per row and 64-wide k
//   chunk) with cp.async into its own column of shared memory, STAGES - 1 chunks ahead
//   of the one it computes on (register-held loads were scheduled next to their use by
//   the compiler, leaving a few in flight); within a chunk the k order is permuted the
//   same way for both operands (a dot product does not depend on the order of its
//   terms), so the copied words are the mma fragments as they are, with no shuffles;
// * a block owns 16 * RT weight rows; its WARPS warps split the block's k range
//   (interleaved chunks of 64), and their partial sums meet in a fixed-order tree in
//   shared memory (deterministic);
// * gridDim.y > 1 splits k across blocks as well: each block writes its partial tile to
//   `work`, and the last block of a row tile to arrive (counted in `counters`, which it
//   resets to zero for the next launch) adds the partials in split order and stores.
//
// Requirements (the launcher checks them): K % 8 == 0, lda and ldw multiples of 8,
// `a` and `w` 16-byte aligned, M <= 8 * NT. Rows of `w` past N and of `a` past M are
// read as the last row and never stored. k_per_split is a multiple of 64. Dynamic
// shared memory: max(WARPS * STAGES * SLOTS * 512, WARPS / 2 * REGS * 128) bytes.
//
// Elements are 16-bit words (`unsigned short`) and BF16 selects their format, so that
// the source needs no CUDA headers under NVRTC.

namespace pyc_skinny {

// The tensor-core step and the conversions of one 16-bit format (BF16: bfloat16, else
// float16); the PTX differs only in the type name.
template <int BF16> struct mma {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1,
                                             unsigned a2, unsigned a3, unsigned b0,
                                             unsigned b1) {
    if constexpr (BF16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  static __device__ __forceinline__ unsigned short out(float v) {
    unsigned short h;
    if constexpr (BF16) {
      asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    } else {
      asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    }
    return h;
  }
  static __device__ __forceinline__ float in(unsigned short h) {
    if constexpr (BF16) {
      return __uint_as_float(static_cast<unsigned>(h) << 16);
    } else {
      float v;
      asm("cvt.f32.f16 %0, %1;\n" : "=f"(v) : "h"(h));
      return v;
    }
  }
};

// Asynchronous 16-byte copies into shared memory, `bytes` of them read (16, or 0 to
// fill zeros past K): weights stream through L2 only, with the next 256 bytes fetched
// into L2; `a`, which every block reads, also through L1. Nothing waits for them until
// cp.async.wait_group, so a warp keeps STAGES - 1 chunks of loads in flight whatever
// the compiler's register scheduling.
__device__ __forceinline__ void copy_stream(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void copy_shared_operand(unsigned dst, const void* src,
                                                    int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
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

template <int BF16, int NT, int RT, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32)
pyc_skinny_gemm(const unsigned short* __restrict__ a, long long lda,
                const unsigned short* __restrict__ w, long long ldw,
                unsigned short* __restrict__ out, long long ldo, float alpha, float beta,
                int M, int N, int K,
                int k_per_split, float* __restrict__ work, int* __restrict__ counters) {
  using namespace pyc_skinny;
  using T = unsigned short;
  constexpr int REGS = RT * NT * 4;    // accumulators per lane
  constexpr int SLOTS = RT * 4 + NT * 2;  // 16-byte pieces per lane and chunk
  extern __shared__ uint4 pyc_skinny_smem[];  // [WARPS][STAGES][SLOTS][32], then the tree
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

  // Row pointers, clamped to a valid row: a row of D depends only on its row of w and a
  // column only on its row of `a`, so what a clamped row computes is never stored. Past
  // K, both operands are zero-filled (0 * Inf would be NaN).
  const T* wrow[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = row0 + r * 16 + g + h * 8;
      wrow[r][h] = w + (long long)(n < N ? n : N - 1) * ldw;
    }
  const T* arow[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int m = t * 8 + g;
    arow[t] = a + (long long)(m < M ? m : M - 1) * lda;
  }

  // This warp's chunks of 64: warp, warp + WARPS, ... below ke; each lane's pieces live
  // in its own column of the warp's ring, so no lane waits for another.
  const int chunks = (ke - kb + 63) / 64;
  const int mine = chunks > warp ? (chunks - warp + WARPS - 1) / WARPS : 0;
  const unsigned ring = static_cast<unsigned>(__cvta_generic_to_shared(
      pyc_skinny_smem + (warp * STAGES * SLOTS) * 32 + lane));
  auto issue = [&](int i) {  // chunk i of this warp into stage i % STAGES
    if (i < mine) {
      const unsigned base = ring + (i % STAGES) * SLOTS * 32 * 16;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int k = kb + (warp + i * WARPS) * 64 + tig * 8 + q * 32;
        const int bytes = k < ke ? 16 : 0;
        const int kc = k < ke ? k : kb;
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            copy_stream(base + ((r * 2 + h) * 2 + q) * 32 * 16, wrow[r][h] + kc, bytes);
#pragma unroll
        for (int t = 0; t < NT; ++t)
          copy_shared_operand(base + (RT * 4 + t * 2 + q) * 32 * 16, arow[t] + kc, bytes);
      }
    }
    commit();  // an empty group too: the wait below counts groups
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(i);
  for (int i = 0; i < mine; ++i) {
    issue(i + STAGES - 1);
    wait_pending<STAGES - 1>();  // chunk i has landed
    const uint4* stage = pyc_skinny_smem + (warp * STAGES + i % STAGES) * SLOTS * 32 + lane;
    uint4 wq[RT][2][2];
    uint4 aq[NT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 2; ++q) wq[r][h][q] = stage[((r * 2 + h) * 2 + q) * 32];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int q = 0; q < 2; ++q) aq[t][q] = stage[(RT * 4 + t * 2 + q) * 32];
#pragma unroll
    for (int s = 0; s < 4; ++s)  // four k16 steps of the 64-wide chunk
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
          mma<BF16>::run(acc[r][t], word(wq[r][0], 2 * s), word(wq[r][1], 2 * s),
                         word(wq[r][0], 2 * s + 1), word(wq[r][1], 2 * s + 1),
                         word(aq[t], 2 * s), word(aq[t], 2 * s + 1));
  }
  wait_pending<0>();
  __syncthreads();  // the ring is reused by the tree below

  // The block's warps: a fixed-order tree in shared memory, warp 0 ends with the sum.
  if (WARPS > 1) {
    float* tree = reinterpret_cast<float*>(pyc_skinny_smem);  // [WARPS / 2][REGS][32]
#pragma unroll
    for (int half = WARPS / 2; half >= 1; half /= 2) {
      if (warp >= half && warp < 2 * half) {
        float* dst = tree + (warp - half) * REGS * 32 + lane;
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) dst[((r * NT + t) * 4 + i) * 32] = acc[r][t][i];
      }
      __syncthreads();
      if (warp < half) {
        const float* src = tree + warp * REGS * 32 + lane;
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
        if (n < N && m < M) {
          T* o = out + (long long)m * ldo + n;
          float v = alpha * acc[r][t][i];
          if (beta != 0.f) v += beta * mma<BF16>::in(*o);  // beta == 0: out is not read
          *o = mma<BF16>::out(v);
        }
      }
}

namespace pyc_skinny {

// 16 bytes of a weight row, read once: not kept in L1, the next 256 bytes fetched into L2.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// 16 bytes of a row of `a`, which every warp reads: through L1.
__device__ __forceinline__ uint4 load_shared_operand(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// The eight 16-bit values of a 16-byte piece as floats.
template <int BF16>
__device__ __forceinline__ void unpack8(const uint4& q, float (&f)[8]) {
  const unsigned u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = mma<BF16>::in(static_cast<unsigned short>(u[i] & 0xffffu));
    f[2 * i + 1] = mma<BF16>::in(static_cast<unsigned short>(u[i] >> 16));
  }
}

}  // namespace pyc_skinny

// pyc_skinny_gemv: the same product for at most 8 rows of `a` (MT, a power of two, rows
// computed; rows past M repeat the last and are not stored) on the CUDA cores. With so
// few rows the tensor cores have nothing to do that FMAs cannot (8 * MT per weight
// element loaded is far under the SM's FMA rate at HBM speed), so this form is only a
// load stream: each warp owns R weight rows, each lane reads 16 bytes of every row per
// step straight into registers (not through L1), U steps issued before the first is
// used, so R * U loads of 16 bytes are in flight per lane with no shared memory and no
// barrier; `a`'s rows come through L1 (every warp reads them). Products are summed in
// float32 in a fixed order (per lane over k, then a butterfly of shuffles), so the
// result is deterministic. Requirements: K % 8 == 0, lda and ldw multiples of 8,
// 16-byte aligned operands, M <= MT. Grid: ceil(ceil(N / R) / warps per block) blocks.
template <int BF16, int MT, int R, int U>
__global__ void pyc_skinny_gemv(const unsigned short* __restrict__ a, long long lda,
                                const unsigned short* __restrict__ w, long long ldw,
                                unsigned short* __restrict__ out, long long ldo, float alpha,
                                float beta, int M, int N, int K) {
  using namespace pyc_skinny;
  using T = unsigned short;
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  if (n0 >= N) return;
  const int pieces = K >> 3;  // 16-byte pieces of a row
  const T* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = w + (long long)min(n0 + r, N - 1) * ldw;
  const T* arow[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) arow[m] = a + (long long)min(m, M - 1) * lda;

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

  for (int p0 = lane; p0 < pieces; p0 += 32 * U) {
    uint4 wq[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int p = p0 + u * 32;
        wq[u][r] = p < pieces ? load_stream(wrow[r] + p * 8) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = p0 + u * 32;
      if (p < pieces) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float af[8];
          unpack8<BF16>(load_shared_operand(arow[m] + p * 8), af);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float wf[8];
            unpack8<BF16>(wq[u][r], wf);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][m] = fmaf(wf[i], af[i], acc[r][m]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1)
        acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int n = n0 + r;
      if (lane == (r * MT + m) % 32 && n < N && m < M) {
        T* o = out + (long long)m * ldo + n;
        float v = alpha * acc[r][m];
        if (beta != 0.f) v += beta * mma<BF16>::in(*o);  // beta == 0: out is not read
        *o = mma<BF16>::out(v);
      }
    }
}
