// float16 values are stored as their IEEE binary16 bits and computed in float.
typedef unsigned short pyc_f16;

__device__ __forceinline__ float pyc_f16_to_float(pyc_f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ pyc_f16 pyc_float_to_f16(float f) {
    pyc_f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ pyc_f16 pyc_double_to_f16(double d) {
    pyc_f16 h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));
    return h;
}

// The result of an op on float16 arrays: rounded to the nearest float16 (as NumPy does
// after every op), kept in a float for the next op.
__device__ __forceinline__ float pyc_round_f16(float f) {
    return pyc_f16_to_float(pyc_float_to_f16(f));
}

__device__ __forceinline__ float pyc_round_f16(double d) {
    return pyc_f16_to_float(pyc_double_to_f16(d));
}

__device__ __forceinline__ float pyc_round_f16(int i) {
    return pyc_round_f16(static_cast<double>(i));
}

__device__ __forceinline__ float pyc_round_f16(long long i) {
    return pyc_round_f16(static_cast<double>(i));
}

__device__ __forceinline__ float pyc_round_f16(bool b) {
    return b ? 1.0f : 0.0f;
}

// a / b for float16 values a and b whose quotient is rounded to float16 next: a float
// whose float16 rounding is that of the exact quotient, as NumPy's (IEEE float32
// division, then rounding) is. One approximate reciprocal (within 2 float32 ulps) and
// one Markstein correction put the quotient within 2**-43 of a/b before its float32
// rounding; a quotient of two float16 values that is not itself a float16 midpoint
// lies at least 2**-23 (relative) from every midpoint, so no rounding crosses one, and
// an exact midpoint is reached exactly (ties stay NumPy's). float16 ranges keep every
// step normal in float32 (1/b <= 2**24, a*r <= 2**40, a/b >= 2**-40). Special values:
// where the remainder is zero or NaN (a or b zero, infinite or NaN) the product a*r is
// the answer, -0.0 and all. IEEE float32 division costs a reciprocal, five fused
// multiply-adds and a range check with a branch to a slow path, per element.
__device__ __forceinline__ float pyc_div_f16(float a, float b) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    const float q = a * r;
    const float rem = fmaf(-b, q, a);
    return fabsf(rem) > 0.0f ? fmaf(rem, r, q) : q;
}
