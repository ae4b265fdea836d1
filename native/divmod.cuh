// NumPy's floor division and remainder (Python's semantics), as NumPy's loops compute
// them. Floats: npy_divmod — fmod, then the quotient (a - mod) / b floored and snapped
// to the nearest integer, the remainder given the divisor's sign, the signs of zero
// results kept; a zero divisor gives a / b and fmod(a, b) (inf or NaN). Integers: the
// quotient rounded toward minus infinity; a zero divisor gives 0 (NumPy warns), and the
// smallest value over -1 gives itself and remainder 0 (NumPy warns of the overflow).
template <typename T>
__device__ __forceinline__ T pyc_float_floor_divide(T a, T b) {
    if (b == T(0)) return a / b;
    const T mod = fmod(a, b);
    T div = (a - mod) / b;
    if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) div -= T(1);
    if (div != T(0)) {
        T fl = floor(div);
        if (div - fl > T(0.5)) fl += T(1);
        return fl;
    }
    return copysign(T(0), a / b);
}

template <typename T>
__device__ __forceinline__ T pyc_float_remainder(T a, T b) {
    T mod = fmod(a, b);
    if (b == T(0)) return mod;
    if (mod != T(0)) {
        if ((b < T(0)) != (mod < T(0))) mod += b;
    } else {
        mod = copysign(T(0), b);
    }
    return mod;
}

__device__ __forceinline__ float pyc_floor_divide(float a, float b) {
    return pyc_float_floor_divide<float>(a, b);
}
__device__ __forceinline__ double pyc_floor_divide(double a, double b) {
    return pyc_float_floor_divide<double>(a, b);
}
__device__ __forceinline__ float pyc_remainder(float a, float b) {
    return pyc_float_remainder<float>(a, b);
}
__device__ __forceinline__ double pyc_remainder(double a, double b) {
    return pyc_float_remainder<double>(a, b);
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

// NumPy's shifts (npy_lshift / npy_rshift): a shift by the bit width or more (or by a
// negative amount, which NumPy reads as a huge unsigned one) gives 0, or -1 for a right
// shift of a negative value; shifted in unsigned arithmetic, so a negative value's left
// shift wraps as NumPy's does.
template <typename T, typename U>
__device__ __forceinline__ T pyc_shift_left(T a, T b) {
    if (static_cast<U>(b) < sizeof(T) * 8) return static_cast<T>(static_cast<U>(a) << b);
    return 0;
}

template <typename T, typename U>
__device__ __forceinline__ T pyc_shift_right(T a, T b) {
    if (static_cast<U>(b) < sizeof(T) * 8) return a >> b;
    return a < 0 ? static_cast<T>(-1) : static_cast<T>(0);
}

__device__ __forceinline__ int pyc_left_shift(int a, int b) {
    return pyc_shift_left<int, unsigned int>(a, b);
}
__device__ __forceinline__ long long pyc_left_shift(long long a, long long b) {
    return pyc_shift_left<long long, unsigned long long>(a, b);
}
__device__ __forceinline__ int pyc_right_shift(int a, int b) {
    return pyc_shift_right<int, unsigned int>(a, b);
}
__device__ __forceinline__ long long pyc_right_shift(long long a, long long b) {
    return pyc_shift_right<long long, unsigned long long>(a, b);
}
