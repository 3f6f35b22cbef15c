// shapeproof — FP8 (e4m3 x e4m3 -> f32) sparse MLA prefill for sm_90a in 64-head tiles (wgmma).
// Semantics: docs/kernels/sparse_mla.md §3.3. Prepended by the library: common.cuh, sparse_mla_common.cuh.
// The library runs it for more than 32 heads (at every top-k: since its grid is persistent it
// is 1.20-1.29x faster than the narrow kernel's 64-head tiles from top-k 128 to 2048,
// bench/NOTES.md), and for every head count with `HeadTiling::Tiles64`.
//
// Launch (the Rust side mirrors these formulas): a persistent grid of min(items, SMs) CTAs,
// 1-D, items = head_tiles * s_q (item w: head tile w % head_tiles, heads 64 tile … 64 tile + 63,
// of query row w / head_tiles; CTA b takes items b, b + gridDim.x, …; any grid size is
// correct, and no CTA waits for another), 384 threads, one CTA per SM, dynamic shared memory
// 192 * D_QK + 119424 bytes (230016 at d_qk 576, 217728 at 512; no static shared memory). topk
// must be a multiple of 128 (the library's rule): both sides count a CTA's blocks in whole
// pairs. SPARSE_MLA_WIDE_PERSISTENT tells the kernel harness (bench/harness) to launch a
// kernel file so.
//
// PAGED (the fourth template argument; d_qk 576, no length or sink inputs): the variant that
// `DecodeThroughPrefill` runs over the FP8 cache itself (docs/kernels/mla_cache.md §8.6). kv is
// the cache ([s_kv, 656] rows), its indices cache slots (-1 or outside the cache: no key);
// the gathers copy a row's latent bytes raw and its four scales into the slot's scale area, the
// owner warpgroup rewrites its block's latent bytes in place as the cache gather's values and
// writes the rows' RoPE values, loaded from the cache and cast to e4m3 as the gather casts
// them, into the RoPE column before its S reads them, and the producer builds V^T from the
// rewritten bytes (kBarKConv).
// Dynamic shared memory 192 * 576 + 119424 + 16 + 2048 = 232080 bytes (two more barriers and
// the scales).
#define SPARSE_MLA_WIDE_PERSISTENT 1
//
// Persistence. K and V^T slots and their barrier phases count blocks across a CTA's items, so
// the producer gathers the next item's first blocks while the consumers finish the item
// before. An item's Q tile is loaded once the consumers' last S of the item before is done
// (q_empty); the epilogue stages O in the V^T slots of the item's last pair (its P.V is done),
// and the threads that sent its head rows return those slots to the producer in the next item,
// behind its first S, once their bulk copies have read them (waiting in the epilogue measured
// 0.2-0.7% slower at topk 2048, 0.9-1.5% at 512). An item without a valid block writes its
// zeros with plain stores.
//
// Structure. Warpgroups 0 and 1 are the consumers; warpgroup 2 is the producer (setmaxnreg 56,
// the consumers 224), one loop for its four warps: step s issues the 16-byte cp.async gathers of
// block s (64 tokens) into a K slot, then builds V^T of block s - 1 (whose rows have had a step
// to land) in shared memory from its K slot (ldmatrix.trans, byte permutes, stmatrix). Blocks
// go in pairs; consumer warpgroup w owns block 2t + w of pair t for S = Q.K^T (m64n64k32, both
// operands in shared memory) and its softmax, and value columns 256w … 256w + 255 of both
// blocks for O = P.V (m64n256k32, P and V^T both from shared memory), so the heads are the rows
// of both accumulators and a thread's softmax statistics are those of its two O rows (no
// cross-warp exchange inside a warpgroup).
// Per pair t a consumer issues P.V of pair t (one commit group per block), then S of its block
// of pair t + 1, releasing each V^T slot as soon as its P.V group is done, then the softmax of
// pair t + 1.
// Buffers: K slots [2] (released after S and after the V^T build, in two parts: columns 0-383
// once S's first four chunks have read them, so the gathers of the block after next start on
// them while S reads the rest: +0.7-1.5%), V^T slots [3] (released after P.V of both
// warpgroups), P [2] (by pair parity): everything the shared memory holds at 576.
// Layouts (wgmma K-major operands):
// * K slots in the 64-byte swizzle: columns of 64 channels, 4 KB each (64 tokens x 64 bytes,
//   atoms of 8 tokens 512 bytes apart), 16-byte chunk index XOR bits 1-2 of the token. A
//   gathered row's 64-byte piece lands in 64 contiguous bytes (the canonical layout without
//   swizzle scatters it over four core matrices: 3.7x the shared-memory wavefronts, and
//   502 against 667 TFLOP/s at 128 heads / 576 / topk 2048).
// * Q tile: the canonical layout without swizzle (core matrices of 8 rows x 16 bytes).
// * V^T slots: [512 value columns][64 positions], canonical without swizzle, core-matrix groups
//   of 8 value columns 528 bytes apart (not 512, so the eight rows of one stmatrix matrix fall
//   in eight bank groups: +7% over 512).
// * P tiles: [64 heads][128 positions of the pair], canonical.
// * An item's start: the producer first warms L2 with the Q tile and the index row of the
//   CTA's next item.
// * The epilogue stages O in bf16 in the V^T slots of the item's last pair (heads 0-31 in one,
//   32-63 in the other, head rows 1040 bytes apart, written with stmatrix; their P.V is done)
//   and sends each head row out as one 1 KB bulk copy (the async proxy),
//   instead of 64 four-byte stores a thread that queued in the LSU (lg throttle: 7% of all
//   samples at 128 heads / topk 2048; +6.5% there, +14% at 64 / 512 / 512). So `out` must
//   start 16-byte aligned (the launch checks).

// Numerics: S promoted to f32 registers every 96 channels (3 k-steps); the softmax keeps a
// reference max m_ref that moves only in a pair where some score exceeds it by more than the
// headroom (the narrow kernel's rule; both warpgroups vote with one barrier and keep the
// speculative weights otherwise; an item's first pair always moves it, without the speculative
// weights or the vote); P in e4m3 (satfinite, nearest even), sums from f32 weights.
// The softmax is on the consumers' critical path (both warpgroups run it at once, between S and
// P.V, with the tensor pipe idle), so its common case is short: with a positive scale and every
// token of the block valid, the row maxima are a tree over the unscaled sums (the same values as
// over the scaled ones: rounding is monotone) and each weight's exponent is one fma; the row
// maxima are exchanged between the warpgroups only when the vote moves m_ref. 347 -> ~215
// instructions a warp from the last S chunk to the vote: 1.09-1.10x at topk 2048, 1.07-1.08x at
// 512 (harness, bench/NOTES.md). A block with an invalid token, or a scale that is not positive,
// takes the general path (scores scaled and masked in place first).
// Safety: an index outside [0, s_kv) or past topk_length gathers nothing (zero-filled copy,
// masked out of the softmax); heads past h_q load zeros and store nothing.
//
// Measured (H200, CUDA 13.0, library benchmark, FLOPs 2*s_q*h_q*topk*(d_qk+512), FP8 matmul
// 1416 TFLOP/s in the same run): (4096, 8k | 32k | 64k, 128, 576, 2048) 869 | 873 | 872
// TFLOP/s; (4096, 8k | 32k, 64, 512, 512) 631 | 635 (with the softmax of every pair as long as
// an exchange's and K slots returned whole: 784 | 785 | 774 and 573 | 579; one CTA per item,
// an earlier run: 768 | 759 | 721 and 524 | 517). The persistent grid first ran 8% slower at
// topk 2048: the producer's per-block loop carried the item state, and ptxas, at 56 registers,
// recomputed the build's addresses and split its four ldmatrix in two pairs (Nsight Compute:
// the consumers' V^T-full waits 8x, K-full 2x; 11% more producer instructions). What bounds it
// now: the consumers wait on barriers (the pair vote, their own S chunks) and on K-full; the
// producer's V^T build waits on its ldmatrix behind the gathers' shared-memory writes
// (bench/NOTES.md).

namespace sparse_mla {

constexpr int kThreads = 384;          // two consumer warpgroups, one producer warpgroup
constexpr int kHeadsPerTile = 64;      // wgmma M of S and of P.V
constexpr int kTokensPerBlock = 64;    // wgmma N of S
constexpr int kDV = 512;               // value width
// Gathered K blocks and V^T blocks in shared memory: two and three, so that V^T of block b goes
// into the slot of block b - 3 (whose P.V is long done) as soon as block b lands, and no K slot
// waits for a P.V (three K slots and two V^T slots measured 2% slower).
constexpr int kKSlots = 2;
constexpr int kVtSlots = 3;
constexpr int kQkChunkSteps = 3;       // S promoted to f32 registers every 3 k-steps (96 channels)
// A K slot goes back to the producer in two parts: its first kKLowCols 64-channel columns once
// S has read them (after its first kKLowChunks chunks), the rest after the whole S. The gathers
// of the block after next fill the low part while S still reads the high one, so less of a
// block is left to land once its slot is free.
constexpr int kKLowChunks = 4;
constexpr int kKLowCols = kKLowChunks * kQkChunkSteps * 32 / 64;  // 6: channels 0-383
static_assert(kKLowChunks * kQkChunkSteps * 32 % 64 == 0, "the low part is whole columns");
// V^T core-matrix groups (8 value columns x 64 positions, 512 bytes) lie kVtGroupStride apart:
// 528, so the rows of one stmatrix matrix (value columns 2r + parity, over two groups) fall in
// eight different 16-byte bank groups.
constexpr int kVtGroupStride = 528;
constexpr int kVtBytes = (kDV / 8) * kVtGroupStride;           // one V^T slot: 33792
constexpr int kPBytes = kHeadsPerTile * 2 * kTokensPerBlock;  // one P tile [64 heads][128]
// The epilogue stages O (bf16 [64 heads][512]) in shared memory, head rows kOutRowStride bytes
// apart (1024 + 16, so the eight rows of one stmatrix matrix fall in eight bank groups), in the
// V^T slots of the item's last pair; each head row goes out as one 1 KB bulk copy.
constexpr int kOutRowStride = 2 * kDV + 16;
// setmaxnreg: 224 * 256 + 56 * 128 = 64512 = 168 * 384, the pool the launch allocated. An
// increase past the pool waits forever (64 producer registers hung the kernel), and the published
// split of 216 / 72 spills ~264 bytes a consumer thread.
constexpr u32 kConsumerRegs = 224;
constexpr u32 kProducerRegs = 56;
constexpr int kBarConsumers = 1;       // named barrier of the 256 consumer threads
constexpr float kMaxHeadroom = 8.f;
constexpr float kLog2ShareLimit = 4.f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// PAGED (the paged variant, d_qk 576 only): two more barriers (kBarKConv) and, after them, each
// K slot's row scales (f32 [64 tokens][4 groups]) as the gathers copy them from the cache rows.
template <int D_QK, bool PAGED = false>
struct Smem {
    static constexpr int kChunks = D_QK / 16;
    static constexpr int kRowGroupBytes = 8 * D_QK;
    // A K slot (64-byte swizzle): byte offset of the 16-byte chunk `chunk` of token `token`, and
    // the distance between 64-channel gather columns.
    static constexpr u32 kColStride = 4096u;
    __device__ static __forceinline__ u32 k_chunk(int token, int chunk) {
        return (u32)((chunk >> 2) * 4096 + (token >> 3) * 512 + (token & 7) * 64 +
                     (((chunk & 3) ^ ((token >> 1) & 3)) << 4));
    }
    static constexpr int kTileBytes = kHeadsPerTile * D_QK;
    static constexpr int kQ = 0;                                // [64 heads][D_QK]
    static constexpr int kK = kQ + kTileBytes;                  // [kKSlots] x 64 * D_QK (k_chunk)
    static constexpr int kVt = kK + kKSlots * kTileBytes;       // [kVtSlots][512][64 positions]
    static constexpr int kP = kVt + kVtSlots * kVtBytes;        // [2][64 heads][128 positions]
    static constexpr int kMax = kP + 2 * kPBytes;               // f32 [2 wg][64] block maxima
    static constexpr int kSum = kMax + 2 * 64 * 4;              // f32 [2 wg][64] row sums
    static constexpr int kTmax = kSum + 2 * 64 * 4;             // f32 [2 wg][64] true maxima
    static constexpr int kMask = kTmax + 2 * 64 * 4;            // u16 [kKSlots][4 warps]
    static constexpr int kBars = kMask + kKSlots * 8;           // mbarriers (below)
    static constexpr int kNumBars = 2 + 3 * kKSlots + 2 * kVtSlots + (PAGED ? kKSlots : 0);
    static constexpr int kScales = kBars + kNumBars * 8;        // PAGED: f32 [kKSlots][64][4]
    static constexpr int kScaleSlotBytes = kTokensPerBlock * 16;
    static constexpr int kBytes = kScales + (PAGED ? kKSlots * kScaleSlotBytes : 0);
    static_assert(PAGED || kBytes == 192 * D_QK + 119424,
                  "launch-shape formula in the header comment");
    static_assert(!PAGED || kBytes == 192 * D_QK + 119424 + 16 + 2048,
                  "the paged variant's launch-shape formula (header comment)");
    static_assert(kScales % 16 == 0, "the scales take 16-byte copies");
    static_assert(kK % 512 == 0 && kTileBytes % 512 == 0, "64-byte swizzle atoms are 512-aligned");
    static_assert(32 * kOutRowStride <= kVtBytes, "half of the O staging fits one V^T slot");
    static_assert(kBytes <= 232448, "exceeds the sm_90 dynamic shared memory limit");
};

constexpr int kBarQFull = 0;
constexpr int kBarKFull = 1;                        // [kKSlots]
constexpr int kBarKEmpty = kBarKFull + kKSlots;     // [kKSlots] the high columns (all of S read)
constexpr int kBarKLowEmpty = kBarKEmpty + kKSlots;  // [kKSlots] columns 0 … kKLowCols - 1
constexpr int kBarVtFull = kBarKLowEmpty + kKSlots;  // [kVtSlots]
constexpr int kBarVtEmpty = kBarVtFull + kVtSlots;  // [kVtSlots]
constexpr int kBarQEmpty = kBarVtEmpty + kVtSlots;  // the consumers' last S of an item is done
constexpr int kBarKConv = kBarQEmpty + 1;  // PAGED [kKSlots]: the owner converted the slot's rows

// wgmma shared-memory descriptor of a K-major operand in the 64-byte swizzle (8-row atoms of
// 512 bytes, `sbo` bytes apart; the leading offset is unused).
__device__ __forceinline__ u64 make_smem_desc_sw64(u32 addr, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(sbo >> 4) << 32) |
           ((u64)2 << 62);
}

// Stores four 8x8 b16 matrices (row addresses from lanes 8i … 8i + 7 for matrix i).
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// One bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from shared to
// global memory by the async proxy, in this thread's bulk group.
__device__ __forceinline__ void bulk_store(void* dst, u32 src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
// This thread's bulk copies so far form one bulk group.
__device__ __forceinline__ void bulk_store_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// This thread's committed bulk copies have read their shared-memory sources on return.
__device__ __forceinline__ void bulk_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// One 4-byte shared-memory store (kept in program order with the asm around it).
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// ---- PAGED: a K slot's raw latent bytes to the gathered workspace's values, in place --------
// The cache gather (mla_cache_gather_kernel, docs/kernels/mla_cache.md §8.6) writes each latent
// byte as e4m3(e4m3 value * its group's scale) in f32, round to nearest even, saturating; the
// paged variant must give the same bytes.

// Whether a scale's products come out the same through f16 as through f32: zero, subnormal,
// inf, NaN, and powers of two up to 2^15 — every e4m3 value times such a scale is exact in f16
// where its e4m3 rounding is not zero, or overflows to the same saturation (the store writes
// only powers of two). Anything else takes the f32 arithmetic.
__device__ __forceinline__ bool scale_exact_in_f16(float scale) {
    const u32 bits = __float_as_uint(scale);
    const u32 e = (bits >> 23) & 0xffu;
    return e == 0u || e == 0xffu || ((bits & 0x7fffffu) == 0u && e <= 127u + 15u);
}

// Four e4m3 bytes times the scale in both halves of `s2` (f16x2), rounded back to e4m3: two
// conversions in, one multiply and one conversion out per two values.
__device__ __forceinline__ u32 rescale_e4m3x4_f16(u32 w, u32 s2) {
    u32 lo, hi;
    u16 out_lo, out_hi;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"((u16)(w & 0xffffu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"((u16)(w >> 16)));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(lo) : "r"(s2));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(hi) : "r"(s2));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(out_lo) : "r"(lo));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(out_hi) : "r"(hi));
    return (u32)out_lo | ((u32)out_hi << 16);
}

// Whether a scale is 2^k with k in [-22, 7], the range in which rescale_e4m3x4_pow2 gives the
// conversions' bytes (bench/harness/e4m3_rescale_model.py checks every byte at every such k).
__device__ __forceinline__ bool scale_for_pow2_path(float scale) {
    const u32 bits = __float_as_uint(scale);
    const u32 e = (bits >> 23) & 0xffu;
    return (bits & 0x807fffffu) == 0u && e >= 127u - 22u && e <= 127u + 7u;
}

// 2^(k + 8) as f16 in both halves of an f16x2, for a scale 2^k that scale_for_pow2_path admits.
__device__ __forceinline__ u32 pow2_path_multiplier(u32 scale_bits) {
    const u32 e16 = ((scale_bits >> 23) & 0xffu) - 104u;  // (k + 8) + 15
    return (e16 << 10) * 0x10001u;
}

// Four e4m3 bytes times 2^k, rounded back to e4m3 as the conversions round them (nearest even,
// saturating at 448, NaN to 0x7f), off the conversion pipe: integer and f16 arithmetic only
// (m2: pow2_path_multiplier). Bytes 0 and 2 travel in one f16x2, bytes 1 and 3 in another.
// - A byte's magnitude bits shifted left by 7 are the f16 bits of |x| * 2^-8, subnormals
//   included (a NaN's, 0x7f, are those of 1.875; every other magnitude is at most 1.75).
// - fma(|x| * 2^-8, 2^(k + 8), 2) is |x| * 2^k + 2 rounded once: |x| * 2^k has at most four
//   significant bits, so only values below e4m3's smallest normal (2^-6) lose bits, at the e4m3
//   grid's step there (2^-9), which is the f16 step in [2, 4): nearest even on both.
// - min(., 450) saturates at 448 + 2; fma(., 2^-8, -2^-7) is the grid value times 2^-8, exact,
//   and its f16 bits shifted right by 7 are the byte's magnitude.
// - max(., fma(|x| * 2^-8, 15, -26.25)) is 1.875 (magnitude 0x7f) for a NaN and changes nothing
//   else (the second operand is at most 0 there); the sign comes back from the input but for
//   a NaN, which comes out positive.
__device__ __forceinline__ u32 rescale_e4m3x4_pow2(u32 w, u32 m2) {
    const u32 even = (w << 7) & 0x3f803f80u;  // bytes 0 and 2 as f16 of |x| * 2^-8
    const u32 odd = (w >> 1) & 0x3f803f80u;   // bytes 1 and 3
    u32 e, o, ne, no;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(e) : "r"(even), "r"(m2), "r"(0x40004000u));  // + 2
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(o) : "r"(odd), "r"(m2), "r"(0x40004000u));
    asm("min.f16x2 %0, %0, %1;" : "+r"(e) : "r"(0x5f085f08u));  // 450
    asm("min.f16x2 %0, %0, %1;" : "+r"(o) : "r"(0x5f085f08u));
    // * 2^-8 - 2^-7
    asm("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(e) : "r"(0x1c001c00u), "r"(0xa000a000u));
    asm("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(o) : "r"(0x1c001c00u), "r"(0xa000a000u));
    // * 15 - 26.25
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(ne) : "r"(even), "r"(0x4b804b80u), "r"(0xce90ce90u));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(no) : "r"(odd), "r"(0x4b804b80u), "r"(0xce90ce90u));
    asm("max.f16x2 %0, %0, %1;" : "+r"(e) : "r"(ne));
    asm("max.f16x2 %0, %0, %1;" : "+r"(o) : "r"(no));
    const u32 mag = (e >> 7) + (o << 1);  // the four magnitudes (the fields do not overlap)
    // A magnitude of 0x7f (a NaN) carries into its sign bit when 1 is added; no other does.
    const u32 sign = w & ~(mag + 0x01010101u) & 0x80808080u;
    return mag | sign;
}

// The same in f32 (the gather's own arithmetic), for any scale.
__device__ __forceinline__ u32 rescale_e4m3x4_f32(u32 w, float s) {
    float a, b, c, d;
    unpack_e4m3x2((u16)(w & 0xffffu), a, b);
    unpack_e4m3x2((u16)(w >> 16), c, d);
    return (u32)pack_e4m3x2(__fmul_rn(a, s), __fmul_rn(b, s)) |
           ((u32)pack_e4m3x2(__fmul_rn(c, s), __fmul_rn(d, s)) << 16);
}

__device__ __forceinline__ uint4 ld_shared_v4(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

__device__ __forceinline__ void st_shared_v4(u32 addr, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// The owner warpgroup's thread ct (0-127) scales its share of a K slot's latent columns (bytes
// 0 … 32767 of the slot: 8 columns of 64 tokens x 64 bytes) in place: the 16-byte chunks at
// 16 ct + 2048 k, k = 0 … 15, i.e. column k / 2 (scale group k / 4) of token ct / 4 + 32 (k % 2).
// Consecutive threads touch consecutive chunks (no bank conflicts). An invalid row was
// zero-filled with zero scales and stays zero. The conversion pipe bounds this (four
// conversions a word on the f16 path), so with the scales the store writes (powers of two) the
// first word of each chunk takes rescale_e4m3x4_pow2 instead, on the integer and f16 pipes: a
// quarter of the words balances the conversion pipe against the instructions issued.
// kPath: 0 f32 (any scale), 1 f16 (scale_exact_in_f16), 2 f16 and the first kPow2Words words
// of each chunk on the pow2 path (scale_for_pow2_path); one loop a path, so no chunk issues both.
constexpr int kPow2Words = 1;  // of a chunk's 4: a quarter balances the pipes (bench/NOTES.md)
template <int kPath>
__device__ __forceinline__ void convert_chunks(u32 k_slot, const u32 (&sc)[8], int ct) {
    // One scale group a round (chunks 4 g … 4 g + 3), its two tokens' scales picked by selects
    // (a run-time index into sc would put it in local memory); not unrolled: unrolled, the
    // pow2 path's registers spill in the paged prefill.
#pragma unroll 1
    for (int g = 0; g < 4; ++g) {
        const u32 sg0 = g == 0 ? sc[0] : g == 1 ? sc[1] : g == 2 ? sc[2] : sc[3];  // token ct / 4
        const u32 sg1 = g == 0 ? sc[4] : g == 1 ? sc[5] : g == 2 ? sc[6] : sc[7];  // ct / 4 + 32
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 addr = k_slot + (u32)(16 * ct + 2048 * (4 * g + i));
            const u32 sb = i & 1 ? sg1 : sg0;
            const float s = __uint_as_float(sb);
            uint4 v = ld_shared_v4(addr);
            if constexpr (kPath == 0) {
                v = make_uint4(rescale_e4m3x4_f32(v.x, s), rescale_e4m3x4_f32(v.y, s),
                               rescale_e4m3x4_f32(v.z, s), rescale_e4m3x4_f32(v.w, s));
            } else {
                u16 h;
                asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(s));
                const u32 s2 = (u32)h * 0x10001u;
                u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    w[j] = kPath == 2 && j < kPow2Words ? rescale_e4m3x4_pow2(w[j], pow2_path_multiplier(sb))
                                                        : rescale_e4m3x4_f16(w[j], s2);
                }
                v = make_uint4(w[0], w[1], w[2], w[3]);
            }
            st_shared_v4(addr, v);
        }
    }
}

__device__ __forceinline__ void convert_latent(u32 k_slot, u32 scales, int ct) {
    const uint4 lo = ld_shared_v4(scales + (u32)(ct >> 2) * 16);          // token ct / 4
    const uint4 hi = ld_shared_v4(scales + (u32)((ct >> 2) + 32) * 16);   // token ct / 4 + 32
    const u32 sc[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // [token][group]
    bool f16 = true, pow2 = true;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        f16 &= scale_exact_in_f16(__uint_as_float(sc[i]));
        pow2 &= scale_for_pow2_path(__uint_as_float(sc[i]));  // (implies f16)
    }
    if (pow2) convert_chunks<2>(k_slot, sc, ct);
    else if (f16) convert_chunks<1>(k_slot, sc, ct);
    else convert_chunks<0>(k_slot, sc, ct);
}

// ---- PAGED: a K slot's RoPE column (column 8), written by its owner warpgroup -------------
// Thread ct (0-127) of the owner takes token ct / 2's bf16 RoPE values 32 (ct % 2) … + 31
// (64 bytes of the token's cache row, from byte 528 + 64 (ct % 2)) in two rounds of 16
// values: round r is cast to e4m3 (as the cache gather casts RoPE values) into the column's
// 16-byte chunk 2 (ct % 2) + r, so one round's loads are in flight while other work runs. A
// token without a key (no source) gets zeros, as the gather's zero fill would give.
__device__ __forceinline__ void load_rope_round(const uint4* src, int round, uint4 (&x)[2]) {
    if (src != nullptr) {
        x[0] = __ldg(src + 2 * round);
        x[1] = __ldg(src + 2 * round + 1);
    } else {
        x[0] = x[1] = make_uint4(0u, 0u, 0u, 0u);
    }
}
template <int D_QK>
__device__ __forceinline__ void store_rope_round(u32 k_slot, int ct, int round,
                                                 const uint4 (&x)[2]) {
    const uint2 lo = cast_bf16x8_e4m3(x[0]), hi = cast_bf16x8_e4m3(x[1]);
    const int chunk = 4 * (kDV / 64) + 2 * (ct & 1) + round;  // column 8's chunks 0-3
    st_shared_v4(k_slot + Smem<D_QK, true>::k_chunk(ct >> 1, chunk),
                 make_uint4(lo.x, lo.y, hi.x, hi.y));
}

// d[64x256 f32] += A[64x32 e4m3, smem] * B[256x32 e4m3, smem]^T, both operands K-major.
__device__ __forceinline__ void wgmma_pv(float (&d)[128], u64 desc_a, u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3\n"
        "{"
        " %0, %1, %2, %3, %4, %5, %6, %7,"
        " %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23,"
        " %24, %25, %26, %27, %28, %29, %30, %31,"
        " %32, %33, %34, %35, %36, %37, %38, %39,"
        " %40, %41, %42, %43, %44, %45, %46, %47,"
        " %48, %49, %50, %51, %52, %53, %54, %55,"
        " %56, %57, %58, %59, %60, %61, %62, %63,"
        " %64, %65, %66, %67, %68, %69, %70, %71,"
        " %72, %73, %74, %75, %76, %77, %78, %79,"
        " %80, %81, %82, %83, %84, %85, %86, %87,"
        " %88, %89, %90, %91, %92, %93, %94, %95,"
        " %96, %97, %98, %99, %100, %101, %102, %103,"
        " %104, %105, %106, %107, %108, %109, %110, %111,"
        " %112, %113, %114, %115, %116, %117, %118, %119,"
        " %120, %121, %122, %123, %124, %125, %126, %127},"
        " %128, %129, p, 1, 1;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b));
}

// Producer warps (warps 8-11) gather: warp w copies tokens 16w … 16w + 15 of every block; lane
// = (token % 8) + 8 * (chunk % 4), so one cp.async instruction fills one 512-byte atom of the
// 64-byte swizzle (8 tokens x 64 bytes, contiguous).
// PAGED: a row is a 656-byte cache row; its latent bytes land raw in columns 0-7 (the owner
// warpgroup scales them in place before its S: convert_latent), its four group scales in the
// slot's scale area (the lanes of chunk 0); column 8 (RoPE) is the owner's too (load_rope_round,
// store_rope_round).
template <int D_QK, bool PAGED = false>
struct Gather {
    using L = Smem<D_QK, PAGED>;
    static constexpr int kRowBytes = PAGED ? 656 : D_QK;  // bytes between kv rows
    static constexpr int kScalesAt = 512;                 // PAGED: a cache row's scales
    static constexpr int kRopeAt = kScalesAt + 16;        // PAGED: its bf16 RoPE values
    u32 k_base, bars;
    u32 scale_base;      // PAGED: K slot 0's scales (L::kScales)
    u16* mask16;
    const u8* kv;
    const i32* idx_row;  // the item's index row
    i32 valid_len, s_kv;
    int next_off;        // offset in idx_row of this lane's group-0 token of the next block
    int pw, lane;

    // The next block's indices: this lane's tokens of it (groups 0 and 1, 8 apart), -1 past
    // the valid length; `next_off` moves on to the block after.
    __device__ __forceinline__ void load_next(int (&nxt)[2]) {
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) {
            const int j = next_off + 8 * grp;
            nxt[grp] = j < valid_len ? __ldg(idx_row + j) : -1;
        }
        next_off += kTokensPerBlock;
    }
    // Whether index i names a row of kv (an invalid one is gathered as zeros and masked).
    __device__ __forceinline__ bool row_valid(int i) const { return i >= 0 && i < s_kv; }
    // Gathers of 64-channel columns Q0 … Q1 - 1 of the CTA's block gb (its slot: gb % kKSlots).
    template <int Q0, int Q1>
    __device__ __forceinline__ void issue_cols(int gb, const int (&idx)[2]) const {
        const u32 dst_slot = k_base + (gb % kKSlots) * L::kTileBytes;
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) {
            const int token = 16 * pw + 8 * grp + (lane & 7);
            const bool valid = row_valid(idx[grp]);
            const u8* row = kv + (valid ? (i64)idx[grp] * kRowBytes : (i64)0);
            const u8* src = row + (lane >> 3) * 16;
            const u32 n = valid ? 16u : 0u;  // an invalid row is zero-filled, nothing read
            const u32 dst = dst_slot + L::k_chunk(token, lane >> 3);
#pragma unroll
            for (int q = Q0; q < Q1; ++q) {
                if (PAGED && q == kDV / 64) continue;  // the RoPE column: the owner's
                cp_async_16(dst + q * L::kColStride, src + q * 64, n);
            }
            if (PAGED && Q0 == 0 && (lane >> 3) == 0) {
                cp_async_16(scale_base + (gb % kKSlots) * L::kScaleSlotBytes + token * 16,
                            row + kScalesAt, n);
            }
        }
    }
    // The validity mask of block gb, and the arrivals on k_full of its slot (its gathers so far
    // complete it).
    __device__ __forceinline__ void finish_block(int gb, const int (&idx)[2]) const {
        const int slot = gb % kKSlots;
        u32 bits = 0;
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) {
            const bool valid = row_valid(idx[grp]);
            bits |= (__ballot_sync(0xffffffffu, valid) & 0xffu) << (8 * grp);
        }
        if (lane == 0) mask16[slot * 4 + pw] = (u16)bits;
        const u32 full = bars + (kBarKFull + slot) * 8;
        mbar_arrive_cp_async(full);
        mbar_arrive(full);
    }
};

// V^T build (the four producer warps): warp pw writes tokens 32(pw % 2) … + 31 and value columns
// 256(pw / 2) … + 255 of a block's V^T,
// [512 value columns][64 positions] in the K-major canonical layout ((n/8)*528 + (p/16)*128 +
// (n%8)*16 + p%16), position p holding token c(p) = 16(p/16) + 8((p%4)/2) + 2((p%16)/4) + p%2
// (the order in which a thread's S accumulator holds its columns, so P needs no shuffle).
// Per 16 value columns: ldmatrix.x4.trans of the four 8-token core matrices (thread (g, t0)
// receives channels 2g, 2g + 1 of tokens 2t0, 2t0 + 1 of each), two byte permutes per pair of
// matrices (channel 2g, resp. 2g + 1, at tokens 2t0, 2t0 + 1, 8 + 2t0, 9 + 2t0), stmatrix.x4
// of rows (value columns) 2r and 2r + 1.
template <int D_QK>
__device__ __forceinline__ void build_vt(u32 k_slot, u32 vt_slot, int pw, int lane) {
    using L = Smem<D_QK>;
    const int bw = pw & 1;              // token half
    const int cc0 = (pw >> 1) * 16;     // first 16-column chunk of this warp
    const int token = 8 * (4 * bw + (lane >> 3)) + (lane & 7);  // the row this lane addresses
    const int m = lane >> 3, r = lane & 7;
    const int n_off = 2 * r + (m & 1);                  // value column inside the 16-column chunk
    const int kc = 2 * bw + (m >> 1);                   // 16-position chunk
    const u32 st =
        vt_slot + (u32)(n_off >> 3) * kVtGroupStride + (u32)kc * 128 + (u32)(n_off & 7) * 16;
    // This lane's ldmatrix row of chunk c = cc + k (cc a multiple of 4) is ld ^ (k << 4), ld
    // the row's address of chunk cc with the swizzle bits of the token (bits 4-5, zero in the
    // rest of the address): one pointer for the four chunks, 4 KB on per four chunks; the
    // stmatrix rows of chunk c are st_c + 2 (c - cc) kVtGroupStride. The pointers are
    // stepped by hand: ptxas otherwise recomputed them per iteration, and with them split the
    // four ldmatrix in two pairs around the permutes (measured in the persistent grid).
    u32 ld = k_slot + L::k_chunk(token, cc0);
    u32 st_c = st + (u32)cc0 * 2 * kVtGroupStride;
    auto store = [&](u32 addr, const u32 (&v)[4]) {
        stmatrix_x4(addr, byte_perm(v[0], v[1], 0x6420u), byte_perm(v[0], v[1], 0x7531u),
                    byte_perm(v[2], v[3], 0x6420u), byte_perm(v[2], v[3], 0x7531u));
    };
    constexpr int kEnd = kDV / 32;  // 16-column chunks a warp builds
    // Four chunks at a time: their ldmatrix first, then the permutes and stores (the asm
    // statements keep program order, so a load after a store would wait for it). Unrolled with
    // immediate offsets it measured 11% slower, and eight chunks at a time, or the next four
    // loaded before the current four are stored, 7-13% slower (the producer spills at 56
    // registers).
#pragma unroll 1
    for (int it = 0; it < kEnd / 4; ++it) {
        u32 v[4][4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            ldmatrix_x4_trans(ld ^ (u32)(k << 4), v[k][0], v[k][1], v[k][2], v[k][3]);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) store(st_c + (u32)(k * 2 * kVtGroupStride), v[k]);
        ld += 4096u;
        st_c += 8u * kVtGroupStride;
    }
}

// Warms L2 with the Q tile and the index row of work item `item` (another CTA of this grid):
// one 128-byte-line prefetch each, spread over the producer's 128 threads (pt). Every address
// lies inside q and indices; a prefetch moves nothing into the program.
template <int D_QK>
__device__ __forceinline__ void prefetch_item_l2(const SparseMlaParams& p, int item, int pt) {
    const int tile = item % p.head_tiles;
    const int row = item / p.head_tiles;
    const int heads = min(kHeadsPerTile, p.h_q - kHeadsPerTile * tile);
    const u8* q = p.q + ((i64)row * p.h_q + kHeadsPerTile * tile) * D_QK;  // [heads][D_QK]
    for (int off = pt * 128; off < heads * D_QK; off += 128 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(q + off));
    }
    const u8* idx = reinterpret_cast<const u8*>(p.indices + (i64)row * p.topk);  // [topk] i32
    for (int off = pt * 128; off < p.topk * 4; off += 128 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(idx + off));
    }
}

}  // namespace sparse_mla

template <int D_QK, bool HAVE_TOPK_LENGTH, bool HAVE_SINK, bool PAGED = false>
__global__ void __launch_bounds__(sparse_mla::kThreads, 1)
    sparse_mla_prefill_kernel(const SparseMlaParams p) {
    using namespace sparse_mla;
    using L = Smem<D_QK, PAGED>;
    static_assert(D_QK == 512 || D_QK == 576, "D_QK must be 512 or 576");
    static_assert(!HAVE_SINK || HAVE_TOPK_LENGTH, "attn_sink requires topk_length");
    static_assert(!PAGED || (D_QK == 576 && !HAVE_TOPK_LENGTH),
                  "the paged variant reads 576-wide cache rows; its indices carry the lengths");

    // The swizzled K slots need their 512-byte atoms aligned: the dynamic shared memory starts
    // 1 KB-aligned (no static shared memory), and every region offset is checked in Smem.
    extern __shared__ __align__(1024) u8 smem[];
    const u32 smem_base = smem_addr(smem);
    const u32 sq = smem_base + L::kQ;
    const u32 sk = smem_base + L::kK;
    const u32 svt = smem_base + L::kVt;
    const u32 sp = smem_base + L::kP;
    const u32 bars = smem_base + L::kBars;

    const int items = p.head_tiles * p.s_q;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    // Valid length and blocks (a multiple of two) of work item `item`.
    auto item_len = [&](int item) {
        return HAVE_TOPK_LENGTH
                   ? min(max(__ldg(p.topk_length + item / p.head_tiles), 0), p.topk)
                   : p.topk;
    };
    auto blocks_of = [&](int len) {
        return HAVE_TOPK_LENGTH ? ((len + 127) / 128) * 2 : p.topk / 64;
    };

    if (threadIdx.x == 0) {
        mbar_init(bars + kBarQFull * 8, 128);
        mbar_init(bars + kBarQEmpty * 8, 256);
        for (int s = 0; s < kKSlots; ++s) {
            mbar_init(bars + (kBarKFull + s) * 8, 256);   // 128 cp.async-tracked + 128 plain
            mbar_init(bars + (kBarKEmpty + s) * 8, 256);     // owner warpgroup + V^T build
            mbar_init(bars + (kBarKLowEmpty + s) * 8, 256);  // the same, for the low columns
        }
        for (int s = 0; s < kVtSlots; ++s) {
            mbar_init(bars + (kBarVtFull + s) * 8, 128);
            mbar_init(bars + (kBarVtEmpty + s) * 8, 256);
        }
        if (PAGED) {
            for (int s = 0; s < kKSlots; ++s) mbar_init(bars + (kBarKConv + s) * 8, 128);
        }
    }
    __syncthreads();

    if (warp >= 8) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
        const int pw = warp & 3;
        const int pt = (threadIdx.x - 256) & 127;  // 0..127 inside the producer warpgroup
        Gather<D_QK, PAGED> gather;
        gather.k_base = sk;
        gather.bars = bars;
        gather.scale_base = smem_base + L::kScales;
        gather.mask16 = reinterpret_cast<u16*>(smem + L::kMask);
        gather.kv = p.kv;
        gather.s_kv = p.s_kv;
        gather.pw = pw;
        gather.lane = lane;
        // The gathers of the CTA's block gb wait for K slot gb % kKSlots to be released by S and
        // by the V^T build of block gb - kKSlots: its low columns first, then the rest.
        auto gather_step = [&](int gb, int (&idx)[2], int (&nxt)[2]) {
            // The next block's indices load while this step waits for its K slot.
            gather.load_next(nxt);
            const int ks = gb % kKSlots;
            const u32 phase = (u32)(gb / kKSlots - 1) & 1u;
            if (gb >= kKSlots) mbar_wait(bars + (kBarKLowEmpty + ks) * 8, phase);
            gather.template issue_cols<0, kKLowCols>(gb, idx);
            if (gb >= kKSlots) mbar_wait(bars + (kBarKEmpty + ks) * 8, phase);
            gather.template issue_cols<kKLowCols, D_QK / 64>(gb, idx);
            gather.finish_block(gb, idx);
#pragma unroll
            for (int grp = 0; grp < 2; ++grp) idx[grp] = nxt[grp];
        };
        // V^T of the CTA's block b from its K slot, once the rows have landed and the V^T slot
        // is free.
        auto build_step = [&](int b) {
            const int ks = b % kKSlots, vs = b % kVtSlots;
            // PAGED: the values V^T takes are the converted ones (the owner's kBarKConv).
            mbar_wait(bars + ((PAGED ? kBarKConv : kBarKFull) + ks) * 8, (u32)(b / kKSlots) & 1u);
            if (b >= kVtSlots) {
                mbar_wait(bars + (kBarVtEmpty + vs) * 8, (u32)(b / kVtSlots - 1) & 1u);
            }
            build_vt<D_QK>(sk + ks * L::kTileBytes, svt + vs * kVtBytes, pw, lane);
            fence_proxy_async();  // V^T is read by wgmma (async proxy)
            mbar_arrive(bars + (kBarVtFull + vs) * 8);
            mbar_arrive(bars + (kBarKLowEmpty + ks) * 8);
            mbar_arrive(bars + (kBarKEmpty + ks) * 8);
        };
        // Per item: its first step (the gathers of its block 0, then the V^T build of the
        // CTA's block before, the last of the item before, then the item's Q tile, once the
        // consumers' last S of the item before has read the one before: q_empty), then the
        // item's other steps in a loop that carries no item state but the block numbers, so
        // that the producer's 56 registers hold the gather and build addresses (with the item
        // state live across it, ptxas rematerialised them and the build's ldmatrix lost their
        // overlap: 11% more producer instructions, 8% slower at topk 2048).
        int gbase = 0;  // the CTA's blocks before this item
        int j = 0;      // the CTA's items before this one (its item: blockIdx.x + j gridDim.x)
        bool pending = false;  // V^T of the CTA's block gbase - 1 is still to build
        for (;; ++j) {
            const int item = blockIdx.x + j * gridDim.x;
            if (item >= items) break;
            const int valid_len = item_len(item);
            const int num_blocks = blocks_of(valid_len);
            gather.idx_row = p.indices + (i64)(item / p.head_tiles) * p.topk;
            gather.valid_len = valid_len;
            // The CTA's next item: its Q tile and index row go to L2 now.
            if (item + (int)gridDim.x < items) {
                prefetch_item_l2<D_QK>(p, item + (int)gridDim.x, pt);
            }
            int idx[2], nxt[2];  // indices of this step's block and of the next one
            gather.next_off = 16 * pw + (lane & 7);
            gather.load_next(idx);
            const int gend = gbase + num_blocks;
            if constexpr (PAGED) {
                // V^T of a block waits for its owner's conversion, which comes after the owner's
                // P.V issue of the pair before; the builds go by pairs, before the gathers of
                // the next pair (whose slots the pair's S and builds release), so no build
                // waits behind a gather that waits for an S.
                if (pending) {
                    build_step(gbase - 2);
                    build_step(gbase - 1);
                }
                if (num_blocks > 0) {
                    gather_step(gbase, idx, nxt);
                    gather_step(gbase + 1, idx, nxt);
                }
                if (j > 0) mbar_wait(bars + kBarQEmpty * 8, (u32)(j - 1) & 1u);
                load_q_tile64<D_QK>(p, item / p.head_tiles, item % p.head_tiles, sq, pt,
                                    num_blocks > 0);
                mbar_arrive_cp_async(bars + kBarQFull * 8);
                for (int gb = gbase + 2; gb < gend; gb += 2) {
                    build_step(gb - 2);
                    build_step(gb - 1);
                    gather_step(gb, idx, nxt);
                    gather_step(gb + 1, idx, nxt);
                }
                gbase = gend;
                pending = num_blocks > 0;  // the item's last pair
                continue;
            }
            if (num_blocks > 0) gather_step(gbase, idx, nxt);
            if (pending) build_step(gbase - 1);
            if (j > 0) mbar_wait(bars + kBarQEmpty * 8, (u32)(j - 1) & 1u);
            load_q_tile64<D_QK>(p, item / p.head_tiles, item % p.head_tiles, sq, pt,
                                num_blocks > 0);
            mbar_arrive_cp_async(bars + kBarQFull * 8);
            for (int gb = gbase + 1; gb < gend; ++gb) {
                gather_step(gb, idx, nxt);
                build_step(gb - 1);
            }
            gbase = gend;
            pending = num_blocks > 0;  // the item's last block
        }
        if (pending) {
            if (PAGED) build_step(gbase - 2);
            build_step(gbase - 1);
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }

    // -------------------------------------------------------------------- consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    const int wg = warp >> 2;
    const int wwarp = warp & 3;
    const int g = lane >> 2;
    const int t0 = lane & 3;
    const int row0 = 16 * wwarp + g;  // this thread's heads (S and O rows): row0, row0 + 8

    float* max_xchg = reinterpret_cast<float*>(smem + L::kMax);
    float* sum_xchg = reinterpret_cast<float*>(smem + L::kSum);
    float* tmax_xchg = reinterpret_cast<float*>(smem + L::kTmax);
    const u16* mask16 = reinterpret_cast<const u16*>(smem + L::kMask);

    const float q_scale = __ldg(p.q_scale);
    const float kv_scale = __ldg(p.kv_scale);
    const float score_scale = p.sm_scale * q_scale * kv_scale * kLog2e;
    const u64 q_desc = make_smem_desc(sq, 128, L::kRowGroupBytes);

    float o[128];  // O[heads row0, row0 + 8][value columns 256wg + 8j + 2t0 + {0,1}]
    float m_ref[2], t_max[2], l_run[2], alpha[2];
    float headroom;
    float s_cur[32], s_next[32];
    u64 s_mask = 0;  // validity of the tokens of the block in s_cur (bit = S column)
    int gbase = 0;   // the CTA's blocks before the current item (block ids below are the CTA's)
    const i32* idx_item = nullptr;  // PAGED: the current item's [topk] cache slots
    // This thread sent a head row of the item before (the last with a valid block) from the
    // staging in the V^T slots of that item's last pair, blocks gbase - 2 and gbase - 1, and
    // has not yet returned those slots.
    bool staging_out = false;

    constexpr int kQkSteps = D_QK / 32;
    constexpr int kQkChunks = (kQkSteps + kQkChunkSteps - 1) / kQkChunkSteps;
    static_assert(kQkChunks >= 2, "s_begin releases the two V^T slots after chunks 0 and 1");
    static_assert(kKLowChunks < kQkChunks && kKLowCols < D_QK / 64,
                  "s_begin returns the low columns inside its chunk loop");

    auto issue_qk_chunk = [&](float (&acc)[32], u64 k_desc, int c) {
        fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int ks = c * kQkChunkSteps; ks < (c + 1) * kQkChunkSteps && ks < kQkSteps; ++ks) {
            // K's k-step ks (32 channels): half a 64-byte swizzle row, the 64-channel columns
            // 4 KB apart (descriptor units of 16 bytes)
            const u64 k_step = (u64)((ks >> 1) * 256 + (ks & 1) * 2);
            wgmma_qk(acc, q_desc + (u64)(ks * 16), k_desc + k_step,
                     ks > c * kQkChunkSteps ? 1u : 0u);
        }
        wgmma_commit();
    };
    // V^T of block blk (>= 0) is in slot vt_slot(blk), use vt_use(blk) of that slot.
    auto vt_slot = [](int blk) { return (int)((u32)blk % (u32)kVtSlots); };
    auto vt_use = [](int blk) { return (u32)blk / (u32)kVtSlots; };
    // P.V of one block of the pair before is complete: its V^T slot goes back to the producer.
    auto pv_release = [&](int slot) {
        mbar_arrive(bars + (kBarVtEmpty + slot) * 8);
    };
    // S of block b: every chunk issued, all but the last summed; the last is left in flight
    // (s_finish adds it once the caller has waited for it). Chunk c lands in s_cur when
    // (kQkChunks - 1 - c) is even, so the complete sum ends in s_cur.
    auto s_begin = [&](int b, bool release_pv) {
        const int slot = b % kKSlots;
        const uint4* rope_src = nullptr;  // PAGED: this thread's RoPE bytes (load_rope_round)
        uint4 rope_x[2];
        if constexpr (PAGED) {
            // The block's first RoPE round is loaded before its rows have landed (the slot is
            // the prepared one: -1 or inside the cache).
            const int ct = threadIdx.x & 127;
            const i32 kv_slot = __ldg(idx_item + (b - gbase) * kTokensPerBlock + (ct >> 1));
            if (kv_slot >= 0 && kv_slot < p.s_kv) {
                using G = Gather<D_QK, true>;
                rope_src = reinterpret_cast<const uint4*>(
                    p.kv + (i64)kv_slot * G::kRowBytes + G::kRopeAt + 64 * (ct & 1));
            }
            load_rope_round(rope_src, 0, rope_x);
        }
        mbar_wait(bars + (kBarKFull + slot) * 8, (u32)(b / kKSlots) & 1u);
        if constexpr (PAGED) {
            // The raw latent bytes to the workspace's values (while P.V of the pair before
            // runs on the tensor cores) and the RoPE column (the second round's loads in
            // flight during the conversion), visible to this warpgroup's wgmma (the barrier)
            // and to the producer's V^T build (kBarKConv).
            const u32 k_slot = sk + slot * L::kTileBytes;
            const int ct = threadIdx.x & 127;
            store_rope_round<D_QK>(k_slot, ct, 0, rope_x);
            load_rope_round(rope_src, 1, rope_x);
            convert_latent(k_slot, smem_base + L::kScales + slot * L::kScaleSlotBytes, ct);
            store_rope_round<D_QK>(k_slot, ct, 1, rope_x);
            fence_proxy_async();
            mbar_arrive(bars + (kBarKConv + slot) * 8);
            named_barrier_sync(2 + wg, 128);
        }
        fence_proxy_async();
        // The validity mask is read now: s_finish releases the slot, and with it the mask.
        s_mask = *reinterpret_cast<const u64*>(mask16 + slot * 4);
        const u64 k_desc = make_smem_desc_sw64(sk + slot * L::kTileBytes, 512);
#pragma unroll
        for (int c = 0; c < kQkChunks; ++c) {
            float (&dst)[32] = (kQkChunks - 1 - c) % 2 == 0 ? s_cur : s_next;
            float (&src)[32] = (kQkChunks - 1 - c) % 2 == 0 ? s_next : s_cur;
            if (c >= 2) {
                // Chunk c - 1 (in src) is done: the running sum of chunks 0 … c - 2 (in dst)
                // goes into it, and dst is free for chunk c.
                wgmma_wait<0>();
                fence_regs(dst);
                fence_regs(src);
                // Chunks 0 … c - 1 have read their columns: the low ones go back.
                if (c == kKLowChunks) mbar_arrive(bars + (kBarKLowEmpty + slot) * 8);
#pragma unroll
                for (int i = 0; i < 32; ++i) src[i] += dst[i];
            }
            issue_qk_chunk(dst, k_desc, c);
            // P.V of the pair before went in as one commit group per block: once the group of
            // block c is done, its V^T slot goes back to the producer.
            if (c < 2 && release_pv) {
                wgmma_wait<2>();
                // block 2t + c of the pair t before
                pv_release(vt_slot(b - wg - 2 + c));
            }
        }
    };
    // The last chunk is done (waited for by the caller): the sum of all of them in s_cur.
    auto s_finish = [&](int b) {
        fence_regs(s_cur);
        fence_regs(s_next);
        if (kQkChunks >= 2) {
#pragma unroll
            for (int i = 0; i < 32; ++i) s_cur[i] += s_next[i];
        }
        mbar_arrive(bars + (kBarKEmpty + b % kKSlots) * 8);
    };

    // ---- softmax of this warpgroup's block of pair t (S in s_cur): P -> P tile t % 2 (e4m3,
    // positions 64wg …), row sums, and the reference max. Returns whether O needs a rescale
    // (alpha, only after a vote that moved m_ref; P.V of pair t - 1 is complete by then).
    auto softmax = [&](int t) -> bool {
        // Scores in the exponent's units are s_cur * scale. While the scale is positive, a block
        // whose 64 tokens are all valid (the common case) keeps its raw sums: the row maxima are
        // taken over them (rounding is monotone, so max(fl(c s)) = fl(c max(s)): the values of
        // scaling every score first) and each weight's exponent is one fma(s, scale, -m). Any
        // other block is scaled and masked in place first, and its scale becomes 1.
        float scale = score_scale;
        if (s_mask != ~0ull || !(score_scale > 0.f)) {
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int col = 8 * (i >> 2) + 2 * t0 + (i & 1);
                s_cur[i] = ((s_mask >> col) & 1ull) ? s_cur[i] * score_scale : -pos_inf();
            }
            scale = 1.f;
        }
        // This thread's row maxima (a tree over each row's 16 scores: four levels of
        // independent maxima, not a chain of 15), in exponent units.
        float mx[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // row h's scores are s_cur[4k + 2h], s_cur[4k + 2h + 1], k = 0 … 7
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                v[k] = fmaxf(s_cur[4 * k + 2 * h], s_cur[4 * k + 2 * h + 1]);
            }
            const float v0 = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
            const float v1 = fmaxf(fmaxf(v[4], v[5]), fmaxf(v[6], v[7]));
            mx[h] = fmaxf(v0, v1) * scale;
        }
        bool grow = false;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            t_max[h] = fmaxf(t_max[h], mx[h]);
            grow |= mx[h] > m_ref[h] + headroom;  // any valid score while m_ref is -inf
        }
        const u32 p_base = sp + (u32)((t & 1) * kPBytes) + (u32)(2 * wwarp * 1024 + g * 16 + 4 * t0);
        float lsum[2];
        // Weights against m_sub, packed into the P tile: register a of k-step ks holds the
        // positions 4t0 … 4t0 + 3 of 16-position chunk 4wg + 2ks + (a >> 1), row row0 + 8(a & 1).
        auto write_p = [&](const float (&m_sub)[2]) {
            lsum[0] = 0.f;
            lsum[1] = 0.f;
            float w[32];
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                w[i] = fast_exp2(fmaf(s_cur[i], scale, -m_sub[(i >> 1) & 1]));
                lsum[(i >> 1) & 1] += w[i];
            }
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const int i0 = 16 * ks + 8 * (a >> 1) + 2 * (a & 1);
                    const u32 word = (u32)pack_e4m3x2(w[i0], w[i0 + 1]) |
                                     ((u32)pack_e4m3x2(w[i0 + 4], w[i0 + 5]) << 16);
                    st_shared_u32(p_base + (u32)((a & 1) * 1024 + (4 * wg + 2 * ks + (a >> 1)) * 128),
                                  word);
                }
            }
            fence_proxy_async();  // P is read by wgmma (async proxy)
        };
        float m_sub[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) m_sub[h] = m_ref[h] == -pos_inf() ? 0.f : m_ref[h];
        // An item's first pair always moves m_ref (from -inf, unless it has no valid score, when
        // the exchange leaves it there): no speculative weights, no vote. Both warpgroups come
        // from the epilogue of the item before, whose barriers keep max_xchg's last readers
        // behind them.
        bool exchange = true;
        if (t > 0) {
            write_p(m_sub);
            exchange = named_barrier_any(kBarConsumers, 256, grow);
        }
        if (!exchange) {
            l_run[0] += lsum[0];
            l_run[1] += lsum[1];
            return false;
        }
        // m_ref moves to the max over both blocks of the pair (the same in both warpgroups): the
        // row maxima are exchanged only now. The vote above keeps these writes behind the other
        // warpgroup's reads of the exchange before.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
        if (t0 == 0) {
            max_xchg[wg * 64 + row0] = mx[0];
            max_xchg[wg * 64 + row0 + 8] = mx[1];
        }
        named_barrier_sync(kBarConsumers, 256);
        bool rescale = false;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float pm = max_xchg[(1 - wg) * 64 + row0 + 8 * h];
            const float m_new = fmaxf(m_ref[h], fmaxf(mx[h], pm));
            m_sub[h] = m_new == -pos_inf() ? 0.f : m_new;
            alpha[h] = fast_exp2(m_ref[h] - m_sub[h]);  // 0 while m_ref is -inf
            rescale |= alpha[h] != 1.f;
            m_ref[h] = m_new;
            l_run[h] *= alpha[h];
        }
        write_p(m_sub);
        // New headroom: log2 of 1/16 of a lower bound of both rows' denominators (this
        // warpgroup's part of them), at most kMaxHeadroom.
        float lw[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lw[h] = l_run[h] + lsum[h];
            lw[h] += __shfl_xor_sync(0xffffffffu, lw[h], 1);
            lw[h] += __shfl_xor_sync(0xffffffffu, lw[h], 2);
        }
        headroom = fminf(fmaxf(__log2f(fminf(lw[0], lw[1])) - kLog2ShareLimit, 0.f), kMaxHeadroom);
        // Both warpgroups' P.V reads the whole P tile: both halves are rewritten before either
        // issues it (without this barrier the tests failed under racecheck's scheduling).
        named_barrier_sync(kBarConsumers, 256);
        l_run[0] += lsum[0];
        l_run[1] += lsum[1];
        return __any_sync(0xffffffffu, rescale);
    };
    // Waits until this thread's bulk copy of the item before has read the staging, then returns
    // its two V^T slots (blocks gbase - 2, gbase - 1) to the producer.
    auto return_staging = [&]() {
        bulk_store_wait_read();
        mbar_arrive(bars + (kBarVtEmpty + vt_slot(gbase - 2)) * 8);
        mbar_arrive(bars + (kBarVtEmpty + vt_slot(gbase - 1)) * 8);
        staging_out = false;
    };
    auto rescale_o = [&]() {
        fence_regs(o);  // P.V of the pair before is complete (waited for in s_begin)
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    };

    // ---- O[:, 256wg …] += P . V^T of pair t (both blocks, two k-steps each), one commit group.
    auto pv_issue = [&](int t) {
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
            const int blk = gbase + 2 * t + kb;
            mbar_wait(bars + (kBarVtFull + vt_slot(blk)) * 8, vt_use(blk) & 1u);
        }
        const u64 p_desc = make_smem_desc(sp + (u32)((t & 1) * kPBytes), 128, 1024);
        fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
            const int vs = vt_slot(gbase + 2 * t + kb);
            const u64 vt_desc =
                make_smem_desc(svt + (u32)(vs * kVtBytes + wg * (kVtBytes / 2)), 128,
                               kVtGroupStride);
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                wgmma_pv(o, p_desc + (u64)((2 * kb + ks) * 16), vt_desc + (u64)(ks * 16));
            }
            wgmma_commit();  // one group per block (s_begin releases its V^T slot)
        }
    };

    for (int item = blockIdx.x, item_no = 0; item < items; item += gridDim.x, ++item_no) {
        const int tile = item % p.head_tiles;
        const int row_i = item / p.head_tiles;
        const int num_pairs = blocks_of(item_len(item)) / 2;
        idx_item = p.indices + (i64)row_i * p.topk;
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m_ref[h] = -pos_inf();
            t_max[h] = -pos_inf();
            l_run[h] = 0.f;
            alpha[h] = 1.f;
        }
        headroom = 0.f;
        mbar_wait(bars + kBarQFull * 8, (u32)item_no & 1u);
        fence_proxy_async();
        const u32 q_done = bars + kBarQEmpty * 8;  // arrived on after the item's last S
        if (num_pairs > 0) {
            s_begin(gbase + wg, false);
            if (staging_out) return_staging();  // behind the item's first S
            wgmma_wait<0>();
            s_finish(gbase + wg);
            if (num_pairs == 1) mbar_arrive(q_done);
            softmax(0);  // O is still zero: no rescale
        } else {
            if (staging_out) return_staging();
            mbar_arrive(q_done);
        }
        for (int t = 0; t < num_pairs; ++t) {
            pv_issue(t);
            if (t + 1 < num_pairs) {
                // S of the next pair queues behind P.V: after S chunks 0 and 1 are issued,
                // s_begin waits for P.V's group of block 0, then of block 1 (wgmma_wait<2>), and
                // returns each V^T slot to the producer as soon as its group is done.
                s_begin(gbase + 2 * (t + 1) + wg, true);
                wgmma_wait<0>();
                s_finish(gbase + 2 * (t + 1) + wg);
                if (t + 2 == num_pairs) mbar_arrive(q_done);
                if (softmax(t + 1)) rescale_o();
            } else {
                wgmma_wait<0>();
                fence_regs(o);
            }
        }

        // ---------------------------------------------------------------- epilogue
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
            t_max[h] = fmaxf(t_max[h], __shfl_xor_sync(0xffffffffu, t_max[h], 1));
            t_max[h] = fmaxf(t_max[h], __shfl_xor_sync(0xffffffffu, t_max[h], 2));
        }
        if (t0 == 0) {
            sum_xchg[wg * 64 + row0] = l_run[0];
            sum_xchg[wg * 64 + row0 + 8] = l_run[1];
            tmax_xchg[wg * 64 + row0] = t_max[0];
            tmax_xchg[wg * 64 + row0 + 8] = t_max[1];
        }
        named_barrier_sync(kBarConsumers, 256);
        float out_scale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            const int head = tile * kHeadsPerTile + row;
            const float l_total = l_run[h] + sum_xchg[(1 - wg) * 64 + row];
            const bool empty = m_ref[h] == -pos_inf();
            float denom = l_total;
            if (HAVE_SINK && head < p.h_q) {
                denom += fast_exp2(__ldg(p.attn_sink + head) * kLog2e - (empty ? 0.f : m_ref[h]));
            }
            out_scale[h] = empty ? 0.f : kv_scale / denom;
            if (wg == h && t0 == 0 && head < p.h_q) {
                const float m_true = fmaxf(t_max[h], tmax_xchg[(1 - wg) * 64 + row]);
                const i64 out_row = (i64)row_i * p.h_q + head;
                p.max_logits[out_row] = empty ? -pos_inf() : m_true * kLn2;
                p.lse[out_row] = empty ? pos_inf() : (m_ref[h] + log2f(l_total)) * kLn2;
            }
        }
        if (num_pairs == 0) {
            // No valid block: O is zero, written with plain 16-byte stores (heads past h_q not).
            for (int e = threadIdx.x; e < kHeadsPerTile * (2 * kDV / 16); e += 256) {
                const int head = tile * kHeadsPerTile + e / (2 * kDV / 16);
                if (head < p.h_q) {
                    uint4* out =
                        reinterpret_cast<uint4*>(p.out + ((i64)row_i * p.h_q + head) * kDV);
                    out[e % (2 * kDV / 16)] = make_uint4(0u, 0u, 0u, 0u);
                }
            }
            // The next item's exchanges must not overwrite what the other warpgroup still reads.
            named_barrier_sync(kBarConsumers, 256);
        } else {
            // O in bf16 into the staging rows. stmatrix.x4 of matrices (value columns 8j …
            // 8j + 7, heads 16 wwarp + 8h …), j = 4jj … 4jj + 3: the accumulator fragment is the
            // stmatrix fragment (row g, columns 2t0, 2t0 + 1). Heads 0-31 stage in the V^T slot
            // of the item's second-to-last block, 32-63 in that of its last block (their P.V is
            // done in both warpgroups: each waited for its own before the barrier above).
            auto stage_row = [&](int head) {
                const int blk = gbase + 2 * num_pairs - 2 + (head >> 5);
                return svt + (u32)(vt_slot(blk) * kVtBytes + (head & 31) * kOutRowStride);
            };
            {
                const int m = lane >> 3, r = lane & 7;
    #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u32 row_addr =
                        stage_row(16 * wwarp + 8 * h + r) + (u32)((256 * wg + 8 * m) * 2);
    #pragma unroll
                    for (int jj = 0; jj < 8; ++jj) {
                        u32 v[4];
    #pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const int j = 4 * jj + i;
                            v[i] = pack_bf16x2(o[4 * j + 2 * h] * out_scale[h],
                                               o[4 * j + 2 * h + 1] * out_scale[h]);
                        }
                        stmatrix_x4(row_addr + (u32)(jj * 64), v[0], v[1], v[2], v[3]);
                    }
                }
            }
            fence_proxy_async();  // the staging is read by the bulk copies (async proxy)
            named_barrier_sync(kBarConsumers, 256);
            // Head row hl (thread hl of the consumers) goes out as one bulk copy; heads past h_q
            // are not written.
            const int hl = threadIdx.x;
            staging_out = hl < kHeadsPerTile && tile * kHeadsPerTile + hl < p.h_q;
            if (staging_out) {
                bf16_t* out = p.out + ((i64)row_i * p.h_q + tile * kHeadsPerTile + hl) * kDV;
                bulk_store(out, stage_row(hl), 2 * kDV);
                bulk_store_commit();
            } else {
                // Both V^T slots go back to the producer: vt_empty counts every consumer thread;
                // a thread that sent a row arrives in the next item, behind its first S, once
                // its copy has read the staging (return_staging).
                mbar_arrive(bars + (kBarVtEmpty + vt_slot(gbase + 2 * num_pairs - 2)) * 8);
                mbar_arrive(bars + (kBarVtEmpty + vt_slot(gbase + 2 * num_pairs - 1)) * 8);
            }
        }
        gbase += 2 * num_pairs;
    }
    // The last item's copies must have read the staging before the CTA's shared memory goes.
    if (staging_out) bulk_store_wait_read();
}
