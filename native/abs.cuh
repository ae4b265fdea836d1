// |x| for every compute type (NumPy's absolute).
__device__ __forceinline__ float pyc_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double pyc_abs(double x) { return fabs(x); }
__device__ __forceinline__ int pyc_abs(int x) { return x < 0 ? -x : x; }
__device__ __forceinline__ long long pyc_abs(long long x) { return x < 0 ? -x : x; }
__device__ __forceinline__ bool pyc_abs(bool x) { return x; }
