// shapeproof — definitions shared by every kernel in this folder.
//
// The library compiles kernels with NVRTC and no toolkit headers: this file is prepended to each
// kernel source before compilation (kernel files therefore carry no #include lines), so it may
// only use built-in CUDA C++ and inline PTX.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef long long i64;
typedef unsigned long long u64;

// A bf16 value as its 16 raw bits (no cuda_bf16.h under NVRTC).
struct bf16_t {
    u16 bits;
};

// bf16 -> f32 is exact: the bf16 bits are the high half of the f32 bits.
__device__ __forceinline__ float bf16_to_f32(bf16_t v) {
    return __uint_as_float(((u32)v.bits) << 16);
}

// f32 -> bf16, round to nearest even (NaN stays NaN).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return bf16_t{r};
}

// Round an f32 to the nearest bf16 and widen it back to f32.
__device__ __forceinline__ float round_bf16(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}

// Two f32 -> two packed bf16 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two f32 -> two packed e4m3 bytes (lo in the low byte), round to nearest even, saturating
// to +-448 (the OCP "satfinite" rule). NaN inputs give the e4m3 NaN byte 0x7F.
__device__ __forceinline__ u16 pack_e4m3x2(float lo, float hi) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two packed e4m3 bytes -> two f32 (exact).
__device__ __forceinline__ void unpack_e4m3x2(u16 v, float& lo, float& hi) {
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(v));
    u16 l16 = (u16)(h2 & 0xffffu), h16 = (u16)(h2 >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l16));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h16));
}

// Count one skipped bad index (a slot outside its buffer) when the caller asked for a counter.
__device__ __forceinline__ void count_bad_index(u32* counter) {
    if (counter != nullptr) {
        atomicAdd(counter, 1u);
    }
}

// ---- MXFP8 (OCP MX, block 32, E8M0 scale, E4M3 data), docs/kernels/prologue.md §1.7 ---------------------------
// Mirrored by src/dtype.rs (`mxfp8_scale_for`, `mxfp8_quantize`); the bytes must agree exactly,
// so everything here is IEEE (no fast log2, no approximate division).

// E8M0 scale byte of a block whose largest magnitude is `amax`:
// clamp(ceil(log2(max(amax, 1e-30) / 448)) + 127, 0, 254), the logarithm read off the bits.
__device__ __forceinline__ u32 mxfp8_scale_byte(float amax) {
    const float r = __fdiv_rn(fmaxf(amax, 1e-30f), 448.0f);
    const u32 bits = __float_as_uint(r);
    const int field = (int)(bits >> 23);
    const u32 mantissa = bits & 0x7fffffu;
    int ceil_log2;
    if (field == 0xff) {
        return 254u;  // r is +inf (amax is inf)
    } else if (field == 0) {
        const int floor_log2 = (31 - __clz(mantissa)) - 149;  // r = mantissa * 2^-149
        ceil_log2 = (mantissa & (mantissa - 1)) == 0 ? floor_log2 : floor_log2 + 1;
    } else {
        ceil_log2 = mantissa == 0 ? field - 127 : field - 126;
    }
    const int e = ceil_log2 + 127;
    return (u32)(e < 0 ? 0 : (e > 254 ? 254 : e));
}

// 2^(byte - 127) as an exact f32 (subnormal for byte 0).
__device__ __forceinline__ float e8m0_to_f32(u32 byte) {
    return byte == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(byte << 23);
}

// Two elements of a block with scale `scale` (= e8m0_to_f32(byte)) -> two packed e4m3 bytes:
// e4m3(clamp(x / scale, -448, 448)); fmin/fmax turn a NaN element into -448.
__device__ __forceinline__ u16 mxfp8_quantize_pair(float lo, float hi, float scale) {
    const float a = fminf(fmaxf(__fdiv_rn(lo, scale), -448.0f), 448.0f);
    const float b = fminf(fmaxf(__fdiv_rn(hi, scale), -448.0f), 448.0f);
    return pack_e4m3x2(a, b);
}

// The shared-memory address (32-bit, as PTX's .shared instructions take it) of a pointer into
// this CTA's shared memory.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{\n.reg .u64 t;\ncvta.to.shared.u64 t, %1;\ncvt.u32.u64 %0, t;\n}\n" : "=r"(r) : "l"(p));
    return r;
}

// The u32 whose unsigned order is the float's order (NaN as -inf, -0 below +0): the order the
// lightning indexer and the top-k select by (`order_key` of src/ops/indexer/cpu.rs).
__device__ __forceinline__ u32 order_key(float v) {
    if (v != v) v = __int_as_float(0xff800000);
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
