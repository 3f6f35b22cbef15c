// Lightning indexer, paged form (decode, MTP verify): keys in pages of the index-key cache, and
// the merge of a split batch's lists. Compiled after common.cuh, sparse_mla_common.cuh,
// indexer_common.cuh and indexer_ws.cuh.

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
    TensorMap cache_map;      // the pages' key tiles: box (0, 0, page), 128-byte swizzle
};

// Parameters of one merge of split lists. Mirrored by `IndexerMergeParams` in
// src/ops/indexer/cuda.rs. A CTA (row, group) merges lists [group * fan, group * fan + fan) of
// its row into one list (or, at the last level, into the row of indices), where a list of this
// level holds at most list_cap entries and fan = kMergeCandidates / list_cap (the splits' own
// lists hold at most a split's positions, often far fewer than TOPK, so more of them fit a CTA).
struct IndexerMergeParams {
    const u32* in_keys;       // [rows, lists, TOPK]
    const i32* in_pos;        // [rows, lists, TOPK]
    const i32* in_count;      // [rows, lists]
    u32* out_keys;            // [rows, ceil(lists / fan), TOPK] (not the last level)
    i32* out_pos;             // [rows, ceil(lists / fan), TOPK] (not the last level)
    i32* out_count;           // [rows, ceil(lists / fan)] (not the last level)
    const i32* block_table;   // [B, max_pages] (the last level: positions to slots)
    i32* indices;             // [rows, TOPK] (the last level)
    i32 rows;                 // B * next_n
    i32 lists;                // lists a row holds
    i32 next_n;
    i32 max_pages;
    i32 last;                 // 1: write indices; 0: write merged lists
    i32 list_cap;             // entries an input list holds at most, in 1 ..= TOPK (lists are
                              // TOPK apart in memory whatever their capacity)
};
namespace indexer {

// Shared memory of one paged CTA, in bytes (ws_smem_bytes with one consumer warpgroup).
// Mirrored by `indexer_smem_bytes` in src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int smem_bytes(int heads, int topk) { return ws_smem_bytes(heads, topk, 1); }
}  // namespace indexer

// Where a CTA's query tokens and their keys are: the CTA's kTokens query rows (row(g), -1 for
// none) and their valid position ranges, and, for a 64-position block starting at `first` (a
// multiple of 64), where its 64 key rows and scales lie.
//
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
    // A page's key tile is one TMA box of cache_map, its 64 scales (16-byte aligned, after the
    // tile) one bulk copy: the producer's lane 0 issues both.
    static constexpr bool kTma = true;
    static constexpr int kTmaRank = 3;
    static constexpr bool kBulkScales = true;
    static constexpr int kSampleStride = 8;  // the selection's sample: every 8th page first
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
    __device__ bool write_partial(int t, const u32* keys, const i32* pos, int n, const indexer::Group& grp) const {
        if (gridDim.y == 1) return false;
        const i64 list = (i64)t * gridDim.y + split;
        for (int i = grp.tid; i < n; i += indexer::kThreads) {
            p.part_keys[list * TOPK + i] = keys[i];
            p.part_pos[list * TOPK + i] = pos[i];
        }
        if (grp.tid == 0) p.part_count[list] = n;
        return true;
    }
    __device__ int page(int s) const {
        return p.block_table[(i64)seq * p.max_pages + s / indexer::kBlock];
    }
    __device__ const u8* base() const { return p.cache; }
    __device__ const void* tensor_map() const { return &p.cache_map; }
    __device__ bool box(int first, int& y, int& z) const {
        const int pg = page(first);
        y = 0;
        z = pg;
        return pg >= 0 && pg < p.pages;
    }
    __device__ const u8* q() const { return p.q; }
    __device__ const float* weights() const { return p.weights; }
    __device__ i32* indices() const { return p.indices; }
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

// The paged form: the warp-specialised CTA (indexer_ws.cuh) with one consumer warpgroup over a
// sequence's pages (two of its next_n tokens), two CTAs an SM.
template <int H_IDX, int TOPK>
__global__ void __launch_bounds__(2 * indexer::kThreads, 2)
    paged_lightning_indexer_kernel(const __grid_constant__ PagedIndexerParams p) {
    // The merge (a dependent launch when the row is split) may be scheduled once every split
    // has begun; it waits for this grid's end before it reads anything.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    indexer_ws_body<H_IDX, TOPK, 1, false>(PagedKeys(p, blockIdx.x, blockIdx.y));
}

namespace indexer {
constexpr int kMergeThreads = 512;
constexpr int kMergeWarps = kMergeThreads / 32;
// Candidates a merge CTA holds: fan lists of list_cap (at least kMergeCandidates / TOPK lists).
constexpr int kMergeCandidates = 16384;

// Shared memory of a merge CTA: the candidates (keys, positions), the kept positions of the
// last level, a 256-bin histogram and the scratch. Mirrored by `indexer_merge_smem_bytes` in src/ops/indexer/cuda.rs.
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
    // Launched as a dependent of the kernel before it (the splits, or the previous merge
    // level), so it may be resident before that one ends: nothing global is touched before
    // that kernel has ended and its writes are visible. A no-op for an ordinary launch. The
    // next level may be scheduled meanwhile; it waits the same way.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    constexpr int FAN = kMergeCandidates / TOPK;
    constexpr int C = FAN * TOPK;
    constexpr int SORT = pow2_at_least(TOPK);
    constexpr int T = kMergeThreads;
    extern __shared__ __align__(1024) u8 smem[];  // as indexer_ws.cuh declares it (the swizzle)
    u32* keys = (u32*)smem;                 // [C]
    i32* pos = (i32*)(keys + C);            // [C]
    i32* kept_pos = pos + C;                // [SORT] the last level's kept positions (TOPK used)
    int* hist = kept_pos + SORT;            // [256]
    int* misc = hist + 256;                 // [0..2) found, [2] kept, [3] total
    const int row = blockIdx.x, group = blockIdx.y;
    // Lists of at most `cap` entries, `fan` of them a CTA (the cap clamped into 1 ..= TOPK, so
    // every read stays inside its list's TOPK entries whatever the parameter holds).
    const int cap = min(max(p.list_cap, 1), TOPK);
    const int fan = C / cap;
    const int first = group * fan;
    const int here = min(fan, p.lists - first);
    const i64 base = (i64)row * p.lists + first;  // the group's first list
    // The live candidates: the counts as the loads below take them (at most `cap` a list),
    // summed by the first warp (up to C / 128 lists).
    if (threadIdx.x < 32) {
        int total = 0;
        for (int l = threadIdx.x; l < here; l += 32) total += min(max(p.in_count[base + l], 0), cap);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
        if (threadIdx.x == 0) {
            misc[2] = 0;
            misc[3] = total;
        }
    }
    for (int i = threadIdx.x; i < C; i += T) {
        const int l = i / cap, e = i % cap;
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
    // The kept entries, in any order (the row is ordered after by a bitmap; a list needs no order).
    for (int i = threadIdx.x; i < C; i += T) {
        const u32 k = keys[i];
        const bool keep = k != 0u && (!cut || k > tau || (k == tau && ~(u32)pos[i] >= tie_cut));
        if (keep) {
            const int at = atomicAdd(misc + 2, 1);
            if (p.last) {
                kept_pos[at] = pos[i];
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
    // The row in ascending position without a sort: the kept positions (all inside the block
    // table's 64 max_pages positions) marked in a bitmap in the candidates' buffer (windows of
    // 64 C positions), each thread writing the slots of its run of words after the marks of the
    // runs before it.
    const int seq = row / p.next_n;
    i32* out = p.indices + (i64)row * TOPK;
    u32* bits = keys;  // [2 C] words: keys and pos, read
    constexpr i64 WINDOW = 32 * (i64)(2 * C);
    const i64 range = (i64)p.max_pages * kBlock;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int written = 0;
    for (i64 w0 = 0; kept > 0 && w0 < range; w0 += WINDOW) {  // uniform over the CTA
        const int span = (int)min(range - w0, WINDOW);  // positions w0 .. w0 + span - 1
        const int words = (span + 31) >> 5;
        for (int i = threadIdx.x; i < words; i += T) bits[i] = 0u;
        __syncthreads();
        for (int i = threadIdx.x; i < kept; i += T) {
            const i64 d = (i64)kept_pos[i] - w0;
            if (d >= 0 && d < span) atomicOr(bits + (d >> 5), 1u << (d & 31));
        }
        __syncthreads();
        // An odd run length keeps a warp's reads of word i of their runs in 32 banks.
        const int per = ((words + T - 1) / T) | 1;
        const int run_lo = min((int)threadIdx.x * per, words), run_hi = min(run_lo + per, words);
        int marks = 0;
        for (int i = run_lo; i < run_hi; ++i) marks += __popc(bits[i]);
        int incl = marks;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int o = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += o;
        }
        if (lane == 31) hist[warp] = incl;  // the histogram is done with
        __syncthreads();
        int at = written + incl - marks, total_marks = 0;
#pragma unroll
        for (int w = 0; w < T / 32; ++w) {
            at += w < warp ? hist[w] : 0;
            total_marks += hist[w];
        }
        for (int i = run_lo; i < run_hi; ++i) {
            for (u32 x = bits[i]; x != 0u; x &= x - 1u) {
                const int s = (int)(w0 + 32 * i + __ffs(x) - 1);  // < range: inside the table
                out[at++] = p.block_table[(i64)seq * p.max_pages + s / kBlock] * kBlock + s % kBlock;
            }
        }
        written += total_marks;
        __syncthreads();  // the words and the warps' counts read before the next window
    }
    for (int i = written + threadIdx.x; i < TOPK; i += T) out[i] = -1;
}
