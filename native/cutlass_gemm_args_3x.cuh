
static typename PycGemm::Arguments pyc_arguments(int M, int N, int K, const void* A,
                                                 const void* B, const void* C, void* D,
                                                 float alpha, float beta, const void* bias,
                                                 int sm_count) {
  using StrideA = typename PycKernel::StrideA;
  using StrideB = typename PycKernel::StrideB;
  using StrideC = typename PycKernel::StrideC;
  using StrideD = typename PycKernel::StrideD;
  typename PycGemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {M, N, K, 1};
  args.mainloop.ptr_A = static_cast<const typename PycGemm::ElementA*>(A);
  args.mainloop.dA = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(M, K, 1));
  args.mainloop.ptr_B = static_cast<const typename PycGemm::ElementB*>(B);
  args.mainloop.dB = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(N, K, 1));
  args.epilogue.thread.alpha = alpha;
  args.epilogue.thread.beta = beta;
#if PYC_BIAS
  args.epilogue.thread.bias_ptr = static_cast<const typename PycGemm::ElementD*>(bias);
#endif
  args.epilogue.ptr_C = static_cast<const typename PycGemm::ElementC*>(C);
  args.epilogue.dC = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(M, N, 1));
  args.epilogue.ptr_D = static_cast<typename PycGemm::ElementD*>(D);
  args.epilogue.dD = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(M, N, 1));
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sm_count;
  return args;
}

// Stream-K's fix-up barriers in the workspace only count up (arrive_inc / wait_eq): they
// must be zero again before every launch, as GemmUniversalAdapter's initialize leaves
// them. Without this the second launch of a Stream-K kernel waits forever.
static int pyc_reset_workspace(PycHandle* p, cudaStream_t stream) {
  return static_cast<int>(PycKernel::initialize_workspace(p->args, p->workspace, stream,
                                                          nullptr));
}
