// NumPy's floor division and remainder (Python's semantics), as NumPy's loops compute
// them. Floats: npy_divmod — fmod, then the quotient (a - mod) / b floored and snapped
// to the nearest integer, the remainder given the divisor's sign, the signs of zero
// results kept; a zero divisor gives a / b and fmod(a, b) (inf or NaN). Integers: the
// quotient rounded toward minus infinity; a zero divisor gives 0 (NumPy warns), and the
// smallest value over -1 gives itself and remainder 0 (NumPy warns of the overflow).
__device__ __forceinline__ float pyc_floor_divide(float a, float b) {
    if (b == 0.0f) return a / b;
    float mod = fmodf(a, b);
    float div = (a - mod) / b;
    if (mod != 0.0f) {
        if ((b < 0.0f) != (mod < 0.0f)) div -= 1.0f;
    }
    if (div != 0.0f) {
        float fl = floorf(div);
        if (div - fl > 0.5f) fl += 1.0f;
        return fl;
    }
    return copysignf(0.0f, a / b);
}

__device__ __forceinline__ double pyc_floor_divide(double a, double b) {
    if (b == 0.0) return a / b;
    double mod = fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0.0) {
        if ((b < 0.0) != (mod < 0.0)) div -= 1.0;
    }
    if (div != 0.0) {
        double fl = floor(div);
        if (div - fl > 0.5) fl += 1.0;
        return fl;
    }
    return copysign(0.0, a / b);
}

__device__ __forceinline__ float pyc_remainder(float a, float b) {
    float mod = fmodf(a, b);
    if (b == 0.0f) return mod;
    if (mod != 0.0f) {
        if ((b < 0.0f) != (mod < 0.0f)) mod += b;
    } else {
        mod = copysignf(0.0f, b);
    }
    return mod;
}

__device__ __forceinline__ double pyc_remainder(double a, double b) {
    double mod = fmod(a, b);
    if (b == 0.0) return mod;
    if (mod != 0.0) {
        if ((b < 0.0) != (mod < 0.0)) mod += b;
    } else {
        mod = copysign(0.0, b);
    }
    return mod;
}

template <typename T>
__device__ __forceinline__ T pyc_int_floor_divide(T a, T b, T smallest) {
    if (b == 0) return 0;
    if (a == smallest && b == -1) return smallest;
    T q = a / b;
    if (((a < 0) != (b < 0)) && q * b != a) q -= 1;
    return q;
}

template <typename T>
__device__ __forceinline__ T pyc_int_remainder(T a, T b, T smallest) {
    if (b == 0 || (a == smallest && b == -1)) return 0;
    T r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

__device__ __forceinline__ int pyc_floor_divide(int a, int b) {
    return pyc_int_floor_divide<int>(a, b, static_cast<int>(0x80000000u));
}
__device__ __forceinline__ long long pyc_floor_divide(long long a, long long b) {
    return pyc_int_floor_divide<long long>(a, b,
                                           static_cast<long long>(0x8000000000000000ull));
}
__device__ __forceinline__ int pyc_remainder(int a, int b) {
    return pyc_int_remainder<int>(a, b, static_cast<int>(0x80000000u));
}
__device__ __forceinline__ long long pyc_remainder(long long a, long long b) {
    return pyc_int_remainder<long long>(a, b, static_cast<long long>(0x8000000000000000ull));
}
