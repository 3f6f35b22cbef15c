// Gather rates of the sparse MLA prefill's row gather, measured alone: every CTA gathers the
// `topk` indexed rows (d_qk = 576 bytes each) of one query row into a shared-memory ring, with
// no math beside it. It answers "how fast can this GPU move the rows, by which copy path", the
// bound the prefill kernels are compared with (bench/NOTES.md, "Gather rates in isolation").
//
//   gather_rates        prints one table per (s_kv, CTAs per query row): ms and TB/s per path
//
// Paths: 16-byte `cp.async.cg` with two lane layouts (8 rows x 64 bytes per warp instruction,
// the 64-head kernel's; 4 rows x 128 bytes) and ring depths; one bulk copy (`cp.async.bulk`) per
// row into 32-row stages, as the narrow kernel; plain 16-byte loads stored to shared memory;
// and four that change the source rows' pitch and the destination's layout one at a time.
// Indices are uniform random over [0, s_kv); 4096 query rows, topk 2048. Built by build.sh
// beside the harness; needs only the CUDA runtime.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "harness.h"

using u32 = uint32_t;

constexpr int kD = 576;        // bytes per gathered row
constexpr int kTopk = 2048;    // rows per query row
constexpr int kQueryRows = 4096;
constexpr int kChunks = kD / 16;

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async_cg16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// CTA b gathers the rows of query row b / tiles (`tiles` CTAs per query row are neighbours in
// launch order, as the head tiles of a row in the prefill kernels).
__device__ __forceinline__ const int* row_indices(const int* idx, int tiles) {
    return idx + (size_t)(blockIdx.x / tiles) * kTopk;
}

// 16-byte cp.async into a ring of SLOTS blocks of 64 rows; block b waits for block b - SLOTS
// (cp.async groups) before reusing its slot. LAYOUT 0: a warp instruction covers 8 rows x 64
// bytes (lane = row % 8 + 8 * (chunk % 4)); LAYOUT 1: 4 rows x 128 bytes (lane = chunk % 8 +
// 8 * (row % 4)). Each thread always writes the same slot addresses: no cross-thread hazard.
template <int LAYOUT, int SLOTS, int THREADS>
__global__ void __launch_bounds__(THREADS)
    gather_cp_async(const uint8_t* kv, const int* idx, int tiles, u32* sink) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int kRowsPerWarp = 64 / (THREADS / 32);
    const int* ir = row_indices(idx, tiles);
    const u32 base = smem_u32(smem);
    for (int b = 0; b < kTopk / 64; ++b) {
        const u32 slot = base + (u32)((b % SLOTS) * 64 * kD);
        if (LAYOUT == 0) {
            for (int r0 = 0; r0 < kRowsPerWarp; r0 += 8) {
                const int row = warp * kRowsPerWarp + r0 + (lane & 7);
                const uint8_t* src = kv + (size_t)ir[b * 64 + row] * kD;
                for (int c = lane >> 3; c < kChunks; c += 4) {
                    cp_async_cg16(slot + row * kD + c * 16, src + c * 16);
                }
            }
        } else {
            for (int r0 = 0; r0 < kRowsPerWarp; r0 += 4) {
                const int row = warp * kRowsPerWarp + r0 + (lane >> 3);
                const uint8_t* src = kv + (size_t)ir[b * 64 + row] * kD;
                for (int c = lane & 7; c < kChunks; c += 8) {
                    cp_async_cg16(slot + row * kD + c * 16, src + c * 16);
                }
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" ::"n"(SLOTS - 1) : "memory");
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(sink, smem[5]);  // keeps the copies observable
}

// 16-byte cp.async of 8 rows x 64 bytes a warp instruction (the 64-head kernel's lane layout)
// with one factor changed at a time: PITCH 576 or 640 between source rows (640: every row
// 128-byte aligned; 576: every other row starts 64 bytes into a line); COLUMNS 1 lands piece q
// of row r at (64 q + r) * 64 (a warp instruction's 8 x 64 bytes contiguous, as the 64-head
// kernel's k_chunk layout), COLUMNS 0 at r * 576 + 64 q (row-major). All four timed within 1%
// of each other on an H100 (2026-12-07): neither factor costs.
template <int PITCH, int COLUMNS>
__global__ void __launch_bounds__(128) gather_pitch(const uint8_t* kv, const int* idx, int tiles,
                                                    u32* sink) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int kSlots = 4;
    const int* ir = row_indices(idx, tiles);
    const u32 base = smem_u32(smem);
    for (int b = 0; b < kTopk / 64; ++b) {
        const u32 slot = base + (u32)((b % kSlots) * 64 * kD);
        for (int r0 = 0; r0 < 16; r0 += 8) {
            const int r = warp * 16 + r0 + (lane & 7);
            const uint8_t* src = kv + (size_t)ir[b * 64 + r] * PITCH + (lane >> 3) * 16;
            for (int q = 0; q < kD / 64; ++q) {
                const u32 dst = COLUMNS ? (u32)((q * 64 + r) * 64) : (u32)(r * kD + q * 64);
                cp_async_cg16(slot + dst + (lane >> 3) * 16, src + q * 64);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" ::"n"(kSlots - 1) : "memory");
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(sink, smem[5]);
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred p;\nwait_%=:\nmbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n"
        "@!p bra wait_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// One bulk copy per row into STAGES stages of 32 rows at a pitch of kD + 16 (the narrow
// kernel's ring); warp w fills stages w, w + 4, ... (STAGES a multiple of the 4 warps, so a
// stage is only ever filled by one warp) and waits for a stage's previous fill before reusing it.
template <int STAGES>
__global__ void __launch_bounds__(128) gather_bulk(const uint8_t* kv, const int* idx, int tiles,
                                                   u32* sink) {
    static_assert(STAGES % 4 == 0, "stages are owned by one warp each");
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int kPitch = kD + 16;
    const int* ir = row_indices(idx, tiles);
    const u32 base = smem_u32(smem);
    const u32 bars = base + STAGES * 32 * kPitch;
    if (threadIdx.x < STAGES) mbar_init(bars + 8 * threadIdx.x, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    constexpr int kStagesPerRow = kTopk / 32;
    for (int j = warp; j < kStagesPerRow; j += 4) {
        const int slot = j % STAGES;
        const u32 bar = bars + 8 * slot;
        const int use = j / STAGES;
        if (use > 0) mbar_wait(bar, (u32)(use - 1) & 1u);
        if (lane == 0) mbar_arrive_expect_tx(bar, 32 * kD);
        __syncwarp();
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(base + (u32)(slot * 32 * kPitch + lane * kPitch)),
            "l"(kv + (size_t)ir[j * 32 + lane] * kD), "r"((u32)kD), "r"(bar)
            : "memory");
    }
    // Every stage's last fill has landed before the CTA exits.
    for (int slot = warp; slot < STAGES; slot += 4) {
        const int uses = (kStagesPerRow - slot + STAGES - 1) / STAGES;
        if (uses > 0) mbar_wait(bars + 8 * slot, (u32)(uses - 1) & 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(sink, smem[5]);
}

// Plain 16-byte loads through registers (8 in flight a thread), stored to two alternating
// shared-memory buffers; each thread always writes the same addresses.
template <int THREADS>
__global__ void __launch_bounds__(THREADS) gather_plain(const uint8_t* kv, const int* idx,
                                                        int tiles, u32* sink) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint4* buf = reinterpret_cast<uint4*>(smem);
    const int* ir = row_indices(idx, tiles);
    constexpr int kBlockChunks = 64 * kChunks;
    for (int b = 0; b < kTopk / 64; ++b) {
        uint4* dst = buf + (b % 2) * kBlockChunks;
        for (int e0 = threadIdx.x; e0 < kBlockChunks; e0 += 8 * THREADS) {
            uint4 v[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int e = e0 + k * THREADS;
                if (e < kBlockChunks) {
                    v[k] = __ldg(reinterpret_cast<const uint4*>(kv + (size_t)ir[b * 64 + e / kChunks] * kD) +
                                 e % kChunks);
                }
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int e = e0 + k * THREADS;
                if (e < kBlockChunks) dst[e] = v[k];
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(sink, smem[5]);
}

__global__ void fill_indices(int* idx, int n, int s_kv, u32 seed) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 h = (u32)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        idx[i] = (int)(h % (u32)s_kv);
    }
}

// Median of 7 timed launches after one warm-up.
template <typename F>
static float median_ms(F launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < 7; ++i) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[3];
}

template <typename K>
static void row(const char* name, K kernel, int threads, int smem_bytes, int grid,
                const uint8_t* kv, const int* idx, int tiles, u32* sink, double bytes) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    const float ms = median_ms([&] { kernel<<<grid, threads, smem_bytes>>>(kv, idx, tiles, sink); });
    printf("| %s | %.3f | %.2f |\n", name, ms, bytes / ms / 1e9);
}

int main() {
    for (int s_kv : {8192, 32768, 65536}) {
        for (int tiles : {1, 2}) {
            uint8_t* kv;
            int* idx;
            u32* sink;
            CK(cudaMalloc(&kv, (size_t)s_kv * kD));
            CK(cudaMemset(kv, 1, (size_t)s_kv * kD));
            CK(cudaMalloc(&idx, (size_t)kQueryRows * kTopk * 4));
            CK(cudaMalloc(&sink, 4));
            fill_indices<<<1024, 256>>>(idx, kQueryRows * kTopk, s_kv, 7);
            CK(cudaDeviceSynchronize());
            const int grid = kQueryRows * tiles;
            const double bytes = (double)grid * kTopk * kD;
            printf("\n(4096 query rows, s_kv %d, %d CTA(s) per query row, d_qk %d, topk %d): %.2f GB\n\n",
                   s_kv, tiles, kD, kTopk, bytes / 1e9);
            printf("| gather | ms | TB/s |\n|---|---|---|\n");
            row("cp.async 8 rows x 64 B, 4 slots of 64 rows, 128 threads", gather_cp_async<0, 4, 128>,
                128, 4 * 64 * kD, grid, kv, idx, tiles, sink, bytes);
            row("cp.async 8 rows x 64 B, 2 slots, 128 threads", gather_cp_async<0, 2, 128>, 128,
                2 * 64 * kD, grid, kv, idx, tiles, sink, bytes);
            // The depth the published-structure experiment has: two slots, one CTA a SM (its
            // shared memory asked for as 120 KB, so two CTAs cannot share an SM).
            row("cp.async 8 rows x 64 B, 2 slots, 128 threads, 1 CTA per SM",
                gather_cp_async<0, 2, 128>, 128, 120 * 1024, grid, kv, idx, tiles, sink, bytes);
            row("cp.async 4 rows x 128 B, 4 slots, 128 threads", gather_cp_async<1, 4, 128>, 128,
                4 * 64 * kD, grid, kv, idx, tiles, sink, bytes);
            row("bulk copy per row, 4 stages of 32 rows, 4 warps", gather_bulk<4>, 128,
                4 * 32 * (kD + 16) + 64, grid, kv, idx, tiles, sink, bytes);
            row("bulk copy per row, 8 stages of 32 rows, 4 warps", gather_bulk<8>, 128,
                8 * 32 * (kD + 16) + 64, grid, kv, idx, tiles, sink, bytes);
            row("plain 16-byte loads to shared memory, 256 threads", gather_plain<256>, 256,
                2 * 64 * kD, grid, kv, idx, tiles, sink, bytes);
            uint8_t* kv_aligned;
            CK(cudaMalloc(&kv_aligned, (size_t)s_kv * 640));
            CK(cudaMemset(kv_aligned, 1, (size_t)s_kv * 640));
            row("cp.async 8 rows x 64 B, pitch 576, rows to rows", gather_pitch<576, 0>, 128,
                4 * 64 * kD, grid, kv, idx, tiles, sink, bytes);
            row("cp.async 8 rows x 64 B, pitch 576, rows to 512-byte runs", gather_pitch<576, 1>,
                128, 4 * 64 * kD, grid, kv, idx, tiles, sink, bytes);
            row("cp.async 8 rows x 64 B, pitch 640, rows to rows", gather_pitch<640, 0>, 128,
                4 * 64 * kD, grid, kv_aligned, idx, tiles, sink, bytes);
            row("cp.async 8 rows x 64 B, pitch 640, rows to 512-byte runs", gather_pitch<640, 1>,
                128, 4 * 64 * kD, grid, kv_aligned, idx, tiles, sink, bytes);
            CK(cudaFree(kv_aligned));
            CK(cudaFree(kv));
            CK(cudaFree(idx));
            CK(cudaFree(sink));
        }
    }
    return 0;
}
