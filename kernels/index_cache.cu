// shapeproof — the lightning indexer's paged key cache: the store, sm_90a.
// Prepended by the library: common.cuh. docs/kernels/indexer.md §6 states the format.
//
// A page (PAGE = 64 tokens, 8448 bytes): bytes 0..8192 the 64 keys' e4m3 bytes (128 a key),
// 8192..8448 their 64 f32 scales. Slot s is offset s % 64 of page s / 64.
//
// One warp a token, eight a block: lane l widens the key's values 4l .. 4l + 4, the warp reduces
// their largest magnitude, and lane l writes their four e4m3 bytes; lane 0 writes the scale.
// Mirrored bit for bit by src/layout/index_cache.rs (`index_key_encode`): IEEE division and
// multiplication only, no fast math.

namespace index_cache {
constexpr int kDim = 128;                    // channels of a key
constexpr int kPage = 64;                    // tokens of a page
constexpr int kPageBytes = kPage * (kDim + 4);
constexpr float kAmaxFloor = 1e-4f;          // a key's largest magnitude is floored here

// The scale for a largest magnitude `amax`: the smallest power of two at or above
// max(amax, 1e-4) / 448, +inf when amax is.
__device__ __forceinline__ float scale_for(float amax) {
    const float r = __fdiv_rn(fmaxf(amax, kAmaxFloor), 448.0f);
    const u32 bits = __float_as_uint(r);
    if ((bits & 0x7f800000u) == 0x7f800000u) {
        return __uint_as_float(0x7f800000u);
    }
    return (bits & 0x007fffffu) == 0 ? r : __uint_as_float((bits & 0x7f800000u) + 0x00800000u);
}
}  // namespace index_cache

// Mirrored by `IndexKeyStoreParams` in src/ops/index_cache/cuda.rs (checked by the NVRTC tests).
struct IndexKeyStoreParams {
    const bf16_t* k;    // [tokens, 128]
    const i64* loc;     // [tokens] cache slot of each token; negative: not stored
    u8* cache;          // [slots / 64, 8448]
    u32* skipped;       // [1] or null: tokens whose slot is past the cache
    i32 tokens;
    i32 slots;
};

template <int PAGE>
__global__ void __launch_bounds__(256) index_key_store_kernel(const IndexKeyStoreParams p) {
    using namespace index_cache;
    static_assert(PAGE == kPage, "pages of 64 tokens");
    const int lane = threadIdx.x & 31;
    const i64 t = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (t >= p.tokens) {
        return;  // uniform over the warp
    }
    const i64 loc = p.loc[t];
    if (loc < 0) {
        return;  // padding
    }
    if (loc >= p.slots) {
        if (lane == 0) {
            count_bad_index(p.skipped);
        }
        return;
    }
    const uint2 v = reinterpret_cast<const uint2*>(p.k + t * kDim)[lane];
    const float x[4] = {__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                        __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u)};
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        amax = fmaxf(amax, fabsf(x[i]));  // a NaN value is ignored
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    const float scale = scale_for(amax);
    const bool inf = (__float_as_uint(scale) & 0x7fffffffu) == 0x7f800000u;
    const float inv = __fdiv_rn(1.0f, scale);
    float q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q[i] = inf ? __fdiv_rn(x[i], scale) : __fmul_rn(x[i], inv);
    }
    const u32 packed = (u32)pack_e4m3x2(q[0], q[1]) | ((u32)pack_e4m3x2(q[2], q[3]) << 16);
    u8* page = p.cache + (loc / kPage) * kPageBytes;
    const int offset = (int)(loc % kPage);
    reinterpret_cast<u32*>(page + offset * kDim)[lane] = packed;
    if (lane == 0) {
        reinterpret_cast<float*>(page + kPage * kDim)[offset] = scale;
    }
}

// Mirrored by `IndexKeyGatherParams` in src/ops/index_cache/cuda.rs (checked by the NVRTC tests).
struct IndexKeyGatherParams {
    const u8* cache;    // [slots / 64, 8448]
    const i32* index;   // [rows] cache slot of each row; negative or past the cache: a zero row
    u8* k;              // [rows, 128] out
    float* k_scale;     // [rows] out
    u32* skipped;       // [1] or null: rows whose slot is past the cache
    i32 rows;
    i32 slots;
};

// One warp a row, eight a block: lane l copies the key's bytes 4l .. 4l + 4, lane 0 its scale.
template <int PAGE>
__global__ void __launch_bounds__(256) index_key_gather_kernel(const IndexKeyGatherParams p) {
    using namespace index_cache;
    static_assert(PAGE == kPage, "pages of 64 tokens");
    const int lane = threadIdx.x & 31;
    const i64 r = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= p.rows) {
        return;  // uniform over the warp
    }
    const i32 slot = p.index[r];
    u32 bytes = 0;
    float scale = 0.0f;
    if (slot >= 0 && slot < p.slots) {
        const u8* page = p.cache + (i64)(slot / kPage) * kPageBytes;
        const int offset = slot % kPage;
        bytes = reinterpret_cast<const u32*>(page + offset * kDim)[lane];
        scale = reinterpret_cast<const float*>(page + kPage * kDim)[offset];
    } else if (slot >= p.slots && lane == 0) {
        count_bad_index(p.skipped);
    }
    reinterpret_cast<u32*>(p.k + r * kDim)[lane] = bytes;
    if (lane == 0) {
        p.k_scale[r] = scale;
    }
}
