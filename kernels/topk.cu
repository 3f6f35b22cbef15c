// shapeproof — exact top-k of rows of f32 scores (docs/kernels/indexer.md §7.9), sm_90.
// Compiled after common.cuh.
//
// Row r's candidates are columns [a, b) of its scores, with a = clamp(starts[r], 0, width) and
// b = clamp(ends[r], a, width). The row written is the TOPK columns with the largest scores,
// ascending, then -1; scores order as the indexer's (order_key: -0 below +0, NaN as -inf), ties
// go to the lower column.
//
// Design. A cluster of CLUSTER CTAs (1024 threads each; 16 for a few rows, down to 1 for batches
// that fill the GPU, the host's choice) takes a row; CTA c of the cluster owns the c-th
// contiguous slice of the row's candidates. The slice is read from global memory once, every
// thread with kLoads loads in flight, and kept in shared memory as order keys when the launch
// gave the room (`%dynamic_smem_size`; otherwise each pass reads global memory again). The
// TOPK-th largest order key (tau) is found by a radix selection of three digits (11, 11 and 10
// bits from the top): a CTA counts its slice's keys that match the digits found so far into a
// 2048-bin shared histogram, adds its nonzero bins into every CTA's cluster total (remote
// reductions in distributed shared memory: scores cluster in few bins, so few of them), and
// after the cluster barrier every CTA finds the same bin in its own copy (a block scan from the
// top). The selection stops early when every key of the chosen bin is kept. It also yields how
// many keys at the cut are kept (`need`: the first ones in column order). Last, every warp walks
// a contiguous part of its CTA's slice twice: once to count the kept keys (a scan over the
// warps, then over the cluster's CTAs in distributed shared memory), once to write each kept
// column at its rank, so the row comes out sorted without a sort. The cluster's barrier protocol
// (histogram copies zeroed a pass ahead, counts read across CTAs behind a split barrier) is
// model-checked by bench/harness/topk_cluster_protocol.py.

// Mirrored by `TopkParams` in src/ops/topk/cuda.rs (checked by the NVRTC tests).
struct TopkParams {
    const float* scores;  // [rows, width]
    const i32* starts;    // [rows]
    const i32* ends;      // [rows]
    i32* indices;         // [rows, TOPK]
    i64 width;
    i32 rows;
};

namespace topk {
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;               // an 11-bit digit
constexpr int kLoads = 8;                 // global loads a thread keeps in flight
// Digits from the top: bits 31..21, 20..10 and 9..0.
__device__ __forceinline__ int digit_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every CTA of the cluster arrives (its shared-memory writes released) ...
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
// ... and waits for all the others (their writes acquired).
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The address of `local` (a shared-memory address of this CTA) in CTA `rank` of the cluster.
__device__ __forceinline__ u32 remote_addr(const int* local, u32 rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"(smem_addr(local)), "r"(rank));
    return remote;
}

// The int at `local` in CTA `rank` of the cluster.
__device__ __forceinline__ int load_remote(const int* local, u32 rank) {
    int v;
    asm volatile("ld.shared::cluster.s32 %0, [%1];"
                 : "=r"(v) : "r"(remote_addr(local, rank)) : "memory");
    return v;
}

// Adds `v` to the int at `local` in CTA `rank` of the cluster.
__device__ __forceinline__ void add_remote(int* local, u32 rank, int v) {
    asm volatile("red.relaxed.cluster.shared::cluster.add.s32 [%0], %1;"
                 :: "r"(remote_addr(local, rank)), "r"(v) : "memory");
}

// The cluster barrier for a cluster of C CTAs, split in its two halves (a CTA barrier when C
// is 1). Every thread calls both, in turn.
template <int C>
__device__ __forceinline__ void sync_arrive() {
    if constexpr (C > 1) cluster_arrive(); else __syncthreads();
}
template <int C>
__device__ __forceinline__ void sync_wait() {
    if constexpr (C > 1) cluster_wait();
}

__device__ __forceinline__ u32 dynamic_smem_bytes() {
    u32 r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

// Counts `key` into `hist` when it is live and matches the digits found so far (`mask`,
// `prefix`). Warp-wide: every lane calls it. A warp whose taken keys all share one digit (a
// run of ties) adds them with one atomic instead of 32 on one address.
__device__ __forceinline__ void count_key(int* hist, u32 key, bool live, u32 mask, u32 prefix,
                                          int shift, u32 digit_mask) {
    const bool take = live && (key & mask) == prefix;
    const u32 active = __ballot_sync(0xffffffffu, take);
    if (active == 0) return;  // warp-uniform
    const u32 digit = (key >> shift) & digit_mask;
    const int leader = __ffs(active) - 1;
    const u32 first = __shfl_sync(0xffffffffu, digit, leader);
    if (__all_sync(0xffffffffu, !take || digit == first)) {
        if ((int)(threadIdx.x & 31) == leader) atomicAdd(hist + first, __popc(active));
    } else if (take) {
        atomicAdd(hist + digit, 1);
    }
}
}  // namespace topk

template <int TOPK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(topk::kThreads, 1)
    topk_kernel(const __grid_constant__ TopkParams p) {
    using namespace topk;
    static_assert(TOPK % 128 == 0 && TOPK <= 2048, "TOPK a multiple of 128 up to 2048");
    static_assert(CLUSTER == 1 || CLUSTER == 2 || CLUSTER == 4 || CLUSTER == 8 || CLUSTER == 16,
                  "a cluster of 1, 2, 4, 8 or 16 CTAs (16 is non-portable: the host allows it)");
    extern __shared__ u32 cache[];    // [slice]: the slice's order keys, when they fit
    __shared__ int hist[kBins];       // this CTA's counts of a digit (clusters of 2 or more)
    __shared__ int total[2][kBins];   // the cluster's counts: a pass's, and the next one's zeroed
    __shared__ int found[3];          // the digit's bin, the rank left in it, the bin's count
    __shared__ int scratch[kWarps];   // the warps' totals of the bin search
    __shared__ int warp_gt[kWarps], warp_eq[kWarps];
    __shared__ int cta_counts[2];     // this CTA's kept keys above the cut and at it
    __shared__ int before_cta[2];     // the same over the cluster's earlier CTAs
    const u32 crank = cluster_rank();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const i64 width = p.width;
    const u32 room = dynamic_smem_bytes();
    int buf = 0;  // the total a pass counts into; total[buf ^ 1] is zeroed for the next pass
    for (int i = tid; i < kBins; i += kThreads) total[0][i] = 0;
    sync_arrive<CLUSTER>();  // zero before any CTA of the cluster adds into it
    sync_wait<CLUSTER>();

    for (i64 row = blockIdx.x / CLUSTER; row < p.rows; row += gridDim.x / CLUSTER) {
        const i64 a = min(max((i64)p.starts[row], (i64)0), width);
        const i64 b = min(max((i64)p.ends[row], a), width);
        const int n = (int)(b - a);  // the host bounds width to i32
        i32* out = p.indices + row * TOPK;
        if (n <= TOPK) {  // every candidate is kept (uniform over the cluster: no barrier)
            for (int i = (int)crank * kThreads + tid; i < TOPK; i += CLUSTER * kThreads)
                out[i] = i < n ? (i32)(a + i) : -1;
            continue;
        }
        // This CTA's slice: [lo, lo + m) of the row's candidates.
        const int chunk = (int)(((i64)n + CLUSTER - 1) / CLUSTER);
        const int lo = min((int)crank * chunk, n);
        const int m = min(chunk, n - lo);
        const float* slice = p.scores + row * width + a + lo;
        const bool cached = (u64)chunk * sizeof(u32) <= room;

        // The selection: prefix/mask are the digits found so far, rank the keys still to take
        // among those matching them.
        u32 prefix = 0, mask = 0;
        int rank = TOPK;
        for (int pass = 0; pass < 3; ++pass) {
            const int shift = digit_shift(pass);
            const u32 digit_mask = pass == 2 ? 0x3ffu : 0x7ffu;
            // No CTA adds into total[buf ^ 1] before this pass's cluster barrier, and this
            // CTA's last reads of it (two passes ago) are behind the barrier that ended them.
            for (int i = tid; i < kBins; i += kThreads) total[buf ^ 1][i] = 0;
            int* h = CLUSTER == 1 ? total[buf] : hist;
            if constexpr (CLUSTER > 1) {
                for (int i = tid; i < kBins; i += kThreads) hist[i] = 0;
            }
            __syncthreads();
            if (pass == 0 || !cached) {
                for (int base = 0; base < m; base += kLoads * kThreads) {
                    float v[kLoads];
#pragma unroll
                    for (int u = 0; u < kLoads; ++u) {
                        const int i = base + u * kThreads + tid;
                        v[u] = i < m ? slice[i] : 0.0f;
                    }
#pragma unroll
                    for (int u = 0; u < kLoads; ++u) {
                        const int i = base + u * kThreads + tid;
                        const u32 key = order_key(v[u]);
                        if (cached && i < m) cache[i] = key;
                        count_key(h, key, i < m, mask, prefix, shift, digit_mask);
                    }
                }
            } else {
                for (int base = 0; base < m; base += kThreads) {  // uniform: whole warps
                    const int i = base + tid;
                    count_key(h, i < m ? cache[i] : 0u, i < m, mask, prefix, shift, digit_mask);
                }
            }
            if constexpr (CLUSTER > 1) {
                __syncthreads();  // this CTA's histogram is complete: add it to every CTA's total
                for (int i = tid; i < kBins; i += kThreads) {
                    const int v = hist[i];
                    if (v != 0) {
#pragma unroll
                        for (int c = 0; c < CLUSTER; ++c) add_remote(&total[buf][i], c, v);
                    }
                }
            }
            sync_arrive<CLUSTER>();  // this CTA's counts are in ...
            sync_wait<CLUSTER>();    // ... and every other CTA's
            // Thread t takes bins 2047 - 2t and 2046 - 2t: bins from the top. The keys in the
            // bins above its two: a scan within the warp, then over the warps' totals, which
            // every warp scans for itself (one barrier).
            const int hi = kBins - 1 - 2 * tid;
            const int hi_count = total[buf][hi], lo_count = total[buf][hi - 1];
            const int mine = hi_count + lo_count;
            int incl = mine;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int o = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d) incl += o;
            }
            if (lane == 31) scratch[warp] = incl;
            __syncthreads();
            const int warp_total = scratch[lane];  // kWarps == 32
            int warps_incl = warp_total;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int o = __shfl_up_sync(0xffffffffu, warps_incl, d);
                if (lane >= d) warps_incl += o;
            }
            const int above =
                __shfl_sync(0xffffffffu, warps_incl - warp_total, warp) + incl - mine;
            if (above < rank && above + mine >= rank) {
                const bool in_hi = above + hi_count >= rank;
                found[0] = in_hi ? hi : hi - 1;
                found[1] = in_hi ? rank - above : rank - above - hi_count;
                found[2] = in_hi ? hi_count : lo_count;
            }
            __syncthreads();
            prefix |= (u32)found[0] << shift;
            mask |= digit_mask << shift;
            const bool whole_bin = found[1] == found[2];  // every key of the bin is kept
            rank = found[1];
            buf ^= 1;
            // found[] and scratch[] are written again only after the next pass's first
            // barrier, which every thread reaches after reading them here.
            if (whole_bin) break;
        }
        const int need = rank;  // keys at the cut ((key & mask) == prefix) that are kept

        // Kept keys in column order. Warp w walks [w0, w1) of the slice, 32 columns a step.
        const int part = (m + kWarps - 1) / kWarps;
        const int w0 = min(warp * part, m), w1 = min(w0 + part, m);
        int gt = 0, eq = 0;
        for (int base = w0; base < w1; base += 32) {
            const int i = base + lane;
            const u32 key = i < w1 ? (cached ? cache[i] : order_key(slice[i])) & mask : 0u;
            gt += __popc(__ballot_sync(0xffffffffu, i < w1 && key > prefix));
            eq += __popc(__ballot_sync(0xffffffffu, i < w1 && key == prefix));
        }
        if (lane == 0) {
            warp_gt[warp] = gt;
            warp_eq[warp] = eq;
        }
        __syncthreads();
        if (warp == 0) {  // exclusive scans over the warps, and this CTA's totals
            const int g = warp_gt[lane], e = warp_eq[lane];
            int gs = g, es = e;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int go = __shfl_up_sync(0xffffffffu, gs, d);
                const int eo = __shfl_up_sync(0xffffffffu, es, d);
                if (lane >= d) {
                    gs += go;
                    es += eo;
                }
            }
            warp_gt[lane] = gs - g;
            warp_eq[lane] = es - e;
            if (lane == 31) {
                cta_counts[0] = gs;
                cta_counts[1] = es;
            }
        }
        sync_arrive<CLUSTER>();  // this CTA's counts are published ...
        sync_wait<CLUSTER>();    // ... and every earlier CTA's too
        if (tid < 2) {
            int s = 0;
            for (u32 c = 0; c < crank; ++c) s += load_remote(cta_counts + tid, c);
            before_cta[tid] = s;
        }
        __syncthreads();
        sync_arrive<CLUSTER>();  // done reading the other CTAs' counts (waited for before they change)
        int gt_before = before_cta[0] + warp_gt[warp];
        int eq_before = before_cta[1] + warp_eq[warp];
        for (int base = w0; base < w1; base += 32) {
            const int i = base + lane;
            const u32 key = i < w1 ? (cached ? cache[i] : order_key(slice[i])) & mask : 0u;
            const bool above = i < w1 && key > prefix;
            const bool tie = i < w1 && key == prefix;
            const u32 above_mask = __ballot_sync(0xffffffffu, above);
            const u32 tie_mask = __ballot_sync(0xffffffffu, tie);
            const u32 lower = (1u << lane) - 1u;
            const int g = gt_before + __popc(above_mask & lower);
            const int e = eq_before + __popc(tie_mask & lower);
            const int at = g + min(e, need);  // < TOPK by the selection; guarded all the same
            if ((above || (tie && e < need)) && at < TOPK) out[at] = (i32)(a + lo + i);
            gt_before += __popc(above_mask);
            eq_before += __popc(tie_mask);
        }
        sync_wait<CLUSTER>();  // no CTA reuses cta_counts (or exits) while another may read it
    }
}
