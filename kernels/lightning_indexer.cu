// Lightning indexer, paged form (decode, MTP verify): keys in pages of the index-key cache, and
// the merge of a split batch's lists. Compiled after common.cuh, sparse_mla_common.cuh and
// indexer_common.cuh.

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

// Shared memory of one paged CTA, in bytes, for H_IDX heads and TOPK: Q tile, key ring (keys and
// scales), head weights, a candidate buffer a token (CAP keys then CAP positions), counters and
// the reduction scratch. Mirrored by `indexer_smem_bytes` in src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int smem_bytes(int heads, int topk) {
    return kTokens * heads * kD + kStages * kStageBytes + kTokens * heads * 4 +
           kTokens * cap_for(topk) * 8 + 64;
}

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
            // One fused multiply-add a head (a sum of products would cost a multiply and an add).
            part[g][0] = fmaf(fmaxf(acc[4 * j + 0], 0.f), w.x, part[g][0]);
            part[g][0] = fmaf(fmaxf(acc[4 * j + 1], 0.f), w.y, part[g][0]);
            part[g][1] = fmaf(fmaxf(acc[4 * j + 2], 0.f), w.x, part[g][1]);
            part[g][1] = fmaf(fmaxf(acc[4 * j + 3], 0.f), w.y, part[g][1]);
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
        // A buffer that the next block could overflow is cut (loosely: to its TOPK best and at
        // most a slack of others).
#pragma unroll
        for (int g = 0; g < kTokens; ++g) {
            const int n = count[g];
            if (n > CAP - kBlock) {
                int kept;
                const u32 cut = cut_to_topk<CAP, TOPK, true>(cand_key(g), cand_pos(g), n, red, parity, grp, kept);
                if (tid == 0) {
                    count[g] = kept;
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

    // The final (exact) cut and the row, written in ascending position from a bitmap in the
    // token's buffer.
#pragma unroll
    for (int g = 0; g < kTokens; ++g) {
        const int t = row_t[g];
        if (t < 0) continue;  // uniform over the CTA
        int n = count[g];
        if (n > TOPK) {
            cut_to_topk<CAP, TOPK>(cand_key(g), cand_pos(g), n, red, parity, grp, n);
        }
        if (keys.template write_partial<TOPK>(t, cand_key(g), cand_pos(g), n)) {
            __syncthreads();  // the list is read before the next token's cut reuses the scratch
            continue;
        }
        write_sorted_row<CAP, TOPK>(cand_key(g), cand_pos(g), n, lo, hi, red, parity, grp,
                                    indices + (i64)t * TOPK, [&](int s) { return keys.index_of(s); });
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
    constexpr int FAN = kMergeCandidates / TOPK;
    constexpr int C = FAN * TOPK;
    constexpr int SORT = pow2_at_least(TOPK);
    constexpr int T = kMergeThreads;
    extern __shared__ __align__(16) u8 smem[];
    u32* keys = (u32*)smem;                 // [C]
    i32* pos = (i32*)(keys + C);            // [C]
    i32* kept_pos = pos + C;                // [SORT] the last level's kept positions (TOPK used)
    int* hist = kept_pos + SORT;            // [256]
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
