// Shared declarations of the sparse MLA prefill harness (bench/harness/main.cu, and the
// gather-rate benchmark beside it): the CUDA error check, the host copy of the kernels' parameter
// block and the entry points of the variants linked in.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// Stops the program with the CUDA error, file and line when a runtime call fails.
#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e = (x);                                                               \
        if (e != cudaSuccess) {                                                            \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

// Host copy of `struct SparseMlaParams` (kernels/sparse_mla_common.cuh), field for field; the
// extents beside each field.
struct HarnessParams {
    const uint8_t* q;          // [s_q, h_q, d_qk] e4m3
    const uint8_t* kv;         // [s_kv, d_qk] e4m3
    const int* indices;        // [s_q, topk]
    const int* topk_length;    // [s_q] or nullptr
    const float* attn_sink;    // [h_q] or nullptr
    const float* q_scale;      // [1]
    const float* kv_scale;     // [1]
    uint16_t* out;             // [s_q, h_q, 512] bf16
    float* max_logits;         // [s_q, h_q]
    float* lse;                // [s_q, h_q]
    float sm_scale;
    int s_q;
    int s_kv;
    int h_q;
    int head_tiles;            // ceil(h_q / tile)
    int topk;
};

// A variant's entry point: launches it on `stream` for d_qk 512 or 576, head tile `tile` (8, 16
// or 32 for a narrow kernel, 64 for a 64-head kernel) and options `opts` (0 plain, 1 with top-k
// lengths, 2 with lengths and sinks). Returns -1 when the variant has no such tile.
using LaunchFn = int (*)(const void* params, int d_qk, int tile, int opts, cudaStream_t stream);

// The variants build.sh links in (bench/harness/variant.cu, one object each).
int launch_base(const void*, int, int, int, cudaStream_t);   // kernels/sparse_mla_narrow.cu
int launch_cand(const void*, int, int, int, cudaStream_t);   // a candidate narrow kernel
int launch_grid7(const void*, int, int, int, cudaStream_t);  // the candidate on 7 CTAs
int launch_wide(const void*, int, int, int, cudaStream_t);   // kernels/sparse_mla_prefill.cu
int launch_widecand(const void*, int, int, int, cudaStream_t);  // a candidate 64-head kernel
