// shapeproof — MXFP8 quantization of bf16 rows (sglang's `to_mxfp8`), sm_90a.
// Prepended by the library: common.cuh.
//
// One thread per 32-element block: four 16-byte loads, the block maximum, the E8M0 byte, then
// 32 e4m3 bytes stored as two 16-byte vectors. Launch: block 256 threads,
// grid ceil(rows * D/32 / 256). Memory-bound; used as the library's smoke kernel and as the
// quantizer of the staged (unfused) MXFP8 path.

// Mirrored by `Mxfp8QuantizeParams` in src/ops/mxfp8_quantize/cuda.rs (checked by the NVRTC tests).
struct Mxfp8QuantizeParams {
    const bf16_t* input;           // [rows, D]
    u8* data;                      // [rows, D] e4m3
    u8* scales;                    // [rows, D/32] E8M0
    i64 rows;
};

template <int D>
__global__ void __launch_bounds__(256) mxfp8_quantize_kernel(const Mxfp8QuantizeParams p) {
    static_assert(D % 32 == 0, "rows are whole 32-element blocks");
    const i64 block = (i64)blockIdx.x * blockDim.x + threadIdx.x;  // 32-element block index
    if (block >= p.rows * (D / 32)) {
        return;
    }
    const uint4* src = reinterpret_cast<const uint4*>(p.input + block * 32);
    uint4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = src[i];
    }
    float x[32];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            x[i * 8 + 2 * j] = __uint_as_float(w[j] << 16);
            x[i * 8 + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        amax = fmaxf(amax, fabsf(x[i]));
    }
    const u32 byte = mxfp8_scale_byte(amax);
    const float scale = e8m0_to_f32(byte);
    u32 packed[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 lo = mxfp8_quantize_pair(x[4 * i], x[4 * i + 1], scale);
        const u32 hi = mxfp8_quantize_pair(x[4 * i + 2], x[4 * i + 3], scale);
        packed[i] = lo | (hi << 16);
    }
    uint4* dst = reinterpret_cast<uint4*>(p.data + block * 32);
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    p.scales[block] = (u8)byte;
}
