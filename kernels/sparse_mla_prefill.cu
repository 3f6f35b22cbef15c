// shapeproof — FP8 (e4m3 x e4m3 -> f32) sparse MLA prefill for sm_90a (wgmma).
// Semantics: spec KERNELS.md §3.3. Prepended by the library: common.cuh.
//
// ================================================================================================
// Launch shape (the Rust side mirrors these formulas exactly)
// ================================================================================================
//
//   grid  = head_tiles * s_q CTAs, 1-D; head_tiles = ceil(h_q / 64). CTA b handles head tile
//           b % head_tiles (heads 64*tile … 64*tile+63) of query row b / head_tiles.
//   block = 384 threads (3 warpgroups), one CTA per SM.
//   dynamic shared memory = 256 * D_QK + 74880 bytes:
//           D_QK = 576 -> 222336 bytes,   D_QK = 512 -> 205952 bytes
//           (set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it; no static shared memory).
//
// ================================================================================================
// Design
// ================================================================================================
//
// One CTA = one query row i and one tile of 64 heads. It walks the row's top-k list in blocks of 64
// tokens, two blocks ("a pair") per step; the number of blocks is topk/64, or 2*ceil(L_i/128) with
// topk_length (only those blocks can hold valid tokens).
//
// Warp roles (warpgroup = 4 consecutive warps):
// * WG2, the producer (128 threads, setmaxnreg down to 40 registers):
//   - gathers the 64 K rows of block b (d_qk bytes each) with 16-byte cp.async into K slot b % 3
//     (3 slots = a ring of blocks, so gathers run up to 3 blocks ahead of the consumers). An
//     invalid slot (idx < 0, idx >= s_kv, or j >= L_i) issues its cp.async with source size 0: the
//     row is zero-filled and global memory is never read for it. Completion is tracked by the
//     mbarrier k_full[slot] (cp.async.mbarrier.arrive.noinc, plus one ordinary arrive per thread
//     that publishes the block's 64-bit validity mask);
//   - transposes the V part (first 512 columns) of the block into Vt[b % 2] (token-contiguous rows,
//     the K-major layout wgmma needs for the P.V B operand; FP8 wgmma cannot transpose B itself):
//     ldmatrix.trans (2x2-byte blocks) + prmt byte shuffles + stmatrix, then signals vt_full.
// * WG0 and WG1, the consumers (setmaxnreg up to 232): WG w owns block 2t+w of pair t.
//   - S = Q.K^T: 64x64 tile, d_qk/32 wgmma m64n64k32 e4m3 with both operands in shared memory;
//   - online softmax in the log2 domain; the row maximum is shared by both WGs (exchanged through
//     shared memory each pair), so both WGs always use the same running max and the same rescale
//     factor, and their P tiles can feed one accumulator;
//   - P (f32) -> e4m3 in the wgmma A-register layout; each WG writes its P to shared memory and
//     reads its peer's;
//   - O[:, 256w … 256w+255] += P_own.V_own + P_peer.V_peer: wgmma m64n256k32 with A (P) from
//     registers, B = Vt half w. Each WG thus accumulates half of the 512 output columns for all
//     tokens (64x256 f32 = 128 registers per thread).
//   - Epilogue: row sums are combined across the two WGs, out = O * kv_scale / (sum + sink term)
//     as bf16; WG0 writes max_logits and lse (natural log).
//
// Token order inside a 32-token k-step: the e4m3 A-operand register layout of wgmma (thread
// holds k = 4*t0 + 0..3 and 16 + 4*t0 + 0..3, t0 = lane % 4) differs from the f32 accumulator layout
// of S (thread holds columns 8*j + 2*t0 + 0..1). Instead of shuffling P between lanes, the k order
// is permuted: logical position p = 16*v2 + 4*t0 + v0 holds token 16*v2 + 8*(v0>>1) + 2*t0 + (v0&1).
// The producer writes Vt in the same permuted token order, so P.V is unchanged.
// Column order of Vt rows: within each 16-column group, Vt row n holds V column d = 2*(n%8) + n/8
// (even columns first, then odd ones): that makes the stmatrix stores conflict-free, and in the
// epilogue each thread then owns 4 consecutive output columns (one 8-byte store).
//
// Shared-memory layouts (all "no swizzle" wgmma canonical K-major: core matrix = 8 rows x 16 bytes,
// 128 contiguous bytes; LBO = distance between core matrices along K, SBO = along M/N):
// * Q and each K slot: [64 rows][d_qk] -> byte (r/8)*(8*d_qk) + (c/16)*128 + (r%8)*16 + c%16;
//   LBO = 128, SBO = 8*d_qk. A k-step (32 columns) advances the start address by 256 bytes.
// * Vt block: [512 rows n][64 token positions p] -> (n/8)*512 + (p/16)*128 + (n%8)*16 + p%16;
//   LBO = 128, SBO = 512; half w (rows 256w…) starts at 16384*w, k-step kb at 256*kb.
//
// Synchronisation: mbarriers k_full[3] (producer -> consumers, 256 arrivals: 128 cp.async-tracked
// + 128 plain), k_empty[3] (consumer WG -> producer after its QK wgmma completed, 128), vt_full[2]
// (producer -> consumers, 128), vt_empty[2] (both consumer WGs -> producer after P.V, 256);
// named barrier 1 (256 consumer threads) for the max / P / row-sum exchanges, named barrier 2
// (128 producer threads) before a K slot is refilled. Writers of data that wgmma reads execute
// fence.proxy.async before releasing it (consumers also fence after acquiring cp.async data).
//
// Numerics: scores in f32, s2 = dot * sm_scale*q_scale*kv_scale*log2(e); p = ex2.approx(s2 - m);
// running max starts at -inf (a row with no valid token so far uses 0 as subtrahend, giving p = 0);
// P re-quantised to e4m3 (satfinite, round to nearest even) for P.V; denominators use f32 p.

// Parameters of one launch. Mirrored field by field by `SparseMlaParams` in
// src/ops/sparse_mla/cuda.rs: change both together.
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
    i32 h_q;                       // real query heads; the kernel pads to 64-head tiles itself
    i32 head_tiles;                // ceil(h_q / 64)
    i32 topk;                      // multiple of 128
};

namespace sparse_mla {

constexpr int kThreads = 384;          // WG0, WG1: consumers; WG2: producer
constexpr int kHeadsPerTile = 64;      // wgmma M
constexpr int kTokensPerBlock = 64;    // tokens per QK tile (wgmma N of Q.K^T)
constexpr int kDV = 512;               // value width
constexpr int kKSlots = 3;             // K ring depth (blocks in flight)
constexpr int kVtBlockBytes = kDV * kTokensPerBlock;   // one transposed V block: 32768
constexpr int kVtHalfBytes = kVtBlockBytes / 2;        // the 256 rows one consumer WG reads
constexpr int kPExchangeBytes = 2 * 2 * 128 * 16;      // [wg][k-step][thread][16 B]
constexpr u32 kConsumerRegs = 232;
constexpr u32 kProducerRegs = 40;
constexpr int kBarConsumers = 1;       // named barrier: 256 consumer threads
constexpr int kBarProducer = 2;        // named barrier: 128 producer threads
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory map for one D_QK (byte offsets from the dynamic shared memory base).
template <int D_QK>
struct Smem {
    static constexpr int kChunks = D_QK / 16;                  // 16-byte chunks per row
    static constexpr int kRowGroupBytes = 8 * D_QK;            // SBO of Q / K tiles
    static constexpr int kTileBytes = kHeadsPerTile * D_QK;    // Q tile == K tile (64 rows)
    static constexpr int kQ = 0;                               // Q tile   [64 heads][D_QK]
    static constexpr int kK = kQ + kTileBytes;                 // K slots  [3][64 tokens][D_QK]
    static constexpr int kVt = kK + kKSlots * kTileBytes;      // Vt       [2][512 n][64 p]
    static constexpr int kP = kVt + 2 * kVtBlockBytes;         // P xchg   [2 wg][2 kb][128][16 B]
    static constexpr int kMax = kP + kPExchangeBytes;          // f32      [2 wg][64 rows]
    static constexpr int kSum = kMax + 2 * 64 * 4;             // f32      [2 wg][64 rows]
    static constexpr int kMask = kSum + 2 * 64 * 4;            // u64      [3 slots] (+pad)
    static constexpr int kBars = kMask + 32;                   // u64 mbarriers (10, +pad)
    static constexpr int kBytes = kBars + 96;
    static_assert(kBytes == 256 * D_QK + 74880, "launch-shape formula in the header comment");
    static_assert(kBytes <= 232448, "exceeds the sm_90 dynamic shared memory limit");
};

// mbarrier indices inside the barrier area.
constexpr int kBarKFull = 0;     // [3]
constexpr int kBarKEmpty = 3;    // [3]
constexpr int kBarVtFull = 6;    // [2]
constexpr int kBarVtEmpty = 8;   // [2]

// ------------------------------------------------------------------------------------------------
// PTX helpers
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ float pos_inf() {
    return __int_as_float(0x7f800000);
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{\n.reg .u64 t;\ncvta.to.shared.u64 t, %1;\ncvt.u32.u64 %0, t;\n}\n" : "=r"(r) : "l"(p));
    return r;
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

__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
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

// acc[64x256 f32] += A[64x32 e4m3, registers] * B[256x32 e4m3, smem]^T
__device__ __forceinline__ void wgmma_pv(float (&acc)[128], const u32 (&a)[4], u64 desc_b,
                                         u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,\n"
        " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,\n"
        " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,\n"
        " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,\n"
        " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},\n"
        " {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]), "+f"(acc[7]),
          "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15]),
          "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]), "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]),
          "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]), "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31]),
          "+f"(acc[32]), "+f"(acc[33]), "+f"(acc[34]), "+f"(acc[35]), "+f"(acc[36]), "+f"(acc[37]), "+f"(acc[38]), "+f"(acc[39]),
          "+f"(acc[40]), "+f"(acc[41]), "+f"(acc[42]), "+f"(acc[43]), "+f"(acc[44]), "+f"(acc[45]), "+f"(acc[46]), "+f"(acc[47]),
          "+f"(acc[48]), "+f"(acc[49]), "+f"(acc[50]), "+f"(acc[51]), "+f"(acc[52]), "+f"(acc[53]), "+f"(acc[54]), "+f"(acc[55]),
          "+f"(acc[56]), "+f"(acc[57]), "+f"(acc[58]), "+f"(acc[59]), "+f"(acc[60]), "+f"(acc[61]), "+f"(acc[62]), "+f"(acc[63]),
          "+f"(acc[64]), "+f"(acc[65]), "+f"(acc[66]), "+f"(acc[67]), "+f"(acc[68]), "+f"(acc[69]), "+f"(acc[70]), "+f"(acc[71]),
          "+f"(acc[72]), "+f"(acc[73]), "+f"(acc[74]), "+f"(acc[75]), "+f"(acc[76]), "+f"(acc[77]), "+f"(acc[78]), "+f"(acc[79]),
          "+f"(acc[80]), "+f"(acc[81]), "+f"(acc[82]), "+f"(acc[83]), "+f"(acc[84]), "+f"(acc[85]), "+f"(acc[86]), "+f"(acc[87]),
          "+f"(acc[88]), "+f"(acc[89]), "+f"(acc[90]), "+f"(acc[91]), "+f"(acc[92]), "+f"(acc[93]), "+f"(acc[94]), "+f"(acc[95]),
          "+f"(acc[96]), "+f"(acc[97]), "+f"(acc[98]), "+f"(acc[99]), "+f"(acc[100]), "+f"(acc[101]), "+f"(acc[102]), "+f"(acc[103]),
          "+f"(acc[104]), "+f"(acc[105]), "+f"(acc[106]), "+f"(acc[107]), "+f"(acc[108]), "+f"(acc[109]), "+f"(acc[110]), "+f"(acc[111]),
          "+f"(acc[112]), "+f"(acc[113]), "+f"(acc[114]), "+f"(acc[115]), "+f"(acc[116]), "+f"(acc[117]), "+f"(acc[118]), "+f"(acc[119]),
          "+f"(acc[120]), "+f"(acc[121]), "+f"(acc[122]), "+f"(acc[123]), "+f"(acc[124]), "+f"(acc[125]), "+f"(acc[126]), "+f"(acc[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// ------------------------------------------------------------------------------------------------
// Producer warpgroup: gathers K blocks, transposes V blocks.
// ------------------------------------------------------------------------------------------------

template <int D_QK>
struct Producer {
    using L = Smem<D_QK>;
    u32 k_base;        // shared address of K slot 0
    u32 vt_base;       // shared address of Vt block 0
    u32 bars;          // shared address of the mbarrier area
    u16* mask16;       // [3 slots][4 warps] validity bits (bit = token within the warp's 16)
    const u8* kv;
    const i32* idx_row;  // indices of this query row
    i32 valid_len;       // L_i (clamped)
    i32 s_kv;
    int warp;            // 0..3 inside the producer WG
    int lane;

    // Issue the gathers of block b into K slot b % 3 and arm k_full[slot].
    // Warp w copies tokens 16w … 16w+15; lane = (token % 8) + 8 * (chunk % 4): eight lanes fill
    // one 128-byte core matrix (conflict-free), four lanes read 64 contiguous bytes of a row.
    __device__ __forceinline__ void issue_block(int b) const {
        const int slot = b % kKSlots;
        const u32 dst_slot = k_base + slot * L::kTileBytes;
        u32 valid_bits = 0;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int token = 16 * warp + 8 * half + (lane & 7);
            const int j = b * kTokensPerBlock + token;
            int idx = -1;
            if (j < valid_len) {
                idx = __ldg(idx_row + j);
            }
            const bool valid = idx >= 0 && idx < s_kv;
            const u8* src = kv + (valid ? (i64)idx * D_QK : (i64)0) + (lane >> 3) * 16;
            const u32 src_bytes = valid ? 16u : 0u;
            const u32 dst = dst_slot + (token >> 3) * L::kRowGroupBytes + (token & 7) * 16 +
                            (lane >> 3) * 128;
#pragma unroll
            for (int q = 0; q < L::kChunks / 4; ++q) {
                cp_async_16(dst + q * 512, src + q * 64, src_bytes);
            }
            valid_bits |= (__ballot_sync(0xffffffffu, valid) & 0xffu) << (8 * half);
        }
        if (lane == 0) {
            mask16[slot * 4 + warp] = (u16)valid_bits;
        }
        const u32 full = bars + (kBarKFull + slot) * 8;
        mbar_arrive_cp_async(full);
        mbar_arrive(full);  // release of the mask store
    }

    // Transpose the first 512 columns of the K block in slot b % 3 into Vt[b % 2].
    // Unit = 16 tokens (group G) x 32 columns (chunks c0, c0+1): ldmatrix.x4.trans gives thread
    // (k = lane%4, cc = lane/4) the 2x2 byte blocks {tokens 2k, 2k+1 | 8+2k, 9+2k} x {columns
    // 2cc, 2cc+1}; two prmt build the 4 bytes of positions 4k…4k+3 of rows 2cc and 2cc+1; stmatrix
    // stores them (matrix 0: even columns = rows n 0…7, matrix 1: odd columns = rows n 8…15).
    __device__ __forceinline__ void transpose_block(int b) const {
        const u32 src_slot = k_base + (b % kKSlots) * L::kTileBytes;
        const u32 dst_block = vt_base + (b & 1) * kVtBlockBytes;
        const int mat = lane >> 3;  // which 8x8 matrix this lane addresses
        const int row = lane & 7;
#pragma unroll 4
        for (int u = 0; u < 16; ++u) {
            const int unit = warp * 16 + u;
            const int group = unit & 3;          // 16-token group G
            const int c0 = (unit >> 2) * 2;      // first of two 16-column chunks
            const u32 src = src_slot + (2 * group + (mat & 1)) * L::kRowGroupBytes +
                            (c0 + (mat >> 1)) * 128 + row * 16;
            u32 r0, r1, r2, r3;
            ldmatrix_x4_trans(src, r0, r1, r2, r3);
            const u32 s0 = byte_perm(r0, r1, 0x6420u);  // chunk c0, even column
            const u32 s1 = byte_perm(r0, r1, 0x7531u);  // chunk c0, odd column
            const u32 s2 = byte_perm(r2, r3, 0x6420u);  // chunk c0+1, even column
            const u32 s3 = byte_perm(r2, r3, 0x7531u);  // chunk c0+1, odd column
            const u32 dst = dst_block + (2 * (c0 + (mat >> 1)) + (mat & 1)) * 512 + group * 128 +
                            row * 16;
            stmatrix_x4(dst, s0, s1, s2, s3);
        }
    }

    __device__ __forceinline__ void run(int num_blocks) const {
        for (int b = 0; b < num_blocks && b < kKSlots; ++b) {
            issue_block(b);
        }
        for (int b = 0; b < num_blocks; ++b) {
            const int slot = b % kKSlots;
            const u32 slot_phase = (u32)(b / kKSlots) & 1u;
            const int pair = b >> 1;
            mbar_wait(bars + (kBarKFull + slot) * 8, slot_phase);
            if (pair >= 1) {
                mbar_wait(bars + (kBarVtEmpty + (b & 1)) * 8, (u32)(pair - 1) & 1u);
            }
            transpose_block(b);
            fence_proxy_async();
            mbar_arrive(bars + (kBarVtFull + (b & 1)) * 8);
            if (b + kKSlots < num_blocks) {
                // All producer threads are done reading this slot; the consumer WG of block b is
                // done with its Q.K^T: refill the slot with block b + 3.
                named_barrier_sync(kBarProducer, 128);
                mbar_wait(bars + (kBarKEmpty + slot) * 8, slot_phase);
                issue_block(b + kKSlots);
            }
        }
    }
};

}  // namespace sparse_mla

// ------------------------------------------------------------------------------------------------
// Kernel
// ------------------------------------------------------------------------------------------------

template <int D_QK, bool HAVE_TOPK_LENGTH, bool HAVE_SINK>
__global__ void __launch_bounds__(sparse_mla::kThreads, 1)
    sparse_mla_prefill_kernel(const SparseMlaParams p) {
    using namespace sparse_mla;
    using L = Smem<D_QK>;
    static_assert(D_QK == 512 || D_QK == 576, "D_QK must be 512 or 576");
    static_assert(!HAVE_SINK || HAVE_TOPK_LENGTH, "attn_sink requires topk_length");

    extern __shared__ __align__(1024) u8 smem[];
    const u32 smem_base = smem_addr(smem);
    const u32 sq = smem_base + L::kQ;
    const u32 sk = smem_base + L::kK;
    const u32 svt = smem_base + L::kVt;
    const u32 bars = smem_base + L::kBars;

    const int tile = blockIdx.x % p.head_tiles;
    const int row_i = blockIdx.x / p.head_tiles;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;

    int valid_len = p.topk;
    if (HAVE_TOPK_LENGTH) {
        valid_len = min(max(__ldg(p.topk_length + row_i), 0), p.topk);
    }
    // Blocks that can hold a valid token, rounded up to whole pairs.
    const int num_blocks = HAVE_TOPK_LENGTH ? ((valid_len + 127) / 128) * 2 : p.topk / 64;
    const int num_pairs = num_blocks / 2;

    if (threadIdx.x == 0) {
        for (int s = 0; s < kKSlots; ++s) {
            mbar_init(bars + (kBarKFull + s) * 8, 256);
            mbar_init(bars + (kBarKEmpty + s) * 8, 128);
        }
        for (int s = 0; s < 2; ++s) {
            mbar_init(bars + (kBarVtFull + s) * 8, 128);
            mbar_init(bars + (kBarVtEmpty + s) * 8, 256);
        }
    }

    // Q tile -> shared memory (all threads). Heads >= h_q are zero-filled, never read.
    {
        const u8* q_row = p.q + (i64)row_i * p.h_q * D_QK;
        for (int e = threadIdx.x; e < kHeadsPerTile * L::kChunks; e += kThreads) {
            const int r = e / L::kChunks;
            const int c = e % L::kChunks;
            const int head = tile * kHeadsPerTile + r;
            const bool valid = head < p.h_q;
            const u8* src = q_row + (valid ? (i64)head * D_QK + c * 16 : (i64)0);
            cp_async_16(sq + (r >> 3) * L::kRowGroupBytes + c * 128 + (r & 7) * 16, src,
                        valid ? 16u : 0u);
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();

    if (warp >= 8) {
        // ---------------------------------------------------------------- producer (WG2)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
        Producer<D_QK> producer;
        producer.k_base = sk;
        producer.vt_base = svt;
        producer.bars = bars;
        producer.mask16 = reinterpret_cast<u16*>(smem + L::kMask);
        producer.kv = p.kv;
        producer.idx_row = p.indices + (i64)row_i * p.topk;
        producer.valid_len = valid_len;
        producer.s_kv = p.s_kv;
        producer.warp = warp - 8;
        producer.lane = lane;
        producer.run(num_blocks);
        return;
    }

    // -------------------------------------------------------------------- consumers (WG0, WG1)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    const int wg = warp >> 2;            // 0 or 1
    const int tw = threadIdx.x & 127;    // thread inside the warpgroup
    const int wwarp = tw >> 5;           // warp inside the warpgroup
    const int g = lane >> 2;             // accumulator row inside the warp's 16 rows
    const int t0 = lane & 3;             // accumulator column pair
    const int row0 = 16 * wwarp + g;     // this thread's rows: row0, row0 + 8

    float* max_xchg = reinterpret_cast<float*>(smem + L::kMax);   // [2][64]
    float* sum_xchg = reinterpret_cast<float*>(smem + L::kSum);   // [2][64]
    const u64* mask64 = reinterpret_cast<const u64*>(smem + L::kMask);
    uint4* p_xchg = reinterpret_cast<uint4*>(smem + L::kP);       // [2 wg][2 kb][128]

    const float q_scale = __ldg(p.q_scale);
    const float kv_scale = __ldg(p.kv_scale);
    const float score_scale = p.sm_scale * q_scale * kv_scale * kLog2e;

    const u64 q_desc = make_smem_desc(sq, 128, L::kRowGroupBytes);
    // B descriptors of this WG's output half in the own / peer Vt block.
    const u64 vt_own_desc = make_smem_desc(svt + wg * kVtBlockBytes + wg * kVtHalfBytes, 128, 512);
    const u64 vt_peer_desc =
        make_smem_desc(svt + (1 - wg) * kVtBlockBytes + wg * kVtHalfBytes, 128, 512);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m_run[2] = {-pos_inf(), -pos_inf()};
    float l_run[2] = {0.f, 0.f};
    float s[32];

    for (int t = 0; t < num_pairs; ++t) {
        const int b = 2 * t + wg;
        const int slot = b % kKSlots;
        mbar_wait(bars + (kBarKFull + slot) * 8, (u32)(b / kKSlots) & 1u);
        fence_proxy_async();
        const u64 mask = mask64[slot];

        // S = Q . K^T
        const u64 k_desc = make_smem_desc(sk + slot * L::kTileBytes, 128, L::kRowGroupBytes);
        fence_regs(s);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < D_QK / 32; ++ks) {
            wgmma_qk(s, q_desc + (u64)(ks * 16), k_desc + (u64)(ks * 16), ks > 0 ? 1u : 0u);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);
        mbar_arrive(bars + (kBarKEmpty + slot) * 8);

        // Scale, mask, block row maxima.
        float bmax[2] = {-pos_inf(), -pos_inf()};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int v = 0; v < 2; ++v) {
                    const int col = 8 * j + 2 * t0 + v;
                    float x = s[4 * j + 2 * h + v] * score_scale;
                    x = ((mask >> col) & 1ull) ? x : -pos_inf();
                    s[4 * j + 2 * h + v] = x;
                    bmax[h] = fmaxf(bmax[h], x);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            bmax[h] = fmaxf(bmax[h], __shfl_xor_sync(0xffffffffu, bmax[h], 1));
            bmax[h] = fmaxf(bmax[h], __shfl_xor_sync(0xffffffffu, bmax[h], 2));
        }
        if (t0 == 0) {
            max_xchg[wg * 64 + row0] = bmax[0];
            max_xchg[wg * 64 + row0 + 8] = bmax[1];
        }
        named_barrier_sync(kBarConsumers, 256);
        float m_sub[2], alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float peer = max_xchg[(1 - wg) * 64 + row0 + 8 * h];
            const float m_new = fmaxf(m_run[h], fmaxf(bmax[h], peer));
            m_sub[h] = m_new == -pos_inf() ? 0.f : m_new;
            alpha[h] = fast_exp2(m_run[h] - m_sub[h]);
            m_run[h] = m_new;
        }

        // p = 2^(s - m); row sums; e4m3 A fragments (see the token-order note in the header).
        float rsum[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int h = (i >> 1) & 1;
            s[i] = fast_exp2(s[i] - m_sub[h]);
            rsum[h] += s[i];
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + rsum[h];

        u32 a_own[2][4];
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
            const int base = 16 * kb;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                // r: bit0 = row +8 (h), bit1 = second 16 tokens of the k-step
                const int i0 = base + 8 * (r >> 1) + 2 * (r & 1);
                a_own[kb][r] = (u32)pack_e4m3x2(s[i0], s[i0 + 1]) |
                               ((u32)pack_e4m3x2(s[i0 + 4], s[i0 + 5]) << 16);
            }
            p_xchg[(wg * 2 + kb) * 128 + tw] =
                make_uint4(a_own[kb][0], a_own[kb][1], a_own[kb][2], a_own[kb][3]);
        }

        // Rescale the output accumulator (skipped while the max is unchanged for the warp).
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
        }

        named_barrier_sync(kBarConsumers, 256);
        u32 a_peer[2][4];
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
            const uint4 v = p_xchg[((1 - wg) * 2 + kb) * 128 + tw];
            a_peer[kb][0] = v.x;
            a_peer[kb][1] = v.y;
            a_peer[kb][2] = v.z;
            a_peer[kb][3] = v.w;
        }

        // O[:, half wg] += P_own . V_own + P_peer . V_peer
        mbar_wait(bars + (kBarVtFull + 0) * 8, (u32)t & 1u);
        mbar_wait(bars + (kBarVtFull + 1) * 8, (u32)t & 1u);
        fence_regs(o);
        wgmma_fence();
        wgmma_pv(o, a_own[0], vt_own_desc, 1u);
        wgmma_pv(o, a_own[1], vt_own_desc + 16, 1u);
        wgmma_pv(o, a_peer[0], vt_peer_desc, 1u);
        wgmma_pv(o, a_peer[1], vt_peer_desc + 16, 1u);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(bars + (kBarVtEmpty + 0) * 8);
        mbar_arrive(bars + (kBarVtEmpty + 1) * 8);
    }

    // ---------------------------------------------------------------- epilogue
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }
    if (t0 == 0) {
        sum_xchg[wg * 64 + row0] = l_run[0];
        sum_xchg[wg * 64 + row0 + 8] = l_run[1];
    }
    named_barrier_sync(kBarConsumers, 256);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int head = tile * kHeadsPerTile + row0 + 8 * h;
        if (head >= p.h_q) continue;
        const float l_total = l_run[h] + sum_xchg[(1 - wg) * 64 + row0 + 8 * h];
        const bool empty = m_run[h] == -pos_inf();
        float denom = l_total;
        if (HAVE_SINK) {
            denom += fast_exp2(__ldg(p.attn_sink + head) * kLog2e - (empty ? 0.f : m_run[h]));
        }
        const float out_scale = empty ? 0.f : kv_scale / denom;
        const i64 out_row = (i64)row_i * p.h_q + head;
        bf16_t* out = p.out + out_row * kDV + wg * 256 + 4 * t0;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
            // Accumulator groups j = 2c (even output columns) and 2c+1 (odd ones) of 16 columns.
            const float* even = &o[4 * (2 * c) + 2 * h];
            const float* odd = &o[4 * (2 * c + 1) + 2 * h];
            uint2 v;
            v.x = pack_bf16x2(even[0] * out_scale, odd[0] * out_scale);
            v.y = pack_bf16x2(even[1] * out_scale, odd[1] * out_scale);
            *reinterpret_cast<uint2*>(out + 16 * c) = v;
        }
        if (wg == 0 && t0 == 0) {
            p.max_logits[out_row] = empty ? -pos_inf() : m_run[h] * kLn2;
            p.lse[out_row] = empty ? pos_inf() : (m_run[h] + log2f(l_total)) * kLn2;
        }
    }
}
