// pyc_small_gemm_k / _n / _t: out[m, n] = store(sum_k a[m, k] * b[k, n]) for a small GEMM:
// a small model's linear layer, where a library GEMM and the separate kernel applying its
// bias and activation are each a few microseconds of launch latency for a fraction of a
// microsecond of work, and where at large batch the libraries' kernels for short
// reductions and narrow outputs leave most of the GPU idle. One launch computes the
// product and hands every sum to `store`, the generated epilogue (bias, activation,
// rounding, the write), so the layer is one kernel.
//
// `a` is row-major with row stride `sam` (its k stride is 1); `b` has strides sbk, sbn.
//
// * pyc_small_gemm_k (M <= 64): b's k stride is 1 (the transposed view of a row-major
//   N x K weight, a linear layer's `x @ w.T`), column n at b + n * sbn. A warp owns a
//   column: its lanes read the column and the block's MT rows of `a` along k (VEC
//   elements per aligned load), and a butterfly of shuffles adds the lanes' partial sums;
//   lane m stores row m.
// * pyc_small_gemm_n (M <= 64): b's n stride is 1 (a row-major K x N weight, `x @ w`), row
//   k at b + k * sbk. A block owns 32 columns, one a lane, and its 8 warps split k (warp w
//   takes k = w, w + 8, ...); the warps' partial sums meet in shared memory and are added
//   in warp order.
//   In both a block computes MT consecutive rows (blockIdx.y * MT ...): rows past M read
//   row M - 1 and are never stored.
// * pyc_small_gemm_t (any M, either layout of b): a block owns a 32 x 32 tile of outputs,
//   a warp four rows of it and a lane one column; k is taken in chunks of 32, both
//   operands' chunks staged in shared memory by coalesced loads (b's along whichever
//   axis is contiguous) and padded with zeros past M, N and K.
// * pyc_small_gemm_e (any M, any strides of b): a thread owns one output, the block's
//   256 threads consecutive outputs of one product (row-major: lanes along n), and sums
//   its K terms alone — for short reductions over many small products (a graph network's
//   4096 products of 9 x 9 by 9 x 64) or short K (a 6-feature input layer), where a
//   tile's staging, barriers and idle rows cost more than the arithmetic. The lanes of a
//   warp read one row of `a` (a broadcast) and consecutive columns of `b`.
//
// A batch of products (blockIdx.z: `a` and `b` advanced by sab and sbb elements, each
// product's rows stored after the previous products' M rows) is one launch; a 2-D `b`
// shared by every product is the caller's single product of all the rows instead. Sums
// are kept in ACC (float; double for float64), one fused multiply-add a term; `load`
// converts a stored element to ACC. Every order of summation is fixed, so a result is
// the same from run to run.
//
// Launch: 256 threads; pyc_small_gemm_k on (ceil(N / 8), ceil(M / MT)) blocks,
// pyc_small_gemm_n on (ceil(N / 32), ceil(M / MT)) blocks, pyc_small_gemm_t on
// (ceil(N / 32), ceil(M / 32)) blocks, pyc_small_gemm_e on ceil(M * N / 256) blocks, each
// with the batch as its z extent. VEC > 1
// needs K % VEC == 0, `sam`, `sbn`, `sab` and `sbb` multiples of VEC and both pointers
// aligned to VEC elements.

__device__ __forceinline__ float pyc_sg_fma(float x, float y, float acc) {
    return fmaf(x, y, acc);
}
__device__ __forceinline__ double pyc_sg_fma(double x, double y, double acc) {
    return fma(x, y, acc);
}

template <typename T, typename ACC, int MT, int VEC, typename Load, typename Store>
__device__ __forceinline__ void pyc_small_gemm_k(const T* __restrict__ a,
                                                 const T* __restrict__ b, int M, int N, int K,
                                                 long long sam, long long sbn, long long sab,
                                                 long long sbb, Load load, Store store) {
    a += static_cast<long long>(blockIdx.z) * sab;
    b += static_cast<long long>(blockIdx.z) * sbb;
    const int zm = blockIdx.z * M;
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
            store(zm + m0 + m, n, acc[m]);
        }
    }
}

template <typename T, typename ACC, int MT, typename Load, typename Store>
__device__ __forceinline__ void pyc_small_gemm_n(const T* __restrict__ a,
                                                 const T* __restrict__ b, int M, int N, int K,
                                                 long long sam, long long sbk, long long sab,
                                                 long long sbb, Load load, Store store) {
    __shared__ ACC part[8][MT][32];
    a += static_cast<long long>(blockIdx.z) * sab;
    b += static_cast<long long>(blockIdx.z) * sbb;
    const int zm = blockIdx.z * M;
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
        store(zm + m0 + warp, n, sum);
    }
}

template <typename T, typename ACC, typename Load, typename Store>
__device__ __forceinline__ void pyc_small_gemm_t(const T* __restrict__ a,
                                                 const T* __restrict__ b, int M, int N, int K,
                                                 long long sam, long long sbk, long long sbn,
                                                 long long sab, long long sbb, Load load,
                                                 Store store) {
    __shared__ ACC as[32][33];  // as[row][k]; the pad keeps column reads conflict-free
    __shared__ ACC bs[32][33];  // bs[k][col]
    a += static_cast<long long>(blockIdx.z) * sab;
    b += static_cast<long long>(blockIdx.z) * sbb;
    const int zm = blockIdx.z * M;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int m0 = blockIdx.y * 32;
    const int n0 = blockIdx.x * 32;
    ACC acc[4];
    for (int r = 0; r < 4; ++r) {
        acc[r] = ACC(0);
    }
    for (int k0 = 0; k0 < K; k0 += 32) {
        for (int i = warp; i < 32; i += 8) {  // row i of the tile, k = k0 + lane
            const int m = m0 + i, k = k0 + lane;
            as[i][lane] = m < M && k < K ? load(a[static_cast<long long>(m) * sam + k])
                                         : ACC(0);
        }
        if (sbk == 1) {  // a column of b is contiguous: lanes along k
            for (int j = warp; j < 32; j += 8) {
                const int n = n0 + j, k = k0 + lane;
                bs[lane][j] = n < N && k < K ? load(b[static_cast<long long>(n) * sbn + k])
                                             : ACC(0);
            }
        } else {  // lanes along n
            for (int i = warp; i < 32; i += 8) {
                const int n = n0 + lane, k = k0 + i;
                bs[i][lane] = n < N && k < K ? load(b[static_cast<long long>(k) * sbk +
                                                      static_cast<long long>(n) * sbn])
                                             : ACC(0);
            }
        }
        __syncthreads();
        const int kn = K - k0 < 32 ? K - k0 : 32;
        for (int kk = 0; kk < kn; ++kk) {
            const ACC w = bs[kk][lane];
            for (int r = 0; r < 4; ++r) {
                acc[r] = pyc_sg_fma(as[warp * 4 + r][kk], w, acc[r]);
            }
        }
        __syncthreads();
    }
    const int n = n0 + lane;
    for (int r = 0; r < 4; ++r) {
        const int m = m0 + warp * 4 + r;
        if (m < M && n < N) {
            store(zm + m, n, acc[r]);
        }
    }
}

template <typename T, typename ACC, typename Load, typename Store>
__device__ __forceinline__ void pyc_small_gemm_e(const T* __restrict__ a,
                                                 const T* __restrict__ b, int M, int N, int K,
                                                 long long sam, long long sbk, long long sbn,
                                                 long long sab, long long sbb, Load load,
                                                 Store store) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= M * N) {
        return;  // no barrier below
    }
    a += static_cast<long long>(blockIdx.z) * sab;
    b += static_cast<long long>(blockIdx.z) * sbb;
    const int m = t / N, n = t - m * N;
    const T* row = a + static_cast<long long>(m) * sam;
    const T* col = b + static_cast<long long>(n) * sbn;
    ACC acc = ACC(0);
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
        acc = pyc_sg_fma(load(row[k]), load(col[static_cast<long long>(k) * sbk]), acc);
    }
    store(blockIdx.z * M + m, n, acc);
}
