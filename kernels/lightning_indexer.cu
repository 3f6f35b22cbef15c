// Lightning indexer of DeepSeek Sparse Attention, prefill form (docs/kernels/indexer.md): for
// every query token t the TOPK key positions s in its valid range [key_start[t], key_end[t]) with
// the largest
//     logit[t, s] = k_scale[s] * sum_h w[t, h] * relu(q[t, h, :] . k[s, :])
// (e4m3 q and k, D = 128), ties to the lower position, the positions written in ascending order
// and -1 after them when fewer are valid. Logits and top-k are fused: no logit leaves the CTA.
//
// One CTA of one warpgroup (128 threads) takes two consecutive query tokens. Their 2 * H_IDX head
// rows of q are the wgmma B operand (N = 2 * H_IDX); the keys of their joint range (and their
// scales) stream through a cp.async ring of 64-key blocks, the A operand (M = 64 keys), so a
// thread's accumulators are 2 keys x (2 tokens x H_IDX/4 heads): the head sum is a thread's own
// adds and two quad shuffles. Two accumulator sets alternate: the next block's wgmma runs while
// the current block's sums and admissions are computed. Two CTAs share an SM.
//
// Top-k without a logit round trip: each token keeps a candidate buffer of
// CAP = TOPK + max(TOPK / 2, 128) (ordered key, position) pairs in shared memory. A logit is admitted when it beats the token's
// threshold (the TOPK-th best candidate so far); when a buffer could overflow on the next block
// it is cut back to exactly its TOPK best (bit-descent selection over the ordered keys, ties on
// the position) and the threshold rises. Keys arrive in ascending position, so after a cut a
// logit equal to the threshold can never win a tie: admission is strictly greater.
//
// Ordering: a logit maps to a u32 that orders like the float (-0 below +0); NaN counts as -inf.
// Compiled after common.cuh and sparse_mla_common.cuh (PTX helpers).

// Parameters of one launch. Mirrored by `IndexerParams` in src/ops/indexer/cuda.rs.
struct IndexerParams {
    const u8* q;            // [T, H_IDX, 128] e4m3
    const float* weights;   // [T, H_IDX]
    const i32* key_start;   // [T] first valid key row (clamped to [0, s_kv])
    const i32* key_end;     // [T] one past the last valid key row (clamped to [start, s_kv])
    const u8* k;            // [s_kv, 128] e4m3
    const float* k_scale;   // [s_kv]
    i32* indices;           // [T, TOPK] out: ascending positions, then -1
    i32 tokens;             // T
    i32 s_kv;
};

// Parameters of one paged launch (decode, MTP verify). Mirrored by `PagedIndexerParams` in
// src/ops/indexer/cuda.rs. A cache page is 64 keys of 128 bytes, then their 64 f32 scales.
struct PagedIndexerParams {
    const u8* q;              // [B * next_n, H_IDX, 128] e4m3
    const float* weights;     // [B * next_n, H_IDX]
    const i32* block_table;   // [B, max_pages] page of each 64 positions (outside [0, pages): none)
    const i32* seq_lens;      // [B] each sequence's length, its next_n new tokens included
    const u8* cache;          // [pages, 8448]
    i32* indices;             // [B * next_n, TOPK] out: cache slots by ascending position, then -1
    u32* part_keys;           // [B * next_n, splits, TOPK] out when split: a split's best order keys
    i32* part_pos;            // [B * next_n, splits, TOPK] out when split: their positions
    i32* part_count;          // [B * next_n, splits] out when split: how many a split holds
    i32 batch;                // B
    i32 next_n;               // query tokens a sequence, 1 ..= 4
    i32 max_pages;            // columns of the block table
    i32 pages;                // pages of the cache
    i32 blocks_per_split;     // 64-position blocks of a split (gridDim.y splits cover max_pages)
};

// Parameters of one merge of split lists. Mirrored by `IndexerMergeParams` in
// src/ops/indexer/cuda.rs. A CTA (row, group) merges lists [group * FAN, group * FAN + FAN) of
// its row into one list (or, at the last level, into the row of indices).
struct IndexerMergeParams {
    const u32* in_keys;       // [rows, lists, TOPK]
    const i32* in_pos;        // [rows, lists, TOPK]
    const i32* in_count;      // [rows, lists]
    u32* out_keys;            // [rows, ceil(lists / FAN), TOPK] (not the last level)
    i32* out_pos;             // [rows, ceil(lists / FAN), TOPK] (not the last level)
    i32* out_count;           // [rows, ceil(lists / FAN)] (not the last level)
    const i32* block_table;   // [B, max_pages] (the last level: positions to slots)
    i32* indices;             // [rows, TOPK] (the last level)
    i32 rows;                 // B * next_n
    i32 lists;                // lists a row holds
    i32 next_n;
    i32 max_pages;
    i32 last;                 // 1: write indices; 0: write merged lists
};

namespace indexer {

constexpr int kD = 128;             // channels of a head and of a key (bytes, e4m3)
constexpr int kThreads = 128;       // one warpgroup
constexpr int kTokens = 2;          // query tokens a CTA takes
constexpr int kBlock = 64;          // keys of one block (the wgmma M)
constexpr int kStages = 5;          // cp.async ring depth (blocks)
constexpr int kBlockBytes = kBlock * kD;
constexpr int kStageBytes = kBlockBytes + kBlock * 4;  // the keys and their scales

// Candidates a token holds: TOPK and room for at least half as many (and 128) more, so a cut
// comes after at least TOPK/2 - 64 admissions.
__host__ __device__ constexpr int cap_for(int topk) {
    return topk + (topk / 2 > 128 ? topk / 2 : 128);
}

// Shared memory of one CTA, in bytes, for H_IDX heads and TOPK: Q tile, key ring (keys and
// scales), head weights, a candidate buffer a token (CAP keys then CAP positions), counters and
// the reduction scratch. Mirrored by `indexer_smem_bytes` in src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int smem_bytes(int heads, int topk) {
    return kTokens * heads * kD + kStages * kStageBytes + kTokens * heads * 4 +
           kTokens * cap_for(topk) * 8 + 64;
}

// The warpgroup that runs a collective step (a count, a cut, a sort): its named barrier and
// this thread's index in it. The paged CTA is one warpgroup on barrier 0; the prefill CTA's
// two consumer warpgroups use barriers 1 and 2.
struct Group {
    int bar;  // named barrier of the warpgroup's 128 threads
    int tid;  // 0 .. 127
    __device__ void sync() const { named_barrier_sync(bar, kThreads); }
};

// acc[64 x 128 f32] (+)= A[64 x 32 e4m3, smem] * B[128 x 32 e4m3, smem]^T
__device__ __forceinline__ void wgmma_n128(float (&acc)[64], u64 desc_a, u64 desc_b, u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3\n"
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
        " %64, %65, p, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]), "+f"(acc[7]),
          "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]), "+f"(acc[14]), "+f"(acc[15]),
          "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]), "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]),
          "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]), "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31]),
          "+f"(acc[32]), "+f"(acc[33]), "+f"(acc[34]), "+f"(acc[35]), "+f"(acc[36]), "+f"(acc[37]), "+f"(acc[38]), "+f"(acc[39]),
          "+f"(acc[40]), "+f"(acc[41]), "+f"(acc[42]), "+f"(acc[43]), "+f"(acc[44]), "+f"(acc[45]), "+f"(acc[46]), "+f"(acc[47]),
          "+f"(acc[48]), "+f"(acc[49]), "+f"(acc[50]), "+f"(acc[51]), "+f"(acc[52]), "+f"(acc[53]), "+f"(acc[54]), "+f"(acc[55]),
          "+f"(acc[56]), "+f"(acc[57]), "+f"(acc[58]), "+f"(acc[59]), "+f"(acc[60]), "+f"(acc[61]), "+f"(acc[62]), "+f"(acc[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// Count over the CTA (WARPS warps) of the threads' `c`, one barrier (two scratch slots of WARPS
// alternate).
template <int WARPS>
__device__ __forceinline__ int block_sum(int c, int* red, int& parity) {
    const int warp = threadIdx.x >> 5;
    c = __reduce_add_sync(0xffffffffu, c);
    int* slot = red + parity * WARPS;
    if ((threadIdx.x & 31) == 0) slot[warp] = c;
    parity ^= 1;
    __syncthreads();
    int sum = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += slot[w];
    return sum;
}

// The same over a warpgroup, on its barrier.
__device__ __forceinline__ int block_sum(int c, int* red, int& parity, const Group& grp) {
    constexpr int WARPS = kThreads / 32;
    const int warp = grp.tid >> 5;
    c = __reduce_add_sync(0xffffffffu, c);
    int* slot = red + parity * WARPS;
    if ((grp.tid & 31) == 0) slot[warp] = c;
    parity ^= 1;
    grp.sync();
    int sum = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += slot[w];
    return sum;
}

// The `rank`-th largest (1-based) of the values v[e] where live[e], over the warpgroup: the
// largest x with at least `rank` live values >= x (bit descent, 32 counts).
template <int E>
__device__ __forceinline__ u32 kth_largest(const u32 (&v)[E], const bool (&live)[E], int rank,
                                           int* red, int& parity, const Group& grp) {
    u32 prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const u32 cand = prefix | (1u << bit);
        int c = 0;
#pragma unroll
        for (int e = 0; e < E; ++e) c += (live[e] && v[e] >= cand) ? 1 : 0;
        if (block_sum(c, red, parity, grp) >= rank) prefix = cand;
    }
    return prefix;
}

// Cuts a token's candidates (n of them, n > TOPK) to exactly its TOPK best, in place, and
// returns the threshold key (the TOPK-th best). Every thread of the warpgroup calls it.
template <int CAP, int TOPK>
__device__ u32 cut_to_topk(u32* keys, i32* pos, int n, int* red, int& parity, const Group& grp) {
    constexpr int E = (CAP + kThreads - 1) / kThreads;
    u32 k[E];
    i32 p[E];
    bool live[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = grp.tid + e * kThreads;
        live[e] = i < n;
        k[e] = live[e] ? keys[i] : 0u;
        p[e] = live[e] ? pos[i] : 0;
    }
    const u32 tau = kth_largest<E>(k, live, TOPK, red, parity, grp);
    int gt = 0, eq = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        gt += (live[e] && k[e] > tau) ? 1 : 0;
        eq += (live[e] && k[e] == tau) ? 1 : 0;
    }
    gt = block_sum(gt, red, parity, grp);
    eq = block_sum(eq, red, parity, grp);
    const int need = TOPK - gt;  // ties at tau to keep: the lowest positions
    u32 tie_cut = 0;             // keep a tie when ~position >= tie_cut
    if (eq > need) {
        u32 inv[E];
        bool tie[E];
#pragma unroll
        for (int e = 0; e < E; ++e) {
            inv[e] = ~(u32)p[e];
            tie[e] = live[e] && k[e] == tau;
        }
        tie_cut = kth_largest<E>(inv, tie, need, red, parity, grp);
    }
    // Ordered compaction: a thread's kept entries go after those of the lower threads.
    bool keep[E];
    int mine = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        keep[e] = live[e] && (k[e] > tau || (k[e] == tau && ~(u32)p[e] >= tie_cut));
        mine += keep[e] ? 1 : 0;
    }
    const int lane = grp.tid & 31, warp = grp.tid >> 5;
    int incl = mine;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
    }
    int* slot = red + parity * 4;
    parity ^= 1;
    if (lane == 31) slot[warp] = incl;
    grp.sync();  // also: every thread has read its entries before any is overwritten
    int base = incl - mine;
    for (int w = 0; w < warp; ++w) base += slot[w];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        if (keep[e]) {
            keys[base] = k[e];
            pos[base] = p[e];
            ++base;
        }
    }
    grp.sync();
    return tau;
}

// Sorts pos[0 .. P) ascending (P a power of two), by the THREADS threads that call it (`tid`
// this one's index among them; `sync` their barrier), bitonic.
template <int P, int THREADS, class Sync>
__device__ void sort_positions(i32* pos, int tid, Sync sync) {
    for (int k = 2; k <= P; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < P; i += THREADS) {
                const int partner = i ^ j;
                if (partner > i) {
                    const i32 a = pos[i], b = pos[partner];
                    const bool up = (i & k) == 0;
                    if ((a > b) == up) {
                        pos[i] = b;
                        pos[partner] = a;
                    }
                }
            }
            sync();
        }
    }
}

__host__ __device__ constexpr int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// Issues the 64 x (2 ACC) product of a key stage and a Q tile (shared-memory addresses, both
// canonical K-major: 16-byte core rows, K-adjacent core matrices 128 B apart, 8-row groups 1024
// B apart) into acc, asynchronously: four k-steps of 32 channels (two core matrices, 256 B),
// one commit group. The caller waits.
template <int ACC>
__device__ __forceinline__ void issue_block_product(float (&acc)[ACC], u32 stage, u32 q) {
    static_assert(ACC == 64 || ACC == 32, "N = 128 or 64");
    fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 32; ++ks) {
        const u64 da = make_smem_desc(stage + ks * 256, 128, 1024);
        const u64 db = make_smem_desc(q + ks * 256, 128, 1024);
        if constexpr (ACC == 64) {
            wgmma_n128(acc, da, db, ks > 0 ? 1u : 0u);
        } else {
            wgmma_qk(acc, da, db, ks > 0 ? 1u : 0u);
        }
    }
    wgmma_commit();
}

// A token's row from its n <= TOPK selected candidates (positions in `pos`, the token's buffer
// of CAP keys before them free): the positions sorted ascending inside the buffer, then written
// as index_of(position), -1 after them. Every thread of the warpgroup calls it.
template <int CAP, int TOPK, class IndexOf>
__device__ __forceinline__ void write_sorted_row(u32* keys, const i32* pos, int n, const Group& grp,
                                                 i32* out, IndexOf index_of) {
    constexpr int SORT = pow2_at_least(TOPK);
    constexpr int E = (CAP + kThreads - 1) / kThreads;
    static_assert(SORT <= 2 * CAP, "the sort runs inside a token's candidate buffer");
    i32* sorted = (i32*)keys;  // the keys are done with: SORT <= 2 * CAP slots
    i32 mine[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = grp.tid + e * kThreads;
        mine[e] = i < n ? pos[i] : 0x7fffffff;
    }
    grp.sync();  // every position read before the keys' slots are overwritten
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = grp.tid + e * kThreads;
        if (i < SORT) sorted[i] = mine[e];
    }
    for (int i = grp.tid + CAP; i < SORT; i += kThreads) sorted[i] = 0x7fffffff;
    grp.sync();
    sort_positions<SORT, kThreads>(sorted, grp.tid, [&] { grp.sync(); });
    for (int i = grp.tid; i < TOPK; i += kThreads) out[i] = i < n ? index_of(sorted[i]) : -1;
    grp.sync();
}

}  // namespace indexer

// Where a CTA's query tokens and their keys are. Both sources give the CTA's kTokens query rows
// (row(g), -1 for none) and their valid position ranges, and, for a 64-position block starting
// at `first` (a multiple of 64 in the paged source), where its 64 key rows and scales lie.

// Decode / MTP verify: a CTA takes tokens j0, j0 + 1 of sequence `seq` (its next_n tokens split
// over ceil(next_n / 2) CTAs); token j sees positions [0, seq_len - next_n + j + 1), clamped to
// [0, 64 max_pages]. Position s is offset s % 64 of page block_table[seq][s / 64]; a page
// outside [0, pages) holds no key. The row written is the cache slot, page * 64 + s % 64.
//
// Split (gridDim.y > 1: a batch too small to fill the GPU): CTA (c, y) takes the positions of
// blocks [y * blocks_per_split, (y + 1) * blocks_per_split) and writes each token's best TOPK of
// them (order keys and positions, unsorted) and their count to its split's list; the merge
// kernel selects the row from the lists.
struct PagedKeys {
    const PagedIndexerParams& p;
    int seq, j0, split, chunk_lo, chunk_hi;
    __device__ PagedKeys(const PagedIndexerParams& params, int cta, int y) : p(params), split(y) {
        const int per = (p.next_n + indexer::kTokens - 1) / indexer::kTokens;
        seq = cta / per;
        j0 = (cta % per) * indexer::kTokens;
        const i64 blocks = (i64)p.max_pages;
        chunk_lo = (int)min((i64)y * p.blocks_per_split, blocks) * indexer::kBlock;
        chunk_hi = (int)min((i64)(y + 1) * p.blocks_per_split, blocks) * indexer::kBlock;
    }
    __device__ int row(int g) const { return j0 + g < p.next_n ? seq * p.next_n + j0 + g : -1; }
    __device__ void range(int g, int& a, int& b) const {
        const i64 end = (i64)p.seq_lens[seq] - p.next_n + j0 + g + 1;
        a = chunk_lo;
        b = (int)min(max(end, (i64)chunk_lo), (i64)chunk_hi);
    }
    // A split's list: the n best (keys, positions) of row t in any order, and n.
    template <int TOPK>
    __device__ bool write_partial(int t, const u32* keys, const i32* pos, int n) const {
        if (gridDim.y == 1) return false;
        const i64 list = (i64)t * gridDim.y + split;
        for (int i = threadIdx.x; i < n; i += indexer::kThreads) {
            p.part_keys[list * TOPK + i] = keys[i];
            p.part_pos[list * TOPK + i] = pos[i];
        }
        if (threadIdx.x == 0) p.part_count[list] = n;
        return true;
    }
    __device__ int page(int s) const {
        return p.block_table[(i64)seq * p.max_pages + s / indexer::kBlock];
    }
    __device__ const u8* base() const { return p.cache; }
    __device__ bool block(int first, const u8*& keys, const float*& scales) const {
        const int pg = page(first);
        const bool ok = pg >= 0 && pg < p.pages;
        keys = p.cache + (ok ? (i64)pg * (indexer::kBlockBytes + indexer::kBlock * 4) : (i64)0);
        scales = (const float*)(keys + indexer::kBlockBytes);
        return ok;
    }
    __device__ bool present(int s) const {
        const int pg = page(s);
        return pg >= 0 && pg < p.pages;
    }
    // The slot of a selected position. A position outside the block table is never selected;
    // the guard keeps the table read inside its buffer whatever the candidates hold.
    __device__ i32 index_of(int s) const {
        if ((u32)s >= (u32)p.max_pages * indexer::kBlock) return -1;
        return page(s) * indexer::kBlock + s % indexer::kBlock;
    }
};

// The fused logits and top-k of one CTA's query tokens over the keys `keys` names; q, weights
// and indices are the call's, indexed by the rows `keys` gives.
template <int H_IDX, int TOPK, class Keys>
__device__ __forceinline__ void indexer_body(const Keys& keys, const u8* q, const float* weights,
                                             i32* indices) {
    using namespace indexer;
    constexpr int N = kTokens * H_IDX;  // wgmma N: the head rows of both tokens
    constexpr int CAP = cap_for(TOPK);  // candidates a token holds
    static_assert(H_IDX == 32 || H_IDX == 64, "32 or 64 index heads");
    static_assert(TOPK % 128 == 0 && TOPK <= 2048, "TOPK a multiple of 128 up to 2048");
    static_assert(CAP - kBlock >= TOPK, "a cut leaves room for a block");

    extern __shared__ __align__(1024) u8 smem[];
    u8* sq = smem;                                        // [N rows, 128] canonical K-major
    u8* sk = sq + N * kD;                                 // [kStages][64 rows, 128 | 64 scales]
    float* sw = (float*)(sk + kStages * kStageBytes);     // [kTokens, H_IDX]
    u32* cand = (u32*)(sw + N);                           // [kTokens][CAP keys | CAP positions]
    int* count = (int*)(cand + kTokens * 2 * CAP);        // [kTokens]
    u32* tau = (u32*)(count + kTokens);                   // [kTokens]
    int* red = (int*)(tau + kTokens);                     // [2][4] reduction scratch
    static_assert(smem_bytes(H_IDX, TOPK) >= N * kD + kStages * kStageBytes + N * 4 +
                                                 kTokens * CAP * 8 + (2 * kTokens + 8) * 4,
                  "shared-memory formula covers the layout");
    auto cand_key = [&](int g) { return cand + g * 2 * CAP; };
    auto cand_pos = [&](int g) { return (i32*)(cand + g * 2 * CAP + CAP); };

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const Group grp{0, tid};  // the CTA is one warpgroup

    // Each token's clamped range; the CTA streams their union.
    int row_t[kTokens], lo_t[kTokens], hi_t[kTokens];
    int lo = 0x7fffffff, hi = 0;
#pragma unroll
    for (int g = 0; g < kTokens; ++g) {
        row_t[g] = keys.row(g);
        int a = 0, b = 0;
        if (row_t[g] >= 0) {
            keys.range(g, a, b);
        }
        lo_t[g] = a;
        hi_t[g] = b;
        if (b > a) {
            lo = min(lo, a);
            hi = max(hi, b);
        }
    }
    const int blocks = hi > lo ? (hi - lo + kBlock - 1) / kBlock : 0;
    // Token g's row by a select, not an index: a register array indexed at run time would
    // live in local memory.
    static_assert(kTokens == 2, "row_of selects between two tokens");
    auto row_of = [&](int g) { return g == 0 ? row_t[0] : row_t[1]; };

    // Q rows r = g * H_IDX + h into the canonical layout; a missing token's rows are zeros.
    for (int e = tid; e < N * (kD / 16); e += kThreads) {
        const int r = e / (kD / 16), c = e % (kD / 16);
        const int t = row_of(r / H_IDX);
        const bool valid = t >= 0;
        const u8* src = q + (valid ? ((i64)t * H_IDX + r % H_IDX) * kD + c * 16 : (i64)0);
        cp_async_16(smem_addr(sq) + (r >> 3) * 1024 + c * 128 + (r & 7) * 16, src, valid ? 16u : 0u);
    }
    for (int e = tid; e < N; e += kThreads) {
        const int t = row_of(e / H_IDX);
        sw[e] = t >= 0 ? weights[(i64)t * H_IDX + e % H_IDX] : 0.f;
    }
    if (tid < kTokens) {
        count[tid] = 0;
        tau[tid] = 0u;  // below every order key: admit everything until the first cut
    }
    asm volatile("cp.async.commit_group;" ::: "memory");

    // Block b's keys and scales into its stage (rows past the range zero-filled, not read); one
    // commit group a call, empty past the last block.
    auto load_block = [&](int b) {
        if (b < blocks) {
            const int first = lo + b * kBlock;
            const u32 dst = smem_addr(sk + (b % kStages) * kStageBytes);
            const u8* kb;
            const float* sb;
            const bool present = keys.block(first, kb, sb);
            // Four 16-byte copies a thread (unrolled: tid < kThreads is not known to the compiler).
            // Warp copy k = 4 i + warp: rows 8 (k / 2) .. + 7, channels 64 (k % 2) .. + 63, eight
            // lanes to the eight rows of one 16-channel column: 512 contiguous bytes of the
            // canonical layout a copy (no bank conflict), whole sectors read.
            static_assert(kBlock * (kD / 16) / kThreads == 4 && kThreads == 128, "four copies a thread");
#pragma unroll
            for (int i = 0; i < kBlock * (kD / 16) / kThreads; ++i) {
                const int k = 4 * i + warp;
                const int r = 8 * (k >> 1) + (lane & 7), c = (lane >> 3) + 4 * (k & 1);
                const bool valid = present && first + r < hi;
                const u8* src = valid ? kb + r * kD + c * 16 : keys.base();
                cp_async_16(dst + (r >> 3) * 1024 + c * 128 + (r & 7) * 16, src, valid ? 16u : 0u);
            }
            if (tid < kBlock) {
                const bool valid = present && first + tid < hi;
                const void* src = valid ? (const void*)(sb + tid) : (const void*)keys.base();
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst + kBlockBytes + tid * 4),
                             "l"(src), "r"(valid ? 4u : 0u)
                             : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    // Issues block b's 64 x N product into acc (asynchronously: the caller waits).
    constexpr int kAcc = N / 2;  // accumulators a thread holds: 2 rows x N/4 columns
    auto issue = [&](float (&acc)[kAcc], int b) {
        issue_block_product(acc, smem_addr(sk + (b % kStages) * kStageBytes), smem_addr(sq));
    };

    const int quad = lane & 3;
    const int my_g = quad >> 1, my_half = quad & 1;  // the (token, row half) this lane admits
    const int my_lo = my_g ? lo_t[1] : lo_t[0];
    const int my_hi = my_g ? hi_t[1] : hi_t[0];
    int parity = 0;

    // Block b's head sums from acc, its admissions, and the cuts they call for.
    auto consume = [&](float (&acc)[kAcc], int b) {
        // Accumulator 4j + i is row (warp*16 + lane/4 + 8*(i>>1)), column 8j + 2*quad + (i&1);
        // column c is head c % H_IDX of token c / H_IDX.
        float part[kTokens][2];
#pragma unroll
        for (int g = 0; g < kTokens; ++g) part[g][0] = part[g][1] = 0.f;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
            const int g = (8 * j) / H_IDX;
            const float2 w = *(const float2*)(sw + 8 * j + 2 * quad);
            part[g][0] += fmaxf(acc[4 * j + 0], 0.f) * w.x + fmaxf(acc[4 * j + 1], 0.f) * w.y;
            part[g][1] += fmaxf(acc[4 * j + 2], 0.f) * w.x + fmaxf(acc[4 * j + 3], 0.f) * w.y;
        }
#pragma unroll
        for (int g = 0; g < kTokens; ++g) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                part[g][h] += __shfl_xor_sync(0xffffffffu, part[g][h], 1);
                part[g][h] += __shfl_xor_sync(0xffffffffu, part[g][h], 2);
            }
        }
        const float mine = quad == 0 ? part[0][0] : quad == 1 ? part[0][1] : quad == 2 ? part[1][0] : part[1][1];
        const int row = warp * 16 + (lane >> 2) + 8 * my_half;
        const int s = lo + b * kBlock + row;
        if (s >= my_lo && s < my_hi && keys.present(s)) {
            const float scale = *(const float*)(sk + (b % kStages) * kStageBytes + kBlockBytes + row * 4);
            const u32 key = order_key(mine * scale);
            if (key > tau[my_g]) {
                const int at = atomicAdd(count + my_g, 1);
                cand_key(my_g)[at] = key;
                cand_pos(my_g)[at] = s;
            }
        }
        __syncthreads();  // the admissions are counted; every thread's wgmma of block b is done
        load_block(b + kStages);  // into block b's stage
        // A buffer that the next block could overflow is cut to its TOPK best.
#pragma unroll
        for (int g = 0; g < kTokens; ++g) {
            const int n = count[g];
            if (n > CAP - kBlock) {
                const u32 cut = cut_to_topk<CAP, TOPK>(cand_key(g), cand_pos(g), n, red, parity, grp);
                if (tid == 0) {
                    count[g] = TOPK;
                    tau[g] = cut;
                }
                __syncthreads();
            }
        }
    };
    // Block b + 1 landed for every thread's copies and its product issued into `next`; then
    // block b's product (in `cur`) is waited for. The steady state always has a next block, so
    // the loop below carries no branch around the issue (a branch there makes ptxas serialise
    // every wgmma).
    auto issue_next = [&](float (&next)[kAcc], int b) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
        __syncthreads();  // block b + 1 landed for every thread's copies
        fence_proxy_async();
        issue(next, b + 1);
        wgmma_wait<1>();
    };
    // The last block: nothing to issue.
    auto wait_last = [&]() {
        wgmma_wait<0>();
        // Every thread has read block b - 1's counts (its cut decisions) before any admits
        // block b's candidates into them: without this barrier a late thread could see a
        // count the last block already raised and enter a cut alone.
        __syncthreads();
    };

#pragma unroll
    for (int b = 0; b < kStages; ++b) load_block(b);
    float acc0[kAcc], acc1[kAcc];
    if (blocks > 0) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
        __syncthreads();  // the Q tile and block 0 landed
        fence_proxy_async();
        issue(acc0, 0);
    }
    int b = 0;
    for (; b + 2 < blocks; b += 2) {
        issue_next(acc1, b);
        fence_regs(acc0);
        consume(acc0, b);
        issue_next(acc0, b + 1);
        fence_regs(acc1);
        consume(acc1, b + 1);
        // Block b + 2's product (issued before block b + 1 was consumed) is done by now; no
        // wgmma may be in flight across the back-edge, or ptxas serialises every wgmma.
        wgmma_wait<0>();
    }
    if (b + 1 < blocks) {  // two blocks left
        issue_next(acc1, b);
        fence_regs(acc0);
        consume(acc0, b);
        wait_last();
        fence_regs(acc1);
        consume(acc1, b + 1);
    } else if (b < blocks) {  // one block left
        wait_last();
        fence_regs(acc0);
        consume(acc0, b);
    }
    // Nothing is in flight here on any real path; ptxas cannot see that (the branches above
    // test different values) and would otherwise serialise every wgmma of the kernel.
    wgmma_wait<0>();
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();

    // The final cut, the sort (in the token's whole buffer) and the row.
#pragma unroll
    for (int g = 0; g < kTokens; ++g) {
        const int t = row_t[g];
        if (t < 0) continue;  // uniform over the CTA
        int n = count[g];
        if (n > TOPK) {
            cut_to_topk<CAP, TOPK>(cand_key(g), cand_pos(g), n, red, parity, grp);
            n = TOPK;
        }
        if (keys.template write_partial<TOPK>(t, cand_key(g), cand_pos(g), n)) {
            __syncthreads();  // the list is read before the next token's cut reuses the scratch
            continue;
        }
        write_sorted_row<CAP, TOPK>(cand_key(g), cand_pos(g), n, grp, indices + (i64)t * TOPK,
                                    [&](int s) { return keys.index_of(s); });
    }
}

namespace indexer {
constexpr int kWgs = 2;                            // consumer warpgroups of a prefill CTA
constexpr int kPrefillTokens = kWgs * kTokens;     // query tokens a prefill CTA takes
constexpr int kPrefillThreads = (kWgs + 1) * kThreads;  // and a producer warpgroup
// setmaxnreg: the launch allocates 168 registers a thread (65536 over 384 threads: a producer
// warp alone would cost as much, each SM sub-partition holding one warp of every warpgroup);
// the producer warpgroup gives back all but 56 and the consumers take 224.
constexpr u32 kPrefillConsumerRegs = 224;
constexpr u32 kPrefillProducerRegs = 56;
static_assert(kWgs * kThreads * kPrefillConsumerRegs + kThreads * kPrefillProducerRegs <=
                  kPrefillThreads * 168,
              "the registers setmaxnreg moves stay within what the launch allocated");
constexpr int kPrefillStages = 6;                  // key blocks in flight

// Shared memory of a prefill CTA, in bytes: the Q tiles of both warpgroups, the key ring, the
// head weights, a candidate buffer a token, the ring's full and empty barriers, counters and
// scratch. Mirrored by `prefill_indexer_smem_bytes` in src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int prefill_smem_bytes(int heads, int topk) {
    return kPrefillTokens * heads * kD + kPrefillStages * kStageBytes + kPrefillTokens * heads * 4 +
           kPrefillTokens * cap_for(topk) * 8 + 2 * kPrefillStages * 8 + 128;
}
}  // namespace indexer

// The prefill: keys [s_kv, 128] and scales [s_kv] in rows. A CTA takes query tokens t0 .. t0 + 3
// (the heavier, later causal ones first) and streams the union of their ranges once: the first
// warp of a producer warpgroup copies each 64-key block and its scales into a ring of six
// stages (cp.async, completing on the stage's full barrier), and two consumer warpgroups, each
// with two of the tokens (its own Q tile, candidates and counters), run the product, sums and
// admissions on every block and release the stage. A warpgroup agrees on a cut with one barrier
// every second block (`bar.red.or` of "my admission could overflow the next two blocks"), and
// its collective steps use its own named barrier, so neither waits for the other. The protocol
// is model-checked by bench/harness/indexer_protocol.py.
template <int H_IDX, int TOPK>
__global__ void __launch_bounds__(indexer::kPrefillThreads, 1)
    lightning_indexer_kernel(const __grid_constant__ IndexerParams p) {
    using namespace indexer;
    constexpr int N = kTokens * H_IDX;  // a warpgroup's wgmma N: the head rows of its tokens
    constexpr int CAP = cap_for(TOPK);
    constexpr int S = kPrefillStages;
    static_assert(H_IDX == 32 || H_IDX == 64, "32 or 64 index heads");
    static_assert(TOPK % 128 == 0 && TOPK <= 2048, "TOPK a multiple of 128 up to 2048");
    static_assert(CAP - 2 * kBlock >= TOPK, "a cut leaves room for two blocks");

    extern __shared__ __align__(1024) u8 smem[];
    u8* sq = smem;                                             // [kWgs][N rows, 128] canonical
    u8* sk = sq + kWgs * N * kD;                               // [S][64 rows, 128 | 64 scales]
    float* sw = (float*)(sk + S * kStageBytes);                // [kPrefillTokens, H_IDX]
    u32* cand = (u32*)(sw + kWgs * N);                         // [kPrefillTokens][CAP | CAP]
    u64* bars = (u64*)(cand + kPrefillTokens * 2 * CAP);       // full [S], empty [S]
    int* count = (int*)(bars + 2 * S);                         // [kPrefillTokens]
    u32* tau = (u32*)(count + kPrefillTokens);                 // [kPrefillTokens]
    int* red_all = (int*)(tau + kPrefillTokens);               // [kWgs][2][4] scratch
    static_assert(prefill_smem_bytes(H_IDX, TOPK) >=
                      kWgs * N * kD + S * kStageBytes + kWgs * N * 4 + kPrefillTokens * CAP * 8 +
                          2 * S * 8 + (2 * kPrefillTokens + kWgs * 8) * 4,
                  "shared-memory formula covers the layout");
    auto full_bar = [&](int s) { return smem_addr(bars + s); };
    auto empty_bar = [&](int s) { return smem_addr(bars + S + s); };

    const int tid = threadIdx.x;
    const int wg = tid / kThreads;  // 0, 1: consumers; 2: the producer (its first warp copies)
    const int t0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * kPrefillTokens;

    // The CTA's key rows: the union of its tokens' clamped ranges (every thread computes it).
    int lo = 0x7fffffff, hi = 0;
#pragma unroll
    for (int g = 0; g < kPrefillTokens; ++g) {
        if (t0 + g < p.tokens) {
            const int a = min(max(p.key_start[t0 + g], 0), p.s_kv);
            const int b = min(max(p.key_end[t0 + g], a), p.s_kv);
            if (b > a) {
                lo = min(lo, a);
                hi = max(hi, b);
            }
        }
    }
    const int blocks = hi > lo ? (hi - lo + kBlock - 1) / kBlock : 0;

    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full_bar(s), 32);                // the producer's lanes
            mbar_init(empty_bar(s), kWgs * kThreads);  // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();  // the last CTA-wide barrier: the roles part here

    if (wg == kWgs) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kPrefillProducerRegs));
        if (tid >= kWgs * kThreads + 32) return;
        // Producer warp: block b's 64 key rows (16-byte copies into the canonical layout) and
        // scales into stage b % S once the consumers released its last use. Rows past the
        // union are zero-filled without a read.
        const int lane = tid & 31;
        for (int b = 0; b < blocks; ++b) {
            const int st = b % S;
            if (b >= S) mbar_wait(empty_bar(st), (u32)(b / S - 1) & 1u);
            const int first = lo + b * kBlock;
            const u32 dst = smem_addr(sk + st * kStageBytes);
            const u8* kb = p.k + (i64)first * kD;
            // Copy i: rows 8 (i / 2) .. + 7, channels 64 (i % 2) .. + 63; eight lanes write the
            // eight rows of one 16-channel column, 128 contiguous bytes of the canonical layout
            // (no bank conflict), and read 16 bytes of each row (a copy reads 16 whole sectors).
#pragma unroll
            for (int i = 0; i < kBlock * (kD / 16) / 32; ++i) {
                const int r = 8 * (i >> 1) + (lane & 7), c = (lane >> 3) + 4 * (i & 1);
                const bool valid = first + r < hi;
                cp_async_16(dst + (r >> 3) * 1024 + c * 128 + (r & 7) * 16,
                            valid ? (const void*)(kb + r * kD + c * 16) : (const void*)p.k,
                            valid ? 16u : 0u);
            }
#pragma unroll
            for (int i = 0; i < kBlock / 32; ++i) {
                const int r = lane + 32 * i;
                const bool valid = first + r < hi;
                const void* src = valid ? (const void*)(p.k_scale + first + r) : (const void*)p.k_scale;
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst + kBlockBytes + r * 4),
                             "l"(src), "r"(valid ? 4u : 0u)
                             : "memory");
            }
            mbar_arrive_cp_async(full_bar(st));
        }
        // The warp leaves only once its copies have landed (their arrivals are then done too).
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }

    // Consumer warpgroup `wg`: tokens t0 + 2 wg + g (g = 0, 1).
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kPrefillConsumerRegs));
    const Group grp{1 + wg, tid - wg * kThreads};
    const int gt = grp.tid, warp = gt >> 5, lane = gt & 31;
    u8* my_q = sq + wg * N * kD;
    float* my_w = sw + wg * N;
    u32* my_cand = cand + wg * kTokens * 2 * CAP;
    int* my_count = count + wg * kTokens;
    u32* my_tau = tau + wg * kTokens;
    int* red = red_all + wg * 8;
    auto cand_key = [&](int g) { return my_cand + g * 2 * CAP; };
    auto cand_pos = [&](int g) { return (i32*)(my_cand + g * 2 * CAP + CAP); };
    static_assert(kTokens == 2, "row_of selects between two tokens");
    const int row0 = t0 + 2 * wg < p.tokens ? t0 + 2 * wg : -1;
    const int row1 = t0 + 2 * wg + 1 < p.tokens ? t0 + 2 * wg + 1 : -1;
    auto row_of = [&](int g) { return g == 0 ? row0 : row1; };

    // Q rows r = g * H_IDX + h into the canonical layout (a missing token's rows are zeros),
    // the head weights, the counters.
    for (int e = gt; e < N * (kD / 16); e += kThreads) {
        const int r = e / (kD / 16), c = e % (kD / 16);
        const int t = row_of(r / H_IDX);
        const bool valid = t >= 0;
        const u8* src = p.q + (valid ? ((i64)t * H_IDX + r % H_IDX) * kD + c * 16 : (i64)0);
        cp_async_16(smem_addr(my_q) + (r >> 3) * 1024 + c * 128 + (r & 7) * 16, src, valid ? 16u : 0u);
    }
    for (int e = gt; e < N; e += kThreads) {
        const int t = row_of(e / H_IDX);
        my_w[e] = t >= 0 ? p.weights[(i64)t * H_IDX + e % H_IDX] : 0.f;
    }
    if (gt < kTokens) {
        my_count[gt] = 0;
        my_tau[gt] = 0u;  // below every order key: admit everything until the first cut
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    grp.sync();  // the Q tile, weights and counters are in place for the whole warpgroup
    fence_proxy_async();

    // This lane admits row (warp*16 + lane/4 + 8*my_half) of a block for token my_g.
    const int quad = lane & 3;
    const int my_g = quad >> 1, my_half = quad & 1;
    int my_lo = 0, my_hi = 0;
    if (row_of(my_g) >= 0) {
        const int t = row_of(my_g);
        my_lo = min(max(p.key_start[t], 0), p.s_kv);
        my_hi = min(max(p.key_end[t], my_lo), p.s_kv);
    }
    int parity = 0;

    constexpr int kAcc = N / 2;
    // Block b's product into acc, once its stage is full (asynchronous: the caller waits).
    auto issue = [&](float (&acc)[kAcc], int b) {
        const int st = b % S;
        mbar_wait(full_bar(st), (u32)(b / S) & 1u);
        fence_proxy_async();  // the producer's copies, seen by the tensor cores
        issue_block_product(acc, smem_addr(sk + st * kStageBytes), smem_addr(my_q));
    };
    // The tokens' thresholds, in registers: they change only in a cut, after which every thread
    // reads them again.
    u32 tau_reg[kTokens] = {0u, 0u};
    // Whether an admission since the last vote left a buffer without room for two blocks.
    bool pending_full = false;
    // Block b's head sums from acc (its product is complete), its admissions and the stage's
    // release; with `vote` (every second block, and the last), the warpgroup's vote on a cut and
    // the cuts it calls for. A vote leaves room for two blocks: CAP - 2 * kBlock >= TOPK.
    auto consume = [&](float (&acc)[kAcc], int b, bool vote) {
        fence_regs(acc);
        // Two independent partial sums a (token, row), over alternate column groups: half the
        // dependent chain.
        float part[kTokens][2][2];
#pragma unroll
        for (int g = 0; g < kTokens; ++g) part[g][0][0] = part[g][0][1] = part[g][1][0] = part[g][1][1] = 0.f;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
            const int g = (8 * j) / H_IDX;
            const float2 w = *(const float2*)(my_w + 8 * j + 2 * quad);
            part[g][0][j & 1] += fmaxf(acc[4 * j + 0], 0.f) * w.x + fmaxf(acc[4 * j + 1], 0.f) * w.y;
            part[g][1][j & 1] += fmaxf(acc[4 * j + 2], 0.f) * w.x + fmaxf(acc[4 * j + 3], 0.f) * w.y;
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
        const int s = lo + b * kBlock + row;
        const float scale = *(const float*)(sk + (b % S) * kStageBytes + kBlockBytes + row * 4);
        mbar_arrive(empty_bar(b % S));  // the product and the scale are read: the stage is free
        if (s >= my_lo && s < my_hi) {
            const u32 key = order_key(mine * scale);
            if (key > (my_g ? tau_reg[1] : tau_reg[0])) {
                const int at = atomicAdd(my_count + my_g, 1);
                cand_key(my_g)[at] = key;
                cand_pos(my_g)[at] = s;
                pending_full = pending_full || at + 1 > CAP - 2 * kBlock;
            }
        }
        if (!vote) return;
        // The vote: one barrier every second block. Then (rare) every thread reads the same
        // counts, and the cuts end in a barrier before the next block's admissions.
        const bool cut_any = named_barrier_any(grp.bar, kThreads, pending_full);
        pending_full = false;
        if (cut_any) {
#pragma unroll
            for (int g = 0; g < kTokens; ++g) {
                const int n = my_count[g];
                if (n > CAP - 2 * kBlock) {
                    const u32 cut = cut_to_topk<CAP, TOPK>(cand_key(g), cand_pos(g), n, red, parity, grp);
                    if (gt == 0) {
                        my_count[g] = TOPK;
                        my_tau[g] = cut;
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

    // The product of block b + 1 runs under block b's sums (two accumulator sets); no wgmma is in
    // flight across the loop's back-edge (ptxas would serialise every wgmma), so the loop waits
    // for everything at the end of each pair, when the product is long done.
    float acc0[kAcc], acc1[kAcc];
    if (blocks > 0) issue(acc0, 0);
    int b = 0;
    for (; b + 2 < blocks; b += 2) {
        issue(acc1, b + 1);
        wgmma_wait<1>();
        consume(acc0, b, false);
        issue(acc0, b + 2);
        wgmma_wait<1>();
        consume(acc1, b + 1, true);
        wgmma_wait<0>();
    }
    if (b + 1 < blocks) {  // two blocks left
        issue(acc1, b + 1);
        wgmma_wait<1>();
        consume(acc0, b, false);
        wgmma_wait<0>();
        consume(acc1, b + 1, true);
    } else if (b < blocks) {  // one block left
        wgmma_wait<0>();
        consume(acc0, b, true);
    }
    wgmma_wait<0>();

    // The final cut, the sort (in the token's whole buffer) and the row.
#pragma unroll
    for (int g = 0; g < kTokens; ++g) {
        const int t = row_of(g);
        if (t < 0) continue;  // uniform over the warpgroup
        int n = my_count[g];
        if (n > TOPK) {
            cut_to_topk<CAP, TOPK>(cand_key(g), cand_pos(g), n, red, parity, grp);
            n = TOPK;
        }
        write_sorted_row<CAP, TOPK>(cand_key(g), cand_pos(g), n, grp, p.indices + (i64)t * TOPK,
                                    [](int s) { return s; });
    }
}

template <int H_IDX, int TOPK>
__global__ void __launch_bounds__(indexer::kThreads, 2)
    paged_lightning_indexer_kernel(const __grid_constant__ PagedIndexerParams p) {
    indexer_body<H_IDX, TOPK>(PagedKeys(p, blockIdx.x, blockIdx.y), p.q, p.weights, p.indices);
}

namespace indexer {
constexpr int kMergeThreads = 512;
constexpr int kMergeWarps = kMergeThreads / 32;
// Candidates a merge CTA holds: FAN lists of TOPK (FAN = kMergeCandidates / TOPK).
constexpr int kMergeCandidates = 16384;

// Shared memory of a merge CTA: the candidates (keys, positions), the sorted row, a 256-bin
// histogram and the scratch. Mirrored by `indexer_merge_smem_bytes` in src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int merge_smem_bytes(int topk) {
    return (kMergeCandidates / topk) * topk * 8 + pow2_at_least(topk) * 4 + 256 * 4 + 16 * 4;
}

// The rank-th largest (1-based) of the values get(i) of the entries i < n with live(i), over the
// CTA, one byte at a time from the top: a 256-bin histogram of the entries that match the digits
// found so far, and the bin where the count from the top reaches the rank left.
template <int THREADS, class Get, class Live>
__device__ u32 radix_kth(int n, int rank, Get get, Live live, int* hist, int* found) {
    u32 prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += THREADS) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += THREADS) {
            const u32 v = get(i);
            if (live(i) && (v & mask) == prefix) atomicAdd(hist + ((v >> shift) & 255), 1);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l sums bins 255 - 8l .. 248 - 8l (from the top), then the lanes scan.
            const int lane = threadIdx.x;
            int mine = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) mine += hist[255 - 8 * lane - j];
            int incl = mine;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int o = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d) incl += o;
            }
            const int before = incl - mine;  // entries in the bins above lane l's
            const bool here = before < rank && incl >= rank;
            if (here) {
                int acc = before;
                for (int j = 0; j < 8; ++j) {
                    const int bin = 255 - 8 * lane - j;
                    if (acc + hist[bin] >= rank) {
                        found[0] = bin;
                        found[1] = rank - acc;  // the rank left inside the bin
                        break;
                    }
                    acc += hist[bin];
                }
            }
        }
        __syncthreads();
        prefix |= (u32)found[0] << shift;
        mask |= 255u << shift;
        rank = found[1];
        __syncthreads();  // found[] read before the next digit's writes
    }
    return prefix;
}
}  // namespace indexer

// Merges split lists of the paged indexer (header: IndexerMergeParams). The lists of a row hold
// disjoint positions, each list the exact best TOPK of its positions, so the best TOPK of their
// union is the row's. 512 threads; candidates in shared memory; one radix selection of the
// TOPK-th key and, when it ties, one of the positions to keep among the ties.
template <int TOPK>
__global__ void __launch_bounds__(indexer::kMergeThreads, 1)
    paged_indexer_merge_kernel(const __grid_constant__ IndexerMergeParams p) {
    using namespace indexer;
    constexpr int FAN = kMergeCandidates / TOPK;
    constexpr int C = FAN * TOPK;
    constexpr int SORT = pow2_at_least(TOPK);
    constexpr int T = kMergeThreads;
    extern __shared__ __align__(16) u8 smem[];
    u32* keys = (u32*)smem;                 // [C]
    i32* pos = (i32*)(keys + C);            // [C]
    i32* sorted = pos + C;                  // [SORT]
    int* hist = sorted + SORT;              // [256]
    int* misc = hist + 256;                 // [0..2) found, [2] kept, [3] total
    const int row = blockIdx.x, group = blockIdx.y;
    const int first = group * FAN;
    const int here = min(FAN, p.lists - first);
    const i64 base = (i64)row * p.lists + first;  // the group's first list
    if (threadIdx.x == 0) {
        int total = 0;
        for (int l = 0; l < here; ++l) total += p.in_count[base + l];
        misc[2] = 0;
        misc[3] = total;
    }
    for (int i = threadIdx.x; i < C; i += T) {
        const int l = i / TOPK, e = i % TOPK;
        const bool live = l < here && e < p.in_count[base + (l < here ? l : 0)];
        keys[i] = live ? p.in_keys[(base + l) * TOPK + e] : 0u;  // 0: below every order key
        pos[i] = live ? p.in_pos[(base + l) * TOPK + e] : 0x7fffffff;
    }
    __syncthreads();
    const int total = misc[3];
    u32 tau = 0, tie_cut = 0;
    bool cut = total > TOPK;
    if (cut) {
        tau = radix_kth<T>(C, TOPK, [&](int i) { return keys[i]; }, [&](int i) { return keys[i] != 0u; },
                           hist, misc);
        int gt = 0, eq = 0;
        for (int i = threadIdx.x; i < C; i += T) {
            gt += keys[i] > tau ? 1 : 0;
            eq += keys[i] == tau ? 1 : 0;
        }
        int parity = 0;
        gt = block_sum<kMergeWarps>(gt, hist, parity);
        eq = block_sum<kMergeWarps>(eq, hist, parity);
        __syncthreads();  // the sums are read before the histogram is reused
        const int need = TOPK - gt;
        if (eq > need) {
            tie_cut = radix_kth<T>(C, need, [&](int i) { return ~(u32)pos[i]; },
                                   [&](int i) { return keys[i] == tau; }, hist, misc);
        }
    }
    // The kept entries, in any order (the row is sorted after; a list needs no order).
    for (int i = threadIdx.x; i < C; i += T) {
        const u32 k = keys[i];
        const bool keep = k != 0u && (!cut || k > tau || (k == tau && ~(u32)pos[i] >= tie_cut));
        if (keep) {
            const int at = atomicAdd(misc + 2, 1);
            if (p.last) {
                sorted[at] = pos[i];
            } else {
                const i64 out = (i64)row * gridDim.y + group;
                p.out_keys[out * TOPK + at] = k;
                p.out_pos[out * TOPK + at] = pos[i];
            }
        }
    }
    __syncthreads();
    const int kept = misc[2];
    if (!p.last) {
        if (threadIdx.x == 0) p.out_count[(i64)row * gridDim.y + group] = kept;
        return;
    }
    for (int i = kept + threadIdx.x; i < SORT; i += T) sorted[i] = 0x7fffffff;
    __syncthreads();
    sort_positions<SORT, T>(sorted, (int)threadIdx.x, [] { __syncthreads(); });
    const int seq = row / p.next_n;
    i32* out = p.indices + (i64)row * TOPK;
    for (int i = threadIdx.x; i < TOPK; i += T) {
        if (i < kept) {
            const int s = sorted[i];  // a split's position: inside the block table (guarded)
            out[i] = (u32)s < (u32)p.max_pages * kBlock
                         ? p.block_table[(i64)seq * p.max_pages + s / kBlock] * kBlock + s % kBlock
                         : -1;
        } else {
            out[i] = -1;
        }
    }
}
