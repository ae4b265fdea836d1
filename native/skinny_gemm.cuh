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

// Four 8 x 8 matrices of 16-bit words from shared memory, each lane handing in the
// address of one 16-byte row (lanes 8j..8j+7: matrix j): register j of a lane holds
// row lane / 4, words 2 (lane % 4) and 2 (lane % 4) + 1 of matrix j — an mma fragment.
__device__ __forceinline__ void load_matrices(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// The byte offset of 16-byte piece p (0..8 KC - 1) of row r in a tile of 128 KC-byte
// rows (64 KC elements of k): pieces are XOR-swizzled by the row within each 128 bytes,
// so the eight rows an ldmatrix reads at the same piece sit in eight bank groups.
template <int KC>
__device__ __forceinline__ unsigned piece(int r, int p) {
  return static_cast<unsigned>(r * 128 * KC + ((p ^ (r & 7)) << 4));
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

// pyc_skinny_gemm_block: the same product (out = alpha * a @ w^T + beta * out) for up to
// 128 rows of `a` (8 * NT), with the block's operands shared. Where the warp form above
// gives every warp its own copy of `a`'s rows (a cost that grows with M: at 32-64 rows
// it moves more bytes through shared memory than the weights), here a block of WN x WM
// warps owns BN = 16 * RT * WN weight rows and all BM = 8 * NT rows of `a`:
//
// * each chunk of 64 KC elements of k of both tiles is copied once per block, with
//   cp.async by all its threads (16 bytes each, weight rows through L2 only, 256 bytes
//   prefetched), STAGES - 1 chunks ahead, one __syncthreads per chunk (the multistage
//   pipeline of an Ampere GEMM); KC > 1 reads longer runs of each weight row at once;
// * tiles are rows of 128 bytes with XOR-swizzled pieces, read by ldmatrix.x4 into mma
//   fragments without bank conflicts; operands stay swapped (weights are the mma's A
//   operand, rows of `a` its B operand), so few rows waste tensor-core lanes, not loads;
// * warp (wn, wm) computes weight rows 16 * RT * wn.. of the block and its NT / WM token
//   tiles from wm on; no warp shares an output, so nothing is reduced inside the block;
// * gridDim.y > 1 splits k as in the warp form: partial tiles to `work`, the last block
//   of a row tile to arrive adds them in split order (deterministic) and resets its
//   counter.
//
// Requirements as the warp form's (K % 8 == 0, lda and ldw multiples of 8, 16-byte
// aligned operands, M <= 8 * NT, k_per_split a multiple of 64 KC). Dynamic shared
// memory: STAGES * (BN + BM) * 128 * KC bytes.
template <int BF16, int NT, int RT, int WN, int WM, int STAGES, int KC>
__global__ void __launch_bounds__(WN * WM * 32)
pyc_skinny_gemm_block(const unsigned short* __restrict__ a, long long lda,
                      const unsigned short* __restrict__ w, long long ldw,
                      unsigned short* __restrict__ out, long long ldo, float alpha,
                      float beta, int M, int N, int K, int k_per_split,
                      float* __restrict__ work, int* __restrict__ counters) {
  using namespace pyc_skinny;
  using T = unsigned short;
  static_assert(NT % WM == 0, "token tiles split evenly across WM warps");
  constexpr int THREADS = WN * WM * 32;
  constexpr int NTW = NT / WM;          // token tiles of a warp
  constexpr int BN = 16 * RT * WN;      // weight rows of the block
  constexpr int BM = 8 * NT;            // rows of `a` of the block
  constexpr int PIECES = 8 * KC;        // 16-byte pieces of a row in one chunk
  constexpr int STAGE = (BN + BM) * 16 * PIECES;  // bytes of one stage: weights, then `a`
  constexpr int REGS = RT * NTW * 4;    // accumulators per lane
  extern __shared__ uint4 pyc_skinny_smem[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wn = warp % WN;
  const int wm = warp / WN;
  const int row0 = blockIdx.x * BN;
  const int kb = blockIdx.y * k_per_split;
  const int ke = min(K, kb + k_per_split);
  const int chunks = (ke - kb + 64 * KC - 1) / (64 * KC);
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(pyc_skinny_smem));

  // Chunk i into stage i % STAGES: piece idx % PIECES of tile row idx / PIECES (weights
  // first).
  // Rows past N or M read the last row (never stored); past K both read zeros.
  auto issue = [&](int i) {
    if (i < chunks) {
      const unsigned stage = smem + (i % STAGES) * STAGE;
      const int k0 = kb + i * 64 * KC;
#pragma unroll
      for (int idx = tid; idx < (BN + BM) * PIECES; idx += THREADS) {
        const int r = idx / PIECES;
        const int p = idx % PIECES;
        const int k = k0 + p * 8;
        const int bytes = k < ke ? 16 : 0;
        const int kc = k < ke ? k : kb;
        if (r < BN) {
          const int n = min(row0 + r, N - 1);
          copy_stream(stage + piece<KC>(r, p), w + (long long)n * ldw + kc, bytes);
        } else {
          const int m = min(r - BN, M - 1);
          copy_shared_operand(stage + piece<KC>(r, p), a + (long long)m * lda + kc, bytes);
        }
      }
    }
    commit();  // an empty group too: the wait below counts groups
  };

  float acc[RT][NTW][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NTW; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.f;

#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(i);
  for (int i = 0; i < chunks; ++i) {
    wait_pending<STAGES - 2>();  // chunk i has landed (this thread's pieces)
    __syncthreads();             // ... everyone's, and stage (i - 1) % STAGES is free
    issue(i + STAGES - 1);
    const unsigned stage = smem + (i % STAGES) * STAGE;
#pragma unroll
    for (int s2 = 0; s2 < 2 * KC; ++s2) {  // two k16 steps per ldmatrix of `a`
      unsigned bq[NTW][4];  // b0, b1 of step 2 s2, then of step 2 s2 + 1
#pragma unroll
      for (int t = 0; t < NTW; ++t) {
        const int r = BN + (wm * NTW + t) * 8 + (lane & 7);
        load_matrices(bq[t], stage + piece<KC>(r, s2 * 4 + (lane >> 3)));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = s2 * 2 + h;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          unsigned aq[4];  // rows g, g + 8 at k 0-7, then at k 8-15 of step s
          const int row = (wn * RT + r) * 16 + (lane & 15);
          load_matrices(aq, stage + piece<KC>(row, s * 2 + (lane >> 4)));
#pragma unroll
          for (int t = 0; t < NTW; ++t)
            mma<BF16>::run(acc[r][t], aq[0], aq[1], aq[2], aq[3], bq[t][2 * h],
                           bq[t][2 * h + 1]);
        }
      }
    }
  }
  wait_pending<0>();

  if (gridDim.y > 1) {  // k split across blocks: the last block of this row tile adds up
    const int splits = gridDim.y;
    const int warps = WN * WM;
    float* mine =
        work + (((long long)blockIdx.x * splits + blockIdx.y) * warps + warp) * REGS * 32 + lane;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int t = 0; t < NTW; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[((r * NTW + t) * 4 + i) * 32] = acc[r][t][i];
    __threadfence();
    __syncthreads();
    __shared__ int arrived;
    if (tid == 0) arrived = atomicAdd(counters + blockIdx.x, 1);
    __syncthreads();
    if (arrived != splits - 1) return;
    __threadfence();
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int t = 0; t < NTW; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float* part =
          work + (((long long)blockIdx.x * splits + s) * warps + warp) * REGS * 32 + lane;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int t = 0; t < NTW; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc[r][t][i] += __ldcg(part + ((r * NTW + t) * 4 + i) * 32);
    }
    if (tid == 0) counters[blockIdx.x] = 0;  // ready for the next launch
  }

  // D fragment: rows are weight rows (n), columns rows of `a` (m).
  const int g = lane >> 2;
  const int tig = lane & 3;
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NTW; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = row0 + (wn * RT + r) * 16 + g + (i >> 1) * 8;
        const int m = (wm * NTW + t) * 8 + tig * 2 + (i & 1);
        if (n < N && m < M) {
          T* o = out + (long long)m * ldo + n;
          float v = alpha * acc[r][t][i];
          if (beta != 0.f) v += beta * mma<BF16>::in(*o);  // beta == 0: out is not read
          *o = mma<BF16>::out(v);
        }
      }
}
