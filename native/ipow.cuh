// NumPy's integer power: exponentiation by squaring in unsigned arithmetic (so it wraps
// like NumPy). NumPy refuses negative exponents; here they give 0, except for bases 1
// and -1, whose powers stay 1 and +-1.
__device__ __forceinline__ int pyc_ipow(int base, int e) {
    if (e < 0) return base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0);
    unsigned int r = 1u, b = static_cast<unsigned int>(base);
    while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
    return static_cast<int>(r);
}

__device__ __forceinline__ long long pyc_ipow(long long base, long long e) {
    if (e < 0) return base == 1 ? 1LL : (base == -1 ? ((e & 1) ? -1LL : 1LL) : 0LL);
    unsigned long long r = 1ull, b = static_cast<unsigned long long>(base);
    while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
    return static_cast<long long>(r);
}
