// pyc_lab's CUTLASS 3 implicit-GEMM convolution for Hopper: TMA im2col loads of the
// activations (of the output gradient for dgrad, of the input for wgrad), TMA loads of the
// other operand, warpgroup MMA, a warp-specialised mainloop and a TMA epilogue with the
// bias and activation fused (forward only). The #defines before this text pick one kernel:
//   PYC_OP / PYC_OP_ID cutlass::conv::Operator::kFprop (0), kDgrad (1) or kWgrad (2). The
//                      problem is always the forward one; the pointers the wrapper takes
//                      are (x, w) -> y for fprop, (dy, w) -> dx for dgrad and
//                      (dy, x) -> dw for wgrad (CUTLASS's A, B -> D of each operator).
//                      CUTLASS 4.2's Hopper dgrad takes unit strides only.
//   PYC_ELEMENT        cutlass::half_t, cutlass::bfloat16_t or float (tf32 MMA)
//   PYC_ALIGN          elements per 16-byte access of PYC_ELEMENT
//   PYC_SPATIAL        1, 2 or 3 spatial axes (NWC / NHWC / NDHWC activations, K*C filter)
//   PYC_TILE_M/N/K     CTA tile (output pixels x output channels x reduction)
//   PYC_CLUSTER_M/N    thread-block cluster
// The mainloop is CUTLASS's one Hopper convolution schedule (one producer warp of TMA
// loads, one consumer warpgroup of MMAs; CUTLASS has no persistent schedule for
// convolutions; its fused epilogues need the TMA epilogue schedule), so the tile and the
// cluster are what there is to tune.
//   PYC_BIAS           1: a per-output-channel bias vector
//   PYC_ACT            the activation functor (cutlass::epilogue::thread::Identity for none)
// The extern "C" functions below are what pyc_lab.kernels.cutlass.conv loads with ctypes.
#include <cstdint>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"

namespace pyc {
using namespace cute;
using Element = PYC_ELEMENT;
using ElementAcc = float;
using ElementCompute = float;
#if PYC_SPATIAL == 1
using Layout = cutlass::layout::TensorNWC;
#elif PYC_SPATIAL == 2
using Layout = cutlass::layout::TensorNHWC;
#else
using Layout = cutlass::layout::TensorNDHWC;
#endif
// The output's layout: the activations' for fprop and dgrad; wgrad writes the filter,
// (K, *kernel, C) in memory, which CUTLASS names KCS / KCSR / KCSRT.
#if PYC_OP_ID != 2
using LayoutOut = Layout;
#elif PYC_SPATIAL == 1
using LayoutOut = cutlass::layout::TensorKCS;
#elif PYC_SPATIAL == 2
using LayoutOut = cutlass::layout::TensorKCSR;
#else
using LayoutOut = cutlass::layout::TensorKCSRT;
#endif
// The K mode is wrapped in a Shape for every convolution; wgrad's N mode (C * kernel) too.
#if PYC_OP_ID == 2
using TileShape = Shape<Int<PYC_TILE_M>, Shape<Int<PYC_TILE_N>>, Shape<Int<PYC_TILE_K>>>;
#else
using TileShape = Shape<Int<PYC_TILE_M>, Int<PYC_TILE_N>, Shape<Int<PYC_TILE_K>>>;
#endif
using ClusterShape = Shape<Int<PYC_CLUSTER_M>, Int<PYC_CLUSTER_N>, _1>;
using MainSchedule = cutlass::conv::KernelImplicitTmaWarpSpecializedSm90;
using EpiSchedule = cutlass::epilogue::TmaWarpSpecialized;
#if PYC_BIAS
using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
    PYC_ACT, Element, ElementCompute, Element, void>;
#else
using Fusion = cutlass::epilogue::fusion::LinCombEltAct<PYC_ACT, Element, ElementCompute, void>;
#endif
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementCompute,
    void, LayoutOut, PYC_ALIGN, Element, LayoutOut, PYC_ALIGN, EpiSchedule, Fusion>::CollectiveOp;
using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, PYC_OP,
    Element, Layout, PYC_ALIGN, Element, Layout, PYC_ALIGN, ElementAcc, TileShape,
    ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    MainSchedule>::CollectiveOp;
using Problem = cutlass::conv::ConvProblemShape<PYC_OP, PYC_SPATIAL>;
using Kernel = cutlass::conv::kernel::ConvUniversal<Problem, Mainloop, Epilogue>;
using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
constexpr int kRankT = PYC_SPATIAL + 2;

// The problem from pyc_lab's packed geometry: activations (N, *spatial, C), filter
// (K, *kernel, C), per spatial axis the padding, stride and dilation (outermost first).
static Problem make_problem(const int* act, const int* flt, const int* pad, const int* stride,
                            const int* dilation) {
  typename Problem::TensorExtent shape_act{}, shape_flt{};
  typename Problem::ShapePadding lower{}, upper{};
  typename Problem::TraversalStride tstride{};
  typename Problem::ShapeDilation dil{};
  for (int i = 0; i < kRankT; ++i) {
    shape_act[i] = act[i];
    shape_flt[i] = flt[i];
  }
  for (int i = 0; i < PYC_SPATIAL; ++i) {
    lower[i] = upper[i] = pad[i];
    tstride[i] = stride[i];
    dil[i] = dilation[i];
  }
  return Problem(cutlass::conv::Mode::kCrossCorrelation, shape_act, shape_flt, lower, upper,
                 tstride, dil, 1);
}

static typename Conv::Arguments make_arguments(const Problem& problem, const void* x,
                                               const void* w, const void* bias, void* y,
                                               int sm_count) {
  typename Kernel::StrideD stride_d{};
#if PYC_OP_ID != 2
  // ((Q, P, Z, N), K): the output pixels' strides, innermost first
  cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(stride_d) = problem.stride_C[kRankT - 2 - i];
  });
#else
  // (K, (C, S, R, T)): the filter's K stride, then its window's strides, innermost first
  cute::get<0>(stride_d) = problem.stride_C[0];
  cute::for_each(cute::make_seq<PYC_SPATIAL>{}, [&](auto i) {
    cute::get<1, i + 1>(stride_d) = problem.stride_C[kRankT - 2 - i];
  });
#endif
  typename Kernel::StrideC stride_c{};
  typename Conv::Arguments args{
      problem,
      {static_cast<const Element*>(x), static_cast<const Element*>(w)},
      {{}, nullptr, stride_c, static_cast<Element*>(y), stride_d}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
#if PYC_BIAS
  args.epilogue.thread.bias_ptr = static_cast<const Element*>(bias);
#endif
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sm_count;
  return args;
}

struct Handle {
  Conv op;
  typename Conv::Arguments args;
};
}  // namespace pyc

extern "C" {
// 0 (cutlass::Status::kSuccess) when the kernel can run the problem.
int pyc_conv_can_implement(const int* act, const int* flt, const int* pad, const int* stride,
                           const int* dilation) {
  auto problem = pyc::make_problem(act, flt, pad, stride, dilation);
  auto args = pyc::make_arguments(problem, nullptr, nullptr, nullptr, nullptr, 1);
  return static_cast<int>(pyc::Conv::can_implement(args));
}
unsigned long long pyc_conv_workspace_size(const int* act, const int* flt, const int* pad,
                                           const int* stride, const int* dilation,
                                           int sm_count) {
  auto problem = pyc::make_problem(act, flt, pad, stride, dilation);
  auto args = pyc::make_arguments(problem, nullptr, nullptr, nullptr, nullptr, sm_count);
  return static_cast<unsigned long long>(pyc::Conv::get_workspace_size(args));
}
void* pyc_conv_create() { return new pyc::Handle(); }
void pyc_conv_destroy(void* h) { delete static_cast<pyc::Handle*>(h); }
// Bind a problem and its pointers (TMA descriptors); 0 on success.
int pyc_conv_initialize(void* h, const int* act, const int* flt, const int* pad,
                        const int* stride, const int* dilation, const void* x, const void* w,
                        const void* bias, void* y, void* workspace, int sm_count,
                        void* stream) {
  auto* p = static_cast<pyc::Handle*>(h);
  auto problem = pyc::make_problem(act, flt, pad, stride, dilation);
  p->args = pyc::make_arguments(problem, x, w, bias, y, sm_count);
  auto st = p->op.can_implement(p->args);
  if (st != cutlass::Status::kSuccess) return static_cast<int>(st);
  return static_cast<int>(p->op.initialize(p->args, workspace,
                                            static_cast<cudaStream_t>(stream)));
}
// Launch the bound problem on a stream.
int pyc_conv_run(void* h, void* stream) {
  return static_cast<int>(static_cast<pyc::Handle*>(h)->op.run(static_cast<cudaStream_t>(stream)));
}
int pyc_conv_has_bias() { return PYC_BIAS; }
int pyc_conv_spatial() { return PYC_SPATIAL; }
int pyc_conv_op() { return PYC_OP_ID; }
}
