// Lightning indexer of DeepSeek Sparse Attention (docs/kernels/indexer.md): the steps both of
// its CTAs share. For every query token t the TOPK key positions s in its valid range with the
// largest
//     logit[t, s] = k_scale[s] * sum_h w[t, h] * relu(q[t, h, :] . k[s, :])
// (e4m3 q and k, D = 128), ties to the lower position, the positions written in ascending order
// and -1 after them when fewer are valid. Logits and top-k are fused: no logit leaves the CTA.
//
// A warpgroup takes two query tokens: their 2 * H_IDX head rows of q are the wgmma B operand
// (N = 2 * H_IDX), a 64-key block the A operand (M = 64 keys), so a thread's accumulators are
// 2 keys x (2 tokens x H_IDX/4 heads): the head sum is a thread's own adds and two quad
// shuffles. Two accumulator sets alternate: the next block's wgmma runs while the current
// block's sums and admissions are computed.
//
// Top-k without a logit round trip: each token keeps a candidate buffer of
// CAP = TOPK + max(TOPK / 2, 128) (ordered key, position) pairs in shared memory. A logit is
// admitted when it beats the token's threshold; when a buffer could overflow on the next blocks
// it is cut (cut_to_topk: loosely while keys arrive, exactly at the end) and the threshold rises.
// A threshold is a key and a tie position: after an exact cut a logit equal to the worst kept
// key wins only from a lower position than that one's (keys may arrive out of position order:
// the prefill samples every 8th block first, indexer_ws.cuh). The row is written in
// ascending position from a bitmap of the selected positions (write_sorted_row).
//
// Ordering: a logit maps to a u32 that orders like the float (-0 below +0); NaN counts as -inf.
// Compiled after common.cuh and sparse_mla_common.cuh (PTX helpers), before indexer_ws.cuh
// (the CTA both forms launch) and lightning_indexer_prefill.cu or lightning_indexer.cu.

namespace indexer {

constexpr int kD = 128;             // channels of a head and of a key (bytes, e4m3)
constexpr int kThreads = 128;       // one warpgroup
constexpr int kTokens = 2;          // query tokens a warpgroup takes
constexpr int kBlock = 64;          // keys of one block (the wgmma M)
constexpr int kBlockBytes = kBlock * kD;
constexpr int kStageBytes = kBlockBytes + kBlock * 4;  // the keys and their scales

// Candidates a token holds: TOPK and room for at least half as many (and 128) more. An exact cut
// leaves room for at least TOPK/2 - 128 admissions before the next vote asks for another, a loose
// one (cut_to_topk) for three quarters of that.
__host__ __device__ constexpr int cap_for(int topk) {
    return topk + (topk / 2 > 128 ? topk / 2 : 128);
}

// The warpgroup that runs a collective step (a count, a cut, a sort): its named barrier and
// this thread's index in it. Consumer warpgroup w of a CTA (indexer_ws.cuh) uses barrier 1 + w
// (the paged CTA has one, the prefill's two).
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

// The largest of the threads' `v` over a warpgroup, one barrier (the scratch slots of
// block_sum).
__device__ __forceinline__ u32 block_max(u32 v, int* red, int& parity, const Group& grp) {
    v = __reduce_max_sync(0xffffffffu, v);
    int* slot = red + parity * 4;
    if ((grp.tid & 31) == 0) slot[grp.tid >> 5] = (int)v;
    parity ^= 1;
    grp.sync();
    u32 m = 0u;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) m = max(m, (u32)slot[w]);
    return m;
}

// The exclusive prefix sum of the threads' `c` in thread order over a warpgroup (`before`) and
// their total, one barrier (the scratch slots of block_sum).
struct GroupScan {
    int before;
    int total;
};
__device__ __forceinline__ GroupScan block_scan(int c, int* red, int& parity, const Group& grp) {
    const int lane = grp.tid & 31, warp = grp.tid >> 5;
    int incl = c;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
    }
    int* slot = red + parity * 4;
    parity ^= 1;
    if (lane == 31) slot[warp] = incl;
    grp.sync();
    GroupScan scan{incl - c, 0};
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
        scan.before += w < warp ? slot[w] : 0;
        scan.total += slot[w];
    }
    return scan;
}

// The `rank`-th largest (1-based) of the values v[e] where live[e], over the warpgroup: the
// largest x with at least `rank` live values >= x. `at` holds the number of live values >= the
// result (pass the number of live values, at least `rank`); with `stop_at` > 0 the descent
// stops early, at a prefix of the result that at most `stop_at` live values reach. The result
// lies between the smallest and the largest live value, so it shares the bits above their
// highest differing bit (two barriers find them): a bit descent from there, one count a bit.
template <int E>
__device__ __forceinline__ u32 kth_largest(const u32 (&v)[E], const bool (&live)[E], int rank,
                                           int* red, int& parity, const Group& grp, int& at,
                                           int stop_at = 0) {
    u32 most = 0u, least_inv = 0u;  // the largest live value, and the largest ~value
#pragma unroll
    for (int e = 0; e < E; ++e) {
        most = live[e] ? max(most, v[e]) : most;
        least_inv = live[e] ? max(least_inv, ~v[e]) : least_inv;
    }
    most = block_max(most, red, parity, grp);
    const u32 least = ~block_max(least_inv, red, parity, grp);
    if (least == most) return most;  // every live value is the same (at = every live one)
    const int top = 31 - __clz(least ^ most);  // the highest bit where they differ
    u32 prefix = most & ~((2u << top) - 1u);   // the bits above it (2u << 31 wraps to 0)
    for (int bit = top; bit >= 0 && at > stop_at; --bit) {  // uniform: `at` is a warpgroup sum
        const u32 cand = prefix | (1u << bit);
        int c = 0;
#pragma unroll
        for (int e = 0; e < E; ++e) c += (live[e] && v[e] >= cand) ? 1 : 0;
        const int reach = block_sum(c, red, parity, grp);
        if (reach >= rank) {
            prefix = cand;
            at = reach;
        }
    }
    return prefix;
}

// Cuts a token's candidates (n of them, n > rank) in place to the `rank` best (rank <= TOPK: less
// while the prefill's sample blocks arrive, indexer_ws.cuh), and returns the admission threshold
// that follows: a later logit with order key `key` at position s is admitted when
// key > threshold, or key == threshold and s < `tie`. Every thread of the warpgroup calls it.
// - Exact (LOOSE false): exactly the `rank` best remain (`kept` = rank); the threshold is the
//   worst kept one (the rank-th best key; `tie` the highest position kept at that key, or
//   INT_MAX when every candidate at that key was kept): a later logit must beat it.
// - Loose (LOOSE true, a cut while keys still arrive): every candidate whose key is at least a
//   prefix of the rank-th best remains, once at most rank + slack of them do; the threshold
//   admits keys from that prefix on (`tie` 0). Nothing that can still be among the rank best is
//   dropped (at least rank kept keys beat anything below the prefix), and the descent stops as
//   soon as the prefix is that narrow (about half the counts of an exact cut). Where equal keys
//   keep more than rank + slack in the running, the cut is exact.
// Everything a cut drops is below its threshold and everything it keeps is at or above it, so
// keys may arrive in any order of position (the prefill's sample blocks come first).
template <int CAP, int TOPK, bool LOOSE = false>
__device__ u32 cut_to_topk(u32* keys, i32* pos, int n, int rank, int* red, int& parity, const Group& grp, int& kept,
                           i32& tie, int keep_ties_within = 0) {
    constexpr int E = (CAP + kThreads - 1) / kThreads;
    // What a loose cut may keep beyond TOPK: a quarter of the room a cut leaves for two blocks.
    constexpr int SLACK = (CAP - 2 * kBlock - TOPK) / 4;
    // Below TOPK (a sample's rank) an eighth of the rank at most: the threshold after the sample
    // sets how many keys the rest of the range admits.
    const int slack = min(SLACK, rank / 8);
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
    int at = n;
    const u32 tau = kth_largest<E>(k, live, rank, red, parity, grp, at, LOOSE ? rank + slack : 0);
    const bool loose = LOOSE && at <= rank + slack;  // uniform
    int gt = 0, eq = 0;
    if (!loose) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
            gt += (live[e] && k[e] > tau) ? 1 : 0;
            eq += (live[e] && k[e] == tau) ? 1 : 0;
        }
        gt = block_sum(gt, red, parity, grp);
        eq = block_sum(eq, red, parity, grp);
    }
    // Where ties at tau keep more than rank + slack but every candidate at or above tau fits in
    // `keep_ties_within`, all of them stay and the threshold admits keys from tau on (as a loose
    // cut's): a sample's cut then leaves the rest of a row of equal keys no reason to be redone.
    const bool from_tau = loose || gt + eq <= keep_ties_within;  // uniform
    if (!loose && from_tau) at = gt + eq;
    const int need = rank - gt;  // ties at tau to keep: the lowest positions
    u32 tie_cut = 0;             // keep a tie when ~position >= tie_cut
    if (!from_tau && eq > need) {
        u32 inv[E];
        bool tie[E];
#pragma unroll
        for (int e = 0; e < E; ++e) {
            inv[e] = ~(u32)p[e];
            tie[e] = live[e] && k[e] == tau;
        }
        int ties = eq;
        tie_cut = kth_largest<E>(inv, tie, need, red, parity, grp, ties);
    }
    // Ordered compaction: a thread's kept entries go after those of the lower threads.
    bool keep[E];
    int mine = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        keep[e] = live[e] && (from_tau ? k[e] >= tau : k[e] > tau || (k[e] == tau && ~(u32)p[e] >= tie_cut));
        mine += keep[e] ? 1 : 0;
    }
    // (The scan's barrier also keeps every thread's reads of its entries ahead of the writes.)
    int base = block_scan(mine, red, parity, grp).before;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        if (keep[e]) {
            keys[base] = k[e];
            pos[base] = p[e];
            ++base;
        }
    }
    grp.sync();
    kept = from_tau ? at : rank;
    // Exact: the worst kept tie is at position ~tie_cut (the highest of the `need` lowest).
    tie = from_tau ? 0 : eq > need ? (i32) ~tie_cut : 0x7fffffff;
    return from_tau ? (tau > 0u ? tau - 1u : 0u) : tau;
}

__host__ __device__ constexpr int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// Issues the 64 x (2 ACC) product of a key stage and a Q tile (shared-memory addresses; the Q
// tile canonical K-major: 16-byte core rows, K-adjacent core matrices 128 B apart, 8-row groups
// 1024 B apart; the key stage the same or, with A_SWIZZLED, 128-byte rows in the 128-byte
// swizzle as a TMA copy writes them) into acc, asynchronously: four k-steps of 32 channels (two core matrices, 256 B),
// one commit group. The caller waits.
template <int ACC, bool A_SWIZZLED = false>
__device__ __forceinline__ void issue_block_product(float (&acc)[ACC], u32 stage, u32 q) {
    static_assert(ACC == 64 || ACC == 32, "N = 128 or 64");
    fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 32; ++ks) {
        // A in the 128-byte swizzle (1024-byte aligned; a k-step 32 bytes further along the
        // rows) or canonical (a k-step two core matrices, 256 bytes, further).
        const u64 da = A_SWIZZLED ? make_smem_desc_sw128(stage + ks * 32, 1024)
                                  : make_smem_desc(stage + ks * 256, 128, 1024);
        const u64 db = make_smem_desc(q + ks * 256, 128, 1024);
        if constexpr (ACC == 64) {
            wgmma_n128(acc, da, db, ks > 0 ? 1u : 0u);
        } else {
            wgmma_qk(acc, da, db, ks > 0 ? 1u : 0u);
        }
    }
    wgmma_commit();
}

// A token's row from its n <= TOPK selected candidates (positions in `pos`, every one in
// [lo, hi); the token's buffer of 2 CAP words, its keys then its positions, is free once they are
// read): the positions in ascending order written as index_of(position), -1 after them. No
// comparison sort: the positions are marked in a bitmap over the range, kept in the buffer
// (64 CAP positions at a time: a longer range takes several windows), and each thread writes the
// positions of its run of the bitmap's words at the number of marks before the run. Every
// thread of the warpgroup calls it.
template <int CAP, int TOPK, class IndexOf>
__device__ __forceinline__ void write_sorted_row(u32* keys, const i32* pos, int n, int lo, int hi, int* red,
                                                 int& parity, const Group& grp, i32* out, IndexOf index_of) {
    constexpr int E = (TOPK + kThreads - 1) / kThreads;  // positions a thread holds
    constexpr int WORDS = 2 * CAP;                       // the bitmap: the token's whole buffer
    constexpr int WINDOW = 32 * WORDS;                   // positions one bitmap covers
    i32 mine[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = grp.tid + e * kThreads;
        mine[e] = i < n ? pos[i] : -1;
    }
    u32* bits = keys;  // [WORDS]
    const int windows = hi > lo && n > 0 ? (int)(((i64)hi - lo + WINDOW - 1) / WINDOW) : 0;
    int written = 0;
    for (int k = 0; k < windows; ++k) {  // uniform over the warpgroup
        const int w0 = lo + k * WINDOW;
        const int span = min(hi - w0, WINDOW);  // positions w0 .. w0 + span - 1
        const int words = (span + 31) >> 5;
        grp.sync();  // every position read (and the last window's words) before the clear
        for (int i = grp.tid; i < words; i += kThreads) bits[i] = 0u;
        grp.sync();
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const u32 d = (u32)(mine[e] - w0);
            if (mine[e] >= 0 && d < (u32)span) atomicOr(bits + (d >> 5), 1u << (d & 31));
        }
        grp.sync();
        // Thread tid's run: words [tid * per, tid * per + per); its marks go after those of the
        // runs before it (an exclusive scan over the warpgroup). An odd run length keeps a warp's
        // 32 reads of word i of their runs in 32 different banks (an even one puts them in 16 or
        // fewer: up to 32-way conflicts at 32 words a run).
        const int per = ((words + kThreads - 1) / kThreads) | 1;
        const int run_lo = min(grp.tid * per, words), run_hi = min(run_lo + per, words);
        int marks = 0;
        for (int i = run_lo; i < run_hi; ++i) marks += __popc(bits[i]);
        const GroupScan scan = block_scan(marks, red, parity, grp);
        int at = written + scan.before;
        for (int i = run_lo; i < run_hi; ++i) {
            for (u32 x = bits[i]; x != 0u; x &= x - 1u) out[at++] = index_of(w0 + 32 * i + __ffs(x) - 1);
        }
        written += scan.total;
    }
    for (int i = written + grp.tid; i < TOPK; i += kThreads) out[i] = -1;
    grp.sync();  // the buffer is read before the caller reuses it
}

}  // namespace indexer
