
// ---- pyc_lab host wrapper ------------------------------------------------------------
using PycKernel = __NAME___base;
using PycGemm = __DEVICE__<PycKernel>;

struct PycHandle {
  PycGemm op;
  typename PycGemm::Arguments args;
  void* workspace = nullptr;
  unsigned long long workspace_bytes = 0;
};
__ARGUMENTS__
extern "C" {
// 0 (cutlass::Status::kSuccess) when the kernel can run an M x N x K problem.
int pyc_can_implement(int M, int N, int K) {
  auto args = pyc_arguments(M, N, K, nullptr, nullptr, nullptr, nullptr, 1.f, 0.f, nullptr, 1);
  return static_cast<int>(PycGemm::can_implement(args));
}
unsigned long long pyc_workspace_size(int M, int N, int K, int sm_count) {
  auto args = pyc_arguments(M, N, K, nullptr, nullptr, nullptr, nullptr, 1.f, 0.f, nullptr,
                            sm_count);
  return static_cast<unsigned long long>(PycGemm::get_workspace_size(args));
}
void* pyc_create() { return new PycHandle(); }
void pyc_destroy(void* h) { delete static_cast<PycHandle*>(h); }
// Bind a problem and its pointers (TMA descriptors, tile scheduler); 0 on success.
int pyc_initialize(void* h, int M, int N, int K, const void* A, const void* B, const void* C,
                   void* D, float alpha, float beta, const void* bias, void* workspace,
                   int sm_count, void* stream) {
  auto* p = static_cast<PycHandle*>(h);
  p->args = pyc_arguments(M, N, K, A, B, C, D, alpha, beta, bias, sm_count);
  auto st = p->op.can_implement(p->args);
  if (st != cutlass::Status::kSuccess) return static_cast<int>(st);
  p->workspace = workspace;
  p->workspace_bytes = static_cast<unsigned long long>(PycGemm::get_workspace_size(p->args));
  return static_cast<int>(p->op.initialize(p->args, workspace,
                                            static_cast<cudaStream_t>(stream)));
}
// Launch the bound problem on a stream (its workspace reset first, if it has one).
int pyc_run(void* h, void* stream) {
  auto* p = static_cast<PycHandle*>(h);
  auto s = static_cast<cudaStream_t>(stream);
  // (a CUDA graph captured from here replays the reset too)
  if (p->workspace_bytes) {
    int st = pyc_reset_workspace(p, s);
    if (st != 0) return st;
  }
  return static_cast<int>(p->op.run(s));
}
const char* pyc_kernel_name() { return "__NAME__"; }
int pyc_has_bias() { return PYC_BIAS; }
}
