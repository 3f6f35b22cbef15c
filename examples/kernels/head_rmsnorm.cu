// shapeproof example — a user-declared kernel: per-head RMSNorm of bf16 rows.
// Prepended by the library: common.cuh (bf16_t, f32 <-> bf16, integer typedefs).
//
// x [rows, HEADS, HD] -> out [rows, HEADS, HD], out = x / sqrt(mean(x^2) + eps) * gamma, one
// warp per (row, head): lane l holds channels l, l + 32, …, sums their squares with fmaf in
// that order, and an xor butterfly over the warp completes the sum. Every step is IEEE round
// to nearest (no contraction, no fast reciprocal square root), so the CPU path in
// head_rmsnorm.rs reproduces the bits exactly. Launch: 128-thread blocks (4 warps),
// grid ceil(rows * HEADS / 4).

// Mirrored by `HeadRmsNormParams` in head_rmsnorm.rs.
struct HeadRmsNormParams {
    const bf16_t* x;      // [rows, HEADS * HD]
    const bf16_t* gamma;  // [HD]
    bf16_t* out;          // [rows, HEADS * HD]
    i64 rows;
    float eps;
};

template <int HEADS, int HD>
__global__ void __launch_bounds__(128) head_rmsnorm_kernel(const HeadRmsNormParams p) {
    static_assert(HD % 32 == 0 && HD <= 1024, "a warp holds one head, HD / 32 channels per lane");
    constexpr int PER_LANE = HD / 32;
    const i64 head = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32;  // (row, head) index
    const int lane = threadIdx.x % 32;
    if (head >= p.rows * HEADS) {
        return;  // the whole warp leaves together
    }
    const bf16_t* x = p.x + head * HD;
    bf16_t* out = p.out + head * HD;

    float v[PER_LANE];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        v[i] = bf16_to_f32(x[lane + 32 * i]);
        sum = fmaf(v[i], v[i], sum);
    }
#pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) {
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, mask));
    }
    const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(sum, (float)HD), p.eps)));
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const float g = bf16_to_f32(p.gamma[lane + 32 * i]);
        out[lane + 32 * i] = f32_to_bf16(__fmul_rn(__fmul_rn(v[i], inv), g));
    }
}
