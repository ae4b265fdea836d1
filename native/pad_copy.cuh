// Copies between a matrix whose lines start anywhere and one whose lines start 16-byte
// aligned, for GEMMs the libraries run slowly on unaligned operands (kernels/padded.py).
//
// A matrix is seen as `lines` lines of `len` contiguous elements, line i starting at
// element i * ld: the rows of a row-major matrix, the columns of a column-major one.
// Elements are moved as raw bits (T is an unsigned integer of the element's size), so
// NaN payloads, infinities and signed zeros arrive unchanged.
//
// - pyc_pad_lines: the source into an aligned destination of dst_lines x dst_len, with
//   zeros beyond the source's lines and lengths (zeros that a GEMM may read: padding the
//   reduction extent K with zeros in both operands leaves every sum unchanged). Each
//   thread gathers V = 16 / sizeof(T) elements and writes them with one 16-byte store.
// - pyc_unpad_lines: the first `len` elements of each aligned source line into a
//   destination of any leading dimension; 16-byte loads, element stores.
// - pyc_unpad_flat: the same into a contiguous, 16-byte aligned destination (dst_ld ==
//   len), walked as one flat array so that every store is a 16-byte store.
//
// Grids stride over lines (y) and over positions in a line (x); any grid is correct.

template <typename T>
union pyc_pad_vec {
  uint4 v;
  T e[16 / sizeof(T)];
};

template <typename T>
__global__ void pyc_pad_lines(const T* __restrict__ src, long long src_ld, int src_lines,
                              int src_len, T* __restrict__ dst, long long dst_ld,
                              int dst_lines, int dst_len) {
  constexpr int V = 16 / sizeof(T);
  for (int line = blockIdx.y; line < dst_lines; line += gridDim.y) {
    const T* s = src + (long long)line * src_ld;
    T* d = dst + (long long)line * dst_ld;
    const int have = line < src_lines ? src_len : 0;
    for (int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * V; i0 < dst_len;
         i0 += gridDim.x * blockDim.x * V) {
      pyc_pad_vec<T> u;
#pragma unroll
      for (int j = 0; j < V; ++j) u.e[j] = i0 + j < have ? s[i0 + j] : T(0);
      if (i0 + V <= dst_len) {
        *reinterpret_cast<uint4*>(d + i0) = u.v;
      } else {
        for (int j = 0; i0 + j < dst_len; ++j) d[i0 + j] = u.e[j];
      }
    }
  }
}

template <typename T>
__global__ void pyc_unpad_lines(const T* __restrict__ src, long long src_ld,
                                T* __restrict__ dst, long long dst_ld, int lines, int len) {
  constexpr int V = 16 / sizeof(T);
  for (int line = blockIdx.y; line < lines; line += gridDim.y) {
    const T* s = src + (long long)line * src_ld;
    T* d = dst + (long long)line * dst_ld;
    for (int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * V; i0 < len;
         i0 += gridDim.x * blockDim.x * V) {
      pyc_pad_vec<T> u;
      u.v = *reinterpret_cast<const uint4*>(s + i0);  // src_ld covers len rounded up to V
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (i0 + j < len) d[i0 + j] = u.e[j];
      }
    }
  }
}

template <typename T>
__global__ void pyc_unpad_flat(const T* __restrict__ src, long long src_ld,
                               T* __restrict__ dst, int lines, int len) {
  constexpr int V = 16 / sizeof(T);
  const long long total = (long long)lines * len;
  for (long long f0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * V; f0 < total;
       f0 += (long long)gridDim.x * blockDim.x * V) {
    long long line = f0 / len;
    int i = (int)(f0 - line * len);
    pyc_pad_vec<T> u;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (f0 + j < total) u.e[j] = src[line * src_ld + i];
      if (++i == len) {
        i = 0;
        ++line;
      }
    }
    if (f0 + V <= total) {
      *reinterpret_cast<uint4*>(dst + f0) = u.v;
    } else {
      for (int j = 0; f0 + j < total; ++j) dst[f0 + j] = u.e[j];
    }
  }
}
