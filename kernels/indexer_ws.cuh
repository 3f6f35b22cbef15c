// Lightning indexer: the warp-specialised CTA both forms launch (docs/kernels/indexer.md).
// Compiled after common.cuh, sparse_mla_common.cuh and indexer_common.cuh.
//
// A CTA takes 2 WGS query tokens and streams the union of their ranges once: the first warp of
// a producer warpgroup copies each 64-key block and its scales into a ring of stages (the keys
// by one TMA copy or by cp.async, as the key source says; the scales by cp.async; completing
// on the stage's full barrier), and WGS consumer warpgroups, each with two of the
// tokens (its own Q tile, candidates and counters), run the product, sums and admissions on
// every block and release the stage. A warpgroup agrees on a cut with one barrier every second
// block (`bar.red.or` of "my admission could overflow the next two blocks"), and its collective
// steps use its own named barrier, so no warpgroup waits for another (but at the end of the
// first pass, where a sample misled a token: below). The protocol is
// model-checked by bench/harness/indexer_protocol.py (one to three consumer warpgroups, the
// end-of-pass barrier and the second pass included).
//
// The prefill launches two consumer warpgroups over rows of keys at 64 heads (four tokens a
// CTA, one CTA an SM) and three at 32 (six tokens: a warpgroup's product is half as large there,
// and twelve consumer warps an SM hide its per-block chain better than eight); the paged form
// one over a sequence's pages (its two tokens, two CTAs an SM).
//
// The key source `Keys` says where the CTA's tokens and keys are:
//   static constexpr bool kTma   whether a block's key rows are one TMA copy (a box of 64 rows
//                                from tensor_map(), in the 128-byte swizzle) or cp.async copies
//                                (from block(), into the canonical layout)
//   static constexpr int kTmaRank   the map's rank: 2 (box (0, y)) or 3 (box (0, y, z))
//   static constexpr bool kBulkScales   whether a block's 64 scales are contiguous and 16-byte
//                                aligned (one bulk copy by the producer's lane 0, with kTma)
//                                or 4-byte cp.async copies by its 32 lanes
//   static constexpr int kSampleStride   F: with F > 1 every F-th block arrives first and the
//                                selection speculates from it (below); 1: ascending order
//   const void* tensor_map()     the tensor map of the key rows (kTma only)
//   bool box(first, y, z)        the box of the block at `first` (kTma only); false: none
//   int row(g)                   query row of the CTA's token g (0 .. 2 WGS - 1), -1 for none
//   void range(g, a, b)          its valid positions [a, b), clamped (only for row(g) >= 0)
//   bool block(first, kb, sb)    where the 64 keys and scales of the block at position `first`
//                                (a multiple of 64 from the CTA's first position) lie; false:
//                                none (never admitted: zero-filled by cp.async sources, not
//                                copied at all by TMA ones, its stage's bytes then stale)
//   bool present(s)              whether position s has a key
//   const u8* base()             a readable address (the source of zero-filled copies)
//   const u8* q(); const float* weights(); i32* indices()   the call's buffers, by row
//   bool write_partial<TOPK>(t, keys, pos, n, grp)   a split's list written instead of the row
//   i32 index_of(s)              the index written for position s

namespace indexer {
// Key blocks in flight: six with two or three consumer warpgroups (one CTA an SM), five with one
// (two CTAs an SM share the shared memory).
__host__ __device__ constexpr int ws_stages(int wgs) { return wgs >= 2 ? 6 : 5; }
// setmaxnreg: the launch allocates 65536 registers over the SM's threads (three warpgroups and
// a producer: 128 a thread; two and a producer: 168; one and a producer, two CTAs: 128); the
// producer warpgroup gives back all but 56 (32 beside three consumer warpgroups, whose 160
// then hold the head weights) and the consumers take the rest.
constexpr u32 kWsProducerRegs = 56;
__host__ __device__ constexpr u32 ws_producer_regs(int wgs) { return wgs == 3 ? 32 : kWsProducerRegs; }
__host__ __device__ constexpr u32 ws_consumer_regs(int wgs) { return wgs == 3 ? 160 : wgs == 2 ? 224 : 200; }
static_assert(3 * kThreads * 160 + kThreads * 32 <= 4 * kThreads * 128,
              "three consumer warpgroups: setmaxnreg within what the launch allocated");
static_assert(2 * kThreads * 224 + kThreads * kWsProducerRegs <= 3 * kThreads * 168,
              "two consumer warpgroups: setmaxnreg within what the launch allocated");
static_assert(2 * (kThreads * 200 + kThreads * kWsProducerRegs) <= 65536,
              "one consumer warpgroup, two CTAs an SM: setmaxnreg within the register file");

// Shared memory of a CTA, in bytes: the Q tiles of the consumer warpgroups, the key ring, the
// head weights, a candidate buffer a token, the ring's full and empty barriers, counters and
// scratch. Mirrored by `prefill_indexer_smem_bytes` (two or three warpgroups) and
// `indexer_smem_bytes` (one) in src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int ws_smem_bytes(int heads, int topk, int wgs) {
    return 2 * wgs * heads * kD + ws_stages(wgs) * kStageBytes + 2 * wgs * heads * 4 +
           2 * wgs * cap_for(topk) * 8 + 2 * ws_stages(wgs) * 8 + (wgs >= 2 ? 256 : 128);
}
}  // namespace indexer

// LOGITS_ONLY (the benchmark's "logits alone", never a library launch): the same CTA without the
// selection: each thread keeps the largest logit it computes for its token and writes its bits
// to indices[t, thread] at the end, so the product and the sums stay; no admission, vote, cut
// or sort.
template <int H_IDX, int TOPK, int WGS, bool LOGITS_ONLY, class Keys>
__device__ __forceinline__ void indexer_ws_body(const Keys& keys) {
    using namespace indexer;
    constexpr int N = kTokens * H_IDX;  // a warpgroup's wgmma N: the head rows of its tokens
    constexpr int CAP = cap_for(TOPK);
    constexpr int S = ws_stages(WGS);
    constexpr int TOKENS = WGS * kTokens;  // query tokens of the CTA
    static_assert(WGS >= 1 && WGS <= 3, "one to three consumer warpgroups");
    static_assert(H_IDX == 32 || H_IDX == 64, "32 or 64 index heads");
    static_assert(TOPK % 128 == 0 && TOPK <= 2048, "TOPK a multiple of 128 up to 2048");
    static_assert(CAP - 2 * kBlock >= TOPK, "a cut leaves room for two blocks");
    static_assert(kBlock == 64 && kBlockBytes == 8192 && kStageBytes == kBlockBytes + kBlock * 4,
                  "a stage is one box of 64 rows of 128 bytes (the host's tensor map) and its scales");
    static_assert((WGS * N * kD) % 1024 == 0 && kBlockBytes % 1024 == 0,
                  "every key stage starts 1024-byte aligned (the 128-byte swizzle)");

    extern __shared__ __align__(1024) u8 smem[];
    u8* sq = smem;                                             // [WGS][N rows, 128] canonical
    u8* sk = sq + WGS * N * kD;            // [S][64 rows, 128]: 128-byte swizzle (kTma) or canonical
    float* ss = (float*)(sk + S * kBlockBytes);                // [S][64 scales]
    float* sw = ss + S * kBlock;                               // [TOKENS, H_IDX]
    u32* cand = (u32*)(sw + WGS * N);                         // [TOKENS][CAP | CAP]
    u64* bars = (u64*)(cand + TOKENS * 2 * CAP);       // full [S], empty [S], decided
    int* count = (int*)(bars + 2 * S + 1);                     // [TOKENS]
    u32* tau = (u32*)(count + TOKENS);                 // [TOKENS]
    i32* tie = (i32*)(tau + TOKENS);                   // [TOKENS]
    int* srank = (int*)(tie + TOKENS);                 // [TOKENS] sample ranks (0: none)
    int* red_all = srank + TOKENS;                     // [WGS][2][4] scratch
    int* stage_first = red_all + WGS * 8;              // [S]: the first position of a stage's block
    int* second_pass = stage_first + S;                // the consumers' decision, for the producer
    static_assert(ws_smem_bytes(H_IDX, TOPK, WGS) >=
                      WGS * N * kD + S * kStageBytes + WGS * N * 4 + TOKENS * CAP * 8 +
                          (2 * S + 1) * 8 + (4 * TOKENS + WGS * 8 + S + 1) * 4,
                  "shared-memory formula covers the layout");
    auto full_bar = [&](int s) { return smem_addr(bars + s); };
    auto empty_bar = [&](int s) { return smem_addr(bars + S + s); };
    // With a sample: the consumers' decision on a second pass is in `second_pass`.
    const u32 decided_bar = smem_addr(bars + 2 * S);

    const int tid = threadIdx.x;
    const int wg = tid / kThreads;  // 0 .. WGS - 1: consumers; WGS: the producer (its first warp)

    // The CTA's key rows: the union of its tokens' clamped ranges (every thread computes it).
    int lo = 0x7fffffff, hi = 0;
#pragma unroll
    for (int g = 0; g < TOKENS; ++g) {
        if (keys.row(g) >= 0) {
            int a, b;
            keys.range(g, a, b);
            if (b > a) {
                lo = min(lo, a);
                hi = max(hi, b);
            }
        }
    }
    const int blocks = hi > lo ? (hi - lo + kBlock - 1) / kBlock : 0;
    // The order blocks arrive in. With a sample stride F > 1 (the prefill's selection): every
    // F-th block first (the sample: `sampled` blocks), then the others in ascending order; block
    // numbers `blocks` .. 2 blocks - 1 are a second pass in ascending order, streamed only when
    // a token's sample misled it (below). The block at number b starts at position
    // lo + 64 block_at(b). The logits alone (LOGITS_ONLY, the benchmark's baseline) stream in
    // the same order without the selection, so both time the same memory traffic.
    constexpr int F = Keys::kSampleStride;
    constexpr bool kSample = F > 1 && !LOGITS_ONLY;
    const int strided = F > 1 ? (blocks + F - 1) / F : 0;  // blocks 0, F, 2F, ...
    auto block_at = [&](int b) {
        if (b >= blocks) return b - blocks;
        if (F == 1) return b;
        if (b < strided) return b * F;
        const int j = b - strided;
        return j / (F - 1) * F + j % (F - 1) + 1;
    };
    // The sample: the first `sampled` blocks of that order, the strided ones and (to end on a
    // block number that votes: every second one, and the last) block 1 when their count is odd.
    const int sampled = min(blocks, (strided + 1) & ~1);
    // With a sample, the consumer warpgroups meet on this barrier when the first pass ends, to
    // agree on a second (the OR of their misled tokens); one thread then writes the decision to
    // `second_pass` and arrives on `decided_bar`, which the producer warp waits on. (The producer
    // does not join the barrier: threads meeting on one named barrier from different
    // instructions fail synccheck as divergent, although the hardware allows it.)
    constexpr int kEndBar = 1 + WGS;

    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            // The producer's lanes' copies and lane 0's arrival (after its TMA issue and its
            // write of the stage's first position), or lane 0 alone (every copy bulk).
            mbar_init(full_bar(s), Keys::kBulkScales ? 1 : 32 + 1);
            mbar_init(empty_bar(s), WGS * kThreads);  // every consumer thread
        }
        mbar_init(decided_bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();  // the last CTA-wide barrier: the roles part here

    if (wg == WGS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(ws_producer_regs(WGS)));
        if (tid >= WGS * kThreads + 32) return;
        // Producer warp: block b's 64 key rows and scales into stage b % S once the consumers
        // released its last use. (Only one warp: the producer runs ahead and waits on the empty
        // barriers, and more waiting warps took issue slots from the consumers.)
        //
        // The rows, with kTma: one TMA copy of the block's box (keys.box: (0, first) of the rows,
        // or (0, 0, page) of the pages) by lane 0, in the 128-byte swizzle the product reads
        // (rows past the keys arrive as zeros; rows past the union but inside the keys are
        // copied and never admitted; an absent block is not copied, and its stale stage bytes
        // only reach products of positions never admitted). Without: 16-byte cp.async copies
        // into the canonical layout, rows past the union or of an absent block zero-filled
        // without a read. Copy i: rows 8 (i / 2) .. + 7, channels 64 (i % 2) .. + 63; eight
        // lanes write the eight rows of one 16-channel column, 128 contiguous bytes of the
        // canonical layout (no bank conflict), and read 16 bytes of each row (a copy reads 16
        // whole sectors). Lane l's copy i reads row 8 (i / 2) + l % 8, channels 16 (l / 8 +
        // 4 (i % 2)): its source and destination offsets are the lane's own plus constants of i.
        //
        // The scales, with kBulkScales (a page's 64 scales, contiguous and 16-byte aligned): one
        // bulk copy by lane 0, which then issues every copy alone (the full barrier counts its
        // one arrival and the bytes). Without: a 4-byte cp.async a lane (k_scale need only be
        // 4-byte aligned), rows past the union zero-filled without a read; the full barrier
        // waits for the 32 lanes' copies (and the TMA's bytes).
        const int lane = tid & 31;
        // Lane 0 alone issues every copy; with a sample the other lanes skip every block (and
        // each waits for the consumers' decision at the end of the first pass).
        if (Keys::kBulkScales && !kSample && lane != 0) return;
        const int lane_src = (lane & 7) * kD + (lane >> 3) * 16;
        const u32 lane_dst = (lane >> 3) * 128 + (lane & 7) * 16;
        int total = blocks;  // 2 blocks once a second pass is asked for
        for (int b = 0;; ++b) {
            if (kSample && b == blocks) {
                // The end of the first pass: the consumers say whether a token needs a second
                // (written by one thread before its arrival, read after the wait: the mbarrier
                // orders them).
                mbar_wait(decided_bar, 0u);
                if (*(volatile int*)second_pass) total = 2 * blocks;
            }
            if (b >= total) break;
            if (Keys::kBulkScales && lane != 0) continue;  // (never waits: no parity to fall behind)
            const int st = b % S;
            if (b >= S) mbar_wait(empty_bar(st), (u32)(b / S - 1) & 1u);
            const int first = lo + block_at(b) * kBlock;
            if (lane == 0) stage_first[st] = first;  // published by the full barrier's arrival
            const u32 rows = smem_addr(sk + st * kBlockBytes);
            const u32 scales = smem_addr(ss + st * kBlock);
            const u8* kb;
            const float* sb;
            const bool present = keys.block(first, kb, sb);  // absent: zero-filled, not read
            const bool whole = present && first + kBlock <= hi;  // no row to check
            if constexpr (Keys::kTma) {
                if (lane == 0) {
                    int y, z;
                    // An absent block is not copied: its positions are never admitted.
                    if (keys.box(first, y, z)) {
                        mbar_expect_tx(full_bar(st), kBlockBytes + (Keys::kBulkScales ? kBlock * 4 : 0));
                        if constexpr (Keys::kTmaRank == 2) {
                            asm volatile(
                                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                                " [%0], [%1, {%2, %3}], [%4];" ::"r"(rows),
                                "l"((u64)keys.tensor_map()), "r"(0), "r"(y), "r"(full_bar(st))
                                : "memory");
                        } else {
                            asm volatile(
                                "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                                " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(rows),
                                "l"((u64)keys.tensor_map()), "r"(0), "r"(y), "r"(z), "r"(full_bar(st))
                                : "memory");
                        }
                        if constexpr (Keys::kBulkScales) bulk_copy_g2s(scales, sb, kBlock * 4, full_bar(st));
                    }
                    mbar_arrive(full_bar(st));
                }
                if constexpr (Keys::kBulkScales) continue;  // lane 0 copied the scales too
            } else {
                const u8* src = kb + lane_src;
                const u32 dst = rows + lane_dst;
                if (whole) {
#pragma unroll
                    for (int i = 0; i < kBlock * (kD / 16) / 32; ++i)
                        cp_async_16(dst + (i >> 1) * 1024 + (i & 1) * 512, src + (i >> 1) * 8 * kD + (i & 1) * 64, 16u);
                } else {
#pragma unroll
                    for (int i = 0; i < kBlock * (kD / 16) / 32; ++i) {
                        const bool valid = present && first + 8 * (i >> 1) + (lane & 7) < hi;
                        cp_async_16(dst + (i >> 1) * 1024 + (i & 1) * 512,
                                    valid ? (const void*)(src + (i >> 1) * 8 * kD + (i & 1) * 64) : keys.base(),
                                    valid ? 16u : 0u);
                    }
                }
                if (lane == 0) mbar_arrive(full_bar(st));  // releases stage_first[st]
            }
            if (whole) {
#pragma unroll
                for (int i = 0; i < kBlock / 32; ++i) {
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(scales + (lane + 32 * i) * 4),
                                 "l"(sb + lane + 32 * i)
                                 : "memory");
                }
            } else {
#pragma unroll
                for (int i = 0; i < kBlock / 32; ++i) {
                    const int r = lane + 32 * i;
                    const bool valid = present && first + r < hi;
                    const void* from = valid ? (const void*)(sb + r) : keys.base();
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(scales + r * 4),
                                 "l"(from), "r"(valid ? 4u : 0u)
                                 : "memory");
                }
            }
            mbar_arrive_cp_async(full_bar(st));
        }
        // The warp leaves only once its copies have landed (their arrivals are then done too).
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }

    // Consumer warpgroup `wg`: the CTA's tokens 2 wg + g (g = 0, 1).
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(ws_consumer_regs(WGS)));
    const Group grp{1 + wg, tid - wg * kThreads};
    const int gt = grp.tid, warp = gt >> 5, lane = gt & 31;
    u8* my_q = sq + wg * N * kD;
    float* my_w = sw + wg * N;
    u32* my_cand = cand + wg * kTokens * 2 * CAP;
    int* my_count = count + wg * kTokens;
    u32* my_tau = tau + wg * kTokens;
    i32* my_tie = tie + wg * kTokens;
    int* my_srank = srank + wg * kTokens;
    int* red = red_all + wg * 8;
    auto cand_key = [&](int g) { return my_cand + g * 2 * CAP; };
    auto cand_pos = [&](int g) { return (i32*)(my_cand + g * 2 * CAP + CAP); };
    static_assert(kTokens == 2, "row_of selects between two tokens");
    const int row0 = keys.row(2 * wg), row1 = keys.row(2 * wg + 1);
    auto row_of = [&](int g) { return g == 0 ? row0 : row1; };

    // The sample's rank for token g (0: the token does not speculate). With a sample, a token
    // whose range is longer than a buffer holds selects, while the sample blocks arrive, only
    // the `rank` best of its positions in them: about the share TOPK is of its range, plus a
    // margin of four standard deviations and 8. After the sample its threshold admits only
    // what beats that rank-th best, so the other blocks admit about TOPK keys instead of
    // TOPK (1 + ln(range / TOPK)), and a buffer is cut about once instead of every ~TOPK / 2
    // admissions. The sample was right when at least TOPK candidates remain at the end: the
    // threshold never fell and everything dropped lies below it, so the exact TOPK best are
    // among them. Otherwise (rare: scores that peak on the sample's blocks) the token is
    // selected again in a second pass without a sample. Uniform over the warpgroup.
    auto sample_rank = [&](int g) {
        if (!kSample || row_of(g) < 0) return 0;
        int a, b;
        keys.range(2 * wg + g, a, b);
        const int n = b - a;
        if (n <= CAP - 2 * kBlock) return 0;  // every key fits: no cut would run
        // Positions of [lo, x) in strided blocks (every F-th 64-position block from lo).
        auto in_strided = [&](int x) { return (x - lo) / (F * kBlock) * kBlock + min((x - lo) % (F * kBlock), kBlock); };
        // The token's positions in the sample: the strided blocks' and, when it joined, block 1's.
        const int m = in_strided(b) - in_strided(a) +
                      (sampled > strided ? max(0, min(b, lo + 2 * kBlock) - max(a, lo + kBlock)) : 0);
        const int r0 = (int)((i64)TOPK * m / n);
        const int rank = r0 + 4 * (int)sqrtf((float)r0) + 8;
        return 2 * rank <= m ? min(rank, TOPK) : 0;  // a sample that keeps half or more saves nothing
    };

    // Q rows r = g * H_IDX + h into the canonical layout (a missing token's rows are zeros),
    // the head weights, the counters.
    for (int e = gt; e < N * (kD / 16); e += kThreads) {
        const int r = e / (kD / 16), c = e % (kD / 16);
        const int t = row_of(r / H_IDX);
        const bool valid = t >= 0;
        const u8* src = keys.q() + (valid ? ((i64)t * H_IDX + r % H_IDX) * kD + c * 16 : (i64)0);
        cp_async_16(smem_addr(my_q) + (r >> 3) * 1024 + c * 128 + (r & 7) * 16, src, valid ? 16u : 0u);
    }
    for (int e = gt; e < N; e += kThreads) {
        const int t = row_of(e / H_IDX);
        my_w[e] = t >= 0 ? keys.weights()[(i64)t * H_IDX + e % H_IDX] : 0.f;
    }
    if (gt < kTokens) {
        my_count[gt] = 0;
        my_tau[gt] = 0u;  // below every order key: admit everything until the first cut
        my_tie[gt] = 0;
        my_srank[gt] = sample_rank(gt);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    grp.sync();  // the Q tile, weights and counters are in place for the whole warpgroup
    fence_proxy_async();

    // This lane admits row (warp*16 + lane/4 + 8*my_half) of a block for token my_g.
    const int quad = lane & 3;
    // The head weights of this thread's accumulator columns 8 j + 2 quad, + 1: with two or three
    // consumer warpgroups (224 or 160 registers) in registers for the whole loop (read
    // from shared memory on every block, they were a dependent load there); with one (200),
    // read on every block (in registers they spill).
    constexpr bool kWeightsInRegisters = WGS >= 2;
    float2 w_of[kWeightsInRegisters ? N / 8 : 1];
    if constexpr (kWeightsInRegisters) {
#pragma unroll
        for (int j = 0; j < N / 8; ++j) w_of[j] = *(const float2*)(my_w + 8 * j + 2 * quad);
    }
    // (`in_registers`: a compile-time constant at every call: false in the second pass.)
    auto weight = [&](bool in_registers, int j) {
        if (kWeightsInRegisters && in_registers) return w_of[kWeightsInRegisters ? j : 0];
        return *(const float2*)(my_w + 8 * j + 2 * quad);
    };
    const int my_g = quad >> 1, my_half = quad & 1;
    int my_lo = 0, my_hi = 0;
    if (row_of(my_g) >= 0) keys.range(2 * wg + my_g, my_lo, my_hi);
    int parity = 0;

    constexpr int kAcc = N / 2;
    // Block b's product into acc, once its stage is full (asynchronous: the caller waits).
    auto issue = [&](float (&acc)[kAcc], int b) {
        const int st = b % S;
        mbar_wait(full_bar(st), (u32)(b / S) & 1u);
        fence_proxy_async();  // the producer's copies, seen by the tensor cores
        issue_block_product<kAcc, Keys::kTma>(acc, smem_addr(sk + st * kBlockBytes), smem_addr(my_q));
    };
    // The tokens' thresholds, in registers: they change only in a cut, after which every thread
    // reads them again. A key is admitted when it beats (threshold, tie): key > threshold, or
    // key == threshold at a position below tie (read from shared memory: only an equal key reads
    // it, and equal keys are few but for logits of exactly 0, where every head sum is negative).
    u32 tau_reg[kTokens] = {0u, 0u};
    // Whether an admission since the last vote left a buffer without room for two blocks.
    bool pending_full = false;
    float best_logit = -pos_inf();  // LOGITS_ONLY: the largest logit this thread computed
    // Block number b's head sums from acc (its product is complete), its admissions and the
    // stage's release; with `vote` (every second block, the last, and the sample's last), the
    // warpgroup's vote on a cut and the cuts it calls for. A vote leaves room for two blocks:
    // CAP - 2 * kBlock >= TOPK.
    auto consume = [&](bool weights_in_registers, float (&acc)[kAcc], int b, bool vote) {
        fence_regs(acc);
        // Two independent partial sums a (token, row), over alternate column groups: half the
        // dependent chain.
        float part[kTokens][2][2];
#pragma unroll
        for (int g = 0; g < kTokens; ++g) part[g][0][0] = part[g][0][1] = part[g][1][0] = part[g][1][1] = 0.f;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
            const int g = (8 * j) / H_IDX;
            const float2 w = weight(weights_in_registers, j);
            // One fused multiply-add a head (a sum of products would cost a multiply and an add).
            part[g][0][j & 1] = fmaf(fmaxf(acc[4 * j + 0], 0.f), w.x, part[g][0][j & 1]);
            part[g][0][j & 1] = fmaf(fmaxf(acc[4 * j + 1], 0.f), w.y, part[g][0][j & 1]);
            part[g][1][j & 1] = fmaf(fmaxf(acc[4 * j + 2], 0.f), w.x, part[g][1][j & 1]);
            part[g][1][j & 1] = fmaf(fmaxf(acc[4 * j + 3], 0.f), w.y, part[g][1][j & 1]);
        }
        float sum[kTokens][2];
#pragma unroll
        for (int g = 0; g < kTokens; ++g) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sum[g][h] = part[g][h][0] + part[g][h][1];
                sum[g][h] += __shfl_xor_sync(0xffffffffu, sum[g][h], 1);
                sum[g][h] += __shfl_xor_sync(0xffffffffu, sum[g][h], 2);
            }
        }
        const float mine = quad == 0 ? sum[0][0] : quad == 1 ? sum[0][1] : quad == 2 ? sum[1][0] : sum[1][1];
        const int row = warp * 16 + (lane >> 2) + 8 * my_half;
        const int s = stage_first[b % S] + row;
        const float scale = ss[(b % S) * kBlock + row];
        mbar_arrive(empty_bar(b % S));  // the product and the scale are read: the stage is free
        if constexpr (LOGITS_ONLY) {
            if (s >= my_lo && s < my_hi) best_logit = fmaxf(best_logit, mine * scale);
            return;
        }
        if (s >= my_lo && s < my_hi && keys.present(s)) {
            const u32 key = order_key(mine * scale);
            const u32 tr = my_g ? tau_reg[1] : tau_reg[0];
            if (key > tr || (key == tr && s < my_tie[my_g])) {
                const int at = atomicAdd(my_count + my_g, 1);
                cand_key(my_g)[at] = key;
                cand_pos(my_g)[at] = s;
                pending_full = pending_full || at + 1 > CAP - 2 * kBlock;
            }
        }
        if (!vote) return;
        // The vote: one barrier every second block. Then (rare) every thread reads the same
        // counts, and the cuts end in a barrier before the next block's admissions. At the
        // sample's last block (a block that votes) every thread takes the cut path: a
        // speculating token is cut to its sample rank there.
        const bool sample_end = kSample && b == sampled - 1;  // uniform
        const bool cut_any = named_barrier_any(grp.bar, kThreads, pending_full || sample_end);
        pending_full = false;
        if (cut_any) {
#pragma unroll
            for (int g = 0; g < kTokens; ++g) {
                const int n = my_count[g];
                const int sr = kSample && b < sampled ? my_srank[g] : 0;
                const int rank = sr > 0 ? sr : TOPK;
                if (n > CAP - 2 * kBlock || (sample_end && sr > 0 && n > sr)) {
                    int kept;
                    i32 cut_tie;
                    // A sample's last cut keeps a class of equal keys whole where the buffer holds
                    // it with room for two blocks (else a row of equal keys would be redone).
                    const int keep_ties = sample_end && sr > 0 ? CAP - 2 * kBlock : 0;
                    const u32 cut = cut_to_topk<CAP, TOPK, true>(cand_key(g), cand_pos(g), n, rank, red, parity, grp,
                                                                 kept, cut_tie, keep_ties);
                    if (gt == 0) {
                        my_count[g] = kept;
                        // The threshold never falls (a loose cut's may lie below the last).
                        if (cut > my_tau[g] || (cut == my_tau[g] && cut_tie < my_tie[g])) {
                            my_tau[g] = cut;
                            my_tie[g] = cut_tie;
                        }
                    }
                    grp.sync();
                }
            }
            tau_reg[0] = my_tau[0];
            tau_reg[1] = my_tau[1];
            // Every thread has read the counts and thresholds before any admits again: a warp
            // may run on to the next block's admissions as soon as its own wgmma wait returns,
            // which does not wait for the other warps' reads here, and a count it raised could
            // send a late warp into a cut alone.
            grp.sync();
        }
    };

    // Block numbers [b0, b1) (the head weights from registers or from shared memory). The
    // product of block b + 1 runs under block b's sums (two
    // accumulator sets); no wgmma is in flight across the loop's back-edge (ptxas would
    // serialise every wgmma), so the loop waits for everything at the end of each pair, when
    // the product is long done.
    float acc0[kAcc], acc1[kAcc];
    auto stream = [&](bool weights_in_registers, int b0, int b1) {
        if (b1 > b0) issue(acc0, b0);
        int b = b0;
        for (; b + 2 < b1; b += 2) {
            issue(acc1, b + 1);
            wgmma_wait<1>();
            consume(weights_in_registers, acc0, b, false);
            issue(acc0, b + 2);
            wgmma_wait<1>();
            consume(weights_in_registers, acc1, b + 1, true);
            wgmma_wait<0>();
        }
        if (b + 1 < b1) {  // two blocks left
            issue(acc1, b + 1);
            wgmma_wait<1>();
            consume(weights_in_registers, acc0, b, false);
            wgmma_wait<0>();
            consume(weights_in_registers, acc1, b + 1, true);
        } else if (b < b1) {  // one block left
            wgmma_wait<0>();
            consume(weights_in_registers, acc0, b, true);
        }
        wgmma_wait<0>();
    };
    if constexpr (LOGITS_ONLY) {
        stream(kWeightsInRegisters, 0, blocks);
        const int t = row_of(my_g);
        if (t >= 0) keys.indices()[(i64)t * TOPK + gt] = __float_as_int(best_logit);  // TOPK >= 128
        return;
    }
    stream(kWeightsInRegisters, 0, blocks);

    // The final (exact) cut and the row, written in ascending position from a bitmap in the
    // token's buffer; a token whose sample misled it (fewer than TOPK candidates left) waits for
    // the second pass.
    auto finish = [&](int g) {
        const int t = row_of(g);
        int n = my_count[g];
        if (n > TOPK) {
            i32 unused;
            cut_to_topk<CAP, TOPK>(cand_key(g), cand_pos(g), n, TOPK, red, parity, grp, n, unused);
        }
        if (keys.template write_partial<TOPK>(t, cand_key(g), cand_pos(g), n, grp)) {
            grp.sync();  // the list is read before the next token's cut reuses the scratch
            return;
        }
        write_sorted_row<CAP, TOPK>(cand_key(g), cand_pos(g), n, lo, hi, red, parity, grp,
                                    keys.indices() + (i64)t * TOPK, [&](int s) { return keys.index_of(s); });
    };
    bool misled[kTokens];
#pragma unroll
    for (int g = 0; g < kTokens; ++g) misled[g] = kSample && my_srank[g] > 0 && my_count[g] < TOPK;  // uniform
#pragma unroll
    for (int g = 0; g < kTokens; ++g) {
        if (row_of(g) >= 0 && !misled[g]) finish(g);  // uniform over the warpgroup
    }
    if constexpr (kSample) {
        // A second pass? (the OR over the consumer warpgroups, uniform after it; the producer
        // warp learns it from one thread)
        const bool again = named_barrier_any(kEndBar, WGS * kThreads, gt == 0 && (misled[0] || misled[1]));
        if (tid == 0) {
            *second_pass = again ? 1 : 0;
            mbar_arrive(decided_bar);  // release: the flag before the arrival
        }
        if (!again) return;
        // The second pass: every block again in ascending order (every consumer warpgroup
        // releases every stage), admitting only for the misled tokens, without a sample; the
        // head weights read from shared memory (rare: its registers are not held for it).
        if (gt < kTokens && (gt == 0 ? misled[0] : misled[1])) {
            my_count[gt] = 0;
            my_tau[gt] = 0u;
            my_tie[gt] = 0;
            my_srank[gt] = 0;
        }
        if (!(my_g == 0 ? misled[0] : misled[1])) my_lo = my_hi = 0;
        tau_reg[0] = tau_reg[1] = 0u;
        pending_full = false;
        grp.sync();  // the counters are reset before any admission
        stream(false, blocks, 2 * blocks);
#pragma unroll
        for (int g = 0; g < kTokens; ++g) {
            if (misled[g]) finish(g);
        }
    }
}
