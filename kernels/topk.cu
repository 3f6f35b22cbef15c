// shapeproof — exact top-k of rows of f32 scores (docs/kernels/indexer.md §7.9), sm_90.
// Compiled after common.cuh.
//
// One CTA a row, 1024 threads. Row r's candidates are columns [a, b) of its scores, with
// a = clamp(starts[r], 0, width) and b = clamp(ends[r], a, width). The row written is the
// TOPK columns with the largest scores, ascending, then -1; scores order as the indexer's
// (order_key: -0 below +0, NaN as -inf), ties go to the lower column.
//
// Design. The TOPK-th largest order key (tau) is found by a radix selection over the row in
// global memory (it stays in L2 after the first pass): four passes of an 8-bit digit, each a
// 256-bin histogram of the keys that match the digits found so far, counted with one shared
// atomic per distinct digit of a warp (__match_any_sync: scores cluster in few top digits).
// The selection also yields how many of the keys equal to tau belong to the row (`need`). A
// last pass walks the row in position order, tiles of 1024 x 16 columns (each thread 16
// consecutive columns), and writes every key above tau and the first `need` keys equal to tau
// at their rank among the kept, found by one block-wide scan a tile: the row comes out sorted
// without a sort.

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
constexpr int kRun = 16;                   // consecutive columns a thread takes in the last pass
constexpr int kTile = kThreads * kRun;     // columns a tile of the last pass

// The u32 whose unsigned order is the float's order (NaN as -inf, -0 below +0): the
// indexer's (lightning_indexer.cu), so both select alike.
__device__ __forceinline__ u32 order_key(float v) {
    if (v != v) v = __int_as_float(0xff800000);
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive scan of `v` over the CTA, and the CTA's total; `scratch` holds kWarps + 1 ints.
// Two barriers; every thread calls it.
__device__ __forceinline__ int block_exclusive_scan(int v, int* scratch, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int incl = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int w = scratch[lane];  // kWarps == 32
        int s = w;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int o = __shfl_up_sync(0xffffffffu, s, d);
            if (lane >= d) s += o;
        }
        scratch[lane] = s - w;  // warps before this one
        if (lane == 31) scratch[kWarps] = s;
    }
    __syncthreads();
    total = scratch[kWarps];
    const int before = scratch[warp] + incl - v;
    __syncthreads();  // scratch read before the next scan writes it
    return before;
}
}  // namespace topk

template <int TOPK>
__global__ void __launch_bounds__(topk::kThreads, 1) topk_kernel(const __grid_constant__ TopkParams p) {
    using namespace topk;
    static_assert(TOPK % 128 == 0 && TOPK <= 2048, "TOPK a multiple of 128 up to 2048");
    __shared__ int hist[256];
    __shared__ int found[2];  // the digit's bin, the rank left inside it
    __shared__ int scratch[kWarps + 1];
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    const i64 width = p.width;
    const i64 a = min(max((i64)p.starts[row], (i64)0), width);
    const i64 b = min(max((i64)p.ends[row], a), width);
    const int n = (int)(b - a);  // the host bounds width to i32
    const float* scores = p.scores + (i64)row * width + a;
    i32* out = p.indices + (i64)row * TOPK;

    if (n <= TOPK) {  // every candidate is kept
        for (int i = tid; i < TOPK; i += kThreads) out[i] = i < n ? (i32)(a + i) : -1;
        return;
    }

    // tau, the TOPK-th largest key, a digit at a time from the top.
    u32 prefix = 0, mask = 0;
    int rank = TOPK;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
        __syncthreads();
        for (int base = 0; base < n; base += 4 * kThreads) {  // uniform: whole warps take part
            u32 key[4];
            bool live[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = base + u * kThreads + tid;
                live[u] = i < n;
                key[u] = live[u] ? order_key(scores[i]) : 0u;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const bool take = live[u] && (key[u] & mask) == prefix;
                const u32 active = __ballot_sync(0xffffffffu, take);
                if (take) {
                    const u32 digit = (key[u] >> shift) & 255u;
                    const u32 peers = __match_any_sync(active, digit);
                    if (lane == __ffs(peers) - 1) atomicAdd(hist + digit, __popc(peers));
                }
            }
        }
        __syncthreads();
        if (tid < 32) {
            // Lane l sums bins 255 - 8l .. 248 - 8l (from the top), then the lanes scan.
            int mine = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) mine += hist[255 - 8 * lane - j];
            int incl = mine;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int o = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d) incl += o;
            }
            const int above = incl - mine;  // keys in the bins above lane l's
            if (above < rank && incl >= rank) {
                int acc = above;
                for (int j = 0; j < 8; ++j) {
                    const int bin = 255 - 8 * lane - j;
                    if (acc + hist[bin] >= rank) {
                        found[0] = bin;
                        found[1] = rank - acc;
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
        __syncthreads();  // found[] and hist[] read before the next digit's writes
    }
    const u32 tau = prefix;
    const int need = rank;  // keys equal to tau that are kept: the first `need` of them

    // The kept columns in position order: keys above tau, and ties until `need` are taken.
    int gt_done = 0, eq_done = 0;  // over the earlier tiles
    for (int tile = 0; tile < n; tile += kTile) {
        const int first = tile + tid * kRun;
        u32 key[kRun];
        int gt = 0, eq = 0;
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
            const int i = first + j;
            key[j] = i < n ? order_key(scores[i]) : 0u;  // 0: below every key, never kept
            gt += (i < n && key[j] > tau) ? 1 : 0;
            eq += (i < n && key[j] == tau) ? 1 : 0;
        }
        // Both counts in one scan: eq in the low 16 bits (a tile holds at most 16384 columns).
        int total;
        const int before = block_exclusive_scan((gt << 16) | eq, scratch, total);
        int gt_before = gt_done + (before >> 16), eq_before = eq_done + (before & 0xffff);
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
            const bool above = first + j < n && key[j] > tau;
            const bool tie = first + j < n && key[j] == tau;
            if (above || (tie && eq_before < need)) {
                out[gt_before + min(eq_before, need)] = (i32)(a + first + j);
            }
            gt_before += above ? 1 : 0;
            eq_before += tie ? 1 : 0;
        }
        gt_done += total >> 16;
        eq_done += total & 0xffff;
    }
}
