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
//   dynamic shared memory = 320 * D_QK + 18304 bytes:
//           D_QK = 576 -> 202624 bytes,   D_QK = 512 -> 182144 bytes
//           (set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it; no static shared memory).
//
// ================================================================================================
// Design
// ================================================================================================
//
// One CTA = one query row i and one tile of 64 heads. It walks the row's top-k list in blocks of 64
// tokens, two blocks ("a pair", 128 tokens) per step; the number of blocks is topk/64, or
// 2*ceil(L_i/128) with topk_length (only those blocks can hold valid tokens).
//
// Warp roles (warpgroup = 4 consecutive warps):
// * WG2, the producer (128 threads, setmaxnreg down to 56 registers): loads the Q tile once, then
//   gathers the 64 K rows of every block (d_qk bytes each) with 16-byte cp.async into K slot b % 4
//   (4 slots = two pairs in flight). An invalid entry (idx < 0, idx >= s_kv, or j >= L_i) issues its
//   cp.async with source size 0: the row is zero-filled and global memory is never read for it.
//   Completion is tracked by mbarrier k_full[slot] (cp.async.mbarrier.arrive.noinc, plus one plain
//   arrive per thread that publishes the block's 64-bit validity mask). Indices are loaded 4 blocks
//   ahead into registers, so no index load latency sits on the gather issue path.
// * WG0 and WG1, the consumers (setmaxnreg up to 224). WG w owns block 2t+w of pair t for Q.K^T
//   and the softmax, and output columns d = 256w … 256w+255 for the P.V product of both blocks:
//   - S = Q.K^T: 64 heads x 64 tokens, d_qk/32 wgmma m64n64k32 e4m3, both operands in shared
//     memory, in chunks of 3 k-steps (96 channels), each into a fresh accumulator and promoted to
//     an f32 register sum (Numerics). Chunk 0 of pair t+1 is issued right behind the P.V of
//     pair t, so the tensor cores run both back to back; the other chunks run at the top of
//     iteration t+1, alternating between the two 32-register S buffers (s_cur / s_next): chunk c
//     goes into the buffer not holding the running sum, which is then added to it, and the
//     parity is chosen so that the last chunk lands in s_cur. No third accumulator is needed,
//     so the register peak stays O^T (128) + two S buffers (64), as before.
//   - Online softmax in the log2 domain. The running row max is shared by both WGs (block maxima
//     exchanged through shared memory every pair), so both use the same max and rescale factor.
//   - P (e4m3) is written to shared memory transposed, P^T[64 heads][128 tokens of the pair].
//   - P.V is computed transposed, O^T = V^T . P^T (M = value columns, N = 64 heads, K = tokens):
//     FP8 wgmma needs both shared-memory operands K-major (token-contiguous) and cannot transpose,
//     and V arrives token-major; P^T is naturally K-major, and V^T is fed from registers: one
//     ldmatrix.x4.trans straight from the K slot plus four prmt build one m64k32 A fragment. So V
//     is never transposed in shared memory. Per pair each WG issues 4 (M tiles of 64 columns) x 4
//     (k-steps of 32 tokens) wgmma m64n64k32; O^T is 4 x 32 f32 registers per thread.
//   - Epilogue: row sums combined across the WGs; out = O * kv_scale / (sum + sink term) -> bf16;
//     WG0 writes max_logits and lse (natural log).
//
// Index permutations (both free, no data movement):
// * Tokens inside a 32-token k-step: the e4m3 A fragment of thread (g = lane/4, t0 = lane%4) holds
//   k = 4*t0 + 0..3 and 16 + 4*t0 + 0..3. We let logical position p = 16*v2 + 4*t0 + v hold token
//   16*v2 + 8*(v>>1) + 2*t0 + (v&1): then (a) ldmatrix.trans (2x2-byte blocks of tokens 2t0, 2t0+1)
//   gives exactly these tokens, and (b) in the S accumulator (columns 8*j + 2*t0 + 0..1) the 4 bytes
//   of P^T positions 4*t0 … 4*t0+3 of every 16-token group belong to one thread (one 4-byte store).
// * Value columns inside a 16-column chunk: A-fragment row g holds column 2g, row g+8 column 2g+1
//   (what ldmatrix.trans delivers). So thread (g, t0) owns output columns 2g and 2g+1: one packed
//   bf16x2 store per head.
//
// Shared-memory layouts (wgmma "no swizzle" canonical K-major: core matrix = 8 rows x 16 bytes,
// 128 contiguous bytes; LBO = distance between core matrices along K, SBO = along M/N):
// * Q tile and each K slot: [64 rows][d_qk] -> byte (r/8)*(8*d_qk) + (c/16)*128 + (r%8)*16 + c%16;
//   LBO = 128, SBO = 8*d_qk; a k-step (32 columns) advances the start address by 256 bytes.
//   The cp.async of 8 consecutive tokens x 16 bytes fill one core matrix (conflict-free), and the
//   ldmatrix of 8 consecutive tokens read one.
// * P^T buffer: [64 heads][128 positions] -> (h/8)*1024 + (p/16)*128 + (h%8)*16 + p%16;
//   LBO = 128, SBO = 1024; k-step ks at 256*ks. Double-buffered by pair parity.
//
// Synchronisation: mbarriers q_full (producer cp.async -> consumers), k_full[4] (producer ->
// consumers, 256 arrivals: 128 cp.async-tracked + 128 plain), k_empty[4] (both consumer WGs -> producer
// after the P.V of the pair that read the slot, 256); named barrier 1 (256 consumer threads) for
// the max / P^T / row-sum exchanges. Writers of data that wgmma reads from shared memory execute
// fence.proxy.async before releasing it; consumers fence after acquiring cp.async data.
//
// Numerics: scores in f32, s2 = dot * sm_scale*q_scale*kv_scale*log2(e); p = ex2.approx(s2 - m);
// running max starts at -inf (a row with no valid token so far uses 0 as subtrahend, so p = 0);
// P re-quantised to e4m3 (satfinite, round to nearest even) for P.V; denominators use f32 p.
// The FP8 tensor cores do not accumulate in full f32: each k-step's 32 products are aligned to
// the largest exponent among them and the accumulator and truncated to roughly 13 fractional
// bits, so the error grows with the running sum's magnitude. Accumulating all of d_qk in one
// wgmma accumulator gave lse / max_logits errors up to 8.5e-3 / 1.9e-2 absolute (0.74 of the lse
// tolerance 2e-3 + 2e-3*|ref|) on N(0,1) inputs with sm_scale 0.1. With S accumulated by the
// tensor cores over at most 96 channels and summed in f32 registers (DeepSeek-V3-style
// promotion, interval 96 instead of 128), the same inputs give <= 1.6e-3 / 1.8e-3 (<= 0.20 of
// the lse tolerance). Interval 128 (4 k-steps) measured up to 0.28 of tolerance, 64 up to 0.16,
// 32 up to 0.10, but 64 and 32 are slower.
//
// Measured (H200, CUDA 13.0, median of 20, inputs rotated beyond L2; FLOPs = 2*s_q*h_q*topk*(d_qk+512)):
// (s_q, s_kv, h_q, d_qk, topk) = (4096, 8k|32k|64k, 128, 576, 2048): 510 | 510 | 497 TFLOP/s
// (one-accumulator Q.K^T, same run: 480 | 481 | 483); (4096, 8k|32k, 64, 512, 512): 406 | 405
// (398 | 393); DeepSeek V3.2 TP8 (4096, 64k, 16 real heads in one 64-head tile, 576, 2048):
// 2.284 ms = 512 TFLOP/s counted on the padded 64 heads (2.410 ms). torch._scaled_mm e4m3
// 8192^3 on the same GPU in the same run: 1338-1370 TFLOP/s (median).
// Timing variants showed the gathers (latency exposed when a pair's K rows are not yet resident)
// and the lock-step softmax between the two consumer WGs are what is left.

namespace sparse_mla {

constexpr int kThreads = 384;          // WG0, WG1: consumers; WG2: producer
constexpr int kHeadsPerTile = 64;      // wgmma M
constexpr int kTokensPerBlock = 64;    // tokens per QK tile (wgmma N of Q.K^T)
constexpr int kDV = 512;               // value width
constexpr int kKSlots = 4;             // K ring depth: two pairs of blocks in flight
constexpr int kIndexLead = 4;          // blocks of indices the producer holds in registers
// Q.K^T precision: wgmma accumulates at most this many k-steps (32 channels each) in one fresh
// accumulator before the partial sum is promoted into an f32 register sum (header, Numerics).
// Measured on H200: 3 is both the fastest and, with 1 and 2, among the most precise choices.
constexpr int kQkChunkSteps = 3;
constexpr int kPairTokens = 2 * kTokensPerBlock;       // 128
constexpr int kPtBytes = kHeadsPerTile * kPairTokens;  // one P^T buffer: 8192
constexpr u32 kConsumerRegs = 224;
constexpr u32 kProducerRegs = 56;
constexpr int kBarConsumers = 1;       // named barrier: 256 consumer threads
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory map for one D_QK (byte offsets from the dynamic shared memory base).
template <int D_QK>
struct Smem {
    static constexpr int kChunks = D_QK / 16;                  // 16-byte chunks per row
    static constexpr int kRowGroupBytes = 8 * D_QK;            // SBO of Q / K tiles
    static constexpr int kTileBytes = kHeadsPerTile * D_QK;    // Q tile == K slot (64 rows)
    static constexpr int kQ = 0;                               // Q tile  [64 heads][D_QK]
    static constexpr int kK = kQ + kTileBytes;                 // K slots [4][64 tokens][D_QK]
    static constexpr int kPt = kK + kKSlots * kTileBytes;      // P^T     [2][64 heads][128 p]
    static constexpr int kMax = kPt + 2 * kPtBytes;            // f32     [2 wg][64] block maxima
    static constexpr int kSum = kMax + 2 * 64 * 4;             // f32     [2 wg][64] row sums
    static constexpr int kAlpha = kSum + 2 * 64 * 4;           // f32     [2][64] rescale factors
    static constexpr int kScale = kAlpha + 2 * 64 * 4;         // f32     [64] output scales
    static constexpr int kMask = kScale + 64 * 4;              // u64     [4] validity masks
    static constexpr int kBars = kMask + kKSlots * 8;          // u64     mbarriers (9, +pad)
    static constexpr int kBytes = kBars + 96;
    static_assert(kBytes == 320 * D_QK + 18304, "launch-shape formula in the header comment");
    static_assert(kBytes <= 232448, "exceeds the sm_90 dynamic shared memory limit");
};

// mbarrier indices inside the barrier area.
constexpr int kBarKFull = 0;     // [4]
constexpr int kBarKEmpty = 4;    // [4]
constexpr int kBarQFull = 8;

// ------------------------------------------------------------------------------------------------
// PTX helpers
// ------------------------------------------------------------------------------------------------

// Keeps register A fragments alive (unmodified, not reused) until a wgmma that reads them is done.
__device__ __forceinline__ void keep_alive(const u32 (&a)[4][4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        asm volatile("" ::"r"(a[k][0]), "r"(a[k][1]), "r"(a[k][2]), "r"(a[k][3]) : "memory");
    }
}

// acc[64x64 f32] += A[64x32 e4m3, registers] * B[64x32 e4m3, smem]^T
__device__ __forceinline__ void wgmma_rs(float (&acc)[32], const u32 (&a)[4], u64 desc_b,
                                         u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7,\n"
        " %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23,\n"
        " %24, %25, %26, %27, %28, %29, %30, %31},\n"
        " {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]), "+f"(acc[7]),
          "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15]),
          "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]), "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]),
          "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]), "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// ------------------------------------------------------------------------------------------------
// Producer warpgroup: Q tile, then K blocks.
// ------------------------------------------------------------------------------------------------

template <int D_QK>
struct Producer {
    using L = Smem<D_QK>;
    u32 k_base;          // shared address of K slot 0
    u32 bars;            // shared address of the mbarrier area
    u16* mask16;         // [4 slots][4 warps] validity bits (bit = token within the warp's 16)
    const u8* kv;
    const i32* idx_row;  // indices of this query row
    i32 valid_len;       // L_i (clamped)
    i32 s_kv;
    int warp;            // 0..3 inside the producer WG
    int lane;

    // Index of this thread's token `half` of block b, or -1 past the valid prefix.
    __device__ __forceinline__ int load_index(int b, int half) const {
        const int j = b * kTokensPerBlock + 16 * warp + 8 * half + (lane & 7);
        return j < valid_len ? __ldg(idx_row + j) : -1;
    }

    // Issue the gathers of block b into K slot b % 4 and arm k_full[slot].
    // Warp w copies tokens 16w … 16w+15; lane = (token % 8) + 8 * (chunk % 4): eight lanes fill
    // one 128-byte core matrix (conflict-free), four lanes read 64 contiguous bytes of a row.
    __device__ __forceinline__ void issue_block(int b, const int (&idx)[2]) const {
        const int slot = b % kKSlots;
        const u32 dst_slot = k_base + slot * L::kTileBytes;
        u32 valid_bits = 0;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int token = 16 * warp + 8 * half + (lane & 7);
            const bool valid = idx[half] >= 0 && idx[half] < s_kv;
            const u8* src = kv + (valid ? (i64)idx[half] * D_QK : (i64)0) + (lane >> 3) * 16;
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

    __device__ __forceinline__ void run(int num_blocks) const {
        // Indices are loaded kIndexLead blocks ahead of their gathers, so the issue of a block's
        // copies never waits for an index load.
        int idx_queue[kIndexLead][2];
#pragma unroll
        for (int k = 0; k < kIndexLead; ++k) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                idx_queue[k][half] = k < num_blocks ? load_index(k, half) : -1;
            }
        }
        for (int b = 0; b < num_blocks; ++b) {
            const int slot = b % kKSlots;
            if (b >= kKSlots) {
                // Both consumer WGs finished the pair that used this slot.
                mbar_wait(bars + (kBarKEmpty + slot) * 8, (u32)(b / kKSlots - 1) & 1u);
            }
            issue_block(b, idx_queue[0]);
#pragma unroll
            for (int k = 0; k + 1 < kIndexLead; ++k) {
                idx_queue[k][0] = idx_queue[k + 1][0];
                idx_queue[k][1] = idx_queue[k + 1][1];
            }
            const int next = b + kIndexLead;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                idx_queue[kIndexLead - 1][half] = next < num_blocks ? load_index(next, half) : -1;
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
    const u32 spt = smem_base + L::kPt;
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
            mbar_init(bars + (kBarKEmpty + s) * 8, 256);
        }
        mbar_init(bars + kBarQFull * 8, 128);
    }
    __syncthreads();

    if (warp >= 8) {
        // ---------------------------------------------------------------- producer (WG2)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
        const int pt = threadIdx.x - 256;
        // Q tile -> shared memory (skipped when the row has no block). Heads >= h_q are
        // zero-filled, never read.
        load_q_tile64<D_QK>(p, row_i, tile, sq, pt, num_pairs > 0);
        if (num_pairs > 0) {
            mbar_arrive_cp_async(bars + kBarQFull * 8);
        }

        Producer<D_QK> producer;
        producer.k_base = sk;
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
    const int wwarp = warp & 3;          // warp inside the warpgroup
    const int g = lane >> 2;             // accumulator row inside the warp's 16 rows
    const int t0 = lane & 3;             // accumulator column pair
    const int row0 = 16 * wwarp + g;     // S rows (heads) of this thread: row0, row0 + 8

    float* max_xchg = reinterpret_cast<float*>(smem + L::kMax);     // [2][64]
    float* sum_xchg = reinterpret_cast<float*>(smem + L::kSum);     // [2][64]
    float* alpha_buf = reinterpret_cast<float*>(smem + L::kAlpha);  // [2][64]
    float* scale_buf = reinterpret_cast<float*>(smem + L::kScale);  // [64]
    const u64* mask64 = reinterpret_cast<const u64*>(smem + L::kMask);

    const float q_scale = __ldg(p.q_scale);
    const float kv_scale = __ldg(p.kv_scale);
    const float score_scale = p.sm_scale * q_scale * kv_scale * kLog2e;
    const u64 q_desc = make_smem_desc(sq, 128, L::kRowGroupBytes);
    // This warp's 16-byte column chunk of V inside an M tile: c = 16*wg + 4*mt + wwarp.
    const u32 v_lane_off = (u32)(lane >> 4) * 2 * L::kRowGroupBytes +
                           (u32)((lane >> 3) & 1) * L::kRowGroupBytes +
                           (u32)(16 * wg + wwarp) * 128 + (u32)(lane & 7) * 16;

    float o[4][32];  // O^T: [M tile][accumulator]; row = value column, column = head
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int i = 0; i < 32; ++i) o[mt][i] = 0.f;
    }
    float m_run[2] = {-pos_inf(), -pos_inf()};
    float l_run[2] = {0.f, 0.f};
    float s_cur[32], s_next[32];
    u64 mask_cur = 0, mask_next = 0;

    constexpr int kQkSteps = D_QK / 32;
    constexpr int kQkChunks = (kQkSteps + kQkChunkSteps - 1) / kQkChunkSteps;

    // Issue k-steps [kQkChunkSteps*c, ...) of S = Q . K^T of the K slot at k_desc into a fresh
    // accumulator (asynchronous, one commit group).
    auto issue_qk_chunk = [&](float (&acc)[32], u64 k_desc, int c) {
        fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int ks = c * kQkChunkSteps; ks < (c + 1) * kQkChunkSteps && ks < kQkSteps; ++ks) {
            wgmma_qk(acc, q_desc + (u64)(ks * 16), k_desc + (u64)(ks * 16),
                     ks > c * kQkChunkSteps ? 1u : 0u);
        }
        wgmma_commit();
    };
    auto k_slot_desc = [&](int b) -> u64 {
        return make_smem_desc(sk + (b % kKSlots) * L::kTileBytes, 128, L::kRowGroupBytes);
    };

    // Chunk c of a block's S goes to s_cur when (kQkChunks - 1 - c) is even, else to s_next, so
    // that the last chunk, and with it the complete sum, lands in s_cur.
    // Issue chunk 0 of S = Q . K^T of block b (asynchronous); returns the block's validity mask.
    auto issue_qk = [&](int b) -> u64 {
        const int slot = b % kKSlots;
        mbar_wait(bars + (kBarKFull + slot) * 8, (u32)(b / kKSlots) & 1u);
        fence_proxy_async();
        const u64 mask = mask64[slot];
        if ((kQkChunks - 1) % 2 == 0) {
            issue_qk_chunk(s_cur, k_slot_desc(b), 0);
        } else {
            issue_qk_chunk(s_next, k_slot_desc(b), 0);
        }
        return mask;
    };

    // Once chunk 0 of block b is complete: chunks 1 … kQkChunks-1, each into a fresh accumulator
    // (the buffer not holding the running sum), then the running sum is added to it in f32.
    auto finish_qk = [&](int b) {
        const u64 k_desc = k_slot_desc(b);
#pragma unroll
        for (int c = 1; c < kQkChunks; ++c) {
            float (&dst)[32] = (kQkChunks - 1 - c) % 2 == 0 ? s_cur : s_next;
            float (&src)[32] = (kQkChunks - 1 - c) % 2 == 0 ? s_next : s_cur;
            issue_qk_chunk(dst, k_desc, c);
            wgmma_wait<0>();
            fence_regs(dst);
            fence_regs(src);
#pragma unroll
            for (int i = 0; i < 32; ++i) dst[i] += src[i];
        }
    };

    // One m64k32 A fragment of V^T: value columns of this warp's chunk in M tile mt, tokens
    // 32*(ks%2) … +31 of the K slot at k_slot_addr, in the permuted order of the header.
    auto load_v_fragment = [&](u32 (&a)[4], u32 k_slot_addr, int mt, int ks) {
        u32 r0, r1, r2, r3;
        ldmatrix_x4_trans(k_slot_addr + (u32)(ks & 1) * 4 * L::kRowGroupBytes + v_lane_off +
                              (u32)mt * 4 * 128,
                          r0, r1, r2, r3);
        a[0] = byte_perm(r0, r1, 0x6420u);  // row g   (column 2g),   tokens of group 0
        a[1] = byte_perm(r0, r1, 0x7531u);  // row g+8 (column 2g+1), tokens of group 0
        a[2] = byte_perm(r2, r3, 0x6420u);  // row g,   tokens of group 1
        a[3] = byte_perm(r2, r3, 0x7531u);  // row g+8, tokens of group 1
    };

    if (num_pairs > 0) {
        mbar_wait(bars + kBarQFull * 8, 0);
        fence_proxy_async();
        mask_cur = issue_qk(wg);
    }

    for (int t = 0; t < num_pairs; ++t) {
        const int own_block = 2 * t + wg;
        const int peer_block = 2 * t + 1 - wg;
        wgmma_wait<0>();
        fence_regs(s_cur);
        fence_regs(s_next);
        finish_qk(own_block);

        // ---- softmax of own block: scale, mask, block row maxima
        float bmax[2] = {-pos_inf(), -pos_inf()};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int v = 0; v < 2; ++v) {
                    const int col = 8 * j + 2 * t0 + v;
                    float x = s_cur[4 * j + 2 * h + v] * score_scale;
                    x = ((mask_cur >> col) & 1ull) ? x : -pos_inf();
                    s_cur[4 * j + 2 * h + v] = x;
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
        float* alpha_t = alpha_buf + (t & 1) * 64;
        if (wg == 0 && t0 == 0) {
            alpha_t[row0] = alpha[0];
            alpha_t[row0 + 8] = alpha[1];
        }

        // ---- p = 2^(s - m), row sums, P^T (e4m3) -> shared memory
        float rsum[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int h = (i >> 1) & 1;
            s_cur[i] = fast_exp2(s_cur[i] - m_sub[h]);
            rsum[h] += s_cur[i];
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + rsum[h];
        {
            u8* pt = smem + L::kPt + (t & 1) * kPtBytes;
#pragma unroll
            for (int grp = 0; grp < 4; ++grp) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i0 = 4 * (2 * grp) + 2 * h;
                    const int i1 = 4 * (2 * grp + 1) + 2 * h;
                    const u32 word = (u32)pack_e4m3x2(s_cur[i0], s_cur[i0 + 1]) |
                                     ((u32)pack_e4m3x2(s_cur[i1], s_cur[i1 + 1]) << 16);
                    const int head = row0 + 8 * h;
                    *reinterpret_cast<u32*>(pt + (head >> 3) * 1024 + (4 * wg + grp) * 128 +
                                            (head & 7) * 16 + 4 * t0) = word;
                }
            }
        }
        fence_proxy_async();  // P^T is read by wgmma (async proxy)
        named_barrier_sync(kBarConsumers, 256);

        // ---- rescale O^T: its columns are heads 8j + 2*t0 + v
        {
            float a_col[8][2];
            bool any = false;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float2 a2 = *reinterpret_cast<const float2*>(alpha_t + 8 * j + 2 * t0);
                a_col[j][0] = a2.x;
                a_col[j][1] = a2.y;
                any |= a2.x != 1.f || a2.y != 1.f;
            }
            if (__any_sync(0xffffffffu, any)) {
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
                    for (int i = 0; i < 32; ++i) o[mt][i] *= a_col[i >> 2][i & 1];
                }
            }
        }

        // ---- O^T[:, d 256wg…] += V^T . P^T over the 128 tokens of the pair
        mbar_wait(bars + (kBarKFull + peer_block % kKSlots) * 8,
                  (u32)(peer_block / kKSlots) & 1u);
        const u32 slot0 = sk + ((2 * t) % kKSlots) * L::kTileBytes;       // block 2t
        const u32 slot1 = sk + ((2 * t + 1) % kKSlots) * L::kTileBytes;   // block 2t+1
        const u64 pt_desc = make_smem_desc(spt + (t & 1) * kPtBytes, 128, 1024);
        u32 frag[2][4][4];  // [buffer][k-step][register]
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
            u32 (&fr)[4][4] = frag[mt & 1];
            if (mt >= 2) {
                wgmma_wait<1>();  // the M tile that used this fragment buffer is done
                keep_alive(fr);   // ... so only now may its registers be reused
            }
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                load_v_fragment(fr[ks], ks < 2 ? slot0 : slot1, mt, ks);
            }
            fence_regs(o[mt]);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                wgmma_rs(o[mt], fr[ks], pt_desc + (u64)(ks * 16), 1u);
            }
            wgmma_commit();
        }
        // Chunk 0 of the next pair's S queues behind this P.V on the tensor cores (the other
        // chunks follow at the top of the next iteration). Issuing it only now
        // (not before the softmax) gives the gathers of pair t+1 a whole pair of lead time: the
        // K slots of pair t+1 are refilled when pair t-1 completes.
        if (t + 1 < num_pairs) {
            mask_next = issue_qk(own_block + 2);
        }
        wgmma_wait<0>();  // P.V of this pair and S of the next one are complete
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) fence_regs(o[mt]);
        fence_regs(s_cur);
        fence_regs(s_next);
        keep_alive(frag[0]);
        keep_alive(frag[1]);
        mbar_arrive(bars + (kBarKEmpty + (2 * t) % kKSlots) * 8);
        mbar_arrive(bars + (kBarKEmpty + (2 * t + 1) % kKSlots) * 8);

        mask_cur = mask_next;
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
    if (wg == 0 && t0 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            const int head = tile * kHeadsPerTile + row;
            const float l_total = l_run[h] + sum_xchg[64 + row];
            const bool empty = m_run[h] == -pos_inf();
            float denom = l_total;
            if (HAVE_SINK && head < p.h_q) {
                denom += fast_exp2(__ldg(p.attn_sink + head) * kLog2e - (empty ? 0.f : m_run[h]));
            }
            scale_buf[row] = empty ? 0.f : kv_scale / denom;
            if (head < p.h_q) {
                const i64 out_row = (i64)row_i * p.h_q + head;
                p.max_logits[out_row] = empty ? -pos_inf() : m_run[h] * kLn2;
                p.lse[out_row] = empty ? pos_inf() : (m_run[h] + log2f(l_total)) * kLn2;
            }
        }
    }
    named_barrier_sync(kBarConsumers, 256);
    // Thread owns value columns d = 256*wg + 64*mt + 16*wwarp + 2g (+1) of heads 8j + 2*t0 + v.
    const int d0 = 256 * wg + 16 * wwarp + 2 * g;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const int row = 8 * j + 2 * t0 + v;
            const int head = tile * kHeadsPerTile + row;
            if (head >= p.h_q) continue;
            const float sc = scale_buf[row];
            bf16_t* out = p.out + ((i64)row_i * p.h_q + head) * kDV + d0;
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                *reinterpret_cast<u32*>(out + 64 * mt) =
                    pack_bf16x2(o[mt][4 * j + v] * sc, o[mt][4 * j + 2 + v] * sc);
            }
        }
    }
}
