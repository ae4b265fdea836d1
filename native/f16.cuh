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
