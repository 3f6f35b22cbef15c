// shapeproof — sparse MLA decode over DeepSeek V3.2's FP8 cache (docs/kernels/mla_cache.md §8.5),
// sm_90a: f16 tensor cores (mma.sync m16n8k16) fed the cache's e4m3 bytes by one conversion
// instruction per two values (exact), the per-group scales folded into the partial scores and
// into P instead of into every K and V value, the top-k split over CTAs when the batch is too
// small to fill the GPU, and a combine kernel that merges the splits (launched as a programmatic
// dependent of the splits' kernel: its launch and start hide behind their tail).
// Compiled after common.cuh and sparse_mla_common.cuh (the mbarrier and bulk copy helpers,
// byte_perm; smem_addr is common.cuh's).
//
// One CTA = (query row, group of 16 heads, split of the top-k), 4 warps, two CTAs an SM. Per
// block of 64 top-k positions: the 64 cache rows (656 bytes each; an invalid slot is a zero row,
// never read) are copied into shared memory by the bulk copy engine, one copy a row completing
// on the buffer's mbarrier, double-buffered — block b + 1's copies are issued before block b is
// computed, and block b + 2's slots are read from global memory into registers meanwhile.
// - S = Q . K^T (M = 16 heads, N = 64 tokens, K = 576), each warp taking 16 tokens: the latent
//   part per 128-channel scale group g into a fresh accumulator, promoted as
//   S += s_k[t, g] . acc_g; Q's latent part is f16, scaled per head by a power of two that puts
//   its largest value in [2^13, 2^14) (bf16 values are then exact in f16 down to 2^-27 of the
//   head's largest), the scale multiplied back at the end; the RoPE part by bf16 mma on the
//   cache's bf16 values. Written to shared memory.
// - Every warp runs the same online softmax over the 64 scores of each head (identical
//   arithmetic, so identical running max and sum) and multiplies P by its own 128 dims of V —
//   one scale group g = warp — into its accumulators: P'[h, t] = 2^14 . P[h, t] . s_k[t, g] / m_g
//   in f16, where m_g is the largest scale of group g seen so far (so P' <= 2^14; the
//   accumulators, in units of m_g / 2^14, are rescaled when m_g grows, exactly: scales are
//   powers of two), V the raw e4m3 bytes converted to f16, and the output multiplied by
//   m_g / 2^14 at the end.
// - The epilogue stages the CTA's 16 x 512 results in the free row buffers and writes each head's
//   row with consecutive threads on consecutive 16 bytes (a thread's own results are 32 dims
//   of two heads, which a direct store would spread over 32 lines a warp instruction).
// H_Q = 8 runs one 16-head group whose last 8 heads have zero queries and are not written.

// Mirrored by `DecodeParams` in src/ops/sparse_mla_decode/cuda.rs (checked by the NVRTC tests).
struct DecodeParams {
    const bf16_t* q;       // [rows, H_Q, 576]
    const i32* indices;    // [rows, TOPK] cache slots
    const i32* lengths;    // [rows] or null
    const u8* cache;       // [slots, 656]
    bf16_t* out;           // [rows, H_Q, 512]
    float* lse;            // [rows, H_Q]
    float* part_o;         // [rows, H_Q, splits, 512] when splits > 1
    float* part_lse;       // [rows, H_Q, splits] when splits > 1
    float sm_scale;
    i32 rows;
    i32 slots;
    i32 splits;            // CTAs a row's top-k is split over (gridDim.z)
    i32 blocks_per_split;  // 64-position blocks a split takes
};

namespace decode {
constexpr int kThreads = 128;
constexpr int kHeads = 16;                 // heads a CTA takes (the mma's M)
constexpr int kDim = 576;
constexpr int kDv = 512;
constexpr int kRowBytes = 656;
constexpr int kBlock = 64;                 // top-k positions a step
// Q in shared memory, kSmemQ bytes (16 rows of kQStride: the host's size of the region).
// - The latent part (f16) as the S loop's A fragments: k-step ks (16 channels) owns the 512
//   bytes from kQLat + 512 ks, 32 fragments of 16 bytes; fragment (row r < 8, quad q) holds
//   the words {row r, row r + 8} of channels 16 ks + 4 q + {0, 1}, then of 16 ks + 4 q + {2, 3},
//   and sits at chunk q_chunk(ks, 4 r + q). One 16-byte load a fragment into four consecutive
//   registers (two 8-byte loads needed four register moves).
// - The RoPE part (bf16) in rows of kRopeStride bytes from kQRope (ldmatrix reads 8 rows at a
//   16-byte column: 144-byte rows put them in distinct banks), the head's f32 scale at byte
//   kQScale of its row.
constexpr int kQStride = kDim * 2 + 32;
constexpr int kQLat = 0;
constexpr int kQRope = kDv * 2 * kHeads;
constexpr int kRopeStride = (kDim - kDv) * 2 + 16;
constexpr int kQScale = (kDim - kDv) * 2;
// Chunk (16 bytes) of fragment `f` = 4 r + q within k-step ks's 512 bytes. A 16-byte shared
// access is served a quarter warp (8 lanes) at a time, and 8 lanes hit distinct banks only when
// their chunks differ in the low three bits. The S loop's lane 4 r + q reads fragment `lane`;
// the writer's quarter warp writes quads {0, 2} (or {1, 3}) of one row for four consecutive
// k-steps. The swizzle XORs the low bits with (ks & 1) | (ks & 2) << 1 (0, 1, 4 or 5), which
// keeps a reader's chunks within its 8 and gives the writer's 8 lanes 8 distinct low parts.
// (Unswizzled quad-major order, chunk 8 q + r, put a reader's four quads on the same banks:
// four wavefronts a load, and the kernel 16% slower at (128, 2, 16) on an H100.)
__device__ __forceinline__ int q_chunk(int ks, int f) {
    return f ^ ((ks & 1) | ((ks & 2) << 1));
}
// Floats of an S row in shared memory: 72 = 8 banks a row, so the 8-byte stores and loads of
// a half warp (rows r0 < 4, columns 2 quad + {0, 1}) hit 32 distinct banks (68 made two ways).
constexpr int kSStride = kBlock + 8;
constexpr int kSmemQ = kHeads * kQStride;
static_assert(kQRope + kHeads * kRopeStride <= kSmemQ, "Q's layout fits its region");
constexpr int kSmemKv = kBlock * kRowBytes;
constexpr int kSmemS = kHeads * kSStride * 4;
constexpr int kSmemBytes = kSmemQ + 2 * kSmemKv + kSmemS + 2 * kBlock * 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kPScale = 16384.0f;        // 2^14: P' = kPScale . P . s / m_g (see P . V)

__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32 (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// The two e4m3 bytes in the low 16 bits of `bytes` (lo first) as packed f16 (exact).
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 bytes) {
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)(bytes & 0xffffu)));
    return h2;
}

// The two e4m3 bytes in the high 16 bits of `bytes` as packed f16 (exact): the halves split
// in PTX, so the conversion reads the high half itself (no shift first).
__device__ __forceinline__ u32 e4m3x2_hi_to_f16x2(u32 bytes) {
    u32 h2;
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}"
        : "=r"(h2)
        : "r"(bytes));
    return h2;
}

// Two f32 -> two packed f16 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One 16-byte global store (left to itself the compiler splits some into four 4-byte ones).
__device__ __forceinline__ void st_global_v4(void* dst, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// Scale group g's f32 scale of the cache row at `row`.
__device__ __forceinline__ float row_scale(const u8* row, int g) {
    return reinterpret_cast<const float*>(row + kDv)[g];
}
}  // namespace decode

template <int H_Q, int TOPK>
__global__ void __launch_bounds__(128) sparse_mla_decode_kernel(const DecodeParams p) {
    using namespace decode;
    static_assert(TOPK % 128 == 0, "top-k is whole pairs of 64-position blocks");
    extern __shared__ __align__(128) u8 smem[];
    u8* sQ = smem;  // Q: f16 latent as A fragments, bf16 RoPE rows with the head's f32 scale
    u8* sKvBuf = smem + kSmemQ;                                     // [2][64][656] cache rows
    float* sS = reinterpret_cast<float*>(sKvBuf + 2 * kSmemKv);     // [16][kSStride] scores
    i32* sSlotBuf = reinterpret_cast<i32*>(sS + kHeads * kSStride);  // [2][64] slot or -1

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row = blockIdx.x, group = blockIdx.y, split = blockIdx.z;
    const int head0 = group * kHeads;
    constexpr int kRealHeads = H_Q < kHeads ? H_Q : kHeads;
    // The combine (a dependent launch) may be scheduled once every split has begun; it waits
    // for this grid's end before it reads anything.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

    // Every global load of the prologue is issued before any is used (one memory round trip on
    // a lone CTA's critical path instead of four: Q, the row's length, its first slots, then the
    // rows): Q of the warp's four heads (latent and RoPE), the row's length, and the raw slots of
    // the split's first two blocks (inside the row's TOPK whatever the length; masked below).
    constexpr int kWarps = kThreads / 32;
    constexpr int kRopeWords = (kDim - kDv) / 8;  // 16-byte words of a head's RoPE part
    uint4 xs[kHeads / kWarps][2];
    uint4 rope[kHeads / kWarps];
#pragma unroll
    for (int i = 0; i < kHeads / kWarps; ++i) {
        const int h = warp + i * kWarps;
        const bf16_t* qh = p.q + ((i64)row * H_Q + head0 + h) * kDim;
        xs[i][0] = xs[i][1] = rope[i] = make_uint4(0, 0, 0, 0);
        if (h < kRealHeads) {
            xs[i][0] = reinterpret_cast<const uint4*>(qh)[lane];
            xs[i][1] = reinterpret_cast<const uint4*>(qh)[lane + 32];
            if (lane < kRopeWords) {
                rope[i] = reinterpret_cast<const uint4*>(qh + kDv)[lane];
            }
        }
    }
    const int first_block = split * p.blocks_per_split;  // < TOPK / kBlock (no split is empty)
    const int raw_length = p.lengths != nullptr ? p.lengths[row] : TOPK;
    // A warp copies the rows of positions 64 b + warp + 4 i, i < 16, and its lane i < 16 holds
    // that position's slot: the slots a warp copies from never leave it (no barrier before the
    // copies). pos_of(b) is this lane's position.
    constexpr int kRowsPerWarp = kBlock / kWarps;
    auto pos_of = [&](int b) -> int { return b * kBlock + warp + kWarps * lane; };
    auto raw_slot = [&](int b) -> i32 {
        return lane < kRowsPerWarp && b < TOPK / kBlock ? p.indices[(i64)row * TOPK + pos_of(b)]
                                                        : -1;
    };
    const i32 raw_first = raw_slot(first_block);
    i32 next_slot = raw_slot(first_block + 1);

    const int length = raw_length < 0 ? 0 : (raw_length > TOPK ? TOPK : raw_length);
    int last_block = first_block + p.blocks_per_split;
    const int length_blocks = (length + kBlock - 1) / kBlock;
    last_block = last_block < length_blocks ? last_block : length_blocks;

    // Running softmax state of this thread's two heads (rows lane/4 and lane/4 + 8), the same
    // in every warp, and the accumulators of its warp's 128 dims (16 n-tiles of 8).
    float m_run[2] = {-pos_inf(), -pos_inf()};
    float l_run[2] = {0.0f, 0.0f};
    float m_scale = 0.0f;  // m_g of the P . V below (scale group `warp`)
    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    }
    const int quad = lane % 4, r0 = lane / 4;

    // Slot `raw` of this lane's position of block b as the copies take it: -1 past the split,
    // past the row's length, or outside the cache.
    auto masked = [&](int b, i32 raw) -> i32 {
        const int pos = pos_of(b);
        if (lane >= kRowsPerWarp || b >= last_block || pos >= length) {
            return -1;
        }
        return (raw >= 0 && raw < p.slots) ? raw : -1;
    };
    // The slot of this lane's position of block b, or -1.
    auto slot_at = [&](int b) -> i32 {
        const int pos = pos_of(b);
        const bool read = lane < kRowsPerWarp && b < last_block && pos < length;
        return read ? masked(b, p.indices[(i64)row * TOPK + pos]) : -1;
    };
    // One mbarrier a row buffer: each of the 128 threads arrives once a use, and the bulk
    // copies of the use's valid rows complete as transaction bytes on it. The n-th use of
    // buffer b & 1 since the split's first block (n = (b - first_block) / 2) is its phase n.
    // The waits count on every thread: all 128 call copy_rows for the same blocks and
    // last_block is the CTA's, so no thread may leave the loop early or skip a block.
    __shared__ __align__(8) u64 sFull[2];
    if (tid == 0) {
        mbar_init(smem_addr(&sFull[0]), kThreads);
        mbar_init(smem_addr(&sFull[1]), kThreads);
        // The bulk copy engine (async proxy) completes transactions on these barriers.
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // Block b's slots into buffer b & 1 (for S's validity) and its cache rows into row buffer
    // b & 1, then this thread's arrival on the buffer's mbarrier (nothing past the last block:
    // no block waits for those). Lane i < 16 of a warp issues one bulk copy of the 656 bytes of
    // row t = warp + 4 i if its slot `my_slot` is valid; the warp zero-fills its invalid rows
    // (never read from global memory: their scores are masked, and zeros keep P . V finite).
    // 16-byte cp.async copies cost about 39 shared-memory wavefronts a row (ncu, against an
    // ideal of about 6), most of the shared-memory pipe's time beside the math's loads; a bulk
    // copy takes none of it.
    auto copy_rows = [&](int b, i32 my_slot) {
        if (lane < kRowsPerWarp) {
            sSlotBuf[(b & 1) * kBlock + warp + kWarps * lane] = my_slot;
        }
        if (b < last_block) {
            const u32 full = smem_addr(&sFull[b & 1]);
            const u32 dst = smem_addr(sKvBuf + (b & 1) * kSmemKv);
            const bool valid = lane < kRowsPerWarp && my_slot >= 0;
            const u32 bits = __ballot_sync(0xffffffffu, valid);
            if (lane == 0) {
                mbar_expect_tx(full, (u32)__popc(bits) * (u32)kRowBytes);
            }
            __syncwarp();
            if (valid) {
                bulk_copy_g2s(dst + (warp + kWarps * lane) * kRowBytes,
                              p.cache + (i64)my_slot * kRowBytes, kRowBytes, full);
            }
            u32 invalid = ~bits & ((1u << kRowsPerWarp) - 1);
            const bool zero_rows = invalid != 0;  // warp-uniform (a ballot)
            while (invalid != 0) {
                const int i = __ffs((int)invalid) - 1;
                invalid &= invalid - 1;
                const u32 zero_row = dst + (warp + kWarps * i) * kRowBytes;
                st_shared_zero16(zero_row + lane * 16);
                if (lane < kRowBytes / 16 - 32) {
                    st_shared_zero16(zero_row + (lane + 32) * 16);
                }
            }
            if (zero_rows) {
                // A later use of this buffer may bulk-copy (async proxy) into these rows: the
                // zero stores (generic proxy) are ordered before it here, by the threads that
                // made them, ahead of the barriers that end the use.
                fence_proxy_async();
            }
            mbar_arrive(full);  // after this thread's slot and zero stores (release)
        }
    };
    next_slot = masked(first_block + 1, next_slot);
    copy_rows(first_block, masked(first_block, raw_first));

    // Q into shared memory while the first rows are in flight (the barrier after it orders it
    // before S): the latent part as f16 times the head's power-of-two scale 2^-k (its largest
    // value into [2^13, 2^14); 2^k kept at kQScale), the RoPE part as it is (bf16); zero rows
    // past H_Q.
    uint4 lat[kHeads / kWarps][2];  // [head hi][i]: channels 8 c ... 8 c + 7, c = lane + 32 i
#pragma unroll
    for (int hi = 0; hi < kHeads / kWarps; ++hi) {
        const int h = warp + hi * kWarps;
        const uint4 x[2] = {xs[hi][0], xs[hi][1]};
        float v[16];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 w[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                v[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
                v[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
            }
        }
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            amax = fmaxf(amax, fabsf(v[i]));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        }
        int e;
        frexpf(amax, &e);  // amax < 2^e
        const int k = min(max(e - 14, -110), 114);
        const float down = ldexpf(1.0f, -k);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            lat[hi][i].x = pack_f16x2(v[8 * i] * down, v[8 * i + 1] * down);
            lat[hi][i].y = pack_f16x2(v[8 * i + 2] * down, v[8 * i + 3] * down);
            lat[hi][i].z = pack_f16x2(v[8 * i + 4] * down, v[8 * i + 5] * down);
            lat[hi][i].w = pack_f16x2(v[8 * i + 6] * down, v[8 * i + 7] * down);
        }
        u8* dst = sQ + kQRope + h * kRopeStride;
        if (lane < kRopeWords) {
            *reinterpret_cast<uint4*>(dst + lane * 16) = rope[hi];
        }
        if (lane == 0) {
            *reinterpret_cast<float*>(dst + kQScale) = ldexpf(1.0f, k);
        }
    }
    // The latent part as fragments: heads warp + 4 pair and warp + 4 pair + 8 are rows
    // r = warp + 4 pair and r + 8 of one fragment, so a lane writes whole fragments: those of
    // channels 8 c ... 8 c + 3 (k-step c / 2, quad 2 (c % 2)) and 8 c + 4 ... 8 c + 7 (the next
    // quad).
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
        const int r = warp + kWarps * pair;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int c = lane + 32 * i;
            const uint4 a = lat[pair][i], b = lat[pair + 2][i];  // rows r and r + 8
            u8* ks_base = sQ + kQLat + (c / 2) * 512;
            const int q0 = 2 * (c % 2);
            *reinterpret_cast<uint4*>(ks_base + q_chunk(c / 2, r * 4 + q0) * 16) =
                make_uint4(a.x, b.x, a.y, b.y);
            *reinterpret_cast<uint4*>(ks_base + q_chunk(c / 2, r * 4 + q0 + 1) * 16) =
                make_uint4(a.z, b.z, a.w, b.w);
        }
    }
    __syncthreads();  // Q is in shared memory (the loop's waits are on the rows alone)

    for (int b = first_block; b < last_block; ++b) {
        // Block b + 1's copies issued (its buffers were last read by block b - 1, before the
        // barrier that ended it); block b + 2's slots read meanwhile.
        copy_rows(b + 1, next_slot);
        next_slot = slot_at(b + 2);
        // Block b's rows, slots and zero rows have landed (acquire).
        mbar_wait(smem_addr(&sFull[b & 1]), (u32)((b - first_block) >> 1) & 1u);
        const u8* sKv = sKvBuf + (b & 1) * kSmemKv;
        const i32* sSlot = sSlotBuf + (b & 1) * kBlock;

        // S for tokens 16 warp .. 16 warp + 15: two n-tiles of 8 tokens. Within a k-step of 16
        // latent channels the mma's k index is a label: k 2 quad + {0, 1} is channel
        // 4 quad + {0, 1} and k 2 quad + 8 + {0, 1} is channel 4 quad + {2, 3}, so a thread's
        // B fragment is one 4-byte word of its token's row and its A fragment one 16-byte
        // chunk of Q's fragment layout (q_chunk).
        const u8* krow[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            krow[j] = sKv + (warp * 16 + j * 8 + r0) * kRowBytes;
        }
        const u8* qfrag = sQ + kQLat;  // k-step ks's fragments from byte 512 ks
        // One accumulator set a scale group, the groups' k-steps interleaved: four independent
        // mma chains of 8 a token tile instead of one of 32 (a lone CTA's latency at B = 1).
        float acc[kDv / 128][2][4];
#pragma unroll
        for (int g = 0; g < kDv / 128; ++g) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                acc[g][j][0] = acc[g][j][1] = acc[g][j][2] = acc[g][j][3] = 0.0f;
            }
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
            for (int g = 0; g < kDv / 128; ++g) {
                const int ks = g * 8 + kk;
                const uint4 f =
                    *reinterpret_cast<const uint4*>(qfrag + ks * 512 + q_chunk(ks, lane) * 16);
                const u32 a[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const u32 w = *reinterpret_cast<const u32*>(krow[j] + ks * 16 + quad * 4);
                    decode::mma_f16(acc[g][j], a, decode::e4m3x2_to_f16x2(w),
                                    decode::e4m3x2_hi_to_f16x2(w));
                }
            }
        }
        // Promote with the scales of the accumulators' columns: tokens
        // 16 warp + 8 j + 2 quad + {0, 1}.
        float s_lat[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const u8* col = sKv + (warp * 16 + j * 8 + 2 * quad) * kRowBytes;
#pragma unroll
            for (int g = 0; g < kDv / 128; ++g) {
                const float sc0 = decode::row_scale(col, g);
                const float sc1 = decode::row_scale(col + kRowBytes, g);
                s_lat[j][0] += sc0 * acc[g][j][0];
                s_lat[j][1] += sc1 * acc[g][j][1];
                s_lat[j][2] += sc0 * acc[g][j][2];
                s_lat[j][3] += sc1 * acc[g][j][3];
            }
        }
        // The RoPE part (bf16 Q and cache values).
        float s_rope[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        const u32 q_base = smem_addr(sQ + kQRope) + (lane % 16) * kRopeStride + (lane / 16) * 16;
#pragma unroll
        for (int ks = kDv / 16; ks < kDim / 16; ++ks) {
            u32 a[4];
            ldmatrix_x4(q_base + (ks - kDv / 16) * 32, a);
            const int k = ks * 16 + 2 * quad;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const u8* rope = krow[j] + 528 + 2 * (k - kDv);
                decode::mma_bf16(s_rope[j], a, *reinterpret_cast<const u32*>(rope),
                                 *reinterpret_cast<const u32*>(rope + 16));
            }
        }
        // S = 2^k_h . latent + RoPE, rows r0 and r0 + 8.
        const float hs0 =
            *reinterpret_cast<const float*>(sQ + kQRope + r0 * kRopeStride + kQScale);
        const float hs1 =
            *reinterpret_cast<const float*>(sQ + kQRope + (r0 + 8) * kRopeStride + kQScale);
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            s[j][0] = hs0 * s_lat[j][0] + s_rope[j][0];
            s[j][1] = hs0 * s_lat[j][1] + s_rope[j][1];
            s[j][2] = hs1 * s_lat[j][2] + s_rope[j][2];
            s[j][3] = hs1 * s_lat[j][3] + s_rope[j][3];
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int t = warp * 16 + j * 8 + 2 * quad;
            const bool v0 = sSlot[t] >= 0, v1 = sSlot[t + 1] >= 0;
            *reinterpret_cast<float2*>(sS + r0 * kSStride + t) =
                make_float2(v0 ? s[j][0] * p.sm_scale : -pos_inf(),
                            v1 ? s[j][1] * p.sm_scale : -pos_inf());
            *reinterpret_cast<float2*>(sS + (r0 + 8) * kSStride + t) =
                make_float2(v0 ? s[j][2] * p.sm_scale : -pos_inf(),
                            v1 ? s[j][3] * p.sm_scale : -pos_inf());
        }
        __syncthreads();

        // Online softmax (every warp the same): this thread's 16 scores of each of its heads.
        float sv[2][4][4];  // [row][k-tile][element]: columns 16 kt + 2 quad + {0, 1, 8, 9}
        float bmax[2] = {-pos_inf(), -pos_inf()};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int kt = 0; kt < 4; ++kt) {
                const float* srow = sS + (r0 + 8 * r) * kSStride + kt * 16 + 2 * quad;
                const float2 lo = *reinterpret_cast<const float2*>(srow);
                const float2 hi = *reinterpret_cast<const float2*>(srow + 8);
                sv[r][kt][0] = lo.x;
                sv[r][kt][1] = lo.y;
                sv[r][kt][2] = hi.x;
                sv[r][kt][3] = hi.y;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    bmax[r] = fmaxf(bmax[r], sv[r][kt][e]);
                }
            }
            bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 1));
            bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 2));
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m_new = fmaxf(m_run[r], bmax[r]);
            // No valid score yet: nothing to rescale, every weight zero.
            const float m_use = m_new == -pos_inf() ? 0.0f : m_new;
            alpha[r] = exp2f((m_run[r] - m_use) * kLog2e);
            float sum = 0.0f;
#pragma unroll
            for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sv[r][kt][e] = exp2f((sv[r][kt][e] - m_use) * kLog2e);
                    sum += sv[r][kt][e];
                }
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l_run[r] = l_run[r] * alpha[r] + sum;
            m_run[r] = m_new;
        }
        // The largest scale of this warp's group over the blocks so far, m_g:
        // P' = 2^14 . P . s / m_g stays in [0, 2^14] (f16's normal range reaches 2^-14, so a
        // weight keeps 11 bits down to 2^-28 of the largest and a step of 2^-38 below), and the
        // accumulators, kept in units of m_g / 2^14, are rescaled when m_g grows. A block of
        // zero scales (or none yet) leaves every P' zero.
        float bscale = fmaxf(decode::row_scale(sKv + lane * kRowBytes, warp),
                             decode::row_scale(sKv + (lane + 32) * kRowBytes, warp));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            bscale = fmaxf(bscale, __shfl_xor_sync(0xffffffffu, bscale, off));
        }
        const float m_scale_new = fmaxf(m_scale, bscale);
        const float alpha_scale = m_scale_new > 0.0f ? m_scale / m_scale_new : 1.0f;
        const float inv_scale = m_scale_new > 0.0f ? kPScale / m_scale_new : 0.0f;
        m_scale = m_scale_new;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            o[n][0] *= alpha[0] * alpha_scale;
            o[n][1] *= alpha[0] * alpha_scale;
            o[n][2] *= alpha[1] * alpha_scale;
            o[n][3] *= alpha[1] * alpha_scale;
        }

        // O += P' . V over this warp's 128 dims (scale group `warp`). The n index of the mma is
        // a label: column j of n-tile n is dim 128 warp + 16 j + n, so a thread's 16 n-tiles
        // read one 16-byte vector of each of its tokens' rows; one byte permute gives two
        // n-tiles' pairs of tokens.
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
            const int t = kt * 16 + 2 * quad;  // tokens t, t+1 (b0) and t+8, t+9 (b1)
            const u8* v0 = sKv + t * kRowBytes + warp * 128 + r0 * 16;
            const uint4 w0 = *reinterpret_cast<const uint4*>(v0);
            const uint4 w1 = *reinterpret_cast<const uint4*>(v0 + kRowBytes);
            const uint4 w8 = *reinterpret_cast<const uint4*>(v0 + 8 * kRowBytes);
            const uint4 w9 = *reinterpret_cast<const uint4*>(v0 + 9 * kRowBytes);
            const float sc0 = decode::row_scale(sKv + t * kRowBytes, warp) * inv_scale;
            const float sc1 = decode::row_scale(sKv + (t + 1) * kRowBytes, warp) * inv_scale;
            const float sc8 = decode::row_scale(sKv + (t + 8) * kRowBytes, warp) * inv_scale;
            const float sc9 = decode::row_scale(sKv + (t + 9) * kRowBytes, warp) * inv_scale;
            const u32 pa[4] = {
                decode::pack_f16x2(sv[0][kt][0] * sc0, sv[0][kt][1] * sc1),
                decode::pack_f16x2(sv[1][kt][0] * sc0, sv[1][kt][1] * sc1),
                decode::pack_f16x2(sv[0][kt][2] * sc8, sv[0][kt][3] * sc9),
                decode::pack_f16x2(sv[1][kt][2] * sc8, sv[1][kt][3] * sc9),
            };
            const u32 a0[4] = {w0.x, w0.y, w0.z, w0.w}, a1[4] = {w1.x, w1.y, w1.z, w1.w};
            const u32 a8[4] = {w8.x, w8.y, w8.z, w8.w}, a9[4] = {w9.x, w9.y, w9.z, w9.w};
#pragma unroll
            for (int n = 0; n < 16; n += 2) {
                // Bytes n and n + 1 of each token's word: (t, n), (t+1, n), (t, n+1), (t+1, n+1).
                const u32 sel = (u32)(n % 4) | ((u32)(4 + n % 4) << 4) |
                                ((u32)(n % 4 + 1) << 8) | ((u32)(5 + n % 4) << 12);
                const u32 lo = byte_perm(a0[n / 4], a1[n / 4], sel);
                const u32 hi = byte_perm(a8[n / 4], a9[n / 4], sel);
                decode::mma_f16(o[n], pa, decode::e4m3x2_to_f16x2(lo),
                                decode::e4m3x2_to_f16x2(hi));
                decode::mma_f16(o[n + 1], pa, decode::e4m3x2_hi_to_f16x2(lo),
                                decode::e4m3x2_hi_to_f16x2(hi));
            }
        }
        __syncthreads();  // buffer b & 1 and sS are rewritten by the next blocks
    }
    __syncthreads();  // every warp is past its last read of the row buffers (the staging below)

    // Epilogue through shared memory. A thread holds 32 consecutive dims of each of its heads
    // r0 and r0 + 8 (accumulator n, column c of its quad is dim 128 warp + 32 quad + 16 c + n),
    // so a warp's direct store would touch 32 heads' or columns' lines at once (8 heads x 4
    // quads). Instead the CTA stages its 16 x 512 results in f32 in the row buffers (free now),
    // then writes each head's row with consecutive threads on consecutive 16 bytes: a warp's
    // store covers 512 contiguous bytes. Staged layout: a head's row is 16 segments of 32 dims,
    // each padded by 16 bytes, and rows kOutStride bytes apart, so the staging's 16-byte stores
    // (8 lanes a phase: 2 heads x 4 quads) and the write-out's loads hit distinct banks.
    constexpr int kSegBytes = 32 * 4 + 16;
    constexpr int kOutStride = (kDv / 32) * kSegBytes + 64;
    static_assert(kHeads * kOutStride <= 2 * kSmemKv, "the staged output fits the row buffers");
    u8* sOut = sKvBuf;  // [16][kOutStride]: f32 out (or partial) rows of the group's heads
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int h = r0 + 8 * r;
        if (h >= kRealHeads) {
            continue;
        }
        const i64 head = (i64)row * H_Q + head0 + h;
        // The accumulators are in units of m_g / 2^14.
        const float inv = l_run[r] > 0.0f ? m_scale / kPScale / l_run[r] : 0.0f;
        const float lse = l_run[r] > 0.0f ? m_run[r] + logf(l_run[r]) : -pos_inf();
        u8* seg = sOut + h * kOutStride + (warp * 4 + quad) * kSegBytes;
#pragma unroll
        for (int c = 0; c < 2; ++c) {  // column 2 quad + c: dims 16 c + n of the segment
#pragma unroll
            for (int n = 0; n < 16; n += 4) {
                const int e = 2 * r + c;
                *reinterpret_cast<float4*>(seg + (16 * c + n) * 4) =
                    make_float4(o[n][e] * inv, o[n + 1][e] * inv, o[n + 2][e] * inv,
                                o[n + 3][e] * inv);
            }
        }
        if (warp == 0 && quad == 0) {
            if (p.splits == 1) {
                p.lse[head] = l_run[r] > 0.0f ? lse : pos_inf();
            } else {
                p.part_lse[head * p.splits + split] = lse;
            }
        }
    }
    __syncthreads();
    // `out` and `part_o` start at multiples of 16 bytes (the host admits them so); a head's
    // 512 values are 1024 (bf16) or 2048 (f32) bytes.
    if (p.splits == 1) {
        // Two heads a pass: thread tid writes dims 8 c ... 8 c + 7 (c = tid % 64) of head
        // 2 pass + tid / 64 as one 16-byte vector of bf16.
        const int c = tid % 64;
        for (int h = tid / 64; h < kRealHeads; h += kThreads / 64) {
            const u8* src = sOut + h * kOutStride + (c / 4) * kSegBytes + (c % 4) * 32;
            const float4 a = *reinterpret_cast<const float4*>(src);
            const float4 b = *reinterpret_cast<const float4*>(src + 16);
            const i64 head = (i64)row * H_Q + head0 + h;
            decode::st_global_v4(p.out + head * kDv + 8 * c,
                                 make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w),
                                            pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w)));
        }
    } else {
        // One head a pass: thread tid writes dims 4 tid ... 4 tid + 3 of the head's partial.
        const u8* src = sOut + (tid / 8) * kSegBytes + (tid % 8) * 16;
#pragma unroll 4
        for (int h = 0; h < kRealHeads; ++h) {
            const float4 v = *reinterpret_cast<const float4*>(src + h * kOutStride);
            const i64 head = (i64)row * H_Q + head0 + h;
            *reinterpret_cast<float4*>(p.part_o + (head * p.splits + split) * kDv + 4 * tid) = v;
        }
    }
}

// Merges the splits of each (row, head): lse = log-sum-exp of the splits' lse, out = their
// outputs weighted by exp(lse_i - lse); no valid slot in any split gives out 0, lse +inf.
// One CTA of 128 threads a (row, head), 4 dims a thread. A row has at most 32 splits (the host
// never splits further: a top-k wider than 2048 takes several blocks a split): the first warp
// reads every split's lse at once and leaves the weights in shared memory, and the output
// loads of all splits are independent. `out` is written in 8-byte vectors (four bf16 a thread):
// the host admits it only at a 16-byte boundary.
template <int H_Q>
__global__ void __launch_bounds__(128) sparse_mla_decode_combine_kernel(const DecodeParams p) {
    constexpr int kMaxSplits = 32;
    __shared__ float weight[kMaxSplits];
    __shared__ float head_lse;
    // Launched as a dependent of the splits' kernel (it may be resident before that kernel
    // ends): nothing global is touched before the splits have ended and their writes are
    // visible. A no-op for an ordinary launch.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const i64 head = blockIdx.x;  // row * H_Q + h
    const int splits = min(p.splits, kMaxSplits);  // the host never splits further
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const bool live = lane < splits;
        const float l = live ? p.part_lse[head * p.splits + lane] : -pos_inf();
        float m = l;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const bool empty = m == -pos_inf();
        const float e = empty ? 0.0f : expf(l - m);  // 0 for a split without a valid slot
        float z = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
        weight[lane] = empty ? 0.0f : e / z;  // exp(l - lse)
        if (lane == 0) head_lse = empty ? pos_inf() : m + logf(z);
    }
    __syncthreads();
    const int d = threadIdx.x * 4;
    const float* po = p.part_o + head * p.splits * 512 + d;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int i = 0; i < splits; ++i) {
        const float w = weight[i];
        const float4 v = *reinterpret_cast<const float4*>(po + (i64)i * 512);
        acc[0] += w * v.x;
        acc[1] += w * v.y;
        acc[2] += w * v.z;
        acc[3] += w * v.w;
    }
    *reinterpret_cast<uint2*>(p.out + head * 512 + d) =
        make_uint2(pack_bf16x2(acc[0], acc[1]), pack_bf16x2(acc[2], acc[3]));
    if (threadIdx.x == 0) {
        p.lse[head] = head_lse;
    }
}

// The decode step through the FP8 prefill (`DecodeThroughPrefill`, docs/kernels/mla_cache.md
// §8.6). Mirrored by `DecodePrepareParams` in src/ops/sparse_mla_decode/cuda.rs.
struct DecodePrepareParams {
    const bf16_t* q;    // [rows, H_Q, 576]
    const i32* indices; // [rows, TOPK] cache slots
    const i32* lengths; // [rows] or null
    u8* q8;             // [rows, H_Q, 576] e4m3
    i32* slots_out;     // [rows, TOPK] the slot the prefill reads, or -1
    i32 rows;
    i32 slots;          // cache slots
};

// The whole step in grid-stride loops (the grid is a few CTAs an SM, whatever the row count):
// q cast to e4m3 (round to nearest even, saturating at +-448, identity scale), a warp taking
// 128 16-byte words of q at a time with its four loads in flight before any conversion; then,
// for each top-k position j of row r, its slot, or -1 for a position past the row's length or a
// slot outside the cache (the prefill then reads nothing and masks it). The prefill casts the
// slots' RoPE values itself. Every access is guarded by its extent: rows * H_Q * 72 words of q
// (and as many 8-byte words of q8), rows * TOPK positions.
template <int H_Q, int TOPK>
__global__ void __launch_bounds__(256)
    sparse_mla_decode_prepare_kernel(const DecodePrepareParams p) {
    constexpr int kDim = decode::kDim;
    constexpr int kUnroll = 4;
    const int lane = threadIdx.x & 31;
    const i64 thread = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 threads = (i64)gridDim.x * blockDim.x;
    const i64 warp = thread >> 5, warps = threads >> 5;

    const i64 words = (i64)p.rows * H_Q * (kDim / 8);  // 16-byte words of q (8 bf16 each)
    const uint4* src = reinterpret_cast<const uint4*>(p.q);
    uint2* dst = reinterpret_cast<uint2*>(p.q8);
    for (i64 base = warp * (32 * kUnroll); base < words; base += warps * (32 * kUnroll)) {
        uint4 x[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
            const i64 i = base + k * 32 + lane;
            if (i < words) x[k] = src[i];
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
            const i64 i = base + k * 32 + lane;
            if (i >= words) continue;
            dst[i] = cast_bf16x8_e4m3(x[k]);
        }
    }

    const i64 positions = (i64)p.rows * TOPK;
    for (i64 at = thread; at < positions; at += threads) {
        const i64 row = at / TOPK;
        const int j = (int)(at - row * TOPK);
        int length = TOPK;
        if (p.lengths != nullptr) {
            const int l = p.lengths[row];
            length = l < 0 ? 0 : (l > TOPK ? TOPK : l);
        }
        const i32 s = p.indices[at];
        p.slots_out[at] = j < length && s >= 0 && s < p.slots ? s : -1;
    }
}
