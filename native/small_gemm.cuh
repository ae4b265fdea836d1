// pyc_small_gemm_k / pyc_small_gemm_n: out[m, n] = store(sum_k a[m, k] * b[k, n]) for a
// GEMM with few rows of `a` (M <= 64): a small model's linear layer at small batch, where
// a library GEMM and the separate kernel applying its bias and activation are each a few
// microseconds of launch latency for a fraction of a microsecond of work. One launch
// computes the product and hands every sum to `store`, the generated epilogue (bias,
// activation, rounding, the write), so the layer is one kernel.
//
// `a` is row-major with row stride `sam` (its k stride is 1); `b` is read in one of two
// layouts, a kernel each:
//
// * pyc_small_gemm_k: b's k stride is 1 (the transposed view of a row-major N x K weight,
//   a linear layer's `x @ w.T`), column n at b + n * sbn. A warp owns a column: its lanes
//   read the column and the block's MT rows of `a` along k (VEC elements per aligned
//   load), and a butterfly of shuffles adds the lanes' partial sums; lane m stores row m.
// * pyc_small_gemm_n: b's n stride is 1 (a row-major K x N weight, `x @ w`), row k at
//   b + k * sbk. A block owns 32 columns, one a lane, and its 8 warps split k (warp w
//   takes k = w, w + 8, ...); the warps' partial sums meet in shared memory and are added
//   in warp order.
//
// A block computes MT consecutive rows (blockIdx.y * MT ...): rows past M read row M - 1
// and are never stored. Sums are kept in ACC (float; double for float64), one fused
// multiply-add a term; `load` converts a stored element to ACC. Both orders of summation
// are fixed, so a result is the same from run to run.
//
// Launch: 256 threads; pyc_small_gemm_k on (ceil(N / 8), ceil(M / MT)) blocks,
// pyc_small_gemm_n on (ceil(N / 32), ceil(M / MT)) blocks. VEC > 1 needs K % VEC == 0,
// `sam` and `sbn` multiples of VEC and both pointers aligned to VEC elements.

__device__ __forceinline__ float pyc_sg_fma(float x, float y, float acc) {
    return fmaf(x, y, acc);
}
__device__ __forceinline__ double pyc_sg_fma(double x, double y, double acc) {
    return fma(x, y, acc);
}

template <typename T, typename ACC, int MT, int VEC, typename Load, typename Store>
__device__ __forceinline__ void pyc_small_gemm_k(const T* __restrict__ a,
                                                 const T* __restrict__ b, int M, int N, int K,
                                                 long long sam, long long sbn, Load load,
                                                 Store store) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= N) {
        return;  // the whole warp: nothing below waits for the other warps
    }
    const int m0 = blockIdx.y * MT;
    const T* rows[MT];
    for (int m = 0; m < MT; ++m) {
        rows[m] = a + static_cast<long long>(m0 + m < M ? m0 + m : M - 1) * sam;
    }
    const T* col = b + static_cast<long long>(n) * sbn;
    ACC acc[MT];
    for (int m = 0; m < MT; ++m) {
        acc[m] = ACC(0);
    }
    for (int k = lane * VEC; k < K; k += 32 * VEC) {
        const pyc_vec<T, VEC> w = *reinterpret_cast<const pyc_vec<T, VEC>*>(col + k);
        for (int m = 0; m < MT; ++m) {
            const pyc_vec<T, VEC> x = *reinterpret_cast<const pyc_vec<T, VEC>*>(rows[m] + k);
            for (int v = 0; v < VEC; ++v) {
                acc[m] = pyc_sg_fma(load(x.v[v]), load(w.v[v]), acc[m]);
            }
        }
    }
    for (int m = 0; m < MT; ++m) {
        for (int offset = 16; offset > 0; offset >>= 1) {
            acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
        }
    }
    for (int m = 0; m < MT; ++m) {
        if (lane == m && m0 + m < M) {
            store(m0 + m, n, acc[m]);
        }
    }
}

template <typename T, typename ACC, int MT, typename Load, typename Store>
__device__ __forceinline__ void pyc_small_gemm_n(const T* __restrict__ a,
                                                 const T* __restrict__ b, int M, int N, int K,
                                                 long long sam, long long sbk, Load load,
                                                 Store store) {
    __shared__ ACC part[8][MT][32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int n = blockIdx.x * 32 + lane;
    const int m0 = blockIdx.y * MT;
    const T* rows[MT];
    for (int m = 0; m < MT; ++m) {
        rows[m] = a + static_cast<long long>(m0 + m < M ? m0 + m : M - 1) * sam;
    }
    const T* col = b + (n < N ? n : N - 1);
    ACC acc[MT];
    for (int m = 0; m < MT; ++m) {
        acc[m] = ACC(0);
    }
    for (int k = warp; k < K; k += 8) {
        const ACC w = load(col[static_cast<long long>(k) * sbk]);
        for (int m = 0; m < MT; ++m) {
            acc[m] = pyc_sg_fma(load(rows[m][k]), w, acc[m]);
        }
    }
    for (int m = 0; m < MT; ++m) {
        part[warp][m][lane] = acc[m];
    }
    __syncthreads();
    if (warp < MT && n < N && m0 + warp < M) {
        ACC sum = part[0][warp][lane];
        for (int w = 1; w < 8; ++w) {
            sum += part[w][warp][lane];
        }
        store(m0 + warp, n, sum);
    }
}
