// Combining operators. max/min propagate NaN like NumPy (x != x only for NaN).
struct pyc_sum_op {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

// On sm_80+ a float takes one max.NaN/min.NaN instruction (a NaN operand gives NaN)
// instead of two NaN tests, a compare and a select: the generic form made the float16
// row kernels issue-bound (benchmarks/exp_row_alu.py). Only the sign of a zero result
// may differ, and that depends on the reduction order already.
struct pyc_max_op {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const {
        return a != a ? a : (b != b ? b : (a > b ? a : b));
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __device__ __forceinline__ float operator()(float a, float b) const {
        float r;
        asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
        return r;
    }
#endif
};

struct pyc_min_op {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const {
        return a != a ? a : (b != b ? b : (a < b ? a : b));
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __device__ __forceinline__ float operator()(float a, float b) const {
        float r;
        asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
        return r;
    }
#endif
};

// Butterfly over the 32 lanes of a warp: every lane ends with the same total.
template <typename T, typename Op>
__device__ __forceinline__ T pyc_warp_reduce(T v, Op op) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Across the warps of a block (blockDim.x a multiple of 32, at most 1024): each warp
// reduces, lane 0 of each writes its total to shared memory, then every warp reduces
// those totals, so every thread gets the result without a broadcast step. The leading
// barrier lets a previous call's readers finish before smem is overwritten.
template <typename T, typename Op>
__device__ __forceinline__ T pyc_block_reduce(T v, Op op, T identity, T* smem) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = pyc_warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x >> 5;
    v = lane < nwarps ? smem[lane] : identity;
    return pyc_warp_reduce(v, op);
}

// Across the TY threads sharing a row in a column program (a block is TX lanes across
// neighbouring rows by TY threads along them; thread = ty * TX + tx): a tree over ty in
// shared memory, in a fixed order, so every thread of the row gets the same total and
// results do not change from run to run. The leading barrier lets a previous call's
// readers finish before smem (TX * TY values) is overwritten.
template <int TX, int TY, typename T, typename Op>
__device__ __forceinline__ T pyc_column_reduce(T v, Op op, T* smem) {
    if (TY == 1) return v;  // a row that is one thread's alone
    const int tx = threadIdx.x % TX;
    const int ty = threadIdx.x / TX;
    __syncthreads();
    smem[ty * TX + tx] = v;
    __syncthreads();
#pragma unroll
    for (int s = TY / 2; s > 0; s >>= 1) {
        if (ty < s) smem[ty * TX + tx] = op(smem[ty * TX + tx], smem[(ty + s) * TX + tx]);
        __syncthreads();
    }
    return smem[tx];
}
