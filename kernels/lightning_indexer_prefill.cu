// Lightning indexer, prefill form: keys in rows (a chunk's history and itself). Compiled after
// common.cuh, sparse_mla_common.cuh, indexer_common.cuh and indexer_ws.cuh.

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
    TensorMap k_map;        // k as [s_kv rows, 128 bytes], boxes of 64 rows, 128-byte swizzle
};

namespace indexer {
// Consumer warpgroups of a prefill CTA: two at 64 heads, three at 32 (what shared memory holds:
// a candidate buffer a token). Mirrored by `prefill_warpgroups` in src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int prefill_wgs(int heads) { return heads == 32 ? 3 : 2; }
// Query tokens a prefill CTA takes, and its threads (with a producer warpgroup).
__host__ __device__ constexpr int prefill_tokens(int heads) { return prefill_wgs(heads) * kTokens; }
__host__ __device__ constexpr int prefill_threads(int heads) { return (prefill_wgs(heads) + 1) * kThreads; }

// Shared memory of a prefill CTA (ws_smem_bytes). Mirrored by `prefill_indexer_smem_bytes` in
// src/ops/indexer/cuda.rs.
__host__ __device__ constexpr int prefill_smem_bytes(int heads, int topk) {
    return ws_smem_bytes(heads, topk, prefill_wgs(heads));
}
static_assert(prefill_smem_bytes(32, 2048) <= 227 * 1024 && prefill_smem_bytes(64, 2048) <= 227 * 1024,
              "a prefill CTA's shared memory fits an SM");
}  // namespace indexer

// The prefill's key source: a CTA takes query tokens t0 .. t0 + tokens_per_cta - 1 (the heavier,
// later causal ones first), each with its clamped range of key rows [s_kv, 128] (scales [s_kv]); the index
// written for a key is its row. The key rows arrive by TMA (k_map; rows past s_kv as zeros).
struct RowKeys {
    static constexpr bool kTma = true;
    static constexpr int kTmaRank = 2;
    static constexpr bool kBulkScales = false;  // k_scale need only be 4-byte aligned
    static constexpr int kSampleStride = 8;     // the selection's sample: every 8th block first
    const IndexerParams& p;
    int t0;
    __device__ RowKeys(const IndexerParams& params, int tokens_per_cta)
        : p(params), t0(((int)gridDim.x - 1 - (int)blockIdx.x) * tokens_per_cta) {}
    __device__ int row(int g) const { return t0 + g < p.tokens ? t0 + g : -1; }
    __device__ void range(int g, int& a, int& b) const {
        a = min(max(p.key_start[t0 + g], 0), p.s_kv);
        b = min(max(p.key_end[t0 + g], a), p.s_kv);
    }
    __device__ bool block(int first, const u8*& keys, const float*& scales) const {
        keys = p.k + (i64)first * indexer::kD;
        scales = p.k_scale + first;
        return true;
    }
    __device__ bool present(int) const { return true; }
    __device__ const u8* base() const { return p.k; }
    __device__ const void* tensor_map() const { return &p.k_map; }
    __device__ bool box(int first, int& y, int& z) const {
        y = first;
        z = 0;
        return true;
    }
    __device__ const u8* q() const { return p.q; }
    __device__ const float* weights() const { return p.weights; }
    __device__ i32* indices() const { return p.indices; }
    template <int TOPK>
    __device__ bool write_partial(int, const u32*, const i32*, int, const indexer::Group&) const {
        return false;
    }
    __device__ i32 index_of(int s) const { return s; }
};

// The prefill: the warp-specialised CTA (indexer_ws.cuh) with two (64 heads) or three (32)
// consumer warpgroups over rows of keys, one CTA an SM.
template <int H_IDX, int TOPK, bool LOGITS_ONLY = false>
__global__ void __launch_bounds__(indexer::prefill_threads(H_IDX), 1)
    lightning_indexer_kernel(const __grid_constant__ IndexerParams p) {
    indexer_ws_body<H_IDX, TOPK, indexer::prefill_wgs(H_IDX), LOGITS_ONLY>(
        RowKeys(p, indexer::prefill_tokens(H_IDX)));
}
