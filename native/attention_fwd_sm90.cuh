// pyc_lab's fused attention forward for Hopper (sm_90a).
//
// A tile is BLOCK_M = 64 * MMA_WG query rows of one (batch, query head) against every key
// block it needs: O = softmax(Q K^T * scale [causal]) V and the rows' log-sum-exp. One
// CTA computes one tile, or (PYC_PERSISTENT) one CTA per SM takes tiles in a static round
// robin, and while its consumers finish a tile (the last P V, the stores) the producer
// already loads the next tile's Q, K and V. The design is the FlashAttention-3 one,
// written here with CuTe's building blocks:
//   * warp specialisation: warpgroup 0 is the producer (one thread issues every TMA load
//     and gives its registers away with setmaxnreg); warpgroups 1..MMA_WG are consumers,
//     each owning 64 query rows;
//   * Q arrives once by TMA; K and V blocks stream through two TMA pipelines of STAGES
//     shared-memory buffers each (mbarrier full/empty pairs), so the producer loads block
//     n-1 while the consumers compute block n, and S = Q K^T of a block can start before
//     its V has landed;
//   * both GEMMs are warpgroup MMAs (wgmma): S from Q and K in shared memory, O += P V
//     with P taken straight from the registers S was accumulated in (converted to the
//     16-bit type in place: no shared-memory round trip), V read through a transposed
//     (MN-major) view of the same buffer TMA wrote;
//   * the online softmax is float32 in registers, in base 2 (one FFMA + EX2 per score),
//     rows reduced across the quad of threads that share them;
//   * with PYC_OVERLAP, FlashAttention-3's two overlaps: within a warpgroup, block n's
//     S = Q K^T is issued with block n+1's O += P V and its softmax runs while P V is in
//     flight; across warpgroups, named barriers make the consumers take turns issuing
//     MMAs, so one's softmax (exp2 on the SFU) hides behind another's tensor-core work;
//   * key blocks are visited last to first, so the blocks that need masking (the causal
//     diagonal, keys past the end) come first and every later block runs unmasked.
// Sequence lengths need not be multiples of the tiles: TMA fills rows past the end with
// zeros, their scores are masked to -inf, and rows past the query length are not stored.
//
// The #defines before this text pick one kernel:
//   PYC_ELEMENT    cutlass::half_t or cutlass::bfloat16_t
//   PYC_HEAD_DIM   64 or 128
//   PYC_BLOCK_N    keys per block (a multiple of 16, at most 256)
//   PYC_STAGES     shared-memory buffers per K and V pipeline
//   PYC_MMA_WG     consumer warpgroups (2 or 3): BLOCK_M = 64 * PYC_MMA_WG
//   PYC_OVERLAP    1: the software-pipelined consumer loop (below), 0: one block at a time
//   PYC_PERSISTENT 1: one CTA per SM looping over tiles, 0: one CTA per tile
//   PYC_STORE_O    1: the output is staged in shared memory and stored by TMA, off the
//                  consumers' path (where shared memory has room for it), 0: each
//                  thread stores its own output registers
//   PYC_Q_STAGES   Q buffers: 2 lets a persistent CTA's producer load the next tile's Q
//                  (and then its K and V) while the consumers still read this tile's,
//                  so a tile's first S = Q K^T does not wait for a load; 1 where shared
//                  memory has no room for the second
// The extern "C" functions at the end are what pyc_lab.kernels.attention_sm90 loads.
#include <cstdint>
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "cute/tensor.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cute/atom/copy_atom.hpp"
#include "cute/arch/copy_sm90_tma.hpp"

namespace pyc_attn {
using namespace cute;

using Element = PYC_ELEMENT;
constexpr int kD = PYC_HEAD_DIM;
constexpr int kBlockN = PYC_BLOCK_N;
constexpr int kStages = PYC_STAGES;
constexpr int kMmaWG = PYC_MMA_WG;
constexpr int kQStages = PYC_Q_STAGES;
constexpr int kBlockM = 64 * kMmaWG;
constexpr int kMmaThreads = 128 * kMmaWG;
constexpr int kThreads = kMmaThreads + 128;
// Registers per thread after setmaxnreg: the producer keeps the minimum, the consumers
// share the rest of the 64K register file (multiples of 8, at most 256).
constexpr int kProducerRegs = kMmaWG == 2 ? 24 : 32;
constexpr int kConsumerRegs = kMmaWG == 2 ? 240 : 160;
static_assert(kD == 64 || kD == 128, "head dimension 64 or 128");
static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "key block a multiple of 16, <= 256");
static_assert(kMmaWG == 2 || kMmaWG == 3, "2 or 3 consumer warpgroups");
static_assert(kQStages == 1 || kQStages == 2, "1 or 2 Q buffers");

using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<kD>>;
using AtomLayout = Layout<Shape<Int<kMmaWG>, _1, _1>>;
// S = Q K^T: both operands in shared memory, K-major (the head dimension is contiguous).
using TiledMmaS = decltype(make_tiled_mma(
    GMMA::ss_op_selector<Element, Element, float, TileShape>(), AtomLayout{}));
// O += P V: P from registers, V MN-major (its rows are keys, the head dimension contiguous).
using TiledMmaO = decltype(make_tiled_mma(
    GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kD>, Int<kBlockN>>,
                         GMMA::Major::K, GMMA::Major::MN>(),
    AtomLayout{}));

// 128-byte swizzled tiles: what TMA writes and wgmma reads without bank conflicts.
using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kD>>{}));
using SmemLayoutQS = decltype(tile_to_shape(SmemAtom{},
                                            Shape<Int<kBlockM>, Int<kD>, Int<kQStages>>{}));
// The output's staging tile: one 64-row tile per consumer warpgroup, each contiguous, so
// that every warpgroup stores its own rows by TMA without waiting for the others.
using SmemLayoutO64 = decltype(tile_to_shape(SmemAtom{}, Shape<_64, Int<kD>>{}));
using SmemLayoutO = decltype(tile_to_shape(SmemLayoutO64{}, Shape<Int<kBlockM>, Int<kD>>{}));
using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{},
                                            Shape<Int<kBlockN>, Int<kD>, Int<kStages>>{}));
using SmemLayoutKV1 = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kD>>{}));
// The same V buffers seen as (head dim, keys, stage): the B operand of O += P V.
using SmemLayoutVt = decltype(composition(
    SmemLayoutKV{}, make_ordered_layout(Shape<Int<kD>, Int<kBlockN>, Int<kStages>>{},
                                        Step<_2, _1, _3>{})));

using Pipeline = cutlass::PipelineTmaAsync<kStages>;
using PipeState = typename cutlass::PipelineState<kStages>;
using Barrier = cutlass::arch::ClusterTransactionBarrier;

struct SharedStorage {
  cute::array_aligned<Element, cosize_v<SmemLayoutQS>, 1024> q;
  cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> k;
  cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> v;
#if PYC_STORE_O
  cute::array_aligned<Element, cosize_v<SmemLayoutO>, 1024> o;  // the output tile, staged
#endif
  alignas(16) uint64_t barrier_q[kQStages];       // Q landed (TMA transaction barrier)
  alignas(16) uint64_t barrier_q_free[kQStages];  // the consumers are done reading Q
  typename Pipeline::SharedStorage pipe_k;
  typename Pipeline::SharedStorage pipe_v;
};

// Global tensors as (sequence, head dim, head, batch) with element strides.
using GShape = Shape<int32_t, Int<kD>, int32_t, int32_t>;
using GStride = Stride<int64_t, _1, int64_t, int64_t>;
using GTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                     GShape{}, GStride{}));
using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, std::declval<GTensor>(), SmemLayoutQ{},
                                    Shape<Int<kBlockM>, Int<kD>>{}, _1{}));
using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, std::declval<GTensor>(),
                                     SmemLayoutKV1{},
                                     Shape<Int<kBlockN>, Int<kD>>{}, _1{}));
using GTensorO = decltype(make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)),
                                      GShape{}, GStride{}));
using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, std::declval<GTensorO>(),
                                    SmemLayoutO64{}, Shape<_64, Int<kD>>{}, _1{}));

struct Params {
  TmaQ tma_q;
  TmaKV tma_k;
  TmaKV tma_v;
  TmaO tma_o;            // used with PYC_STORE_O: one consumer warpgroup's 64 rows
  Element* o;
  float* lse;            // (batch, query head, query) contiguous, or null
  int64_t o_row, o_head, o_batch;
  int batch, heads_q, heads_kv, group, len_q, len_k;
  float scale;           // multiplies the scores
  float scale_log2;      // scale * log2(e)
  int causal;            // top-left aligned: query i sees keys j <= i
  int m_blocks;          // query blocks per (batch, head)
  int tiles;             // m_blocks * heads_q * batch: the work items
  int unit;              // tiles a persistent CTA takes at a time (1, or 2: causal pairs)
};

// An accumulator's layout ((2, 2, N/8), MMA_M, MMA_N) seen as (rows, columns): each
// thread holds two rows (r and r + 8 of its warp's 16) and pairs of adjacent columns.
template <class L>
CUTE_HOST_DEVICE auto rowcol(L const& l) {
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The S accumulator's layout reread as the register A operand of O += P V: a k16 step
// of that MMA holds two consecutive 8-column groups of S, so (2, 2, N/8) splits into
// ((2, 2, 2), N/16) with the N/16 groups as the MMA's K mode.
template <class L>
CUTE_HOST_DEVICE auto acc_as_a(L const& l) {
  static_assert(decltype(size<2>(l))::value == 1, "one MMA atom across the key block");
  auto v = logical_divide(get<0>(l), Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(v), get<1>(v), get<2, 0>(v)), get<1>(l),
                     get<2, 1>(v));
}

// Issue one warpgroup GEMM over the K mode of a and b (a in registers when kRegA) as one
// batch of wgmma, without waiting for it.
template <bool kZero, bool kRegA, class Mma, class TA, class TB, class TC>
CUTLASS_DEVICE void wg_issue(Mma& mma, TA const& a, TB const& b, TC& c) {
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZero) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// The same GEMM, waited for.
template <bool kZero, bool kRegA, class Mma, class TA, class TB, class TC>
CUTLASS_DEVICE void wg_gemm(Mma& mma, TA const& a, TB const& b, TC& c) {
  wg_issue<kZero, kRegA>(mma, a, b, c);
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<TA&>(a));
}

CUTLASS_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__global__ void __launch_bounds__(kThreads, 1) attention_fwd(CUTE_GRID_CONSTANT Params const p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  int const warp_group = cutlass::canonical_warp_group_idx();
  // Tile t is the (t % m_blocks)-th query block of head (t / m_blocks) % heads_q of
  // batch t / (m_blocks * heads_q): consecutive tiles share a head (its K and V stay in
  // L2). Causal blocks near the end of the sequence do the most work: they come first;
  // with p.unit == 2 (persistent, causal) they alternate with the shortest instead
  // (last, first, second last, second, ...), so that each pair of tiles a CTA takes
  // holds the same number of key blocks and a static round robin stays balanced.
  auto tile = [&](int t, int& m_block, int& head, int& batch, int& n_blocks) {
    int const hb = t / p.m_blocks;
    int const m = t % p.m_blocks;
    int const longest_first = p.m_blocks - 1 - m;
    int const zigzag = (m & 1) ? m / 2 : p.m_blocks - 1 - m / 2;
    m_block = !p.causal ? m : p.unit == 2 ? zigzag : longest_first;
    head = hb % p.heads_q;
    batch = hb / p.heads_q;
    n_blocks = (p.len_k + kBlockN - 1) / kBlockN;
    if (p.causal) {
      int const last_row = min((m_block + 1) * kBlockM, p.len_q);
      n_blocks = min(n_blocks, (last_row + kBlockN - 1) / kBlockN);
    }
  };
  // A persistent CTA takes units of p.unit consecutive tiles: units blockIdx.x,
  // + gridDim.x, ...; otherwise a CTA takes its one tile.
#if PYC_PERSISTENT
  int const first_tile = blockIdx.x * p.unit;
  auto next_tile = [&](int t) {
    return (t + 1) % p.unit ? t + 1 : (t / p.unit + int(gridDim.x)) * p.unit;
  };
#else
  int const first_tile = blockIdx.x + p.m_blocks * (blockIdx.y + p.heads_q * blockIdx.z);
  auto next_tile = [&](int) { return p.tiles; };
#endif

  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                            : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = kMmaThreads;
  pp.transaction_bytes = kBlockN * kD * sizeof(Element);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kQStages; ++s) {
      Barrier::init(&smem.barrier_q[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.barrier_q_free[s], kMmaThreads);
    }
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
#if PYC_STORE_O
    cute::prefetch_tma_descriptor(p.tma_o.get_tma_descriptor());
#endif
  }
  Pipeline pipe_k(smem.pipe_k, pp, Shape<_1, _1, _1>{});
  Pipeline pipe_v(smem.pipe_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQS{});  // (M, D, stage)
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutKV{});

  if (warp_group == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (threadIdx.x == 0) {
      Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.len_q, Int<kD>{}, p.heads_q, p.batch));
      Tensor mK = p.tma_k.get_tma_tensor(make_shape(p.len_k, Int<kD>{}, p.heads_kv, p.batch));
      Tensor mV = p.tma_v.get_tma_tensor(make_shape(p.len_k, Int<kD>{}, p.heads_kv, p.batch));
      auto cta_q = p.tma_q.get_slice(0);
      auto cta_k = p.tma_k.get_slice(0);
      auto cta_v = p.tma_v.get_slice(0);
      Tensor tQsQ = cta_q.partition_D(sQ);  // (TMA, TMA_M, TMA_D, stage)
      Tensor tKsK = cta_k.partition_D(sK);  // (TMA, TMA_N, TMA_D, stage)
      Tensor tVsV = cta_v.partition_D(sV);
      PipeState write = cutlass::make_producer_start_state<Pipeline>();
      int iter = 0;
      for (int t = first_tile; t < p.tiles; t = next_tile(t), ++iter) {
        int m_block, head, batch, n_blocks;
        tile(t, m_block, head, batch, n_blocks);
        int const kv_head = head / p.group;
        Tensor gQ = local_tile(mQ(_, _, head, batch), Shape<Int<kBlockM>, Int<kD>>{},
                               make_coord(m_block, 0));
        Tensor gK = local_tile(mK(_, _, kv_head, batch), Shape<Int<kBlockN>, Int<kD>>{},
                               make_coord(_, 0));
        Tensor gV = local_tile(mV(_, _, kv_head, batch), Shape<Int<kBlockN>, Int<kD>>{},
                               make_coord(_, 0));
        Tensor tKgK = cta_k.partition_S(gK);  // (TMA, TMA_N, TMA_D, n)
        Tensor tVgV = cta_v.partition_S(gV);
        // Tile iter's Q goes to buffer iter % kQStages, once the consumers have read to
        // the end the Q of the tile that used that buffer before.
        int const qs = iter % kQStages;
        int const use = iter / kQStages;
        if (use > 0) {
          cutlass::arch::ClusterBarrier::wait(&smem.barrier_q_free[qs], (use - 1) & 1);
        }
        Barrier::arrive_and_expect_tx(&smem.barrier_q[qs], kBlockM * kD * sizeof(Element));
        copy(p.tma_q.with(smem.barrier_q[qs]), cta_q.partition_S(gQ), tQsQ(_, _, _, qs));
        for (int n = n_blocks - 1; n >= 0; --n) {
          pipe_k.producer_acquire(write);
          copy(p.tma_k.with(*pipe_k.producer_get_barrier(write)), tKgK(_, _, _, n),
               tKsK(_, _, _, write.index()));
          pipe_v.producer_acquire(write);
          copy(p.tma_v.with(*pipe_v.producer_get_barrier(write)), tVgV(_, _, _, n),
               tVsV(_, _, _, write.index()));
          ++write;
        }
      }
    }
    return;
  }

  // consumers
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
  int const tid = threadIdx.x - 128;
  int const consumer = warp_group - 1;
  TiledMmaS mma_s;
  TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutVt{});
  Tensor tSrQs = thr_s.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K, stage)
  Tensor tSrK = thr_s.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrV = thr_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<kD>>{});
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_s.partition_C(cS);
  Tensor O = make_tensor(tOrO.data(), rowcol(tOrO.layout()));
  constexpr int kRows = decltype(size<0>(rowcol(tOrO.layout())))::value;
  float row_max[kRows];
  float row_sum[kRows];
  int row0 = 0;  // the tile's first query row

  // Key block n's scores: masked where the block needs it (the causal diagonal, keys
  // past the end), then the online softmax in place: each row's new maximum, the factor
  // corr that rescales what was accumulated before, P = exp2(s * scale_log2 - max), and
  // the running row sums.
  auto softmax_block = [&](auto& tSrS, int n, float (&corr)[kRows]) {
    Tensor S = make_tensor(tSrS.data(), rowcol(tSrS.layout()));
    Tensor C = make_tensor(tScS.data(), rowcol(tScS.layout()));
    int const col0 = n * kBlockN;
    bool const edge = col0 + kBlockN > p.len_k;
    bool const diagonal = p.causal && col0 + kBlockN - 1 > row0;
    if (edge || diagonal) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(S); ++i) {
        int const row = row0 + get<0>(C(i, 0));
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(S); ++j) {
          int const col = col0 + get<1>(C(i, j));
          if (col >= p.len_k || (p.causal && col > row)) S(i, j) = -INFINITY;
        }
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(S); ++i) {
      float mx = row_max[i];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(S); ++j) mx = fmaxf(mx, S(i, j));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      // A row with every score so far masked keeps -inf; subtract 0 from it instead.
      float const shift = mx == -INFINITY ? 0.f : mx * p.scale_log2;
      corr[i] = mx == -INFINITY ? 1.f : fast_exp2(row_max[i] * p.scale_log2 - shift);
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(S); ++j) {
        S(i, j) = fast_exp2(S(i, j) * p.scale_log2 - shift);
        sum += S(i, j);
      }
      row_sum[i] = row_sum[i] * corr[i] + sum;
      row_max[i] = mx;
    }
  };
  auto rescale = [&](float const (&corr)[kRows]) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(O); ++i) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(O); ++j) O(i, j) *= corr[i];
    }
  };
  // P in the 16-bit type, in the registers it was computed in.
  using FragS = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  constexpr int kFrag = decltype(size(FragS{}))::value;
  using FragP = cutlass::Array<Element, kFrag>;
  auto to_p = [&](auto const& tSrS) {
    cutlass::NumericArrayConverter<Element, float, kFrag> convert;
    return convert(*reinterpret_cast<cutlass::Array<float, kFrag> const*>(tSrS.data()));
  };
  auto p_operand = [&](FragP& p16) {
    return make_tensor(make_rmem_ptr<Element>(p16.data()), acc_as_a(FragS{}.layout()));
  };

  float corr[kRows];
  PipeState read_k, read_v;
  int const lane = threadIdx.x % 32;
  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kD>>{});
  Tensor CO = make_tensor(thr_o.partition_C(cO).data(), rowcol(thr_o.partition_C(cO).layout()));
#if PYC_STORE_O
  Tensor sO = make_tensor(make_smem_ptr(smem.o.data()), SmemLayoutO{});
  Tensor tOsO = thr_o.partition_C(sO);
  Tensor OS = make_tensor(tOsO.data(), rowcol(tOsO.layout()));
  // This warpgroup's 64 rows of the staging tile, stored by its first thread.
  Tensor sOw = make_tensor(make_smem_ptr(smem.o.data() + consumer * 64 * kD), SmemLayoutO64{});
  bool const store_thread = tid % 128 == 0;
  int const o_barrier = kMmaWG + consumer;  // this warpgroup's threads
#endif
  int iter = 0;
  for (int t = first_tile; t < p.tiles; t = next_tile(t), ++iter) {
  int m_block, head, batch, n_blocks;
  tile(t, m_block, head, batch, n_blocks);
  row0 = m_block * kBlockM;
  clear(tOrO);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRows; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.f;
  }
  int const qs = iter % kQStages;
  Barrier::wait(&smem.barrier_q[qs], (iter / kQStages) & 1);
  Tensor tSrQ = tSrQs(_, _, _, qs);
#if PYC_OVERLAP
  // Software-pipelined: block n's S = Q K^T is issued together with the previous block's
  // O += P V, and the softmax of block n runs while P V is still on the tensor cores.
  // The consumer warpgroups also take turns issuing their MMAs (named barriers, round
  // robin), so one warpgroup's softmax overlaps another's MMAs.
  using cutlass::arch::NamedBarrier;
  FragP p16;
  {
    FragS tSrS;
    pipe_k.consumer_wait(read_k);
    wg_gemm<true, false>(mma_s, tSrQ, tSrK(_, _, _, read_k.index()), tSrS);
    pipe_k.consumer_release(read_k);
    ++read_k;
    softmax_block(tSrS, n_blocks - 1, corr);  // O is still zero: nothing to rescale
    p16 = to_p(tSrS);
  }
  // Every sync below pairs with one arrive; the last consumer lets the first start, and
  // skips its final arrive, which no one would wait for.
  if (n_blocks > 1 && consumer == kMmaWG - 1) NamedBarrier::arrive(256, 0);
  for (int n = n_blocks - 2; n >= 0; --n) {
    FragS tSrS;
    Tensor tOrP = p_operand(p16);
    pipe_k.consumer_wait(read_k);
    pipe_v.consumer_wait(read_v);
    NamedBarrier::sync(256, consumer);
    wg_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, read_k.index()), tSrS);
    wg_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
    if (n > 0 || consumer != kMmaWG - 1) NamedBarrier::arrive(256, (consumer + 1) % kMmaWG);
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);
    pipe_k.consumer_release(read_k);
    ++read_k;
    softmax_block(tSrS, n, corr);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    warpgroup_fence_operand(tOrP);
    pipe_v.consumer_release(read_v);
    ++read_v;
    rescale(corr);
    p16 = to_p(tSrS);
  }
  cutlass::arch::ClusterBarrier::arrive(&smem.barrier_q_free[qs]);  // every Q K^T is done
  {
    Tensor tOrP = p_operand(p16);
    pipe_v.consumer_wait(read_v);
    wg_gemm<false, true>(mma_o, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
    pipe_v.consumer_release(read_v);
    ++read_v;  // the next tile reads the next stage
  }
#else
  for (int n = n_blocks - 1; n >= 0; --n) {
    FragS tSrS;
    pipe_k.consumer_wait(read_k);
    wg_gemm<true, false>(mma_s, tSrQ, tSrK(_, _, _, read_k.index()), tSrS);
    pipe_k.consumer_release(read_k);
    ++read_k;
    softmax_block(tSrS, n, corr);
    rescale(corr);
    FragP p16 = to_p(tSrS);
    Tensor tOrP = p_operand(p16);
    pipe_v.consumer_wait(read_v);
    wg_gemm<false, true>(mma_o, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
    pipe_v.consumer_release(read_v);
    ++read_v;
  }
  cutlass::arch::ClusterBarrier::arrive(&smem.barrier_q_free[qs]);
#endif

  // Rows: the quad's partial sums, 1 / sum (0 for a row that saw no key: NaN, as the
  // softmax of an empty or fully masked row is), then the 16-bit output: staged in
  // shared memory for a TMA store per warpgroup (PYC_STORE_O), else stored in column
  // pairs. A warpgroup never waits for another here: the one that finished its last
  // P V first stores and starts its next tile's S = Q K^T while the others still work
  // on the tensor cores.
#if PYC_STORE_O
  // This warpgroup's last TMA store must have read its rows before they are rewritten.
  if (store_thread) tma_store_wait<0>();
  cutlass::arch::NamedBarrier::sync(128, o_barrier);
#endif
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size<0>(O); ++i) {
    float sum = row_sum[i];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    float const inv = 1.f / sum;
    int const row = row0 + get<0>(CO(i, 0));
#if PYC_STORE_O
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(O); ++j) OS(i, j) = Element(O(i, j) * inv);
    if (row >= p.len_q) continue;
#else
    if (row >= p.len_q) continue;
    Element* out = p.o + batch * p.o_batch + head * p.o_head + row * p.o_row;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(O); j += 2) {
      int const col = get<1>(CO(i, j));
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(O(i, j) * inv);
      pair[1] = Element(O(i, j + 1) * inv);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(out + col) = pair;
    }
#endif
    if (p.lse != nullptr && lane % 4 == 0) {
      p.lse[(int64_t(batch) * p.heads_q + head) * p.len_q + row] =
          row_max[i] * p.scale + logf(sum);
    }
  }
#if PYC_STORE_O
  // The warpgroup's writes reach the async proxy, then its first thread stores its rows
  // (TMA clips the rows past the query length; rows that all lie past it are skipped).
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(128, o_barrier);
  if (store_thread && row0 + 64 * consumer < p.len_q) {
    Tensor mO = p.tma_o.get_tma_tensor(make_shape(p.len_q, Int<kD>{}, p.heads_q, p.batch));
    Tensor gO = local_tile(mO(_, _, head, batch), Shape<_64, Int<kD>>{},
                           make_coord(m_block * kMmaWG + consumer, 0));
    auto cta_o = p.tma_o.get_slice(0);
    copy(p.tma_o, cta_o.partition_S(sOw), cta_o.partition_D(gO));
    tma_store_arrive();
  }
#endif
  }  // tiles
#if PYC_STORE_O
  if (store_thread) tma_store_wait<0>();  // shared memory lives until the store has read it
#endif
}

// Global tensor of an operand: (sequence, head dim, head, batch).
template <class T>
inline auto gtensor(T* ptr, int len, int heads, int batch, long long const* st) {
  return make_tensor(make_gmem_ptr(ptr), make_shape(len, Int<kD>{}, heads, batch),
                     make_stride(int64_t(st[2]), _1{}, int64_t(st[1]), int64_t(st[0])));
}
}  // namespace pyc_attn

extern "C" {
// Shared memory one CTA takes (bytes).
int pyc_attn_smem_bytes() { return int(sizeof(pyc_attn::SharedStorage)); }
int pyc_attn_head_dim() { return pyc_attn::kD; }
int pyc_attn_block_m() { return pyc_attn::kBlockM; }

// Launch the forward on a stream. Strides are in elements, (batch, head, row) per operand;
// the head dimension is contiguous. lse (float32, (batch, heads_q, len_q) contiguous) may
// be null. Returns a cudaError_t.
int pyc_attn_fwd(void const* q, void const* k, void const* v, void* o, float* lse, int batch,
                 int heads_q, int heads_kv, int len_q, int len_k, long long const* q_stride,
                 long long const* k_stride, long long const* v_stride,
                 long long const* o_stride, float scale, int causal, void* stream) {
  using namespace pyc_attn;
  static bool configured = false;
  static int sm_count = 0;
  int const smem = int(sizeof(SharedStorage));
  if (!configured) {
    cudaError_t st = cudaFuncSetAttribute(attention_fwd,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int device = 0;
    if (st == cudaSuccess) st = cudaGetDevice(&device);
    if (st == cudaSuccess) {
      st = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
    }
    if (st != cudaSuccess) return int(st);
    configured = true;
  }
  int const m_blocks = ceil_div(len_q, kBlockM);
  Params p{
      make_tma_copy(SM90_TMA_LOAD{}, gtensor(static_cast<Element const*>(q), len_q, heads_q,
                                             batch, q_stride),
                    SmemLayoutQ{}, Shape<Int<kBlockM>, Int<kD>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gtensor(static_cast<Element const*>(k), len_k, heads_kv,
                                             batch, k_stride),
                    SmemLayoutKV1{}, Shape<Int<kBlockN>, Int<kD>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, gtensor(static_cast<Element const*>(v), len_k, heads_kv,
                                             batch, v_stride),
                    SmemLayoutKV1{}, Shape<Int<kBlockN>, Int<kD>>{}, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, gtensor(static_cast<Element*>(o), len_q, heads_q, batch,
                                              o_stride),
                    SmemLayoutO64{}, Shape<_64, Int<kD>>{}, _1{}),
      static_cast<Element*>(o),
      lse,
      int64_t(o_stride[2]), int64_t(o_stride[1]), int64_t(o_stride[0]),
      batch, heads_q, heads_kv, heads_q / heads_kv, len_q, len_k,
      scale, scale * 1.4426950408889634f, causal, m_blocks, m_blocks * heads_q * batch, 1};
#if PYC_PERSISTENT
  // Causal tiles go in equal-work pairs once there are enough to fill every SM with them.
  if (causal && p.tiles >= 2 * sm_count) p.unit = 2;
  dim3 grid(min(ceil_div(p.tiles, p.unit), sm_count));
#else
  dim3 grid(m_blocks, heads_q, batch);
#endif
  attention_fwd<<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}
}
