// bfloat16 values are stored as their bits (the upper half of a float's) and computed in
// float. Rounding is to nearest even, NaN becomes the quiet NaN of its sign, and doubles
// and integers go through float first: all as ml_dtypes (NumPy's bfloat16) converts.
typedef unsigned short pyc_bf16;

__device__ __forceinline__ float pyc_bf16_to_float(pyc_bf16 h) {
    return __uint_as_float(static_cast<unsigned int>(h) << 16);
}

// Round to nearest even by bit arithmetic (any architecture; what the emulator checks).
__device__ __forceinline__ pyc_bf16 pyc_float_to_bf16_bits(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return static_cast<pyc_bf16>(((u >> 16) & 0x8000u) | 0x7fc0u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<pyc_bf16>(u >> 16);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// f rounded to nearest even, as the upper half of a float's bits (the lower half zero):
// sm_80+ rounds in the packed cvt.rn.bf16x2.f32, one full-rate F2FP instruction on
// sm_90 (subnormals kept: as the bit arithmetic, bit for bit). The scalar
// cvt.rn.bf16.f32 compiles to F2F, a quarter-rate conversion, and the bit arithmetic to
// seven integer instructions per op.
__device__ __forceinline__ unsigned int pyc_bf16_rounded_bits(float f) {
    unsigned int u;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(f), "f"(0.0f));
    return u;
}
#endif

// Rounded to nearest even; a NaN becomes ml_dtypes' quiet NaN of its sign.
__device__ __forceinline__ pyc_bf16 pyc_float_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return f != f ? static_cast<pyc_bf16>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7fc0u)
                  : static_cast<pyc_bf16>(pyc_bf16_rounded_bits(f) >> 16);
#else
    return pyc_float_to_bf16_bits(f);
#endif
}

__device__ __forceinline__ pyc_bf16 pyc_double_to_bf16(double d) {
    return pyc_float_to_bf16(static_cast<float>(d));
}

// The result of an op on bfloat16 arrays: rounded to the nearest bfloat16 (as NumPy with
// ml_dtypes does after every op), kept in a float for the next op.
__device__ __forceinline__ float pyc_round_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // a NaN stays the float it is (its sign kept): a store makes it ml_dtypes' NaN
    return f != f ? f : __uint_as_float(pyc_bf16_rounded_bits(f));
#else
    return pyc_bf16_to_float(pyc_float_to_bf16(f));
#endif
}

__device__ __forceinline__ float pyc_round_bf16(double d) {
    return pyc_round_bf16(static_cast<float>(d));
}

__device__ __forceinline__ float pyc_round_bf16(int i) {
    return pyc_round_bf16(static_cast<float>(i));
}

__device__ __forceinline__ float pyc_round_bf16(long long i) {
    return pyc_round_bf16(static_cast<float>(i));
}

__device__ __forceinline__ float pyc_round_bf16(bool b) {
    return b ? 1.0f : 0.0f;
}
