// shapeproof — DeepSeek V3.2's FP8 sparse MLA cache: the store and the gather, sm_90a.
// Prepended by the library: common.cuh. docs/kernels/mla_cache.md states the format.
//
// A cache row (one token, 656 bytes): bytes 0..512 the e4m3 latent values, 512..528 four f32
// scales (one per 128 latent channels), 528..656 the 64 bf16 RoPE values. Slot s is the row at
// byte s * 656 (pages of 64 tokens are contiguous, so the page size never enters the address).
//
// Both kernels give one warp ROWS consecutive rows (1 for short calls, which need every SM they
// can get, 4 for long ones, which need bytes in flight): 256 threads, grid ceil(rows / (8 ROWS))
// (at least 1). Mirrored
// bit for bit by src/layout/mla_fp8.rs (`mla_fp8_encode_row`, `mla_fp8_decode_row`): IEEE
// division and multiplication only, no fast math.

namespace mla_cache {
constexpr int kLatent = 512;
constexpr int kRope = 64;
constexpr int kDim = kLatent + kRope;        // 576 values a row in and out
constexpr int kRowBytes = 656;               // bytes of a cache row
constexpr int kScalesAt = kLatent;           // byte offset of the four f32 scales
constexpr int kRopeAt = kLatent + 16;        // byte offset of the RoPE values
constexpr float kMinScale = 1.0f / 8192.0f;  // 2^-13, the power of two at or above 1e-4

// The group scale for a largest magnitude `amax`: the smallest power of two at or above
// max(amax / 448, 2^-13), +inf when amax is.
__device__ __forceinline__ float scale_for(float amax) {
    const float r = fmaxf(__fdiv_rn(amax, 448.0f), kMinScale);
    const u32 bits = __float_as_uint(r);
    if ((bits & 0x7f800000u) == 0x7f800000u) {
        return __uint_as_float(0x7f800000u);
    }
    return (bits & 0x007fffffu) == 0 ? r : __uint_as_float((bits & 0x7f800000u) + 0x00800000u);
}

// x / scale as the encoder computes it: a multiplication by the exact reciprocal of a finite
// power of two, a division by +inf otherwise.
__device__ __forceinline__ float scaled(float x, float scale, float inv) {
    return (__float_as_uint(scale) & 0x7fffffffu) == 0x7f800000u ? __fdiv_rn(x, scale)
                                                                : __fmul_rn(x, inv);
}

// Eight bf16 values (a 16-byte vector) widened to f32.
__device__ __forceinline__ void widen8(const uint4 v, float* x) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        x[2 * j] = __uint_as_float(w[j] << 16);
        x[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

// Four f32 values to four packed e4m3 bytes (first value in the low byte).
__device__ __forceinline__ u32 pack4(float a, float b, float c, float d) {
    return (u32)pack_e4m3x2(a, b) | ((u32)pack_e4m3x2(c, d) << 16);
}
}  // namespace mla_cache

// Mirrored by `MlaCacheStoreParams` in src/ops/mla_cache/cuda.rs (checked by the NVRTC tests).
struct MlaCacheStoreParams {
    const bf16_t* kv;   // [tokens, 576]
    const i64* loc;     // [tokens] cache slot of each token; negative: not stored
    u8* cache;          // [slots, 656]
    u32* skipped;       // [1] or null: tokens whose slot is past the cache
    i32 tokens;
    i32 slots;
};

// A warp takes ROWS consecutive tokens: first every load of all of them (their slots,
// latent vectors and RoPE values in flight together), then each token's quantization. Lane l
// quantizes the 16-byte vectors l and l + 32 of a token's latent values (groups l / 16 and
// 2 + l / 16; a group is 16 lanes, reduced by xor shuffles that stay inside the half warp) and
// lanes 0..7 copy the RoPE values. Every branch is uniform across the warp.
template <int GROUP, int ROWS>
__global__ void __launch_bounds__(256) mla_cache_store_kernel(const MlaCacheStoreParams p) {
    using namespace mla_cache;
    static_assert(GROUP == 128, "the format scales groups of 128 latent channels");
    const int lane = threadIdx.x & 31;
    const i64 t0 = ((i64)blockIdx.x * 8 + (threadIdx.x >> 5)) * ROWS;
    i64 loc[ROWS];
    uint4 latent[ROWS][2];
    uint4 rope[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const i64 t = t0 + r;
        loc[r] = t < p.tokens ? p.loc[t] : -1;
        if (t < p.tokens) {
            const uint4* src = reinterpret_cast<const uint4*>(p.kv + t * kDim);
            latent[r][0] = src[lane];
            latent[r][1] = src[lane + 32];
            rope[r] = src[kLatent / 8 + (lane & 7)];
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if (loc[r] < 0) {
            continue;  // padding, or past the last token
        }
        if (loc[r] >= p.slots) {
            if (lane == 0) {
                count_bad_index(p.skipped);
            }
            continue;
        }
        u8* dst = p.cache + loc[r] * kRowBytes;
        float group_scale[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int vec = lane + 32 * half;  // values 8 vec .. 8 vec + 8, group vec / 16
            float x[8];
            widen8(latent[r][half], x);
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                amax = fmaxf(amax, fabsf(x[i]));  // a NaN value is ignored
            }
#pragma unroll
            for (int off = 8; off >= 1; off >>= 1) {
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            }
            const float scale = scale_for(amax);
            const float inv = __fdiv_rn(1.0f, scale);
            group_scale[half] = scale;
            const u32 lo = pack4(scaled(x[0], scale, inv), scaled(x[1], scale, inv),
                                 scaled(x[2], scale, inv), scaled(x[3], scale, inv));
            const u32 hi = pack4(scaled(x[4], scale, inv), scaled(x[5], scale, inv),
                                 scaled(x[6], scale, inv), scaled(x[7], scale, inv));
            *reinterpret_cast<uint2*>(dst + 8 * vec) = make_uint2(lo, hi);
        }
        const float s0 = __shfl_sync(0xffffffffu, group_scale[0], 0);
        const float s1 = __shfl_sync(0xffffffffu, group_scale[0], 16);
        const float s2 = __shfl_sync(0xffffffffu, group_scale[1], 0);
        const float s3 = __shfl_sync(0xffffffffu, group_scale[1], 16);
        if (lane == 0) {
            *reinterpret_cast<float4*>(dst + kScalesAt) = make_float4(s0, s1, s2, s3);
        }
        if (lane < kRope / 8) {
            reinterpret_cast<uint4*>(dst + kRopeAt)[lane] = rope[r];
        }
    }
}

// Mirrored by `MlaCacheGatherParams` in src/ops/mla_cache/cuda.rs (checked by the NVRTC tests).
struct MlaCacheGatherParams {
    const u8* cache;    // [slots, 656]
    const i32* index;   // [rows] cache slot of each workspace row
    u8* data;           // [rows, 576] e4m3 workspace
    float* scale;       // [1] the workspace's scale, set to 1
    u32* skipped;       // [1] or null: rows whose slot is past the cache
    i32 rows;
    i32 slots;
};

// A warp takes ROWS consecutive rows: first their slots, then every load of all of
// them in flight together, then each row's re-cast. Lane l re-casts latent bytes 16 l .. 16 l
// + 16 (group l / 8); lanes 0..7 cast the RoPE values. A row without a valid slot is written as
// zeros. Every branch is uniform across the warp.
template <int GROUP, int ROWS>
__global__ void __launch_bounds__(256) mla_cache_gather_kernel(const MlaCacheGatherParams p) {
    using namespace mla_cache;
    static_assert(GROUP == 128, "the format scales groups of 128 latent channels");
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        p.scale[0] = 1.0f;
    }
    const int lane = threadIdx.x & 31;
    const i64 r0 = ((i64)blockIdx.x * 8 + (threadIdx.x >> 5)) * ROWS;
    i32 slot[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        slot[r] = r0 + r < p.rows ? p.index[r0 + r] : -1;
    }
    uint4 latent[ROWS];
    uint4 rope[ROWS];
    float scale[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if (slot[r] >= 0 && slot[r] < p.slots) {
            const u8* src = p.cache + (i64)slot[r] * kRowBytes;
            latent[r] = reinterpret_cast<const uint4*>(src)[lane];
            scale[r] = reinterpret_cast<const float*>(src + kScalesAt)[lane / 8];
            rope[r] = reinterpret_cast<const uint4*>(src + kRopeAt)[lane & 7];
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if (r0 + r >= p.rows) {
            break;
        }
        u8* out = p.data + (r0 + r) * kDim;
        if (slot[r] < 0 || slot[r] >= p.slots) {
            if (slot[r] >= p.slots && lane == 0) {
                count_bad_index(p.skipped);
            }
            reinterpret_cast<uint4*>(out)[lane] = make_uint4(0, 0, 0, 0);
            if (lane < kRope / 16) {
                reinterpret_cast<uint4*>(out + kLatent)[lane] = make_uint4(0, 0, 0, 0);
            }
            continue;
        }
        const u32 w[4] = {latent[r].x, latent[r].y, latent[r].z, latent[r].w};
        u32 packed[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float a, b, c, d;
            unpack_e4m3x2((u16)(w[j] & 0xffffu), a, b);
            unpack_e4m3x2((u16)(w[j] >> 16), c, d);
            packed[j] = pack4(__fmul_rn(a, scale[r]), __fmul_rn(b, scale[r]),
                              __fmul_rn(c, scale[r]), __fmul_rn(d, scale[r]));
        }
        reinterpret_cast<uint4*>(out)[lane] =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
        if (lane < kRope / 8) {
            float x[8];
            widen8(rope[r], x);
            *reinterpret_cast<uint2*>(out + kLatent + 8 * lane) =
                make_uint2(pack4(x[0], x[1], x[2], x[3]), pack4(x[4], x[5], x[6], x[7]));
        }
    }
}
