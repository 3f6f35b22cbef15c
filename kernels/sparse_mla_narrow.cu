// shapeproof — FP8 (e4m3 x e4m3 -> f32) sparse MLA prefill for narrow head tiles (8, 16 or 32
// heads per CTA, and 64 as two 32-head warpgroups), sm_90a (wgmma). Same function as
// sparse_mla_prefill.cu (docs/kernels/sparse_mla.md §3.3, same parameter block, same numerics); this variant
// serves a tensor-parallel rank that holds fewer than 64 query heads without padding them to a
// 64-head tile, and by default also runs more than 32 heads, in 64-head tiles.
// Prepended by the library: common.cuh.
//
// ================================================================================================
// Launch shape (the Rust side mirrors these formulas exactly)
// ================================================================================================
//
//   grid  = min(head_tiles * s_q, SMs * CTAs per SM) CTAs, 1-D (persistent; any grid size is
//           correct); head_tiles = ceil(h_q / HEAD_TILE) (1 for 8, 16 and 32 heads, ceil(h_q /
//           64) for more heads in 64-head tiles). Work item w = (heads HEAD_TILE*(w %
//           head_tiles) … +HEAD_TILE-1 of query row w / head_tiles); CTA b takes items b,
//           b + gridDim.x, ...
//   block = 256 threads: warps 0-3 = the consumer warpgroup, warps 4-7 = the gather warpgroup.
//           Two CTAs per SM (128 registers a thread at launch; setmaxnreg then moves registers
//           from the gather warpgroup, 40 a thread, to the consumers, 216; 32 and 224 for 32
//           heads), except 8 heads at D_QK 512: three CTAs per SM (80 at launch; 40 and 120).
//           64 heads: 384 threads, warps 0-7 = two consumer warpgroups (heads 0-31 and 32-63),
//           warps 8-11 the gather warpgroup; one CTA per SM (168 at launch; 40 and 232).
//   dynamic shared memory = q_buffers * (HEAD_TILE * D_QK + 16) + stages * (32 * D_QK + 536)
//           + 112 * HEAD_TILE bytes; stages (of the K ring, 32 rows each) = 5 (8, 16 heads, D_QK
//           576), 4 (8 heads, D_QK 512), 6 (16 heads, D_QK 512), 4 (32 heads), 9 (64 heads, D_QK
//           576), 11 (64 heads, D_QK 512); q_buffers (Q tiles) = 2 for 8 heads, for 16 heads at
//           D_QK 576 and 32 heads at 512, else 1:
//           D_QK 576: 104984 (8 heads), 115096 (16), 97904 (32), 214760 (64);
//           D_QK 512: 76800 (8), 111520 (16), 104064 (32), 226072 (64).
//           (set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it; no static shared memory).
//
// ================================================================================================
// Design
// ================================================================================================
//
// MLA heads share one latent KV row, so a narrow head tile saves tensor-core work but not the
// gather: every query row still gathers topk rows of D_QK bytes. The kernel is built around the
// gather and computes everything transposed, so that the 64 gathered tokens of a block are the
// wgmma M dimension and the heads the (narrow) N dimension:
//   S^T = K . Q^T      M = 64 tokens, N = HEAD_TILE heads, K = D_QK channels;
//                      A = K rows from registers (ldmatrix from the K ring), B = the Q tile.
//   O^T += V^T . P^T   M = 512 value columns (8 M tiles of 64), N = HEAD_TILE, K = 64 tokens;
//                      A = V^T from registers (ldmatrix.trans straight from the K ring),
//                      B = P^T [HEAD_TILE heads][64 tokens] e4m3, written K-major by the softmax.
// Both accumulators have the heads as columns, in the same register layout, so a thread's softmax
// statistics (running max, rescale factor, row sum) are those of the O^T columns it holds.
//
// A CTA works through its query rows one after the other, and its gathered rows go through one
// ring of stages of 32 rows (half a block; block b of a row is the row's stages 2b and 2b + 1)
// numbered across the rows, so the gather warps fill the next row's first stages while the
// consumers finish the current row (without it, a row's consumer waited ~10% of its time for
// its first block). Gather warp w fills stages w, w + gather_warps, ...:
// lane l issues one bulk copy (cp.async.bulk, completing as transaction bytes on the stage's
// mbarrier) of D_QK bytes for row l if it is valid; invalid rows are zero-filled by the warp (no
// global read; their scores are masked and their zeros add nothing to P.V). (16-byte cp.async
// gathers, as fast as bulk copies or faster when nothing else runs, were 30-45% slower here:
// they share the shared-memory pipe with the consumer's ldmatrix; the bulk copy engine's rate
// grows with the number of issuing warps: a whole gather warpgroup, with all P.V tiles in
// flight, ran 11% faster at 8 heads than two gather warps.) Half-block stages let the
// ring hold more of the next blocks than whole-block slots in the same shared memory (with two
// 64-row slots per CTA, the consumers waited for their next block a quarter of the time).
// The consumer warpgroup runs, per block: S^T (in chunks of 3 k-steps promoted to f32, as the
// wide kernel), masking, a barrier vote on whether any score passed the reference max by more
// than the headroom (only then the per-head (column) maximum across its four warps and the
// rescale of O^T), p = 2^(s - m_ref), P^T to shared memory and the P.V product (all eight M
// tiles in flight for 8 and 16 heads, their V^T fragments in the registers the gather warpgroup
// gave up; for 32 heads three, the first of them loaded before the softmax); it releases both
// stages as soon as its last ldmatrix has read them. Two (or three) CTAs share an SM, so one
// CTA's softmax overlaps the other's tensor-core work. The 64-head tile is one CTA whose two
// consumer warpgroups each run 32 of its heads exactly so (HEAD_TILE below then means the
// 32 heads of one warpgroup wherever S^T, P^T or O^T are described), reading the same ring:
// a stage is released once both have read it.
//
// Register layout of an m64nN f32 accumulator (wgmma): thread (warp w, g = lane/4, t0 = lane%4),
// element i: row 16w + g + 8*((i>>1)&1), column 8*(i>>2) + 2*t0 + (i&1).
//
// Index permutations (free, no data movement):
// * Tokens inside a 32-token k-step of P.V: the e4m3 A fragment of thread (g, t0) holds k = 4*t0
//   + 0..3 and 16 + 4*t0 + 0..3; logical position p = 16*v2 + 4*t0 + v holds token 16*v2 +
//   2*t0 + (v>>1) + 8*(v&1) (the byte permutes of the ldmatrix.trans 2-byte column pairs put
//   tokens r and r + 8 side by side). So the softmax writes the weight of token r (= S^T row) at
//   P^T position pos(r) below, a thread's rows g and g + 8 of a head in one two-byte store.
// * Value columns inside a 16-column chunk: A-fragment row g holds column 2g, row g+8 column
//   2g+1; thread (g, t0) therefore owns output columns 2g, 2g+1 (one bf16x2 store per head).
//
// Shared-memory layouts (wgmma "no swizzle" canonical K-major: core matrix = 8 rows x 16 bytes,
// 128 contiguous bytes; LBO = distance between core matrices along K, SBO = along M/N):
// * Q tile [HEAD_TILE rows][D_QK] (each of the q_buffers): byte (r/8)*(8*D_QK) + (c/16)*128 +
//   (r%8)*16 + c%16; LBO = 128, SBO = 8*D_QK; a k-step (32 channels) advances the start
//   address by 256 bytes.
// * Each K ring stage [32 rows][D_QK] row-major at a pitch of D_QK + 16 bytes (what a bulk copy
//   of a row writes; the pitch puts the 8 rows of every ldmatrix 8x16-byte matrix in distinct
//   banks). The S^T A fragment of a k-step is one ldmatrix.x4 (block rows 16*warp … +15, 32
//   channels; warps 0-1 read the block's first stage, warps 2-3 its second), V^T one
//   ldmatrix.x4.trans per 32 tokens (one stage) and 16 value columns.
// * P^T [HEAD_TILE heads][64 positions]: (h/8)*512 + (p/16)*128 + (h%8)*16 + p%16; LBO = 128,
//   SBO = 512; k-step ks at 256*ks.
//
// Synchronisation: mbarriers q_full[q_buffers] (32 cp.async-tracked arrivals of gather warp 0,
// one phase per row with blocks that uses the buffer; row u with blocks uses Q buffer
// u % q_buffers), q_empty[q_buffers] (128 consumer arrivals after the row's last S^T, 256 for
// 64 heads: a later row's Q may come into the buffer), k_full[stages] (32 arrivals of the
// stage's gather warp, after its zero rows and validity mask are stored, plus the transaction
// bytes of its bulk copies) and k_empty[stages] (128 consumer arrivals, 256 for 64 heads, after
// the last ldmatrix that read the stage); named barrier 1 (the 128 consumer threads; 1 + the
// warpgroup for 64 heads) for the headroom vote (bar.red.or), the
// column-max exchange, the P^T hand-off and the column sums. The Q tiles and P^T, which wgmma
// reads, are fenced with fence.proxy.async;
// the K ring is read by ldmatrix only.
//
// Numerics (as sparse_mla_prefill.cu, but for the reference max): s2 = dot *
// sm_scale*q_scale*kv_scale*log2(e); S^T accumulated by the tensor cores over at most 96
// channels per fresh accumulator and summed in f32 registers; p = ex2.approx(s2 - m_ref); P
// re-quantised to e4m3 (satfinite, round to nearest even) for P.V; denominators use the f32 p.
// m_ref starts at -inf (a head with no valid token so far subtracts 0, so p = 0) and becomes the
// column max of the block (over the previous m_ref) in every block with a score above m_ref +
// headroom: the first valid token, and any score that would weigh more than 1/16 of the
// column's denominator or more than 2^8 (the headroom: min(8, log2 of 1/16 of a lower bound of
// the denominator, kept from the last such block; one value a thread, from the smallest of its
// columns' sums)). Other blocks keep m_ref: their weights may
// exceed 1 (at most 2^8, inside e4m3), so the one cross-warp exchange of column maxima, the
// rescale of l and of O^T (64 or 128 registers a thread) are skipped where the max grows by a
// little — in random scores, most blocks. A weight above 1 is then rounded to e4m3 where the
// exact-max scheme would have given the new maximum weight exactly 1, but only while it is at
// most 1/16 of the denominator, so the output moves by at most 2^-8 of its magnitude; where one
// token dominates, every block that raises the max takes the exchange as before. max_logits is
// the true max (tracked per thread beside m_ref); lse = m_ref + log2(l) is exact for any m_ref.
// (Measured against an f64 reference on the harness's 39 narrow cases: max |dout| equal or
// lower in 38, 3% higher in one; bench/NOTES.md.)

namespace sparse_mla_narrow {

constexpr int kConsumerThreads = 128;
constexpr int kTokensPerBlock = 64;    // wgmma M of S^T
constexpr int kDV = 512;               // value width
constexpr int kValueTiles = kDV / 64;  // M tiles of O^T
// The K ring holds stages of 32 gathered rows (half a block); a block is two consecutive stages.
constexpr int kStageTokens = 32;
// CTAs per SM by tile: two, and three for 8 heads at d_qk 512 (their 32-row stages are small
// enough for four of them a CTA; three CTAs measured 10% faster than two). 32 heads fit two CTAs
// (their O^T accumulator takes 128 of the consumer's 224 registers, with one S^T chunk in
// flight): 1.5x faster than one CTA per SM with eleven stages, whose one consumer chain per SM
// left the SM idle. (8 heads at d_qk 576 in three CTAs would have room for three 32-row stages
// or seven 16-row ones a CTA: both measured slower than two CTAs.)
template <int D_QK, int H>
constexpr int kCtasPerSmFor = H == 64 ? 1 : (H == 8 && D_QK == 512 ? 3 : 2);
// 64 heads: one CTA per SM with two consumer warpgroups, warpgroup w running heads 32w …
// 32w + 31 as a 32-head tile of its own (its S^T, softmax, P^T and O^T over all 512 value
// columns; nothing crosses the warpgroups but the K ring and the Q tile, which both read). So a
// row is gathered once per 64 heads instead of once per 32. Against two 32-head CTAs per SM:
// equal at d_qk 576 up to s_kv 32768, 1.5% faster at s_kv 65536 and 1% at d_qk 512 (the
// harness, bench/NOTES.md). (Splitting P.V by value columns instead, so that each warpgroup's
// O^T covered all 64 heads with half the P.V instructions, measured no faster: the two
// warpgroups then wait for each other's P^T every block.)
template <int H>
constexpr int kConsumerWgsFor = H == 64 ? 2 : 1;
// Heads of one consumer warpgroup: the N of its S^T and O^T, the columns of its softmax.
template <int H>
constexpr int kSHeadsFor = H == 64 ? 32 : H;
constexpr int kGatherWarps = 4;  // a whole warpgroup: setmaxnreg works on warpgroups
// Threads per CTA: the consumer warpgroup(s), then the gather warpgroup (gather warp w fills
// stages w, w + 4, ...).
template <int H>
constexpr int kThreadsFor = kConsumerThreads * kConsumerWgsFor<H> + 32 * kGatherWarps;
// Registers per thread at launch, under the launch bounds (unit of 8): 128 at two CTAs of 256
// threads per SM, 80 at three, 168 for the one 384-thread CTA of 64 heads.
template <int D_QK, int H>
constexpr int kLaunchRegsFor = 65536 / (kThreadsFor<H> * kCtasPerSmFor<D_QK, H>) / 8 * 8;
// Registers per thread after the warp-specialised re-allocation: the gather warpgroup gives
// registers to the consumer warpgroup. The gather warps' row loop runs in 32 without spills
// (24 spill), but measured 2-9% slower at 8 and 16 heads than with 40; at 32 heads the 8 more
// consumer registers (224) cut its spill from ~130 to ~30 bytes a thread, 1% faster at d_qk 576
// and 4% at 512. The consumer at three CTAs per SM fits 120 with four P.V tiles in flight; the
// 64-head tile's consumers get the rest of their pool, 232 (no spill).
template <int D_QK, int H>
constexpr int kGatherRegsFor = H == 32 ? 32 : 40;
// The consumers take what is left of the CTA's pool: 216 (224 at 32 heads) at two CTAs per SM,
// 120 at three, 232 for the 64-head tile.
template <int D_QK, int H>
constexpr int kConsumerRegsFor = (kLaunchRegsFor<D_QK, H> * kThreadsFor<H> -
                                  32 * kGatherWarps * kGatherRegsFor<D_QK, H>) /
                                 (kConsumerThreads * kConsumerWgsFor<H>);
// setmaxnreg.inc blocks until the CTA's pool (its registers at launch) can supply it, so the two
// counts must add up to that pool (and setmaxnreg takes multiples of 8).
template <int D_QK, int H>
constexpr bool kRegisterPoolFits =
    (kConsumerRegsFor<D_QK, H> * kConsumerWgsFor<H> + kGatherRegsFor<D_QK, H>) * 128 ==
        kLaunchRegsFor<D_QK, H> * kThreadsFor<H> &&
    kConsumerRegsFor<D_QK, H> % 8 == 0;
// Ring depth: as many stages as the shared memory of an SM holds for its CTAs (checked below);
// for 64 heads, with one Q tile, nine at d_qk 576 and eleven at 512 (not tuned further).
template <int D_QK, int H>
constexpr int kStagesFor = H == 64 ? (D_QK == 576 ? 9 : 11) : H == 32 ? 4
                           : H == 16 ? (D_QK == 576 ? 5 : 6)
                                     : (D_QK == 576 ? 5 : 4);
// S^T precision: wgmma accumulates at most this many k-steps (32 channels each) in one fresh
// accumulator before the partial sum is added to the f32 register sum (same as the wide kernel).
constexpr int kQkChunkSteps = 3;
// Named barrier of the 128 threads of a consumer warpgroup: kBarConsumers + its index (64 heads:
// ids 1 and 2).
constexpr int kBarConsumers = 1;
// The softmax's reference max (see "Numerics" above): a block whose scores exceed it by at most
// the headroom keeps it; the headroom is at most kMaxHeadroom (weights <= 2^8, inside e4m3) and
// at most log2 of 1/16 of a lower bound of the denominator, so such a weight is never more than
// 1/16 of the denominator.
constexpr float kMaxHeadroom = 8.f;
constexpr float kLog2ShareLimit = 4.f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Bytes of one CTA's shared memory with QB Q tiles (the layout of Smem below). (Variable
// templates, not constexpr functions: NVRTC compiles no host functions.)
template <int D_QK, int H, int QB>
constexpr int kSmemBytesWith =
    QB * (H * D_QK + 16) + kStagesFor<D_QK, H> * (32 * D_QK + 536) + 112 * H;
// Whether the CTAs of one SM fit in its shared memory (1 KB of it reserved per CTA).
template <int D_QK, int H, int QB>
constexpr bool kSmemFits =
    kCtasPerSmFor<D_QK, H> * (kSmemBytesWith<D_QK, H, QB> + 1024) <= 233472 &&
    kSmemBytesWith<D_QK, H, QB> <= 232448;
// Q tiles per CTA: two where they fit beside the ring (8 and 16 heads at d_qk 576, 8 and 32
// heads at 512, where 32 heads give up a fifth ring stage for it, which measured faster), so
// gather warp 0 loads the next row's Q while the consumers still read the current one (with
// one, it waits for the row's last S^T before it loads the next row's Q, and its later stages
// of that row wait behind it); else one.
template <int D_QK, int H>
constexpr int kQBuffersFor = kSmemFits<D_QK, H, 2> ? 2 : 1;

// Shared-memory map for one (D_QK, HEAD_TILE) (byte offsets from the dynamic shared memory base).
template <int D_QK, int H>
struct Smem {
    static constexpr int kChunks = D_QK / 16;                // 16-byte chunks per row
    static constexpr int kRowGroupBytes = 8 * D_QK;          // SBO of the Q tile
    static constexpr int kRowStride = D_QK + 16;             // K ring row pitch (bank spread)
    static constexpr int kStageBytes = kStageTokens * kRowStride;
    static constexpr int kPtBytes = H * kTokensPerBlock;     // one P^T buffer
    static constexpr int kStages = kStagesFor<D_QK, H>;
    static constexpr int kQBuffers = kQBuffersFor<D_QK, H>;
    static constexpr int kQBytes = H * D_QK;                 // one Q tile
    static constexpr int kQ = 0;                             // Q tiles [kQBuffers][H heads][D_QK]
    static constexpr int kK = kQ + kQBuffers * kQBytes;      // K ring  [kStages][32 rows][pitch]
    // (64 heads: P^T, max and sums hold one [32-head] part per consumer warpgroup, in order.)
    static constexpr int kPt = kK + kStages * kStageBytes;   // P^T     [H heads][64 positions]
    static constexpr int kMax = kPt + kPtBytes;              // f32     [2 parity][4 warps][H]
    static constexpr int kSum = kMax + 2 * 4 * H * 4;        // f32     [4 warps][H]
    static constexpr int kMask = kSum + 4 * H * 4;           // u32     [kStages] validity masks
    static constexpr int kBars = kMask + kStages * 8;  // u64 mbarriers (2*kQBuffers + 2*kStages)
    static constexpr int kBytes = kBars + (2 * kQBuffers + 2 * kStages) * 8;
    static_assert(kK % 128 == 0 && kStageBytes % 16 == 0, "K stages must stay 16-byte aligned");
    static_assert(kQBytes % 128 == 0, "Q tiles must stay 128-byte aligned");
    static_assert(kBytes == kSmemBytesWith<D_QK, H, kQBuffers>,
                  "the layout and its formula (kSmemBytesWith, the header's launch shape)");
    static_assert(kSmemFits<D_QK, H, kQBuffers>,
                  "the CTAs of one SM must fit in its shared memory");
};

// mbarrier indices inside the barrier area: q_full[kQBuffers], k_full[kStages],
// k_empty[kStages], q_empty[kQBuffers].
constexpr int kBarQFull = 0;
template <int D_QK, int H>
constexpr int kBarKFullFor = kQBuffersFor<D_QK, H>;
template <int D_QK, int H>
constexpr int kBarKEmptyFor = kQBuffersFor<D_QK, H> + kStagesFor<D_QK, H>;
template <int D_QK, int H>
constexpr int kBarQEmptyFor = kQBuffersFor<D_QK, H> + 2 * kStagesFor<D_QK, H>;

// ------------------------------------------------------------------------------------------------
// PTX helpers
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32 (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void st_shared_u16(u32 addr, u16 v) {
    asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}

// Keeps register A fragments alive (unmodified, not reused) until a wgmma that reads them is done.
template <int K>
__device__ __forceinline__ void keep_alive(const u32 (&a)[K][4]) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
        asm volatile("" ::"r"(a[k][0]), "r"(a[k][1]), "r"(a[k][2]), "r"(a[k][3]) : "memory");
    }
}

// acc[64 x N f32] (+)= A[64x32 e4m3, registers] * B[N x 32 e4m3, smem]^T, N = 8, 16 or 32;
// accumulate = 0 overwrites acc.
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&acc)[N / 2], const u32 (&a)[4], u64 desc_b,
                                         u32 accumulate = 1u) {
    if constexpr (N == 8) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3\n"
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    } else if constexpr (N == 16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3\n"
            "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]),
              "+f"(acc[6]), "+f"(acc[7])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    } else {
        static_assert(N == 32, "head tile must be 8, 16 or 32");
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3\n"
            "{%0, %1, %2, %3, %4, %5, %6, %7,\n"
            " %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]),
              "+f"(acc[6]), "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]),
              "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    }
}

// ------------------------------------------------------------------------------------------------
// Gather warp: Q tile, then the K rows of every block.
// ------------------------------------------------------------------------------------------------

template <int D_QK, int H>
struct Gather {
    static constexpr int kStages = kStagesFor<D_QK, H>;
    static constexpr int kWarps = kGatherWarps;
    // The phase argument in run needs kWarps <= kStages.
    static_assert(kWarps <= kStages, "no more gather warps than ring stages");
    static constexpr int kChunks = D_QK / 16;
    static constexpr int kRowStride = Smem<D_QK, H>::kRowStride;
    static constexpr int kStageBytes = Smem<D_QK, H>::kStageBytes;
    u32 k_base;          // shared address of stage 0 of the K ring
    u32 bars;            // shared address of the mbarrier area
    u32* mask32;         // [kStages] validity bits (bit r = row r of the stage)
    const u8* kv;        // [s_kv, D_QK]
    const i32* idx_row;  // [topk] indices of this query row
    i32 valid_len;       // L_i (clamped)
    i32 s_kv;
    int lane;

    // Lane l gathers row l of a stage: one bulk copy of D_QK bytes if the row is valid.
    // Index of row lane of stage j (token 32*j + lane of the row), or -1 past the valid prefix.
    __device__ __forceinline__ int load_index(int j) const {
        const int t = j * kStageTokens + lane;
        return t < valid_len ? __ldg(idx_row + t) : -1;
    }

    // Issue the gathers of stage j into ring slot j % kStages and arrive on k_full[slot]: valid
    // rows by the bulk copy engine (transaction bytes), invalid rows zero-filled by the warp
    // (never read from global memory), the validity mask by lane 0.
    __device__ __forceinline__ void issue_stage(int j, int idx) const {
        const int slot = j % kStages;
        const u32 dst = k_base + slot * kStageBytes;
        const u32 full = bars + (kBarKFullFor<D_QK, H> + slot) * 8;
        const bool valid = idx >= 0 && idx < s_kv;
        const u32 bits = __ballot_sync(0xffffffffu, valid);
        if (lane == 0) {
            mbar_expect_tx(full, (u32)__popc(bits) * (u32)D_QK);
        }
        __syncwarp();
        if (valid) {
            bulk_copy_g2s(dst + lane * kRowStride, kv + (i64)idx * D_QK, D_QK, full);
        }
        // Zero-fill the invalid rows (their scores are masked; zeros keep P.V finite).
        u32 invalid = ~bits;
        while (invalid != 0) {
            const int r = __ffs((int)invalid) - 1;
            invalid &= invalid - 1;
            const u32 row = dst + r * kRowStride;
            st_shared_zero16(row + lane * 16);
            if (lane < kChunks - 32) {
                st_shared_zero16(row + (32 + lane) * 16);
            }
        }
        if (lane == 0) {
            mask32[slot] = bits;
        }
        mbar_arrive(full);  // 32 arrivals: releases the zero rows and the mask
    }

    // Gather warp w: the row's stages t whose CTA-wide stage number j = j_base + t is w, w +
    // kWarps, ... (stage j into ring slot j % kStages). after_first() runs once, right after
    // the warp's first stage of the row is issued (at the end if it has none).
    template <class F>
    __device__ __forceinline__ void run(int w, int j_base, int num_stages, F&& after_first) const {
        const int t_first = ((w - j_base) % kWarps + kWarps) % kWarps;
        int idx_cur = t_first < num_stages ? load_index(t_first) : -1;
        for (int t = t_first; t < num_stages; t += kWarps) {
            const int j = j_base + t;
            // The index of this warp's next stage loads while this one waits for its slot.
            const int idx_next = t + kWarps < num_stages ? load_index(t + kWarps) : -1;
            if (j >= kStages) {
                // The consumers finished reading stage j - kStages, the slot's previous stage.
                // They release stages in order, and this warp already saw stage
                // j - kWarps - kStages released (kWarps <= kStages), so stage j - 2*kStages is
                // released too: the barrier is at most one phase behind the parity waited for.
                mbar_wait(bars + (kBarKEmptyFor<D_QK, H> + j % kStages) * 8,
                          (u32)(j / kStages - 1) & 1u);
                // The slot's previous rows may have been zero-filled by another gather warp
                // (generic proxy); order those writes before this warp's bulk copies (async
                // proxy) into the same rows.
                fence_proxy_async();
            }
            issue_stage(j, idx_cur);
            if (t == t_first) after_first();
            idx_cur = idx_next;
        }
        if (t_first >= num_stages) after_first();
    }
};

}  // namespace sparse_mla_narrow

// ------------------------------------------------------------------------------------------------
// Kernel
// ------------------------------------------------------------------------------------------------

template <int D_QK, int HEAD_TILE, bool HAVE_TOPK_LENGTH, bool HAVE_SINK>
__global__ void __launch_bounds__(sparse_mla_narrow::kThreadsFor<HEAD_TILE>,
                                  sparse_mla_narrow::kCtasPerSmFor<D_QK, HEAD_TILE>)
    sparse_mla_narrow_kernel(const SparseMlaParams p) {
    using namespace sparse_mla_narrow;
    constexpr int H = HEAD_TILE;
    using L = Smem<D_QK, H>;
    constexpr int kStages = L::kStages;
    constexpr int kBarKEmpty = kBarKEmptyFor<D_QK, H>;
    static_assert(D_QK == 512 || D_QK == 576, "D_QK must be 512 or 576");
    static_assert(H == 8 || H == 16 || H == 32 || H == 64, "HEAD_TILE must be 8, 16, 32 or 64");
    constexpr int kWgs = kConsumerWgsFor<H>;
    constexpr int kAllConsumers = kConsumerThreads * kWgs;
    constexpr int kGatherWarp0 = 4 * kWgs;  // first gather warp
    constexpr int HS = kSHeadsFor<H>;        // heads of one warpgroup's S^T
    static_assert(!HAVE_SINK || HAVE_TOPK_LENGTH, "attn_sink requires topk_length");
    static_assert(kRegisterPoolFits<D_QK, H>, "register pool of one CTA");

    extern __shared__ __align__(1024) u8 smem[];
    const u32 smem_base = smem_addr(smem);
    const u32 sq = smem_base + L::kQ;
    const u32 sk = smem_base + L::kK;
    const u32 spt = smem_base + L::kPt;
    const u32 bars = smem_base + L::kBars;

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;

    // The CTA is persistent: it takes work items (query row, head tile) blockIdx.x,
    // blockIdx.x + gridDim.x, ...; its K ring, barriers and phases run on across them, so the
    // gather warps fill the next row's first stages while the consumers finish the current row.
    const int items = p.s_q * p.head_tiles;
    struct Row {
        int tile, row_i, valid_len, num_blocks;  // num_blocks: blocks that can hold a valid token
    };
    auto row_of = [&](int item) {
        Row r;
        r.tile = item % p.head_tiles;
        r.row_i = item / p.head_tiles;
        r.valid_len = p.topk;
        if (HAVE_TOPK_LENGTH) {
            r.valid_len = min(max(__ldg(p.topk_length + r.row_i), 0), p.topk);
        }
        r.num_blocks = HAVE_TOPK_LENGTH ? (r.valid_len + kTokensPerBlock - 1) / kTokensPerBlock
                                        : p.topk / kTokensPerBlock;
        return r;
    };

    if (threadIdx.x == 0) {
        for (int qb = 0; qb < L::kQBuffers; ++qb) {
            mbar_init(bars + (kBarQFull + qb) * 8, 32);
            mbar_init(bars + (kBarQEmptyFor<D_QK, H> + qb) * 8, kAllConsumers);
        }
        for (int s = 0; s < kStages; ++s) {
            mbar_init(bars + (kBarKFullFor<D_QK, H> + s) * 8, 32);
            mbar_init(bars + (kBarKEmpty + s) * 8, kAllConsumers);
        }
        // The bulk copy engine (async proxy) completes transactions on these barriers.
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp >= kGatherWarp0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kGatherRegsFor<D_QK, H>));
        // ---------------------------------------------------------------- gather warp
        Gather<D_QK, H> gather;
        gather.k_base = sk;
        gather.bars = bars;
        gather.mask32 = reinterpret_cast<u32*>(smem + L::kMask);
        gather.kv = p.kv;
        gather.s_kv = p.s_kv;
        gather.lane = lane;
        int j_base = 0;  // CTA-wide number of the row's first stage
        int q_uses = 0;  // rows with blocks so far: the phase of q_full / q_empty
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            const Row r = row_of(item);
            if (r.num_blocks == 0) continue;  // no Q, no stages: the consumers skip it too
            // Q tile -> Q buffer q_uses % kQBuffers by gather warp 0, once the consumers are
            // done with the row that used it last (q_empty of that buffer; one warp loads every
            // Q tile, so it waited for the buffer's previous phase itself and the barrier is at
            // most one phase behind). Heads >= h_q are zero-filled (no global read); their
            // outputs are not written.
            auto load_q = [&]() {
                if (warp != kGatherWarp0) return;
                const int qb = q_uses % L::kQBuffers;
                if (q_uses >= L::kQBuffers) {
                    mbar_wait(bars + (kBarQEmptyFor<D_QK, H> + qb) * 8,
                              (u32)(q_uses / L::kQBuffers - 1) & 1u);
                }
                const u32 sq_row = sq + (u32)(qb * L::kQBytes);
                const u8* q_row = p.q + (i64)r.row_i * p.h_q * D_QK;
                for (int e = lane; e < H * L::kChunks; e += 32) {
                    const int hr = e / L::kChunks;
                    const int c = e % L::kChunks;
                    const int head = r.tile * H + hr;
                    const bool valid = head < p.h_q;
                    const u8* src = q_row + (valid ? (i64)head * D_QK + c * 16 : (i64)0);
                    cp_async_16(sq_row + (hr >> 3) * L::kRowGroupBytes + c * 128 + (hr & 7) * 16, src,
                                valid ? 16u : 0u);
                }
                mbar_arrive_cp_async(bars + (kBarQFull + qb) * 8);
            };
            gather.idx_row = p.indices + (i64)r.row_i * p.topk;
            gather.valid_len = r.valid_len;
            if constexpr (L::kQBuffers == 2) {
                // The buffer was last read two rows back: its q_empty wait has almost always
                // completed by now, so Q goes first.
                load_q();
                gather.run(warp - kGatherWarp0, j_base, 2 * r.num_blocks, [] {});
            } else {
                // With one Q buffer, q_empty completes only after the previous row's last S^T.
                // Gather warp 0 issues its first stage of this row before it waits there, so
                // that stage (which the row's first block needs beside the Q tile) is not held
                // back by the wait and the Q copies (1.5-2% faster at 64 heads, bench/NOTES.md).
                gather.run(warp - kGatherWarp0, j_base, 2 * r.num_blocks, load_q);
            }
            ++q_uses;
            j_base += 2 * r.num_blocks;
        }
        // Gather warp 0's Q cp.async (and its mbarrier arrival) completes before it exits.
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }

    // -------------------------------------------------------------------- consumer warpgroup
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegsFor<D_QK, H>));
    // 64 heads: warpgroup wg runs heads 32wg … 32wg + 31 as a 32-head tile of its own, both
    // reading the one K ring (compile-time 0 for the narrow tiles).
    const int wg = kWgs > 1 ? warp >> 2 : 0;
    const int wwarp = kWgs > 1 ? warp & 3 : warp;  // warp inside the warpgroup
    constexpr int kAcc = HS / 2;             // f32 registers of one m64nHS accumulator
    constexpr int kColGroups = HS / 8;       // 8-column groups of an accumulator
    const int bar_wg = kBarConsumers + wg;   // named barrier of this warpgroup's 128 threads
    constexpr int kQkSteps = D_QK / 32;
    constexpr int kQkChunks = (kQkSteps + kQkChunkSteps - 1) / kQkChunkSteps;
    // S^T chunk accumulators in flight at once: as many as the 216 (224) registers a consumer
    // thread gets allow (O^T holds 8 * kAcc of them: 32 for 8 heads, 64 for 16, 128 for 32).
    // (8 heads at three CTAs per SM: 120 registers hold two.)
    constexpr int kQkBuffers =
        HS == 8 ? (kCtasPerSmFor<D_QK, H> == 3 ? 2 : kQkChunks) : (HS == 16 ? 3 : 1);
    // A-fragment (K row) buffers of the S^T chunks: one more than the chunk accumulators, so a
    // chunk's ldmatrix runs while the chunk before it is still in the tensor cores (2-3% faster
    // at 16 and 32 heads than loading after the wait). At 32 heads ptxas then spills about 30
    // bytes a thread (L1-resident local memory; 130 with 216 registers, where the spill-free
    // choice, no spare buffer and two P.V tiles, measured 3% slower at d_qk 576).
    constexpr int kKaBuffers = kQkBuffers + 1 < kQkChunks ? kQkBuffers + 1 : kQkChunks;
    // P.V M tiles in flight (each holds its V^T A fragments, 8 registers, until it completes).
    constexpr int kPvBuffers = HS == 32 ? 3 : (kCtasPerSmFor<D_QK, H> == 3 ? 4 : 8);
    // 32 heads: the first P.V tiles' V^T fragments load before the softmax (3% faster measured
    // at two CTAs per SM); 8 and 16 heads gain nothing from it.
    constexpr bool kPrefetchV = HS == 32;
    // 64 heads at d_qk 576: the first S^T chunk of block b + 1 is issued while the last P.V M
    // tile of block b is still in the tensor cores, so the pipe does not drain between them
    // (+0.6-1.1% in the harness; at d_qk 512 0.7-0.9% slower, and for 16 and 32 heads within
    // ±0.9% either way, so only there; bench/NOTES.md). Keeping more P.V tiles in flight
    // there spills.
    constexpr bool kSUnderPv = kWgs == 2 && D_QK == 576;
    static_assert(!kSUnderPv || kQkChunks > kQkBuffers, "s_begin must wait for a chunk");

    const int g = lane >> 2;    // accumulator row inside the warp's 16 rows
    const int t0 = lane & 3;    // accumulator column pair

    // Per warpgroup: max [2 parity][4 warps][HS], sums [4 warps][HS].
    float* max_xchg = reinterpret_cast<float*>(smem + L::kMax) + wg * 2 * 4 * HS;
    float* sum_xchg = reinterpret_cast<float*>(smem + L::kSum) + wg * 4 * HS;
    const u32* mask32 = reinterpret_cast<const u32*>(smem + L::kMask);

    const float q_scale = __ldg(p.q_scale);
    const float kv_scale = __ldg(p.kv_scale);
    const float score_scale = p.sm_scale * q_scale * kv_scale * kLog2e;
    // Descriptor of Q buffer 0; buffer qb starts qb * kQBytes later (the start-address field
    // counts 16-byte units).
    const u64 q_desc0 =
        make_smem_desc(sq + (u32)(wg * (HS / 8) * L::kRowGroupBytes), 128, L::kRowGroupBytes);
    u64 q_desc = q_desc0;  // the current row's Q buffer
    const u32 spt_wg = spt + (u32)(wg * HS * kTokensPerBlock);  // this warpgroup's P^T
    const u64 pt_desc = make_smem_desc(spt_wg, 128, 512);
    // ldmatrix row addresses of this lane in a stage (row-major, pitch kRowStride).
    // S^T A fragment of a k-step (32 channels): matrix lane/8 = block rows 16*warp +
    // 8*((lane/8)&1) + lane%8, bytes 16*(lane/16) … +15, i.e. registers a0..a3 of the wgmma A
    // fragment; block rows 0-31 are the block's first stage (warps 0, 1), 32-63 its second.
    const u32 k_lane_off =
        (u32)(16 * (wwarp & 1) + 8 * ((lane >> 3) & 1) + (lane & 7)) * L::kRowStride +
        (u32)(lane >> 4) * 16;
    // V^T (ldmatrix.trans) of a 32-token k-step: matrix lane/8 covers tokens 8*(lane/8) … +7,
    // so lane l addresses token l; this warp's 16-byte value-column chunk of M tile mt is
    // 4*mt + warp.
    const u32 v_lane_off = (u32)lane * L::kRowStride + (u32)wwarp * 16;
    // P^T byte of this thread's S^T row r = 16*warp + g + 8*hr, head column c:
    //   (c/8)*512 + warp*128 + (c%8)*16 + 4*(g/2) + 2*(g%2) + hr,
    // so the thread's two rows of a head are one two-byte store.
    const u32 pt_lane = spt_wg + (u32)wwarp * 128 + (u32)(4 * (g >> 1) + 2 * (g & 1));

    float o[kValueTiles][kAcc];  // O^T: [M tile][accumulator]; row = value column, column = head
    // Statistics of this thread's columns: heads 8*j + 2*t0 + v, stored at [2*j + v].
    // m_ref: the reference max the weights are taken against; t_max: the true max (for
    // max_logits); l_run: the row sum against m_ref; headroom: how far a score may exceed m_ref
    // without a new exchange (one value for the thread's columns, set at each exchange).
    float m_ref[2 * kColGroups], t_max[2 * kColGroups], l_run[2 * kColGroups];
    float headroom;
    // CTA-wide number of the current row's first stage: block b of the row is stages
    // j_base + 2b and j_base + 2b + 1.
    int j_base = 0;

    // Stage addresses: block b of the row is stages j_base + 2b (tokens 0-31) and + 1 (32-63).
    auto stage_addr = [&](int j) { return sk + (u32)((j % kStages) * L::kStageBytes); };

    // ---- S^T = K . Q^T of block b, chunks of kQkChunkSteps k-steps into fresh accumulators.
    // s_begin waits for the block's stages and issues every chunk (waiting for chunk
    // c - kQkBuffers before reusing its buffers), leaving the last kQkBuffers chunks in flight;
    // s_end adds them once the caller has waited for them. With pv_tail_in_flight (kSUnderPv)
    // the last P.V M tile of the previous block is still in the tensor cores: the first of those
    // waits retires it too, and only then are its accumulator and fragment registers released.
    float s[kAcc];
    float part[kQkBuffers][kAcc];
    u32 frag[kPvBuffers][2][4];  // V^T fragments of P.V (below): [buffer][k-step][register]
    // Once P.V M tile mt is done (waited for): its O^T registers may be read and, for the last
    // kPvBuffers tiles (the ones still holding a buffer), its fragment registers reused.
    auto pv_retire = [&](int mt) {
        fence_regs(o[mt]);
        if (mt + kPvBuffers >= kValueTiles) keep_alive(frag[mt % kPvBuffers]);
    };
    u32 ka[kKaBuffers][kQkChunkSteps][4];  // A fragments (K rows) of the chunks in flight
    auto add_chunk = [&](int c) {
        float (&done)[kAcc] = part[c % kQkBuffers];
        fence_regs(done);
        keep_alive(ka[c % kKaBuffers]);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) s[i] += done[i];
    };
    auto s_begin = [&](int b, bool pv_tail_in_flight) {
        const int j0 = j_base + 2 * b, j1 = j0 + 1;
        mbar_wait(bars + (kBarKFullFor<D_QK, H> + j0 % kStages) * 8, (u32)(j0 / kStages) & 1u);
        mbar_wait(bars + (kBarKFullFor<D_QK, H> + j1 % kStages) * 8, (u32)(j1 / kStages) & 1u);
        const u32 k_rows = stage_addr(wwarp < 2 ? j0 : j1) + k_lane_off;  // this warp's rows
#pragma unroll
        for (int i = 0; i < kAcc; ++i) s[i] = 0.f;
#pragma unroll
        for (int c = 0; c < kQkChunks; ++c) {
            u32 (&fa)[kQkChunkSteps][4] = ka[c % kKaBuffers];
            // With a spare A buffer the chunk's K rows load before the wait below (the chunk
            // that last used this buffer, c - kKaBuffers, was waited for by then).
            if constexpr (kKaBuffers > kQkBuffers) {
#pragma unroll
                for (int j = 0; j < kQkChunkSteps; ++j) {
                    const int ks = c * kQkChunkSteps + j;
                    if (ks < kQkSteps) ldmatrix_x4(k_rows + (u32)ks * 32, fa[j]);
                }
            }
            if (c >= kQkBuffers) {
                wgmma_wait<kQkBuffers - 1>();  // chunk c - kQkBuffers is done
                if (c == kQkBuffers && pv_tail_in_flight) pv_retire(kValueTiles - 1);
                add_chunk(c - kQkBuffers);
            }
            float (&acc)[kAcc] = part[c % kQkBuffers];
            if constexpr (kKaBuffers == kQkBuffers) {
#pragma unroll
                for (int j = 0; j < kQkChunkSteps; ++j) {
                    const int ks = c * kQkChunkSteps + j;
                    if (ks < kQkSteps) ldmatrix_x4(k_rows + (u32)ks * 32, fa[j]);
                }
            }
            fence_regs(acc);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < kQkChunkSteps; ++j) {
                const int ks = c * kQkChunkSteps + j;
                if (ks < kQkSteps) {
                    wgmma_rs<HS>(acc, fa[j], q_desc + (u64)(ks * 16), j > 0 ? 1u : 0u);
                }
            }
            wgmma_commit();
        }
    };
    auto s_end = [&]() {
#pragma unroll
        for (int c = kQkChunks - kQkBuffers; c < kQkChunks; ++c) add_chunk(c);
    };

    // ---- softmax of block b: scale, mask (row r of S^T is token r of the block), then the
    // weights p = 2^(s - m_ref) -> P^T (e4m3) and the row sums. m_ref moves to the column max
    // (an exchange across the four warps, and O^T rescaled) only in a block where some score
    // exceeds m_ref by more than the headroom; otherwise the block keeps m_ref (one barrier vote
    // instead of the exchange).
    // Returns whether any alpha of the warp differs from 1 (O^T then needs the rescale).
    float alpha[2 * kColGroups];
    auto softmax = [&](int b) -> bool {
        const int j0 = j_base + 2 * b;
        const u64 mask = (u64)mask32[j0 % kStages] | ((u64)mask32[(j0 + 1) % kStages] << 32);
        bool grow = false;
#pragma unroll
        for (int j = 0; j < kColGroups; ++j) {
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                const int c = 2 * j + v;
                float mx = -pos_inf();
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int r = 16 * wwarp + g + 8 * hr;
                    float x = s[4 * j + 2 * hr + v] * score_scale;
                    x = ((mask >> r) & 1ull) ? x : -pos_inf();
                    s[4 * j + 2 * hr + v] = x;
                    mx = fmaxf(mx, x);
                }
                t_max[c] = fmaxf(t_max[c], mx);
                grow |= mx > m_ref[c] + headroom;  // any valid score while m_ref is -inf
            }
        }
        const bool exchange = named_barrier_any(bar_wg, kConsumerThreads, grow);
        float m_sub[2 * kColGroups];
        bool rescale = false;
        if (exchange) {
            // Column maxima: the thread's two rows, the 8 lanes of a column, the 4 warps.
            float cmax[2 * kColGroups];
#pragma unroll
            for (int c = 0; c < 2 * kColGroups; ++c) {
                const int j = c >> 1, v = c & 1;
                float mx = fmaxf(s[4 * j + v], s[4 * j + 2 + v]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                cmax[c] = mx;
            }
            float* max_b = max_xchg + (b & 1) * 4 * HS;
            if (g == 0) {
#pragma unroll
                for (int j = 0; j < kColGroups; ++j) {
                    *reinterpret_cast<float2*>(max_b + wwarp * HS + 8 * j + 2 * t0) =
                        make_float2(cmax[2 * j], cmax[2 * j + 1]);
                }
            }
            named_barrier_sync(bar_wg, kConsumerThreads);
#pragma unroll
            for (int j = 0; j < kColGroups; ++j) {
                float2 bm = *reinterpret_cast<const float2*>(max_b + 8 * j + 2 * t0);
#pragma unroll
                for (int w = 1; w < 4; ++w) {
                    const float2 x =
                        *reinterpret_cast<const float2*>(max_b + w * HS + 8 * j + 2 * t0);
                    bm.x = fmaxf(bm.x, x.x);
                    bm.y = fmaxf(bm.y, x.y);
                }
#pragma unroll
                for (int v = 0; v < 2; ++v) {
                    const int c = 2 * j + v;
                    const float m_new = fmaxf(m_ref[c], v == 0 ? bm.x : bm.y);
                    m_sub[c] = m_new == -pos_inf() ? 0.f : m_new;
                    alpha[c] = fast_exp2(m_ref[c] - m_sub[c]);
                    rescale |= alpha[c] != 1.f;
                    m_ref[c] = m_new;
                    l_run[c] *= alpha[c];
                }
            }
        } else {
#pragma unroll
            for (int c = 0; c < 2 * kColGroups; ++c) {
                m_sub[c] = m_ref[c] == -pos_inf() ? 0.f : m_ref[c];
            }
        }
        // Weights of the thread's rows g and g + 8 of head column c: one two-byte P^T store.
#pragma unroll
        for (int j = 0; j < kColGroups; ++j) {
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                const int c = 2 * j + v;
                const float p0 = fast_exp2(s[4 * j + v] - m_sub[c]);      // row g
                const float p1 = fast_exp2(s[4 * j + 2 + v] - m_sub[c]);  // row g + 8
                l_run[c] += p0;
                l_run[c] += p1;
                st_shared_u16(pt_lane + (u32)(j * 512 + (2 * t0 + v) * 16), pack_e4m3x2(p0, p1));
            }
        }
        if (exchange) {
            // New headroom: log2 of 1/16 of the warp's part of the smallest of the thread's
            // column sums (a lower bound of each of those columns' whole sums, which only grow
            // until the next exchange), at most kMaxHeadroom.
            float w = l_run[0];
#pragma unroll
            for (int c = 1; c < 2 * kColGroups; ++c) w = fminf(w, l_run[c]);
            w += __shfl_xor_sync(0xffffffffu, w, 4);
            w += __shfl_xor_sync(0xffffffffu, w, 8);
            w += __shfl_xor_sync(0xffffffffu, w, 16);
            headroom = fminf(fmaxf(__log2f(w) - kLog2ShareLimit, 0.f), kMaxHeadroom);
        }
        fence_proxy_async();  // P^T is read by wgmma (async proxy)
        named_barrier_sync(bar_wg, kConsumerThreads);
        return __any_sync(0xffffffffu, rescale);
    };
    // O^T columns are this thread's heads: element i <-> statistic [2*(i/4) + i%2].
    auto rescale_o = [&]() {
#pragma unroll
        for (int mt = 0; mt < kValueTiles; ++mt) {
            fence_regs(o[mt]);
#pragma unroll
            for (int i = 0; i < kAcc; ++i) o[mt][i] *= alpha[2 * (i >> 2) + (i & 1)];
        }
    };

    // ---- O^T += V^T . P^T of block b over its 64 tokens, kPvBuffers M tiles in flight; the
    // block's stages are released after the last ldmatrix, before the tensor cores finish.
    // V^T A fragments of M tile mt of block b (ldmatrix.trans delivers 2-byte column pairs; the
    // byte permutes split them into the e4m3 rows g and g+8).
    auto load_v = [&](int b, int mt, u32 (&fr)[2][4]) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            u32 r0, r1, r2, r3;
            ldmatrix_x4_trans(stage_addr(j_base + 2 * b + ks) + v_lane_off + (u32)mt * 4 * 16, r0,
                              r1, r2, r3);
            fr[ks][0] = byte_perm(r0, r1, 0x6240u);  // row g   (column 2g),   tokens 0-15
            fr[ks][1] = byte_perm(r0, r1, 0x7351u);  // row g+8 (column 2g+1), tokens 0-15
            fr[ks][2] = byte_perm(r2, r3, 0x6240u);  // row g,   tokens 16-31
            fr[ks][3] = byte_perm(r2, r3, 0x7351u);  // row g+8, tokens 16-31
        }
    };
    // With kPrefetchV the first kPvBuffers tiles' fragments were loaded before the softmax
    // (prefetch_v), so their shared-memory latency hid behind it.
    auto prefetch_v = [&](int b) {
        if constexpr (kPrefetchV) {
#pragma unroll
            for (int mt = 0; mt < kPvBuffers; ++mt) load_v(b, mt, frag[mt]);
        }
    };
    auto pv_issue = [&](int b) {
#pragma unroll
        for (int mt = 0; mt < kValueTiles; ++mt) {
            u32 (&fr)[2][4] = frag[mt % kPvBuffers];
            if (mt >= kPvBuffers) {
                wgmma_wait<kPvBuffers - 1>();  // the M tile that used this buffer is done
                keep_alive(fr);                // ... so only now may its registers be reused
                load_v(b, mt, fr);
            } else if (!kPrefetchV) {
                load_v(b, mt, fr);
            }
            fence_regs(o[mt]);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) wgmma_rs<HS>(o[mt], fr[ks], pt_desc + (u64)(ks * 16));
            wgmma_commit();
        }
        mbar_arrive(bars + (kBarKEmpty + (j_base + 2 * b) % kStages) * 8);
        mbar_arrive(bars + (kBarKEmpty + (j_base + 2 * b + 1) % kStages) * 8);
    };
    auto pv_end = [&]() {
#pragma unroll
        for (int mt = 0; mt < kValueTiles; ++mt) pv_retire(mt);
    };

    int q_uses = 0;  // rows with blocks so far: their Q buffer and the phase of q_full / q_empty
    // The last S^T of a row has read its Q tile: gather warp 0 may load a later row's into it.
    auto q_done = [&]() {
        fence_proxy_async();
        mbar_arrive(bars + (kBarQEmptyFor<D_QK, H> + q_uses % L::kQBuffers) * 8);
    };
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const Row r = row_of(item);
        const int tile = r.tile, row_i = r.row_i, num_blocks = r.num_blocks;
#pragma unroll
        for (int mt = 0; mt < kValueTiles; ++mt) {
#pragma unroll
            for (int i = 0; i < kAcc; ++i) o[mt][i] = 0.f;
        }
#pragma unroll
        for (int c = 0; c < 2 * kColGroups; ++c) {
            m_ref[c] = -pos_inf();
            t_max[c] = -pos_inf();
            headroom = 0.f;
            l_run[c] = 0.f;
        }
        if (num_blocks > 0) {
            const int qb = q_uses % L::kQBuffers;
            q_desc = q_desc0 + (u64)((qb * L::kQBytes) >> 4);
            mbar_wait(bars + (kBarQFull + qb) * 8, (u32)(q_uses / L::kQBuffers) & 1u);
            fence_proxy_async();  // the Q tile (cp.async) is read by wgmma (async proxy)
            s_begin(0, false);
            wgmma_wait<0>();
            s_end();
            if (num_blocks == 1) q_done();
            prefetch_v(0);
            softmax(0);  // O^T is still zero: no rescale
        }
        // Per block: P.V of block b, then S^T and the softmax of block b + 1, then the rescale of
        // O^T for block b + 1. (Issuing S^T of block b + 1 before P.V of block b, so that the
        // softmax overlaps P.V, holds four stages at once; with the ring depth that fits, that
        // measured slower.)
        for (int b = 0; b + 1 < num_blocks; ++b) {
            pv_issue(b);
            if constexpr (kSUnderPv) {
                // Every M tile but the last is done before S^T starts (their fragment
                // registers are free for the S^T chunks); the last one finishes under the
                // first S^T chunk.
                wgmma_wait<1>();
#pragma unroll
                for (int mt = 0; mt + 1 < kValueTiles; ++mt) pv_retire(mt);
                s_begin(b + 1, true);
            } else {
                wgmma_wait<0>();
                pv_end();
                s_begin(b + 1, false);
            }
            wgmma_wait<0>();
            s_end();
            if (b + 2 == num_blocks) q_done();
            prefetch_v(b + 1);
            if (softmax(b + 1)) rescale_o();
        }
        if (num_blocks > 0) {
            pv_issue(num_blocks - 1);
            wgmma_wait<0>();
            pv_end();
        }

        // ---------------------------------------------------------------- epilogue
        // Column sums and true maxima: this thread's two rows, then the 8 lanes of a column,
        // then the 4 warps (the maxima through the max-exchange buffer, which every thread
        // finished reading before the last softmax's P^T barrier).
#pragma unroll
        for (int c = 0; c < 2 * kColGroups; ++c) {
            l_run[c] += __shfl_xor_sync(0xffffffffu, l_run[c], 4);
            l_run[c] += __shfl_xor_sync(0xffffffffu, l_run[c], 8);
            l_run[c] += __shfl_xor_sync(0xffffffffu, l_run[c], 16);
            t_max[c] = fmaxf(t_max[c], __shfl_xor_sync(0xffffffffu, t_max[c], 4));
            t_max[c] = fmaxf(t_max[c], __shfl_xor_sync(0xffffffffu, t_max[c], 8));
            t_max[c] = fmaxf(t_max[c], __shfl_xor_sync(0xffffffffu, t_max[c], 16));
        }
        if (g == 0) {
#pragma unroll
            for (int j = 0; j < kColGroups; ++j) {
                *reinterpret_cast<float2*>(sum_xchg + wwarp * HS + 8 * j + 2 * t0) =
                    make_float2(l_run[2 * j], l_run[2 * j + 1]);
                *reinterpret_cast<float2*>(max_xchg + wwarp * HS + 8 * j + 2 * t0) =
                    make_float2(t_max[2 * j], t_max[2 * j + 1]);
            }
        }
        named_barrier_sync(bar_wg, kConsumerThreads);  // the sums and maxima are written
        float out_scale[2 * kColGroups];
#pragma unroll
        for (int j = 0; j < kColGroups; ++j) {
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                const int c = 2 * j + v;
                const int col = 8 * j + 2 * t0 + v;
                const int head = tile * H + HS * wg + col;
                float l_total = 0.f;
#pragma unroll
                for (int w = 0; w < 4; ++w) l_total += sum_xchg[w * HS + col];
                // m_ref is -inf exactly while no valid token has been seen (the first valid
                // score always forces an exchange).
                const bool empty = m_ref[c] == -pos_inf();
                float denom = l_total;
                if (HAVE_SINK && head < p.h_q) {
                    denom += fast_exp2(__ldg(p.attn_sink + head) * kLog2e - (empty ? 0.f : m_ref[c]));
                }
                out_scale[c] = empty ? 0.f : kv_scale / denom;
                // max_logits and lse of column group j: written by warp j % 4 (the statistics
                // are the same in every warp), so no warp does all of them while the others
                // wait at the barrier below.
                if (wwarp == (j & 3) && g == 0 && head < p.h_q) {
                    float m_true = max_xchg[col];
#pragma unroll
                    for (int w = 1; w < 4; ++w) m_true = fmaxf(m_true, max_xchg[w * HS + col]);
                    const i64 out_row = (i64)row_i * p.h_q + head;
                    p.max_logits[out_row] = empty ? -pos_inf() : m_true * kLn2;
                    p.lse[out_row] = empty ? pos_inf() : (m_ref[c] + log2f(l_total)) * kLn2;
                }
            }
        }
        // Thread owns value columns d = 64*mt + 16*warp + 2g (+1) of heads 8j + 2*t0 + v.
        const int d0 = 16 * wwarp + 2 * g;
#pragma unroll
        for (int j = 0; j < kColGroups; ++j) {
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                const int head = tile * H + HS * wg + 8 * j + 2 * t0 + v;
                if (head >= p.h_q) continue;
                const float sc = out_scale[2 * j + v];
                bf16_t* out = p.out + ((i64)row_i * p.h_q + head) * kDV + d0;
#pragma unroll
                for (int mt = 0; mt < kValueTiles; ++mt) {
                    *reinterpret_cast<u32*>(out + 64 * mt) =
                        pack_bf16x2(o[mt][4 * j + v] * sc, o[mt][4 * j + 2 + v] * sc);
                }
            }
        }

        // Every thread has read the column sums before the next row's epilogue rewrites them.
        named_barrier_sync(bar_wg, kConsumerThreads);
        if (num_blocks > 0) {
            ++q_uses;
            j_base += 2 * num_blocks;
        }
    }
}
