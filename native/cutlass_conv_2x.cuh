// pyc_lab's CUTLASS 2 implicit-GEMM convolution, Ampere-class: mma.sync tensor cores fed
// by cp.async (or, with two stages, by register-staged loads), built for sm_80 and up,
// sm_90a included. It is the family for what the Hopper kernel (cutlass_conv_3x.cuh)
// cannot take: TMA's im2col mode needs every channel row to be a multiple of 16 bytes, so
// a stem convolution (C = 3 RGB pixels) or any C that is not a multiple of 8
// half-precision elements has no TMA descriptor; CUTLASS 4.2's Hopper dgrad takes unit
// strides only, and its kernels have no split-K for a wgrad's long reduction. CUTLASS 2's
// activation iterators gather the channels in accesses of PYC_ALIGN elements instead, down
// to one, and its few-channels and fixed-channels iterators fold the filter window into
// the reduction so a C of 3 or 4 does not waste a whole K tile per filter tap.
// The #defines before this text pick one kernel:
//   PYC_OP_ID          0 forward, 1 dgrad, 2 wgrad. The problem is always the forward one;
//                      the pointers the wrapper takes are (x, w) -> y for fprop,
//                      (dy, w) -> dx for dgrad and (dy, x) -> dw for wgrad (CUTLASS's
//                      A, B -> D of each operator). Dgrad runs CUTLASS's strided kernel
//                      (any stride, unit dilation) under its strided-dgrad swizzle.
//   PYC_SPLIT_K        reduction slices (serial split-K: each slice's CTA adds its part
//                      into the output in turn, ordered by a semaphore in the workspace);
//                      1 for none. Not with a strided dgrad.
//   PYC_ELEMENT        cutlass::half_t, cutlass::bfloat16_t or float (tf32 MMA)
//   PYC_MATH           the MMA operator: cutlass::arch::OpMultiplyAdd (default), or for
//                      float cutlass::arch::OpMultiplyAddFastF32, "3xTF32": each float32
//                      operand split into a TF32 big part and the TF32 rest, three MMAs
//                      (big*big + big*rest + rest*big) in float32 accumulators, which
//                      keeps float32's accuracy on the tensor cores
//   PYC_ALIGN          elements per activation / filter access (8, 4, 2 or 1; divides C;
//                      with PYC_STAGES > 2 an access is a cp.async of 4, 8 or 16 bytes)
//   PYC_ALIGN_OUT      elements per output (and bias) access of the epilogue; divides K
//   PYC_SPATIAL        1 or 2 spatial axes (NWC runs as NHWC with H = 1; K*C filter)
//   PYC_TILE_M/N/K     CTA tile (output pixels x output channels x reduction)
//   PYC_WARP_M/N/K     warp tile (the CTA tile over it is the warp count)
//   PYC_STAGES         2: ImplicitGemmPipelined (any alignment); 3+: ImplicitGemmMultistage
//   PYC_ITERATOR       cutlass::conv::IteratorAlgorithm::k{Analytic,Optimized,FewChannels,
//                      FixedChannels} (fixed channels: C must equal PYC_ALIGN)
//   PYC_BIAS           1: a per-output-channel bias vector (read as the C operand with a
//                      zero stride, so every output pixel adds the same K values)
//   PYC_ACT            the activation functor (cutlass::epilogue::thread::Identity for none)
//   PYC_RESIDUAL       1: a forward kernel that adds a residual tensor of the output's
//                      shape after the bias and before the activation (a residual block's
//                      sum in the epilogue); it takes a bias (see below)
// The epilogue is LinearCombinationGeneric: D = act(acc + bias) (NoBetaScaling reads the
// bias), or D = act(acc) without one (OnlyAlphaScaling never reads C); with split-K the
// scaling is the default one, whose beta CUTLASS sets to 1 for every slice after the
// first, so a slice adds to what the earlier ones wrote. With a residual it is
// LinearCombinationResidualBlock under DefaultConv2dFpropWithBroadcast: the bias read as
// the broadcast vector, the residual as the C tensor, D = act((acc + bias) + residual),
// in float32 and in the order the unfused ops round. (Without a bias the broadcast vector
// would add +0.0, which turns a -0.0 sum into +0.0, so a residual kernel needs one.)
// The extern "C" functions are the same, with the same packed geometry, as those of
// cutlass_conv_3x.cuh, so pyc_lab.kernels.cutlass.conv.CutlassConv drives either family.
#include <cstdint>
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/arch/arch.h"
#include "cutlass/arch/mma.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/conv/kernel/default_conv2d_dgrad.h"
#include "cutlass/conv/kernel/default_conv2d_wgrad.h"
#include "cutlass/conv/threadblock/threadblock_swizzle.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"

#ifndef PYC_RESIDUAL
#define PYC_RESIDUAL 0
#endif
#if PYC_RESIDUAL
#include "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h"
#include "cutlass/epilogue/thread/linear_combination_residual_block.h"
#if PYC_OP_ID != 0 || PYC_SPLIT_K > 1 || !PYC_BIAS
#error "a residual is added by forward kernels with a bias and without split-K"
#endif
#endif

#ifndef PYC_MATH
#define PYC_MATH cutlass::arch::OpMultiplyAdd
#endif

#if PYC_SPATIAL != 1 && PYC_SPATIAL != 2
#error "cutlass_conv_2x.cuh takes 1 or 2 spatial axes"
#endif

namespace pyc {
using Element = PYC_ELEMENT;
using ElementAcc = float;
using ElementCompute = float;
using Layout = cutlass::layout::TensorNHWC;  // activations NHWC, filter KRSC, output NPQK
// tf32 MMAs are m16n8k8; half and bfloat16 ones m16n8k16.
using Instruction = cutlass::gemm::GemmShape<16, 8, (sizeof(Element) == 4 ? 8 : 16)>;
#if PYC_SPLIT_K > 1 && PYC_BIAS
#error "split-K kernels here take no bias"
#endif
constexpr auto kScale = PYC_BIAS ? cutlass::epilogue::thread::ScaleType::NoBetaScaling
                        : PYC_SPLIT_K > 1 ? cutlass::epilogue::thread::ScaleType::Default
                                          : cutlass::epilogue::thread::ScaleType::OnlyAlphaScaling;
#if PYC_RESIDUAL
// act(binary(identity(acc + bias), residual)): the activation is the unary op after the sum
using OutputOp = cutlass::epilogue::thread::LinearCombinationResidualBlock<
    Element, ElementAcc, ElementCompute, Element, PYC_ALIGN_OUT,
    cutlass::epilogue::thread::Identity, cutlass::plus, PYC_ACT>;
#else
using OutputOp = cutlass::epilogue::thread::LinearCombinationGeneric<
    PYC_ACT, Element, PYC_ALIGN_OUT, ElementAcc, ElementCompute, kScale>;
#endif
using Tile = cutlass::gemm::GemmShape<PYC_TILE_M, PYC_TILE_N, PYC_TILE_K>;
using Warp = cutlass::gemm::GemmShape<PYC_WARP_M, PYC_WARP_N, PYC_WARP_K>;
// the forward kernel: with a residual, the same mainloop under the broadcast epilogue
#if PYC_RESIDUAL
#define PYC_FPROP cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast
#else
#define PYC_FPROP cutlass::conv::kernel::DefaultConv2dFprop
#endif
#if PYC_OP_ID == 0
using Kernel = typename PYC_FPROP<
    Element, Layout, Element, Layout, Element, Layout, ElementAcc,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, Tile, Warp, Instruction, OutputOp,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, PYC_STAGES,
    PYC_MATH, PYC_ITERATOR, cutlass::conv::StrideSupport::kStrided,
    PYC_ALIGN, PYC_ALIGN>::Kernel;
#elif PYC_OP_ID == 1
using Kernel = typename cutlass::conv::kernel::DefaultConv2dDgrad<
    Element, Layout, Element, Layout, Element, Layout, ElementAcc,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, Tile, Warp, Instruction, OutputOp,
    cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<1>, PYC_STAGES,
    PYC_MATH, PYC_ITERATOR, cutlass::conv::StrideSupport::kStrided,
    PYC_ALIGN, PYC_ALIGN>::Kernel;
#else
using Kernel = typename cutlass::conv::kernel::DefaultConv2dWgrad<
    Element, Layout, Element, Layout, Element, Layout, ElementAcc,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, Tile, Warp, Instruction, OutputOp,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, PYC_STAGES,
    PYC_MATH, PYC_ITERATOR, cutlass::conv::StrideSupport::kStrided,
    PYC_ALIGN, PYC_ALIGN>::Kernel;
#endif
using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
using Problem = cutlass::conv::Conv2dProblemSize;

static int out_extent(int n, int r, int pad, int stride, int dilation) {
  return (n + 2 * pad - dilation * (r - 1) - 1) / stride + 1;
}

// The problem from pyc_lab's packed geometry: activations (N, *spatial, C), filter
// (K, *kernel, C), per spatial axis the padding, stride and dilation (outermost first).
// One spatial axis is the width of a height-1 image. The output extent is computed here
// (CUTLASS's own formula for it is off by dilation - 1 when dilation > 1).
static Problem make_problem(const int* act, const int* flt, const int* pad, const int* stride,
                            const int* dilation) {
#if PYC_SPATIAL == 1
  const int n = act[0], h = 1, w = act[1], c = act[2];
  const int k = flt[0], r = 1, s = flt[1];
  const int ph = 0, pw = pad[0], sh = 1, sw = stride[0], dh = 1, dw = dilation[0];
#else
  const int n = act[0], h = act[1], w = act[2], c = act[3];
  const int k = flt[0], r = flt[1], s = flt[2];
  const int ph = pad[0], pw = pad[1], sh = stride[0], sw = stride[1];
  const int dh = dilation[0], dw = dilation[1];
#endif
  return Problem(n, h, w, c, k, r, s, out_extent(h, r, ph, sh, dh), out_extent(w, s, pw, sw, dw),
                 ph, pw, sh, sw, dh, dw, cutlass::conv::Mode::kCrossCorrelation, PYC_SPLIT_K, 1);
}

// The operands A, B and the output D of the operator (x, w -> y; dy, w -> dx; dy, x -> dw),
// each packed in the extent CUTLASS gives it; a residual kernel's residual r is packed as D.
static typename Conv::Arguments make_arguments(const Problem& p, const void* a, const void* b,
                                               const void* bias, void* d,
                                               const void* r = nullptr) {
  using Ref = cutlass::TensorRef<Element, Layout>;
  constexpr auto op = Kernel::kConvolutionalOperator;
  Ref ref_a(static_cast<Element*>(const_cast<void*>(a)),
            Layout::packed(cutlass::conv::implicit_gemm_tensor_a_extent(op, p)));
  Ref ref_b(static_cast<Element*>(const_cast<void*>(b)),
            Layout::packed(cutlass::conv::implicit_gemm_tensor_b_extent(op, p)));
  Ref ref_d(static_cast<Element*>(d),
            Layout::packed(cutlass::conv::implicit_gemm_tensor_c_extent(op, p)));
#if PYC_RESIDUAL
  // the residual as the C operand, the bias as the broadcast vector (one value per K)
  Ref ref_r(static_cast<Element*>(const_cast<void*>(r)),
            Layout::packed(cutlass::conv::implicit_gemm_tensor_c_extent(op, p)));
  typename OutputOp::Params epilogue(ElementCompute(1), ElementCompute(1));
  return typename Conv::Arguments(p, ref_a, ref_b, ref_r, ref_d, epilogue,
                                  cutlass::conv::SplitKMode::kSerial, const_cast<void*>(bias));
#else
  (void)r;
  // The bias as the C operand: a zero stride over N, P and Q leaves the K offset only.
  Ref ref_bias(static_cast<Element*>(const_cast<void*>(bias)), Layout(Layout::Stride(0)));
  typename OutputOp::Params epilogue(ElementCompute(1), ElementCompute(PYC_BIAS ? 1 : 0));
  return typename Conv::Arguments(p, ref_a, ref_b, PYC_BIAS ? ref_bias : ref_d, ref_d,
                                  epilogue, cutlass::conv::SplitKMode::kSerial);
#endif
}

struct Handle {
  Conv op;
  typename Conv::Arguments args;
  const void* residual = nullptr;  // a residual kernel's, for the next initialize
};
}  // namespace pyc

extern "C" {
// 0 (cutlass::Status::kSuccess) when the kernel can run the problem.
int pyc_conv_can_implement(const int* act, const int* flt, const int* pad, const int* stride,
                           const int* dilation) {
  auto problem = pyc::make_problem(act, flt, pad, stride, dilation);
  auto args = pyc::make_arguments(problem, nullptr, nullptr, nullptr, nullptr);
  return static_cast<int>(pyc::Conv::can_implement(args));
}
// Bytes of workspace (split-K's semaphores; none without); sm_count is taken for the 3x
// kernels' signature.
unsigned long long pyc_conv_workspace_size(const int* act, const int* flt, const int* pad,
                                           const int* stride, const int* dilation,
                                           int sm_count) {
  (void)sm_count;
  auto problem = pyc::make_problem(act, flt, pad, stride, dilation);
  auto args = pyc::make_arguments(problem, nullptr, nullptr, nullptr, nullptr);
  return static_cast<unsigned long long>(pyc::Conv::get_workspace_size(args));
}
void* pyc_conv_create() { return new pyc::Handle(); }
void pyc_conv_destroy(void* h) { delete static_cast<pyc::Handle*>(h); }
// Bind a problem and its pointers (kernel parameters, shared-memory attribute); 0 on
// success.
int pyc_conv_initialize(void* h, const int* act, const int* flt, const int* pad,
                        const int* stride, const int* dilation, const void* x, const void* w,
                        const void* bias, void* y, void* workspace, int sm_count,
                        void* stream) {
  (void)sm_count;
  auto* p = static_cast<pyc::Handle*>(h);
  auto problem = pyc::make_problem(act, flt, pad, stride, dilation);
  p->args = pyc::make_arguments(problem, x, w, bias, y, p->residual);
  auto st = p->op.can_implement(p->args);
  if (st != cutlass::Status::kSuccess) return static_cast<int>(st);
  return static_cast<int>(p->op.initialize(p->args, workspace,
                                            static_cast<cudaStream_t>(stream)));
}
// Launch the bound problem on a stream.
int pyc_conv_run(void* h, void* stream) {
  return static_cast<int>(static_cast<pyc::Handle*>(h)->op.run(static_cast<cudaStream_t>(stream)));
}
// A residual kernel's residual pointer, bound by the next pyc_conv_initialize.
void pyc_conv_set_residual(void* h, const void* r) { static_cast<pyc::Handle*>(h)->residual = r; }
int pyc_conv_has_residual() { return PYC_RESIDUAL; }
int pyc_conv_has_bias() { return PYC_BIAS; }
int pyc_conv_spatial() { return PYC_SPATIAL; }
int pyc_conv_op() { return PYC_OP_ID; }
}
