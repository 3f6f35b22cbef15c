// Definitions shared by the two sparse MLA prefill kernels (sparse_mla_prefill.cu, 64-head tiles,
// and sparse_mla_narrow.cu, 8/16/32-head tiles and its own 64-head tile): their parameter block
// and the sm_90a PTX helpers they use (mbarriers, cp.async and bulk
// copies, named barriers and their OR vote, ldmatrix, wgmma fences and descriptors, the S = Q.K^T
// wgmma and the Q tile load of the 64-head kernels; the benchmark's bulk-copy gather limit uses
// them too).
// Compiled after common.cuh and before either kernel file.

// Parameters of one launch of either sparse MLA kernel (64-head and narrow tiles). Mirrored field
// by field by `SparseMlaParams` in src/ops/sparse_mla/cuda.rs: change both together (the NVRTC
// tests assert the two layouts equal).
struct SparseMlaParams {
    const u8* q;                   // [s_q, h_q, D_QK] e4m3; h_q real heads (not padded)
    const u8* kv;                  // [s_kv, D_QK] e4m3; value = first 512 columns
    const i32* indices;            // [s_q, topk] rows of kv; invalid: < 0, >= s_kv, or >= length
    const i32* topk_length;        // [s_q] valid prefix per row (variants with length), else nullptr
    const float* attn_sink;        // [h_q] sink logit per head (sink variant), else nullptr
    const float* q_scale;          // [1] dequantization scale of q
    const float* kv_scale;         // [1] dequantization scale of kv
    bf16_t* out;                   // [s_q, h_q, 512]
    float* max_logits;             // [s_q, h_q] natural-log units
    float* lse;                    // [s_q, h_q] natural-log units
    float sm_scale;                // softmax scale
    i32 s_q;
    i32 s_kv;
    i32 h_q;                       // real query heads; the kernel zero-fills the tile's padding
    i32 head_tiles;                // ceil(h_q / HEAD_TILE)
    i32 topk;                      // multiple of 128
    // The paged variant of the 64-head kernel (PAGED, `DecodeThroughPrefill`) reads kv as the
    // FP8 cache, [s_kv, 656] rows (docs/kernels/mla_cache.md), its indices cache slots.
};

// Eight bf16 values (16 bytes) cast to e4m3 as the FP8 cache's gather casts its RoPE values
// (round to nearest even, saturating at +-448): eight bytes, first value in the low byte.
__device__ __forceinline__ uint2 cast_bf16x8_e4m3(const uint4 x) {
    const u32 w[4] = {x.x, x.y, x.z, x.w};
    u32 e[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 lo = pack_e4m3x2(__uint_as_float(w[2 * h] << 16),
                                   __uint_as_float(w[2 * h] & 0xffff0000u));
        const u32 hi = pack_e4m3x2(__uint_as_float(w[2 * h + 1] << 16),
                                   __uint_as_float(w[2 * h + 1] & 0xffff0000u));
        e[h] = lo | (hi << 16);
    }
    return make_uint2(e[0], e[1]);
}

__device__ __forceinline__ float pos_inf() {
    return __int_as_float(0x7f800000);
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Adds `bytes` to the transaction count the current phase of `bar` waits for (no arrival).
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// Bulk copy engine: `bytes` (a multiple of 16) contiguous bytes global -> shared, completing as
// transaction bytes on the mbarrier `bar` (16-byte aligned source and destination).
__device__ __forceinline__ void bulk_copy_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}

// Sixteen zero bytes at a shared address (a row the bulk copies skip).
__device__ __forceinline__ void st_shared_zero16(u32 addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0u) : "memory");
}

// Arrive once all cp.async operations issued so far by this thread have completed.
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void named_barrier_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// 16-byte global -> shared copy; src_bytes = 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 selector) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
    return r;
}

// wgmma shared-memory matrix descriptor, no-swizzle canonical layout (offsets in bytes).
__device__ __forceinline__ u64 make_smem_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

// A TMA tensor map (CUtensorMap), made on the host and passed in a kernel's parameters.
// Mirrored by `TensorMap` in src/backend/cuda/tensor_map.rs.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

// wgmma shared-memory matrix descriptor, K-major in the 128-byte swizzle (layout type 1): rows
// of 128 bytes, 8-row groups `sbo` bytes apart, the tile 1024-byte aligned; a k-step within
// the rows advances the start address (the leading-dimension offset is unused).
__device__ __forceinline__ u64 make_smem_desc_sw128(u32 addr, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(sbo >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across wgmma issue/wait points.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        asm volatile("" : "+f"(r[i])::"memory");
    }
}

// Named barrier `id` over `count` threads that also returns the OR of `pred` over them.
__device__ __forceinline__ bool named_barrier_any(int id, int count, bool pred) {
    u32 r;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\n"
        "selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(r)
        : "r"((u32)pred), "r"(id), "r"(count)
        : "memory");
    return r != 0u;
}

// acc[64x64 f32] (+)= A[64x32 e4m3, smem] * B[64x32 e4m3, smem]^T
__device__ __forceinline__ void wgmma_qk(float (&acc)[32], u64 desc_a, u64 desc_b, u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7,\n"
        " %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23,\n"
        " %24, %25, %26, %27, %28, %29, %30, %31},\n"
        " %32, %33, p, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]), "+f"(acc[7]),
          "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15]),
          "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]), "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]),
          "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]), "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The Q tile of 64 heads of query row `row_i` (head tile `tile`) into shared memory at `sq` in
// the K-major canonical layout of the 64-head kernels ((r/8)*8*D_QK + (c/16)*128 + (r%8)*16 +
// c%16), by the 128 threads of a warpgroup (`pt` = this thread's index in it): 16-byte cp.async,
// heads >= h_q zero-filled without a read; nothing when `needed` is false (a row without
// blocks). The caller arrives on its barrier.
template <int D_QK>
__device__ __forceinline__ void load_q_tile64(const SparseMlaParams& p, int row_i, int tile, u32 sq,
                                              int pt, bool needed) {
    constexpr int kChunks = D_QK / 16;
    const u8* q_row = p.q + (i64)row_i * p.h_q * D_QK;
    for (int e = pt; needed && e < 64 * kChunks; e += 128) {
        const int r = e / kChunks;
        const int c = e % kChunks;
        const int head = tile * 64 + r;
        const bool valid = head < p.h_q;
        const u8* src = q_row + (valid ? (i64)head * D_QK + c * 16 : (i64)0);
        cp_async_16(sq + (r >> 3) * (8 * D_QK) + c * 128 + (r & 7) * 16, src, valid ? 16u : 0u);
    }
}
