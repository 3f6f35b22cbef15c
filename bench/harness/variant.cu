// One kernel variant of the sparse MLA prefill harness, compiled in a namespace of its own so
// that several copies of a kernel file (the committed one and a candidate) link into one
// program. Build flags (bench/harness/build.sh sets them):
//   -DVARIANT_NAME=<identifier>    the variant's name (namespace and entry point suffix)
//   -DVARIANT_FILE='"<path>"'      the kernel source: a copy of kernels/sparse_mla_narrow.cu or
//                                  kernels/sparse_mla_prefill.cu
//   -DVARIANT_WIDE=0 | 1           0: a narrow kernel (8, 16, 32 or 64 heads per tile, persistent
//                                  grid); 1: a 64-head kernel (one CTA per row and head tile,
//                                  or, where its file defines SPARSE_MLA_WIDE_PERSISTENT, a
//                                  persistent grid of one CTA an SM)
//   -DVARIANT_GRID=<n>             optional (narrow, or a persistent 64-head kernel): a
//                                  persistent grid of n CTAs instead of one per resident slot
//                                  (many rows per CTA: checks the persistent loop)
#include <cuda_runtime.h>

#include <cstddef>

#include "harness.h"

#define HARNESS_CAT2(a, b) a##b
#define HARNESS_CAT(a, b) HARNESS_CAT2(a, b)

namespace VARIANT_NAME {
#include "../../kernels/common.cuh"
#include "../../kernels/sparse_mla_common.cuh"
#include VARIANT_FILE

// SMs of device 0, asked once: the persistent grids' size.
static int sm_count() {
    static int sms = 0;
    if (!sms) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    return sms;
}

#if VARIANT_WIDE
template <int D, bool L, bool S>
static int go(const SparseMlaParams& p, int /*tile*/, cudaStream_t st) {
    constexpr int bytes = sparse_mla::Smem<D>::kBytes;
    auto k = sparse_mla_prefill_kernel<D, L, S>;
    static bool once = false;
    if (!once) {
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        once = true;
    }
    int grid = p.head_tiles * p.s_q;
#ifdef SPARSE_MLA_WIDE_PERSISTENT
    // A persistent kernel file (it defines the macro): one CTA an SM at most.
#ifdef VARIANT_GRID
    const int cap = VARIANT_GRID;  // fewer CTAs, many items each: checks the persistent loop
#else
    const int cap = sm_count();
#endif
    grid = grid < cap ? grid : cap;
#endif
    k<<<grid, sparse_mla::kThreads, bytes, st>>>(p);
    return 0;
}
template <int D, bool L, bool S>
static int go_tile(const SparseMlaParams& p, int tile, cudaStream_t st) {
    return tile == 64 ? go<D, L, S>(p, tile, st) : -1;
}
#else
template <int D, int H, bool L, bool S>
static int go(const SparseMlaParams& p, cudaStream_t st) {
    using Sm = sparse_mla_narrow::Smem<D, H>;
    auto k = sparse_mla_narrow_kernel<D, H, L, S>;
    static bool once = false;
    if (!once) {
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Sm::kBytes);
        once = true;
    }
    const int items = p.head_tiles * p.s_q;
#ifdef VARIANT_GRID
    const int grid = VARIANT_GRID;
#else
    const int grid = sm_count() * sparse_mla_narrow::kCtasPerSmFor<D, H>;
#endif
    k<<<items < grid ? items : grid, sparse_mla_narrow::kThreadsFor<H>, Sm::kBytes, st>>>(p);
    return 0;
}
template <int D, bool L, bool S>
static int go_tile(const SparseMlaParams& p, int tile, cudaStream_t st) {
    switch (tile) {
        case 8: return go<D, 8, L, S>(p, st);
        case 16: return go<D, 16, L, S>(p, st);
        case 32: return go<D, 32, L, S>(p, st);
        case 64: return go<D, 64, L, S>(p, st);
        default: return -1;
    }
}
#endif

template <int D>
static int go_opts(const SparseMlaParams& p, int tile, int opts, cudaStream_t st) {
    switch (opts) {
        case 0: return go_tile<D, false, false>(p, tile, st);
        case 1: return go_tile<D, true, false>(p, tile, st);
        default: return go_tile<D, true, true>(p, tile, st);
    }
}
}  // namespace VARIANT_NAME

// The host copy of the parameter block must match the kernels' field for field.
static_assert(sizeof(HarnessParams) == sizeof(VARIANT_NAME::SparseMlaParams), "parameter block size");
static_assert(offsetof(HarnessParams, sm_scale) == offsetof(VARIANT_NAME::SparseMlaParams, sm_scale) &&
                  offsetof(HarnessParams, topk) == offsetof(VARIANT_NAME::SparseMlaParams, topk),
              "parameter block layout");

// The variant's entry point (declared in harness.h).
int HARNESS_CAT(launch_, VARIANT_NAME)(const void* params, int d_qk, int tile, int opts,
                                       cudaStream_t stream) {
    const auto& p = *reinterpret_cast<const VARIANT_NAME::SparseMlaParams*>(params);
    return d_qk == 576 ? VARIANT_NAME::go_opts<576>(p, tile, opts, stream)
                       : VARIANT_NAME::go_opts<512>(p, tile, opts, stream);
}
