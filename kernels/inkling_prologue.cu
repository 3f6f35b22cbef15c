// shapeproof — Inkling fused attention prologue (verify / extend / decode), sm_90a.
// Semantics: docs/kernels/prologue.md §1.5–§1.8. Prepended by the library: common.cuh.
//
// ================================================================================================
// Design
// ================================================================================================
//
// The prologue is a streaming, memory-bound job: per token it reads one packed qkvr row (DQ + 2*DKV
// bf16) plus a little history, does O(1) f32 work per element, and writes q/k/v outputs, the KV
// pool rows (+ scales) and, for verify, (W-1) saved window rows per k/v channel. There is no reuse
// worth staging in shared memory; the kernel is built for bandwidth and short latency.
//
// * Threads per token, in two role regions each padded to whole warps (TokenLayout below):
//     q threads:   HQ*HD/8/QV, QV = 4 (HQ % 4 == 0, whole warps) else 2 else 1 q vectors per thread;
//                  thread i owns channel (i % (HD/8))*8 of heads i/(HD/8) + j*HQ/QV, j < QV;
//     k/v threads: HKV*HD/8 k threads then HKV*HD/8 v threads, one 8-channel vector each.
//   Every warp therefore serves a single token and a single role: shuffles are full-warp, and a
//   head is an aligned group of HD/8 (8, 16 or 32) lanes — reductions never cross heads. There is
//   no per-block lane limit: tokens are laid out flat over the grid, any DQ, DKV <= 16384 works
//   (Inkling TP1, HQ=64 HKV=8: 256 + 256 threads per token).
// * Every bf16 access is one 16-byte vector (e4m3 data: 8 bytes), consecutive lanes at consecutive
//   addresses: fully coalesced. A q thread has QV independent 16-byte row loads in flight; a k/v
//   thread its own row plus W-1 history loads (earlier rows of the sequence — L2 hits — or
//   conv-cache rows) plus the weight vectors, all issued before first use. Metadata loads that do
//   not depend on each other (index and mask, gamma, tau, loc) are issued together, so history waits
//   for one round trip (verify, decode) or two (extend: seq_of_token, then the sequence's entries).
// * Why QV = 4: with one vector per thread, the q threads (80% of Inkling TP8's bytes) carried one
//   load each and the kernel reached 68% of copy bandwidth at T = 65536; four per thread, same
//   register budget, reached 88%. Why 128-thread blocks: at 64 registers, 8 blocks of 128 fit per
//   SM; a small block retires as soon as its two tokens are done (q warps do not wait for slow k/v
//   warps of many other tokens), and small T spreads over more SMs. Measured 128 vs 256: equal or
//   better everywhere (up to 12% on small-T MXFP8). Capping registers below 64 spills (56: a few
//   instantiations spill; 48: all do).
// * Small T (a verify step, T = 4…256): the call is a few dependent memory round trips (L2 hits in a
//   graph replay) plus the compute chain of the q warp, which handles QV = 4 vectors per lane; one
//   thread per vector with no loop keeps the critical path at one pass, and even T = 4 covers
//   several blocks (TP8: 4 tokens x 64 threads = 2 blocks; TP1: 16 blocks).
// * Short dependent chains (ncu, TP8 T=4, before this design: MXFP8 7,100-7,270 cycles vs bf16
//   5,650-5,770, +0.6 us per call; the q warp's four vectors ran one after another, each through an
//   IEEE division for the scale byte, 5 shuffles and the slow-path branches of sqrt/div, which are
//   scheduling barriers). Now, all bit-identical to the previous arithmetic:
//   - the QV vectors of a q lane are normalised together and encoded together: their shuffles and
//     chains overlap;
//   - the E8M0 scale byte is read off the bits of max(amax, 1e-30) (no division; proof at
//     mxfp8_scale_byte_nodiv, checked over all 2^32 inputs);
//   - a block's first lane stores the scale byte itself (u8 stores, 4 adjacent bytes per head)
//     instead of gathering the head's 4 bytes with 3 more shuffles;
//   - inverse_rms of the QV vectors runs the ptxas fast paths of sqrt.rn/div.rn without their
//     slow-path branches for arguments in [2^-100, 2^100] (exhaustively equal), IEEE otherwise;
//   - bf16 rounding is one cvt.rn.bf16x2 per pair (exhaustively equal to cvt.rn.bf16);
//   - the e4m3 clamp is one-sided (the satfinite conversion clamps above; exhaustively equal).
//   ncu after: MXFP8 5,750-5,820 cycles vs bf16 5,670-5,730 at T=4.
// * Long batches are bound by instruction issue at the occupancy 64 registers allow, not by DRAM:
//   ncu, extend MXFP8 T = 16384: 1,169 warp instructions per token, issue slots 76% busy, 2.8
//   eligible warps per scheduler, 43% achieved occupancy, DRAM 33% (at ncu's locked clock). Two
//   cuts, bit-identical again (1,093 per token, MXFP8 2-5% faster at T >= 16384):
//   - a rounding whose f32 result is used again (q before tau, q before the encoder, k before its
//     norm) is one cvt.rn.bf16x2 with +0 in the low half (round_bf16_one_op): the register is the
//     rounded f32, instead of a packing cvt per pair plus a shift or mask per value;
//   - the encoder joins two cvt.rn.satfinite.e4m3x2 results as the halves of a word (no 64-bit
//     shifts and masks), and the 8 bytes are stored as one 8-byte access.
//   And one dependent round trip less for the k/v history of verify and extend: the K qkvr rows
//   before the token are read before the sequence metadata (extend MXFP8 3% faster at T >= 16384).
//   Tried and dropped: two tokens per k/v thread (the second token of the same sequence reuses the
//   first one's history rows and the weights): bit-identical, but 72-80 registers (6-7 blocks per
//   SM), 5-15% slower at T >= 4096 and +0.6-0.8 us per call at small batches. Capping registers
//   at 56 (9 blocks per SM, no spills for extend): within +-4%, mixed.
// * PDL: the kernels execute `griddepcontrol.wait` before their first global read and
//   `griddepcontrol.launch_dependents` at the end. Both are no-ops unless the host launches with
//   programmatic stream serialization; with it, block launch overlaps the tail of the qkvr GEMM.
//
// Measured on one H200 (this file in a standalone harness; bytes = unique bytes read + written,
// the library benchmark's count; device-to-device copy 4.24 TB/s in the same run), Inkling TP8
// geometry HQ=8 HKV=1 HD=128 W=4, verify q=4, tau on:
//   graph replay per call, B = 1 / 4 / 16 / 64 (T = 4B):
//     bf16 store   1.92 / 1.93 / 2.04 / 2.30 us      (before: 1.96 / 1.98 / 2.09 / 2.34)
//     MXFP8 store  2.01 / 2.05 / 2.12 / 2.42 us      (before: 2.57 / 2.61 / 2.66 / 2.77), +4…6%
//   T = 16384, one launch between events (as the library benchmark) / back-to-back graph launches:
//     bf16  37.4 us (78% of copy) / 32.8 us (89%);   MXFP8 37.6 us (65%) / 32.3 us (76%)
//     (before: bf16 38.3 / 33.7 us, MXFP8 40.6 / 35.4 us; the ~5 us between the two columns is
//     the host launch gap inside the event pair, not kernel time)
//   T = 65536: bf16 128.3 us (91%) / 123.9 us (95%);   MXFP8 126.0 us (78%) / 120.8 us (81%)
//   decode T = 65536 bf16: 144.0 us (94%);  extend 16 x 4096 MXFP8 + trailing: 109.7 us
//   TP1 (HQ=64 HKV=8): verify MXFP8 T=64 2.63 us (graph); T=16384 240 us (81%);
//                      extend bf16 4 x 4096 + trailing: 194.9 us (89%)
// bf16 and MXFP8 take about the same time per token at large T: MXFP8 moves 17% fewer bytes, and
// the limit is the per-token latency chain at the occupancy 64 registers allow (ncu, T=16384
// MXFP8: 41% achieved occupancy, 0.62-0.66 instructions issued per scheduler cycle, DRAM 53-61%).
//
// Numerics (docs/kernels/prologue.md §1.5/§1.6): f32 arithmetic; conv accumulated tap 0 … tap W-2 then the current
// token, each step one fused multiply-add; bf16 rounding points exactly: q after norm, q after tau,
// k conv output before its norm, k after norm, v after conv. RMSNorm: per-lane fma over the lane's
// 8 channels in order, xor butterfly 1, 2, 4, … over the head, then inverse_rms (IEEE; mirrored bit
// for bit by the Rust CPU reference). MXFP8 (docs/kernels/prologue.md §1.7) encodes those bf16 values with the exact E8M0
// exponent (no log2, no division) and multiplies by the exact inverse scale.
//
// ================================================================================================
// Launch shape (the Rust side mirrors these exactly)
// ================================================================================================
//
// inkling_prologue_kernel<VARIANT, HD, HQ, HKV, W, SILU, RESIDUAL, STORE, PAGE, Q_OFF, K_OFF, V_OFF>:
//     Q_VECS  = HQ*HD/8,  KV_VECS = HKV*HD/8
//     QV      = 4 if HQ % 4 == 0 and (Q_VECS/4) % 32 == 0
//               else 2 if HQ % 2 == 0 and (Q_VECS/2) % 32 == 0
//               else 4 if HQ % 4 == 0 else 2 if HQ % 2 == 0 else 1
//     TOKEN_THREADS = roundup(Q_VECS/QV, 32) + roundup(2*KV_VECS, 32)
//     block   = (128, 1, 1) threads
//     grid    = (ceil(T * TOKEN_THREADS / 128), 1, 1)         (T >= 1; do not launch for T == 0)
//     dynamic shared memory = 0 bytes
//   e.g. Inkling TP8 (HD=128, HQ=8, HKV=1): TOKEN_THREADS = 32 + 32 = 64, grid = ceil(T/2);
//        SWA TP8 (HQ=8, HKV=2): 32 + 64 = 96; TP1 (HQ=64, HKV=8): 256 + 256 = 512;
//        HD=64, HQ=8, HKV=1: QV = 2, 32 + 32 = 64.
//
// inkling_conv_state_update_kernel<HD, HKV, W, K_OFF, V_OFF>   (extend only, after the main kernel,
// same stream):
//     block   = (256, 1, 1) threads
//     grid    = (ceil(B * 2 * HKV*HD/8 / 256), 1, 1)          (B >= 1; do not launch for B == 0)
//     dynamic shared memory = 0 bytes
//
// Bad-index counting (p.bad_index_count, when not null). Main kernel: each token adds one per kind
// of out-of-range index it had to skip (loc; cache_indices of its sequence/token; extend
// seq_of_token or cu_seqlens[seq] (also cu_seqlens[seq] > t); decode track_indices). Trailing
// kernel: each sequence adds one per bad cache_indices, bad cu_seqlens pair, bad track_dst, and one
// per bad track_rows entry (a tracked window with any bad row or a bad destination is not written).

// Parameters of one launch. Mirrored field by field (same order, same C types) by
// `PrologueParams` in src/ops/prologue/cuda.rs: change both together.
// Extents in the comments: T tokens, B sequences, S KV slots, DQ = HQ*HD, DKV = HKV*HD.
struct PrologueParams {
    const bf16_t* qkvr;            // [T, qkvr_row_stride] packed projection rows
    i64 qkvr_row_stride;           // elements; multiple of 8
    i32 num_tokens;                // T
    i32 num_seqs;                  // B (verify, extend); T for decode
    bf16_t* k_cache;               // [conv_slots, W-1, DKV] conv-state history of k
    bf16_t* v_cache;               // [conv_slots, W-1, DKV] conv-state history of v
    i32 conv_slots;                // rows of the conv caches
    i32 draft_tokens;              // verify: q (T == B*q); otherwise 0
    const i32* cache_indices;      // verify/extend [B], decode [T]; -1 = padding
    const u8* cache_mask;          // same length as cache_indices; 1 = use cached history
    const bf16_t* k_weight;        // [DKV, W] depthwise conv taps, column W-1 = current token
    const bf16_t* v_weight;        // [DKV, W]
    const bf16_t* q_gamma;         // [HD] RMSNorm weight of q
    const bf16_t* k_gamma;         // [HD] RMSNorm weight of k
    float eps;                     // RMSNorm epsilon
    const float* tau;              // [T] log-scaling tau, or nullptr
    void* q_out;                   // [T, DQ] bf16, or e4m3 bytes with the MXFP8 store
    u8* q_scale;                   // [T, HQ, HD/32] E8M0 bytes (MXFP8 store only)
    bf16_t* k_out;                 // [T, DKV]
    bf16_t* v_out;                 // [T, DKV]
    const i64* loc;                // [T] KV slot per token; negative = do not store
    i64 kv_slots;                  // S = pages * PAGE
    void* k_buf;                   // [S, DKV] bf16, or e4m3 bytes with the MXFP8 store
    void* v_buf;                   // [S, DKV]
    u8* sfk;                       // [S/PAGE, HKV, 32, PAGE/32, 4] E8M0 (MXFP8 store only)
    u8* sfv;                       // [S/PAGE, HKV, 32, PAGE/32, 4]
    bf16_t* k_inter;               // verify: [inter_capacity, q, W-1, DKV] saved windows
    bf16_t* v_inter;               // verify: [inter_capacity, q, W-1, DKV]
    i32 inter_capacity;            // verify: rows of k_inter/v_inter (>= B)
    const i64* cu_seqlens;         // extend: [B+1] token start of each sequence
    const i32* seq_of_token;       // extend: [T] sequence of each token
    const u8* track_mask;          // decode: [T] or nullptr (no tracking)
    const i64* track_indices;      // decode: [T] conv slot to copy the new window to
    u32* bad_index_count;          // nullptr, or one counter of skipped out-of-range indices
};

// Parameters of the extend variant's trailing conv-state update (a second launch).
// Mirrored by `ConvStateUpdateParams` in src/ops/prologue/cuda.rs.
struct ConvStateUpdateParams {
    const bf16_t* qkvr;            // [T, qkvr_row_stride]
    i64 qkvr_row_stride;
    i32 num_seqs;                  // B
    i32 num_tokens;                // T
    bf16_t* k_cache;               // [conv_slots, W-1, DKV]
    bf16_t* v_cache;               // [conv_slots, W-1, DKV]
    i32 conv_slots;
    i32 do_cache_update;           // 0: only tracking
    const i32* cache_indices;      // [B]; -1 = padding
    const u8* has_initial_state;   // [B]
    const i64* cu_seqlens;         // [B+1]
    const u8* track_mask;          // [B] or nullptr (no tracking)
    const i64* track_rows;         // [B, W-1] qkvr rows that form the tracked window
    const i64* track_dst;          // [B] conv slot receiving the tracked window
    u32* bad_index_count;          // nullptr or one counter
};


constexpr int kPrologueThreads = 128;       // threads per block, main kernel
constexpr int kConvUpdateThreads = 256;     // threads per block, extend trailing update

constexpr int kVariantVerify = 0;
constexpr int kVariantExtend = 1;
constexpr int kVariantDecode = 2;

constexpr int kStoreNone = 0;
constexpr int kStoreBf16 = 1;
constexpr int kStoreMxfp8 = 2;

// 8 bf16 channels in one aligned 16-byte vector (word j holds channels 2j (low) and 2j+1 (high)).
struct alignas(16) Bf16x8 {
    u32 word[4];
};

__device__ __forceinline__ Bf16x8 zero_bf16x8() {
    Bf16x8 v;
#pragma unroll
    for (int j = 0; j < 4; ++j) v.word[j] = 0u;
    return v;
}

__device__ __forceinline__ Bf16x8 load_bf16x8(const bf16_t* ptr) {
    return *reinterpret_cast<const Bf16x8*>(ptr);
}

__device__ __forceinline__ void store_bf16x8(bf16_t* ptr, const Bf16x8& v) {
    *reinterpret_cast<Bf16x8*>(ptr) = v;
}

// Channel c (0..7) of a vector, widened exactly to f32.
__device__ __forceinline__ float bf16x8_channel(const Bf16x8& v, int c) {
    const u32 w = v.word[c >> 1];
    return __uint_as_float((c & 1) ? (w & 0xffff0000u) : (w << 16));
}

// 8 f32 values -> 8 bf16, round to nearest even.
__device__ __forceinline__ Bf16x8 pack_bf16x8(const float (&f)[8]) {
    Bf16x8 v;
#pragma unroll
    for (int j = 0; j < 4; ++j) v.word[j] = pack_bf16x2(f[2 * j], f[2 * j + 1]);
    return v;
}

// Sum over an aligned group of GROUP lanes (power of two <= 32). Every lane of the warp calls it
// (warps are role-uniform, see the launch shape), so the shuffles use the full mask.
template <int GROUP>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int m = 1; m < GROUP; m <<= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// Max over an aligned group of GROUP lanes (fmaxf: NaN inputs are dropped).
template <int GROUP>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int m = 1; m < GROUP; m <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

// 1 / sqrt(sum_sq / HD + eps) with IEEE operations only (no FMA contraction, correctly rounded
// square root and division), so the CPU reference computes the same f32 and the bf16 outputs, and
// hence the MXFP8 bytes, agree bit for bit. HD is a power of two: the scaling by 1/HD is exact.
template <int HD>
__device__ __forceinline__ float inverse_rms(float sum_sq, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fmul_rn(sum_sq, 1.0f / HD), eps)));
}

__device__ __forceinline__ void grid_dependency_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void grid_dependents_launch() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// 1 / 2^(byte - 127) = 2^(127 - byte), exactly representable for byte in [0, 254] (2^-127 is a
// subnormal). x * 2^(127-byte) rounded once is the same f32 as the IEEE division x / 2^(byte-127)
// done by common.cuh's mxfp8_quantize_pair (both are the correctly rounded value of the same real
// number, subnormal and overflowing results included), so the encoder multiplies: one FMUL instead
// of the IEEE division sequence for each of the DQ + 2*DKV elements of a token.
__device__ __forceinline__ float mxfp8_inverse_scale(u32 byte) {
    return __uint_as_float(byte == 254u ? 0x00400000u : ((254u - byte) << 23));
}

// The E8M0 scale byte of docs/kernels/prologue.md §1.7 (= common.cuh's mxfp8_scale_byte, byte for byte, for every f32
// input) without the division. a = max(amax, 1e-30) is +inf (-> 254) or a normal f32 m * 2^E with
// m in [1, 2) (NaN -> 1e-30 as there). r = RN(a / 448) = RN(m/7) * 2^(E-6) is normal for every
// such a, and m/7 lies in [1/7, 2/7); RN(m/7) equals 1/4 only for m = 1.75 exactly (any other f32 m
// is at least 2^-23/7 > half an ulp away from 1.75/7 = 1/4), and is never a power of two otherwise.
// So ceil(log2 r) = E - 8 for m <= 1.75 (mantissa field <= 0x600000) and E - 7 above, i.e.
// byte = ((bits(a) + 0x1fffff) >> 23) - 8, already inside [19, 247]. Checked exhaustively against
// the division form over all 2^32 inputs (on the CPU).
__device__ __forceinline__ u32 mxfp8_scale_byte_nodiv(float amax) {
    const u32 bits = __float_as_uint(fmaxf(amax, 1e-30f));
    return bits >= 0x7f800000u ? 254u : ((bits + 0x1fffffu) >> 23) - 8u;
}

// Four f32 -> four e4m3 bytes in one word (a in the lowest byte), round to nearest even,
// saturating: two cvt.rn.satfinite.e4m3x2 whose 16-bit results are joined as the two halves of
// the word (no shifts or masks).
__device__ __forceinline__ u32 pack_e4m3x4(float a, float b, float c, float d) {
    u32 r;
    asm("{\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};\n\t}"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

// 8 e4m3 bytes of one lane (channel 0 in the lowest byte of word 0), stored as one 8-byte access.
struct alignas(8) E4m3x8 {
    u32 word[2];
};

// 8 values of one lane -> 8 e4m3 bytes with the block's scale byte.
__device__ __forceinline__ E4m3x8 mxfp8_encode8(const float (&x)[8], u32 scale_byte) {
    const float inv_scale = mxfp8_inverse_scale(scale_byte);
    float v[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        // clamp(x / s, -448, 448) then e4m3: fmaxf turns NaN into -448; the upper clamp is the
        // satfinite conversion's own (448 and +inf -> 448). Same bytes as the two-sided clamp for
        // every f32 (checked exhaustively on sm_90).
        v[c] = fmaxf(__fmul_rn(x[c], inv_scale), -448.0f);
    }
    E4m3x8 bytes;
    bytes.word[0] = pack_e4m3x4(v[0], v[1], v[2], v[3]);
    bytes.word[1] = pack_e4m3x4(v[4], v[5], v[6], v[7]);
    return bytes;
}

// Largest magnitude of one lane's 8 values (fmaxf: NaN dropped; never NaN, never negative).
__device__ __forceinline__ float lane_amax8(const float (&x)[8]) {
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) amax = fmaxf(amax, fabsf(x[c]));
    return amax;
}

// inverse_rms for N independent sums at once, same f32 results. For arguments v in [2^-100, 2^100]
// (every realistic one: eps >= 2^-100 and no overflow) it runs the fast paths that ptxas itself
// emits for sqrt.rn / div.rn (MUFU.RSQ + 2 FMA, MUFU.RCP + 4 FMA) without their slow-path branches,
// so the N chains interleave; checked exhaustively on sm_90 against __fdiv_rn(1, __fsqrt_rn(v)) for
// every f32 in that range (checked exhaustively). Anything else takes the IEEE functions.
__device__ __forceinline__ float inverse_sqrt_fastpath(float v) {
    float r, rc;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    const float s = __fmul_rn(v, r);
    const float h = __fmul_rn(r, 0.5f);
    const float e = __fmaf_rn(-s, s, v);
    const float root = __fmaf_rn(e, h, s);  // = __fsqrt_rn(v)
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rc) : "f"(root));
    const float t1 = __fmaf_rn(rc, -root, 1.0f);
    const float t2 = __fmaf_rn(rc, t1, rc);
    const float rem = __fmaf_rn(t2, -root, 1.0f);
    return __fmaf_rn(t2, rem, t2);          // = __fdiv_rn(1, root)
}

template <int HD, int N>
__device__ __forceinline__ void inverse_rms_n(const float (&sum_sq)[N], float eps, float (&inv)[N]) {
    float v[N];
    bool fast = true;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        v[j] = __fadd_rn(__fmul_rn(sum_sq[j], 1.0f / HD), eps);
        fast = fast && v[j] >= 0x1p-100f && v[j] <= 0x1p100f;  // false for NaN
    }
    if (fast) {
#pragma unroll
        for (int j = 0; j < N; ++j) inv[j] = inverse_sqrt_fastpath(v[j]);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) inv[j] = inverse_rms<HD>(sum_sq[j], eps);
    }
}

// f rounded to bf16 (round to nearest even) and widened back to f32, in one instruction
// (common.cuh's round_bf16 takes two):
// cvt.rn.bf16x2 with f in the high half and +0 in the low half leaves exactly the f32 bits of
// the rounded value (the high half of an f32 is its bf16). Same bits as rounding to bf16 and
// widening for every f32, NaN included (both give the canonical bf16 NaN in the high half).
__device__ __forceinline__ float round_bf16_one_op(float f) {
    return __uint_as_float(pack_bf16x2(0.0f, f));
}

// Rounds 8 f32 to bf16 in place (one instruction each; packing and unpacking again costs one and
// a half). Callers that need only the packed form use pack_bf16x8, which rounds as it packs.
__device__ __forceinline__ void round_bf16x8(float (&f)[8]) {
#pragma unroll
    for (int c = 0; c < 8; ++c) f[c] = round_bf16_one_op(f[c]);
}

// Offset of scale byte (slot, head, block 0) in an interleaved sfk/sfv plane
// [S/PAGE, HKV, 32, PAGE/32, 4] (docs/kernels/prologue.md §1.8); blocks 1..3 follow in the next bytes.
template <int PAGE, int HKV>
__device__ __forceinline__ i64 interleaved_scale_offset(i64 slot, int head) {
    constexpr int PC = PAGE / 32;
    const i64 page = slot / PAGE;
    const int po = (int)(slot % PAGE);
    return (page * HKV + head) * (i64)(32 * PC * 4) + (i64)((po % 32) * (PC * 4) + (po / 32) * 4);
}

// Where the conv history of one k/v lane comes from (docs/kernels/prologue.md §1.5), per variant.
struct ConvHistory {
    int first_token;     // bos: rows u >= bos come from qkvr
    i64 read_slot;       // conv-cache slot supplying rows before bos; -1 = none (zeros)
    bool gate;           // cache history is used (else zeros); qkvr rows are never gated
    bool load_ungated;   // verify: cache rows are read even when not gated (raw window copies)
    i64 window_slot;     // verify: saved-window row s (< inter_capacity); decode: slot to update; -1 = none
    i64 track_slot;      // decode: tracking slot; -1 = none
    bool may_store;      // token may be scattered into the KV pool
};

// Reads the token's sequence metadata. Loads that do not depend on each other are issued together
// (mask next to index) so that the history loads wait for one round trip (verify, decode) or two
// (extend: seq_of_token, then the sequence's entries).
template <int VARIANT>
__device__ __forceinline__ ConvHistory resolve_history(const PrologueParams& p, int t, bool counter_lane) {
    ConvHistory h;
    h.first_token = t;
    h.read_slot = -1;
    h.gate = false;
    h.load_ungated = false;
    h.window_slot = -1;
    h.track_slot = -1;
    h.may_store = true;
    if (VARIANT == kVariantVerify) {
        const int q = p.draft_tokens;
        if (q <= 0) return h;
        const int s = t / q;
        h.first_token = s * q;
        if (s >= p.num_seqs) return h;  // T != B*q (rejected by the host): no history, no windows
        const i32 raw_slot = p.cache_indices[s];
        const bool mask = p.cache_mask[s] != 0;
        const bool slot_ok = raw_slot >= 0 && raw_slot < p.conv_slots;
        if (raw_slot != -1 && !slot_ok && counter_lane) count_bad_index(p.bad_index_count);
        if (slot_ok) {
            h.read_slot = raw_slot;
            h.gate = mask;
            h.load_ungated = true;
            if (s < p.inter_capacity) h.window_slot = s;
        }
    } else if (VARIANT == kVariantExtend) {
        const i32 s = p.seq_of_token[t];
        if (s < 0 || s >= p.num_seqs) {
            if (counter_lane) count_bad_index(p.bad_index_count);
            h.may_store = false;
            return h;
        }
        const i64 bos = p.cu_seqlens[s];
        const i32 raw_slot = p.cache_indices[s];
        const bool mask = p.cache_mask[s] != 0;
        if (bos < 0 || bos > p.num_tokens || bos > t) {
            if (counter_lane) count_bad_index(p.bad_index_count);
            h.may_store = false;
            return h;
        }
        h.first_token = (int)bos;
        const bool slot_ok = raw_slot >= 0 && raw_slot < p.conv_slots;
        if (raw_slot != -1 && !slot_ok) {
            if (counter_lane) count_bad_index(p.bad_index_count);
            return h;  // bad slot: no history
        }
        // History only from a real slot: a padding sequence (-1) never reads another's state
        // (sglang's kernel reads slot 0 there; its outputs for padding are discarded anyway).
        h.gate = mask && slot_ok;
        h.read_slot = slot_ok ? (i64)raw_slot : -1;
    } else {
        const i32 raw_slot = p.cache_indices[t];
        const bool mask = p.cache_mask[t] != 0;
        const bool track = p.track_mask != nullptr && p.track_mask[t] != 0;
        const bool slot_ok = raw_slot >= 0 && raw_slot < p.conv_slots;
        h.may_store = slot_ok;  // decode stores valid tokens only
        if (raw_slot != -1 && !slot_ok) {
            if (counter_lane) count_bad_index(p.bad_index_count);
            return h;
        }
        // As for extend: padding tokens read no history, so they cannot race with the valid
        // token that updates slot 0 in the same launch.
        h.gate = mask && slot_ok;
        h.read_slot = slot_ok ? (i64)raw_slot : -1;
        if (slot_ok) {
            h.window_slot = raw_slot;
            if (track) {
                const i64 dst = p.track_indices[t];
                if (dst >= 0 && dst < p.conv_slots) {
                    h.track_slot = dst;
                } else if (counter_lane) {
                    count_bad_index(p.bad_index_count);
                }
            }
        }
    }
    return h;
}

// Thread layout of one token (all counts are multiples of 32, so every warp serves one token and
// one role: q warps, then k/v warps; shuffles never cross roles and need no partial masks).
// QV = q vectors per q thread: the largest of 4, 2, 1 that divides HQ and leaves a whole number of
// warps of q threads (else the largest dividing HQ, padded). Thread i of a token's q threads owns
// channel (i % HEAD_LANES)*8 of heads i / HEAD_LANES + j * HQ/QV, j < QV: QV independent 16-byte
// loads in flight per q thread, and each aligned group of HEAD_LANES lanes still covers whole heads.
template <int HD, int HQ, int HKV>
struct TokenLayout {
    static constexpr int Q_VECS = HQ * HD / 8;
    static constexpr int KV_VECS = HKV * HD / 8;
    static constexpr bool FITS4 = HQ % 4 == 0 && (Q_VECS / 4) % 32 == 0;
    static constexpr bool FITS2 = HQ % 2 == 0 && (Q_VECS / 2) % 32 == 0;
    static constexpr int QV = FITS4 ? 4 : (FITS2 ? 2 : (HQ % 4 == 0 ? 4 : (HQ % 2 == 0 ? 2 : 1)));
    static constexpr int Q_THREADS = ((Q_VECS / QV + 31) / 32) * 32;      // q threads per token (padded)
    static constexpr int KV_THREADS = ((2 * KV_VECS + 31) / 32) * 32;     // k then v threads per token (padded)
    static constexpr int TOKEN_THREADS = Q_THREADS + KV_THREADS;
};

// q role: RMSNorm (+ tau) of QV head vectors, then bf16 or MXFP8 output. Called by whole warps;
// inactive lanes (padding, or past the last token) run the shuffles only.
template <int HD, int HQ, int STORE, int Q_OFF>
__device__ __forceinline__ void prologue_q_lane(const PrologueParams& p, bool active, int t, int q_thread) {
    constexpr int QV = TokenLayout<HD, HQ, 1>::QV;
    constexpr int Q_WORK = TokenLayout<HD, HQ, 1>::Q_VECS / QV;   // q threads with work (rest: padding)
    constexpr int HEAD_LANES = HD / 8;
    constexpr int HEAD_STRIDE = HQ / QV;                         // heads between a thread's vectors
    constexpr int DQ = HQ * HD;
    if (q_thread >= Q_WORK) active = false;
    const int head_group = q_thread / HEAD_LANES;
    const int head_ch = (q_thread % HEAD_LANES) * 8;             // channel within the head
    const bf16_t* const x_base = p.qkvr + (i64)t * p.qkvr_row_stride + Q_OFF + head_group * HD + head_ch;

    Bf16x8 x[QV];
    Bf16x8 gamma = zero_bf16x8();
    float tau = 1.0f;
    if (active) {
#pragma unroll
        for (int j = 0; j < QV; ++j) x[j] = load_bf16x8(x_base + j * HEAD_STRIDE * HD);
        gamma = load_bf16x8(p.q_gamma + head_ch);
        if (p.tau != nullptr) tau = p.tau[t];
    } else {
#pragma unroll
        for (int j = 0; j < QV; ++j) x[j] = zero_bf16x8();
    }

    float sum_sq[QV];
#pragma unroll
    for (int j = 0; j < QV; ++j) {
        sum_sq[j] = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const float v = bf16x8_channel(x[j], c);
            sum_sq[j] = fmaf(v, v, sum_sq[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < QV; ++j) sum_sq[j] = group_sum<HEAD_LANES>(sum_sq[j]);
    float inv_rms[QV];
    inverse_rms_n<HD, QV>(sum_sq, p.eps, inv_rms);

    // All QV vectors are normalised first and encoded together below, so that their shuffles and
    // dependent chains overlap instead of running one vector after the other.
    float out[QV][8];
    Bf16x8 packed[QV];
#pragma unroll
    for (int j = 0; j < QV; ++j) {
#pragma unroll
        for (int c = 0; c < 8; ++c) out[j][c] = bf16x8_channel(x[j], c) * inv_rms[j] * bf16x8_channel(gamma, c);
        if (p.tau != nullptr) {
            round_bf16x8(out[j]);
#pragma unroll
            for (int c = 0; c < 8; ++c) out[j][c] = out[j][c] * tau;
        }
        // The last rounding: packed for the bf16 store, in place for the MXFP8 encoder.
        if (STORE != kStoreMxfp8) {
            packed[j] = pack_bf16x8(out[j]);
        } else {
            round_bf16x8(out[j]);
        }
    }
    if (STORE != kStoreMxfp8) {
        if (active) {
#pragma unroll
            for (int j = 0; j < QV; ++j) {
                const int head = head_group + j * HEAD_STRIDE;
                store_bf16x8(static_cast<bf16_t*>(p.q_out) + (i64)t * DQ + head * HD + head_ch, packed[j]);  // q_out [T, DQ]
            }
        }
    } else {
        // One 32-channel MXFP8 block = 4 lanes: block max over the 4 lanes, then each block's first
        // lane writes the block's scale byte (4 adjacent bytes per head, one sector per warp store).
        float amax[QV];
#pragma unroll
        for (int j = 0; j < QV; ++j) amax[j] = lane_amax8(out[j]);
#pragma unroll
        for (int m = 1; m < 4; m <<= 1) {
#pragma unroll
            for (int j = 0; j < QV; ++j) amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], m));
        }
        if (active) {
#pragma unroll
            for (int j = 0; j < QV; ++j) {
                const int head = head_group + j * HEAD_STRIDE;
                const u32 scale_byte = mxfp8_scale_byte_nodiv(amax[j]);
                *reinterpret_cast<E4m3x8*>(static_cast<u8*>(p.q_out) + (i64)t * DQ + head * HD + head_ch) = mxfp8_encode8(out[j], scale_byte);
                if (head_ch % 32 == 0) {
                    p.q_scale[((i64)t * HQ + head) * (HD / 32) + head_ch / 32] = (u8)scale_byte;  // q_scale [T, HQ, HD/32]
                }
            }
        }
    }
}

// k or v role: depthwise conv over (history, current), SiLU/residual, k RMSNorm, outputs, KV
// store, verify windows / decode state update. Called by whole warps; inactive lanes (padding, or
// past the last token) run the shuffles only.
template <int VARIANT, int HD, int HKV, int W, bool SILU, bool RESIDUAL, int STORE, int PAGE, int K_OFF, int V_OFF>
__device__ __forceinline__ void prologue_kv_lane(const PrologueParams& p, bool active, int t, int kv_thread) {
    constexpr int DKV = HKV * HD;
    constexpr int KV_VECS = DKV / 8;
    constexpr int HEAD_LANES = HD / 8;
    constexpr int K = W - 1;                                      // history taps
    if (kv_thread >= 2 * KV_VECS) active = false;                // padding lanes
    const bool is_v = kv_thread >= KV_VECS;
    const int ch = (is_v ? kv_thread - KV_VECS : kv_thread) * 8;  // channel in [0, DKV)
    const int head_ch = ch % HD;
    const bool counter_lane = active && kv_thread == 0;           // counts this token's bad indices
    const int role_off = is_v ? V_OFF : K_OFF;

    float value[8];          // bf16-rounded conv output y
    float sum_sq = 0.0f;     // k: per-lane sum of squares of y
    Bf16x8 x_vec = zero_bf16x8();
    Bf16x8 gamma = zero_bf16x8();
    Bf16x8 shifted_window[K > 1 ? K - 1 : 1];  // verify: raw inputs t-K+1 .. t-1; decode: gated history 1..K-1
    ConvHistory hist;
    hist.window_slot = -1;
    hist.track_slot = -1;
    i64 store_slot = -1;
#pragma unroll
    for (int c = 0; c < 8; ++c) value[c] = 0.0f;

    if (active) {
        x_vec = load_bf16x8(p.qkvr + (i64)t * p.qkvr_row_stride + role_off + ch);
        if (!is_v) gamma = load_bf16x8(p.k_gamma + head_ch);
        const bf16_t* const weight = (is_v ? p.v_weight : p.k_weight) + (i64)ch * W;  // [DKV, W]
        Bf16x8 taps_w[W];  // weights of channels ch..ch+7, W taps each: element c*W + i
#pragma unroll
        for (int n = 0; n < W; ++n) taps_w[n] = load_bf16x8(weight + 8 * n);
        i64 loc = -1;
        if (STORE != kStoreNone) loc = p.loc[t];
        // Verify and extend: the K qkvr rows before t are read now, before the sequence's
        // metadata arrives; once it has, the rows that lie before the sequence's first token are
        // replaced by conv-cache rows. Most tokens take all K taps from qkvr, so their history
        // no longer waits for the metadata (extend: one dependent round trip less, two not three).
        Bf16x8 row_before[K];
#pragma unroll
        for (int i = 0; i < K; ++i) {
            const int u = t - K + i;
            row_before[i] = (VARIANT != kVariantDecode && u >= 0) ? load_bf16x8(p.qkvr + (i64)u * p.qkvr_row_stride + role_off + ch)
                                                                   : zero_bf16x8();
        }

        hist = resolve_history<VARIANT>(p, t, counter_lane);
        if (STORE != kStoreNone) {
            if (loc >= p.kv_slots) {
                if (counter_lane) count_bad_index(p.bad_index_count);
            } else if (hist.may_store) {
                store_slot = loc;  // negative: do not store (valid input)
            }
        }

        const bf16_t* const cache = is_v ? p.v_cache : p.k_cache;  // [conv_slots, K, DKV]
        const int pos = t - hist.first_token;                        // position in its sequence
        Bf16x8 tap_raw[K];
        bool tap_from_cache[K];
#pragma unroll
        for (int i = 0; i < K; ++i) {
            const int u = t - K + i;  // input time of tap i
            tap_from_cache[i] = u < hist.first_token;
            if (!tap_from_cache[i]) {
                tap_raw[i] = (VARIANT != kVariantDecode) ? row_before[i]  // u >= first_token >= 0
                                                         : load_bf16x8(p.qkvr + (i64)u * p.qkvr_row_stride + role_off + ch);
            } else if (hist.read_slot >= 0 && (hist.gate || hist.load_ungated)) {
                tap_raw[i] = load_bf16x8(cache + (hist.read_slot * K + (pos + i)) * (i64)DKV + ch);
            } else {
                tap_raw[i] = zero_bf16x8();
            }
        }
        Bf16x8 tap_used[K];  // history after the cache gate
#pragma unroll
        for (int i = 0; i < K; ++i) tap_used[i] = (tap_from_cache[i] && !hist.gate) ? zero_bf16x8() : tap_raw[i];
#pragma unroll
        for (int w = 0; w + 1 < K; ++w) {
            shifted_window[w] = (VARIANT == kVariantVerify) ? tap_raw[w + 1] : tap_used[w + 1];
        }

#pragma unroll
        for (int c = 0; c < 8; ++c) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < K; ++i) {
                acc = fmaf(bf16x8_channel(tap_used[i], c), bf16x8_channel(taps_w[(c * W + i) / 8], (c * W + i) % 8), acc);
            }
            const float x = bf16x8_channel(x_vec, c);
            acc = fmaf(x, bf16x8_channel(taps_w[(c * W + K) / 8], (c * W + K) % 8), acc);
            if (SILU) acc = acc / (1.0f + expf(-acc));
            if (RESIDUAL) acc = acc + x;
            value[c] = acc;
        }
        round_bf16x8(value);
#pragma unroll
        for (int c = 0; c < 8; ++c) sum_sq = fmaf(value[c], value[c], sum_sq);
    }

    // k RMSNorm over the head (v lanes take part in the shuffles and ignore the result).
    float sum_sq_head[1] = {group_sum<HEAD_LANES>(sum_sq)};
    float out[8];
    Bf16x8 out_vec;
    if (!is_v) {
        float inv_rms[1];
        inverse_rms_n<HD, 1>(sum_sq_head, p.eps, inv_rms);
#pragma unroll
        for (int c = 0; c < 8; ++c) out[c] = value[c] * inv_rms[0] * bf16x8_channel(gamma, c);
        if (STORE == kStoreMxfp8) round_bf16x8(out);  // the encoder reads the rounded values
        out_vec = pack_bf16x8(out);
    } else {
#pragma unroll
        for (int c = 0; c < 8; ++c) out[c] = value[c];
        out_vec = pack_bf16x8(out);  // exact: value is bf16-rounded
    }

    if (active) {
        store_bf16x8((is_v ? p.v_out : p.k_out) + (i64)t * DKV + ch, out_vec);  // k_out/v_out [T, DKV]
        if (STORE == kStoreBf16 && store_slot >= 0) {
            store_bf16x8(static_cast<bf16_t*>(is_v ? p.v_buf : p.k_buf) + store_slot * DKV + ch, out_vec);  // [S, DKV]
        }
    }
    if (STORE == kStoreMxfp8) {
        // Block max over the block's 4 lanes; each block's first lane writes its scale byte
        // (4 adjacent bytes per head in the interleaved plane).
        float amax = lane_amax8(out);
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        if (active && store_slot >= 0) {
            const u32 scale_byte = mxfp8_scale_byte_nodiv(amax);
            *reinterpret_cast<E4m3x8*>(static_cast<u8*>(is_v ? p.v_buf : p.k_buf) + store_slot * DKV + ch) = mxfp8_encode8(out, scale_byte);
            if (head_ch % 32 == 0) {
                u8* const planes = is_v ? p.sfv : p.sfk;  // [S/PAGE, HKV, 32, PAGE/32, 4]
                planes[interleaved_scale_offset<PAGE, HKV>(store_slot, ch / HD) + head_ch / 32] = (u8)scale_byte;
            }
        }
    }

    if (!active) return;
    if (VARIANT == kVariantVerify && hist.window_slot >= 0) {
        // k_inter/v_inter [inter_capacity, q, K, DKV]: conv state after consuming draft token tq.
        const int tq = t - hist.first_token;
        bf16_t* const inter = (is_v ? p.v_inter : p.k_inter) + ((hist.window_slot * p.draft_tokens + tq) * (i64)K) * DKV + ch;
#pragma unroll
        for (int w = 0; w + 1 < K; ++w) store_bf16x8(inter + (i64)w * DKV, shifted_window[w]);
        store_bf16x8(inter + (i64)(K - 1) * DKV, x_vec);
    }
    if (VARIANT == kVariantDecode && hist.window_slot >= 0) {
        // In-place shift of the conv state [conv_slots, K, DKV]; this thread read the same rows above.
        bf16_t* const cache = is_v ? p.v_cache : p.k_cache;
        bf16_t* const dst = cache + hist.window_slot * K * (i64)DKV + ch;
#pragma unroll
        for (int w = 0; w + 1 < K; ++w) store_bf16x8(dst + (i64)w * DKV, shifted_window[w]);
        store_bf16x8(dst + (i64)(K - 1) * DKV, x_vec);
        if (hist.track_slot >= 0) {
            bf16_t* const track = cache + hist.track_slot * K * (i64)DKV + ch;
#pragma unroll
            for (int w = 0; w + 1 < K; ++w) store_bf16x8(track + (i64)w * DKV, shifted_window[w]);
            store_bf16x8(track + (i64)(K - 1) * DKV, x_vec);
        }
    }
}

template <int VARIANT, int HD, int HQ, int HKV, int W, bool SILU, bool RESIDUAL, int STORE, int PAGE,
          int Q_OFF, int K_OFF, int V_OFF>
__global__ void __launch_bounds__(kPrologueThreads)
    inkling_prologue_kernel(const PrologueParams p) {
    static_assert(VARIANT >= kVariantVerify && VARIANT <= kVariantDecode, "VARIANT: 0 verify, 1 extend, 2 decode");
    static_assert(HD == 64 || HD == 128 || HD == 256, "head dim must be 64, 128 or 256");
    static_assert(HQ >= 1 && HKV >= 1, "need at least one q and one kv head");
    static_assert(HQ * HD <= 16384 && HKV * HD <= 16384, "DQ and DKV are limited to 16384");
    static_assert(W >= 2, "conv width W >= 2");
    static_assert(STORE >= kStoreNone && STORE <= kStoreMxfp8, "STORE: 0 none, 1 bf16, 2 MXFP8");
    static_assert(STORE != kStoreMxfp8 || HD == 128, "MXFP8 store needs head dim 128");
    static_assert(STORE != kStoreMxfp8 || (PAGE > 0 && PAGE % 32 == 0), "MXFP8 page size must be a multiple of 32");
    static_assert(Q_OFF % 8 == 0 && K_OFF % 8 == 0 && V_OFF % 8 == 0, "qkvr offsets must be multiples of 8");

    using Layout = TokenLayout<HD, HQ, HKV>;
    constexpr int TOKEN_THREADS = Layout::TOKEN_THREADS;  // threads per token, a multiple of 32

    // Flat thread index -> (token, thread within token); 32-bit division when it fits.
    const u64 item = (u64)blockIdx.x * kPrologueThreads + threadIdx.x;
    const u64 num_items = (u64)(p.num_tokens > 0 ? p.num_tokens : 0) * TOKEN_THREADS;
    const bool active = item < num_items;
    u32 t, within;
    if (num_items <= 0xffffffffull) {
        const u32 item32 = (u32)item;
        t = item32 / TOKEN_THREADS;
        within = item32 - t * TOKEN_THREADS;
    } else {
        t = (u32)(item / TOKEN_THREADS);
        within = (u32)(item - (u64)t * TOKEN_THREADS);
    }
    if (!active) t = 0;

    grid_dependency_wait();

    if (within < (u32)Layout::Q_THREADS) {  // warp-uniform
        prologue_q_lane<HD, HQ, STORE, Q_OFF>(p, active, (int)t, (int)within);
    } else {
        prologue_kv_lane<VARIANT, HD, HKV, W, SILU, RESIDUAL, STORE, PAGE, K_OFF, V_OFF>(p, active, (int)t, (int)within - Layout::Q_THREADS);
    }

    grid_dependents_launch();
}

// Extend trailing conv-state update (docs/kernels/prologue.md §1.5 "Extend trailing update" + tracking). One thread per
// (sequence, role k/v, 8-channel vector): item = (b * 2 + role) * KV_VECS + vector.
template <int HD, int HKV, int W, int K_OFF, int V_OFF>
__global__ void __launch_bounds__(kConvUpdateThreads)
    inkling_conv_state_update_kernel(const ConvStateUpdateParams p) {
    static_assert(HD == 64 || HD == 128 || HD == 256, "head dim must be 64, 128 or 256");
    static_assert(HKV >= 1 && HKV * HD <= 16384, "DKV is limited to 16384");
    static_assert(W >= 2, "conv width W >= 2");
    static_assert(K_OFF % 8 == 0 && V_OFF % 8 == 0, "qkvr offsets must be multiples of 8");
    constexpr int DKV = HKV * HD;
    constexpr int KV_VECS = DKV / 8;
    constexpr int K = W - 1;

    const u64 item = (u64)blockIdx.x * kConvUpdateThreads + threadIdx.x;
    const u64 num_items = (u64)(p.num_seqs > 0 ? p.num_seqs : 0) * (2 * KV_VECS);
    if (item >= num_items) {
        grid_dependents_launch();
        return;
    }
    const int b = (int)(item / (2 * KV_VECS));
    const int within = (int)(item % (2 * KV_VECS));
    const bool is_v = within >= KV_VECS;
    const int ch = (within % KV_VECS) * 8;
    const bool counter_lane = within == 0;
    const int role_off = is_v ? V_OFF : K_OFF;
    bf16_t* const cache = is_v ? p.v_cache : p.k_cache;  // [conv_slots, K, DKV]

    grid_dependency_wait();

    if (p.do_cache_update != 0) {
        const i32 raw_slot = p.cache_indices[b];
        if (raw_slot != -1) {
            const i64 start = p.cu_seqlens[b];
            const i64 end = p.cu_seqlens[b + 1];
            if (raw_slot < 0 || raw_slot >= p.conv_slots) {
                if (counter_lane) count_bad_index(p.bad_index_count);
            } else if (start < 0 || end > p.num_tokens || start > end) {
                if (counter_lane) count_bad_index(p.bad_index_count);
            } else if (end > start) {
                const i64 qlen = end - start;
                const bool has_init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
                bf16_t* const state = cache + (i64)raw_slot * K * DKV + ch;
                Bf16x8 next[K];
#pragma unroll
                for (int w = 0; w < K; ++w) {
                    if (qlen >= K - w) {
                        next[w] = load_bf16x8(p.qkvr + (end - K + w) * p.qkvr_row_stride + role_off + ch);
                    } else if (has_init) {
                        next[w] = load_bf16x8(state + (w + qlen) * DKV);  // old row, read before any write
                    } else {
                        next[w] = zero_bf16x8();
                    }
                }
#pragma unroll
                for (int w = 0; w < K; ++w) store_bf16x8(state + (i64)w * DKV, next[w]);
            }
        }
    }

    if (p.track_mask != nullptr && p.track_mask[b] != 0 && p.track_rows != nullptr && p.track_dst != nullptr) {
        const i64 dst = p.track_dst[b];
        bool rows_ok = true;
        i64 rows[K];
#pragma unroll
        for (int w = 0; w < K; ++w) {
            rows[w] = p.track_rows[(i64)b * K + w];  // [B, K]
            if (rows[w] < 0 || rows[w] >= p.num_tokens) {
                rows_ok = false;
                if (counter_lane) count_bad_index(p.bad_index_count);
            }
        }
        if (dst < 0 || dst >= p.conv_slots) {
            if (counter_lane) count_bad_index(p.bad_index_count);
        } else if (rows_ok) {
            Bf16x8 window[K];
#pragma unroll
            for (int w = 0; w < K; ++w) window[w] = load_bf16x8(p.qkvr + rows[w] * p.qkvr_row_stride + role_off + ch);
            bf16_t* const track = cache + dst * K * DKV + ch;
#pragma unroll
            for (int w = 0; w < K; ++w) store_bf16x8(track + (i64)w * DKV, window[w]);
        }
    }

    grid_dependents_launch();
}
