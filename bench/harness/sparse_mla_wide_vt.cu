// shapeproof — an experiment, not used by the library: FP8 (e4m3 x e4m3 -> f32) sparse MLA
// prefill for sm_90a in 64-head tiles with the structure of the best published Hopper kernel
// (V^T built in shared memory by the producer, P.V as m64n256k32), written from scratch to
// measure that structure beside ours. Same function and parameter block as
// kernels/sparse_mla_prefill.cu (spec KERNELS.md §3.3), and the same numerics as the narrow
// kernel (below). It passes every check of the kernel harness; its speed, what limits it and
// what was tried are in bench/NOTES.md ("The published structure, re-implemented"). Build it as
// the harness's 64-head candidate: `bench/harness/build.sh kernels/sparse_mla_narrow.cu
// bench/harness/sparse_mla_wide_vt.cu`, then `harness check widecand`, `harness time-wide`.
// Timing-only switches (wrong results): -DEXP_NO_GATHER_READ (every gather copy zero-fills,
// no global read), -DEXP_HALF_ROWS (only tokens 0 … 31 of each block read, the rest zero-filled:
// what one CTA of a 2-CTA cluster sharing its gathers would read; not yet run on a GPU),
// -DEXP_NO_VT_BUILD (V^T slots released without being written). Structural
// switches (correct, measured): -DEXP_K3_VT2 (three K slots and two V^T slots, the first
// layout), -DEXP_LR (each K slot in two parts on barriers of their own); built, not yet run:
// -DEXP_CLUSTER2 (two head tiles of a row share their gathers), -DEXP_SW64 (K slots in the
// 64-byte swizzle). Their barrier protocol is model-checked by wide_vt_protocol.py. Build
// switched copies beside the harness with HARNESS_WIDE_SWITCHES (bench/harness/build.sh), e.g.
// "EXP_SW64;EXP_LR" gives harness-EXP_SW64 and harness-EXP_LR.
//
// Launch: grid = head_tiles * s_q CTAs (CTA b: head tile b % head_tiles of query row
// b / head_tiles), 384 threads, one CTA per SM, dynamic shared memory Smem<D_QK>::kBytes
// (226920 bytes at d_qk 576, 214632 at 512).
//
// Structure. Warpgroups 0 and 1 are the consumers; warpgroup 2 is the producer, one loop for
// its four warps: step s issues the 16-byte cp.async gathers of block s (into the K-major
// canonical layout wgmma reads), then builds V^T of block s - 1 (whose rows have had a step to
// land) in shared memory from its K slot (ldmatrix.trans, byte permutes, stmatrix). Blocks of
// 64 tokens go in pairs; consumer warpgroup w owns block 2t + w of pair t for S = Q.K^T
// (m64n64k32, both operands in shared memory) and its softmax, and value columns 256w …
// 256w + 255 of both blocks for O = P.V (m64n256k32, P and V^T both from shared memory), so
// the heads are the rows of both accumulators and a thread's softmax statistics are those of
// its two O rows (no cross-warp exchange inside a warpgroup).
// Per pair t a consumer issues P.V of pair t (one commit group per block), then S of its block
// of pair t + 1, releasing each V^T slot as soon as its P.V group is done, then the softmax of
// pair t + 1.
// Buffers: K slots [2] (released after S and after the V^T build), V^T slots [3] (released after
// P.V of both warpgroups), P [2] (by pair parity): everything the shared memory holds at 576.
// Numerics: S promoted every 96 channels; the softmax keeps a reference max m_ref that moves
// only in a pair where some score exceeds it by more than the headroom (the narrow kernel's
// rule; both warpgroups vote with one barrier and keep the speculative weights otherwise).

namespace sparse_mla {

constexpr int kThreads = 384;          // two consumer warpgroups, one producer warpgroup
constexpr int kHeadsPerTile = 64;      // wgmma M of S and of P.V
constexpr int kTokensPerBlock = 64;    // wgmma N of S
constexpr int kDV = 512;               // value width
// Gathered K blocks and V^T blocks in shared memory: two and three, so that V^T of block b goes
// into the slot of block b - 3 (whose P.V is long done) as soon as block b lands, and no K slot
// waits for a P.V. -DEXP_K3_VT2: three and two, the first layout measured (bench/NOTES.md).
#ifdef EXP_K3_VT2
constexpr int kKSlots = 3;
constexpr int kVtSlots = 2;
#else
constexpr int kKSlots = 2;
constexpr int kVtSlots = 3;
#endif
// -DEXP_LR: each K slot lands and is released in two parts on barriers of their own, channels
// 0 … 319 (S chunks 0-2) and the rest, so S starts before the whole block has landed and the
// gather of the left part of block b + kKSlots starts once S of block b is past it.
#ifdef EXP_LR
constexpr bool kSplitLR = true;
#else
constexpr bool kSplitLR = false;
#endif
// -DEXP_CLUSTER2 (built, not yet run on a GPU): CTAs in clusters of two. When a query row has
// two head tiles (128 heads), its two CTAs form a cluster and share the gathers: CTA `tile`
// gathers token groups 4 tile … 4 tile + 3 of every block (32 rows, one contiguous span of the K
// slot) and copies them into its peer's slot with one shared-to-shared bulk copy, so each CTA
// reads half the rows. With one head tile a row nothing is shared (an odd grid gets one idle
// CTA). bench/NOTES.md, "Two K slots, and what bounds the experiment now", lead 1.
#ifdef EXP_CLUSTER2
constexpr bool kCluster2 = true;
#define EXP_CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
constexpr bool kCluster2 = false;
#define EXP_CLUSTER_DIMS
#endif
static_assert(!(kCluster2 && kSplitLR), "the shared gathers complete whole K slots");
// -DEXP_SW64 (built, not yet run on a GPU): K slots in the 64-byte-swizzled K-major layout
// instead of the canonical one without swizzle. A gathered row's 64-byte piece then lands in 64
// contiguous bytes (its 16-byte chunks permuted), where today each 16-byte chunk goes to its own
// core matrix. The profile counts 32 shared-memory wavefronts per gather instruction, 8x the
// ideal 4, and 62% of all the kernel's wavefronts (bench/NOTES.md).
#ifdef EXP_SW64
constexpr bool kSw64 = true;
#else
constexpr bool kSw64 = false;
#endif
constexpr int kLeftQ = 5;              // 64-channel gather columns in the left part
constexpr int kLeftChunks = 3;         // S chunks (96 channels each) inside the left part
constexpr int kQkChunkSteps = 3;       // S promoted to f32 registers every 3 k-steps (96 channels)
static_assert(kLeftChunks * kQkChunkSteps * 32 <= kLeftQ * 64, "left S chunks past the left part");
// V^T core-matrix groups (8 value columns x 64 positions, 512 bytes) lie kVtGroupStride apart.
// -DEXP_VT_PAD: 528, so the eight rows of one stmatrix matrix (value columns 2r + parity, which
// span two groups) fall in eight different 16-byte bank groups; at 512 they meet pairwise (the
// profile counts twice the ideal wavefronts for every stmatrix).
#ifdef EXP_VT_PAD
constexpr int kVtGroupStride = 528;
#else
constexpr int kVtGroupStride = 512;
#endif
constexpr int kVtBytes = (kDV / 8) * kVtGroupStride;           // one V^T slot: 32768 (33792)
// The V^T build's loop: -DEXP_BUILD_PIPE issues the ldmatrix of the next four chunks before the
// stores of the current four; -DEXP_BUILD_BATCH8 loads eight chunks, then stores them.
#ifdef EXP_BUILD_PIPE
constexpr bool kBuildPipe = true;
#else
constexpr bool kBuildPipe = false;
#endif
#ifdef EXP_BUILD_BATCH8
constexpr int kBuildBatch = 8;
#else
constexpr int kBuildBatch = 4;
#endif
constexpr int kPBytes = kHeadsPerTile * 2 * kTokensPerBlock;  // one P tile [64 heads][128]
// setmaxnreg: 224 * 256 + 56 * 128 = 64512 = 168 * 384, the pool the launch allocated. An
// increase past the pool waits forever (64 producer registers hung the kernel), and the published
// split of 216 / 72 spills ~264 bytes a consumer thread here.
constexpr u32 kConsumerRegs = 224;
constexpr u32 kProducerRegs = 56;
constexpr int kBarConsumers = 1;       // named barrier of the 256 consumer threads
constexpr float kMaxHeadroom = 8.f;
constexpr float kLog2ShareLimit = 4.f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D_QK>
struct Smem {
    static constexpr int kChunks = D_QK / 16;
    static constexpr int kRowGroupBytes = 8 * D_QK;
    // A K slot: byte offset of the 16-byte chunk `chunk` of token `token`, and the distance
    // between 64-channel gather columns. Without swizzle: core matrices of 8 tokens x 16 bytes,
    // token groups kRowGroupBytes apart. kSw64: columns of 64 channels, 4 KB each (64 tokens x
    // 64 bytes, atoms of 8 tokens 512 bytes apart), chunk index XOR bits 1-2 of the token.
    static constexpr u32 kColStride = kSw64 ? 4096u : 512u;
    __device__ static __forceinline__ u32 k_chunk(int token, int chunk) {
        if constexpr (kSw64) {
            return (u32)((chunk >> 2) * 4096 + (token >> 3) * 512 + (token & 7) * 64 +
                         (((chunk & 3) ^ ((token >> 1) & 3)) << 4));
        } else {
            return (u32)((token >> 3) * kRowGroupBytes + chunk * 128 + (token & 7) * 16);
        }
    }
    static constexpr int kTileBytes = kHeadsPerTile * D_QK;
    static constexpr int kQ = 0;                                // [64 heads][D_QK]
    static constexpr int kK = kQ + kTileBytes;                  // [kKSlots][64 tokens][D_QK]
    static constexpr int kVt = kK + kKSlots * kTileBytes;       // [kVtSlots][512][64 positions]
    static constexpr int kP = kVt + kVtSlots * kVtBytes;        // [2][64 heads][128 positions]
    static constexpr int kMax = kP + 2 * kPBytes;               // f32 [2 wg][64] block maxima
    static constexpr int kSum = kMax + 2 * 64 * 4;              // f32 [2 wg][64] row sums
    static constexpr int kTmax = kSum + 2 * 64 * 4;             // f32 [2 wg][64] true maxima
    static constexpr int kMask = kTmax + 2 * 64 * 4;            // u16 [kKSlots][4 warps]
    static constexpr int kBars = kMask + kKSlots * 8;           // mbarriers (below)
    static constexpr int kBytes =
        kBars + (1 + 2 * kKSlots + 2 * kVtSlots + (kSplitLR ? 2 * kKSlots : 0) +
                 (kCluster2 ? 2 * kKSlots : 0)) * 8;
    static_assert(kBytes <= 232448, "exceeds the sm_90 dynamic shared memory limit");
};

constexpr int kBarQFull = 0;
constexpr int kBarKFull = 1;                        // [kKSlots]
constexpr int kBarKEmpty = kBarKFull + kKSlots;     // [kKSlots]
constexpr int kBarVtFull = kBarKEmpty + kKSlots;    // [kVtSlots]
constexpr int kBarVtEmpty = kBarVtFull + kVtSlots;  // [kVtSlots]
// With kSplitLR, kBarKFull / kBarKEmpty are the left parts' and these the right parts'.
constexpr int kBarKFullR = kBarVtEmpty + kVtSlots;  // [kKSlots]
constexpr int kBarKEmptyR = kBarKFullR + kKSlots;   // [kKSlots]
// With kCluster2 (and not kSplitLR): this CTA's own half of a K slot has landed, and the peer's
// K slot is free for this CTA's copy into it (arrived by the peer).
constexpr int kBarHalfFull = kBarKFullR;            // [kKSlots]
constexpr int kBarPeerFree = kBarHalfFull + kKSlots;  // [kKSlots]

// Cluster helpers (kCluster2).
__device__ __forceinline__ u32 peer_addr(u32 addr, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void mbar_arrive_remote(u32 cluster_bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar)
                 : "memory");
}
// Arrives once and adds `bytes` to the transaction count of the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// `bytes` from this CTA's shared memory into a peer's (cluster address), completing as
// transaction bytes on the peer's mbarrier `cluster_bar`.
__device__ __forceinline__ void bulk_copy_s2peer(u32 cluster_dst, u32 src, u32 bytes,
                                                 u32 cluster_bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(cluster_dst),
        "r"(src), "r"(bytes), "r"(cluster_bar)
        : "memory");
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                     : "memory");
}

// wgmma shared-memory descriptor of a K-major operand in the 64-byte swizzle (8-row atoms of
// 512 bytes, `sbo` bytes apart; the leading offset is unused).
__device__ __forceinline__ u64 make_smem_desc_sw64(u32 addr, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(sbo >> 4) << 32) |
           ((u64)2 << 62);
}

// Stores four 8x8 b16 matrices (row addresses from lanes 8i … 8i + 7 for matrix i).
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// One 4-byte shared-memory store (kept in program order with the asm around it).
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// d[64x256 f32] += A[64x32 e4m3, smem] * B[256x32 e4m3, smem]^T, both operands K-major.
__device__ __forceinline__ void wgmma_pv(float (&d)[128], u64 desc_a, u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3\n"
        "{"
        " %0, %1, %2, %3, %4, %5, %6, %7,"
        " %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23,"
        " %24, %25, %26, %27, %28, %29, %30, %31,"
        " %32, %33, %34, %35, %36, %37, %38, %39,"
        " %40, %41, %42, %43, %44, %45, %46, %47,"
        " %48, %49, %50, %51, %52, %53, %54, %55,"
        " %56, %57, %58, %59, %60, %61, %62, %63,"
        " %64, %65, %66, %67, %68, %69, %70, %71,"
        " %72, %73, %74, %75, %76, %77, %78, %79,"
        " %80, %81, %82, %83, %84, %85, %86, %87,"
        " %88, %89, %90, %91, %92, %93, %94, %95,"
        " %96, %97, %98, %99, %100, %101, %102, %103,"
        " %104, %105, %106, %107, %108, %109, %110, %111,"
        " %112, %113, %114, %115, %116, %117, %118, %119,"
        " %120, %121, %122, %123, %124, %125, %126, %127},"
        " %128, %129, p, 1, 1;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b));
}

// Producer warps (warps 8-11) gather: warp w copies tokens 16w … 16w + 15 of every block; lane
// = (token % 8) + 8 * (chunk % 4), so eight lanes fill one 128-byte core matrix.
template <int D_QK>
struct Gather {
    using L = Smem<D_QK>;
    u32 k_base, bars;
    u16* mask16;
    const u8* kv;
    const i32* idx_row;
    i32 valid_len, s_kv;
    int pw, lane;

    __device__ __forceinline__ int load_index(int b, int grp) const {
        const int j = b * kTokensPerBlock + 16 * pw + 8 * grp + (lane & 7);
        return j < valid_len ? __ldg(idx_row + j) : -1;
    }
    // Gathers of block b, gather columns q0 … q1 - 1 (64 channels each); the part that starts at
    // column 0 also writes the block's validity mask. Completes on barrier `full`.
    __device__ __forceinline__ void issue_part(int b, const int (&idx)[2], int q0, int q1,
                                               u32 full) const {
        const int slot = b % kKSlots;
        const u32 dst_slot = k_base + slot * L::kTileBytes;
        u32 bits = 0;
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) {
            const int token = 16 * pw + 8 * grp + (lane & 7);
            const bool valid = idx[grp] >= 0 && idx[grp] < s_kv;
            const u8* src = kv + (valid ? (i64)idx[grp] * D_QK : (i64)0) + (lane >> 3) * 16;
#if defined(EXP_NO_GATHER_READ)
            const u32 n = 0u;
#elif defined(EXP_HALF_ROWS)
            const u32 n = valid && pw < 2 ? 16u : 0u;  // tokens 32 … 63 zero-filled
#else
            const u32 n = valid ? 16u : 0u;
#endif
            const u32 dst = dst_slot + L::k_chunk(token, lane >> 3);
#pragma unroll
            for (int q = q0; q < q1; ++q) cp_async_16(dst + q * L::kColStride, src + q * 64, n);
            bits |= (__ballot_sync(0xffffffffu, valid) & 0xffu) << (8 * grp);
        }
        if (q0 == 0 && lane == 0) mask16[slot * 4 + pw] = (u16)bits;
        mbar_arrive_cp_async(full);
        mbar_arrive(full);
    }
    __device__ __forceinline__ void issue_block(int b, const int (&idx)[2]) const {
        issue_part(b, idx, 0, L::kChunks / 4, bars + (kBarKFull + b % kKSlots) * 8);
    }
    // Shared gathers (kCluster2, two head tiles): warp pw copies token group 4 rank + pw of
    // block b (idx[0]) and only tests token group 4 (1 - rank) + pw (idx[1]), which the peer
    // copies, for the validity mask (one byte per token group). Completes on the half-full
    // barrier (this CTA's rows) and on k_full, which also waits for the peer's copy.
    __device__ __forceinline__ int load_index_shared(int b, int grp, int rank) const {
        const int group = grp == 0 ? 4 * rank + pw : 4 * (1 - rank) + pw;
        const int j = b * kTokensPerBlock + 8 * group + (lane & 7);
        return j < valid_len ? __ldg(idx_row + j) : -1;
    }
    __device__ __forceinline__ void issue_shared(int b, const int (&idx)[2], int rank) const {
        const int slot = b % kKSlots;
        const int token = 8 * (4 * rank + pw) + (lane & 7);
        const bool valid = idx[0] >= 0 && idx[0] < s_kv;
        const u8* src = kv + (valid ? (i64)idx[0] * D_QK : (i64)0) + (lane >> 3) * 16;
#if defined(EXP_NO_GATHER_READ)
        const u32 n = 0u;
#else
        const u32 n = valid ? 16u : 0u;
#endif
        const u32 dst = k_base + slot * L::kTileBytes + L::k_chunk(token, lane >> 3);
#pragma unroll
        for (int q = 0; q < L::kChunks / 4; ++q) {
            cp_async_16(dst + q * L::kColStride, src + q * 64, n);
        }
        const u32 own = __ballot_sync(0xffffffffu, valid) & 0xffu;
        const u32 other = __ballot_sync(0xffffffffu, idx[1] >= 0 && idx[1] < s_kv) & 0xffu;
        if (lane == 0) {
            u8* mask8 = reinterpret_cast<u8*>(mask16) + slot * 8;
            mask8[4 * rank + pw] = (u8)own;
            mask8[4 * (1 - rank) + pw] = (u8)other;
        }
        mbar_arrive_cp_async(bars + (kBarHalfFull + slot) * 8);
        const u32 full = bars + (kBarKFull + slot) * 8;
        mbar_arrive_cp_async(full);
        mbar_arrive(full);
    }
};

// V^T build (the four producer warps): warp pw writes tokens 32(pw % 2) … + 31 and value columns
// 256(pw / 2) … + 255 of a block's V^T,
// [512 value columns][64 positions] in the K-major canonical layout ((n/8)*512 + (p/16)*128 +
// (n%8)*16 + p%16), position p holding token c(p) = 16(p/16) + 8((p%4)/2) + 2((p%16)/4) + p%2
// (the order in which a thread's S accumulator holds its columns, so P needs no shuffle).
// Per 16 value columns: ldmatrix.x4.trans of the four 8-token core matrices (thread (g, t0)
// receives channels 2g, 2g + 1 of tokens 2t0, 2t0 + 1 of each), two byte permutes per pair of
// matrices (channel 2g, resp. 2g + 1, at tokens 2t0, 2t0 + 1, 8 + 2t0, 9 + 2t0), stmatrix.x4
// of rows (value columns) 2r and 2r + 1.
template <int D_QK>
__device__ __forceinline__ void build_vt(u32 k_slot, u32 vt_slot, int pw, int lane) {
    using L = Smem<D_QK>;
    const int bw = pw & 1;              // token half
    const int cc0 = (pw >> 1) * 16;     // first 16-column chunk of this warp
    const int token = 8 * (4 * bw + (lane >> 3)) + (lane & 7);  // the row this lane addresses
    const u32 ld = k_slot + (u32)(4 * bw + (lane >> 3)) * L::kRowGroupBytes + (u32)(lane & 7) * 16;
    const int m = lane >> 3, r = lane & 7;
    const int n_off = 2 * r + (m & 1);                  // value column inside the 16-column chunk
    const int kc = 2 * bw + (m >> 1);                   // 16-position chunk
    const u32 st =
        vt_slot + (u32)(n_off >> 3) * kVtGroupStride + (u32)kc * 128 + (u32)(n_off & 7) * 16;
    // chunk c's ldmatrix of this lane's token, and its permutes and stmatrix
    auto load = [&](int c, u32 (&v)[4]) {
        const u32 at = kSw64 ? k_slot + L::k_chunk(token, c) : ld + (u32)c * 128;
        ldmatrix_x4_trans(at, v[0], v[1], v[2], v[3]);
    };
    auto store = [&](int c, const u32 (&v)[4]) {
        stmatrix_x4(st + (u32)c * 2 * kVtGroupStride, byte_perm(v[0], v[1], 0x6420u),
                    byte_perm(v[0], v[1], 0x7531u), byte_perm(v[2], v[3], 0x6420u),
                    byte_perm(v[2], v[3], 0x7531u));
    };
    constexpr int kEnd = kDV / 32;  // 16-column chunks a warp builds
    if constexpr (kBuildPipe) {
        // Two batches of four chunks in turn: the loads of one batch are in flight while the
        // other batch is permuted and stored.
        u32 a[4][4], b[4][4];
#pragma unroll
        for (int k = 0; k < 4; ++k) load(cc0 + k, a[k]);
#pragma unroll 1
        for (int cc = cc0; cc < cc0 + kEnd; cc += 8) {
#pragma unroll
            for (int k = 0; k < 4; ++k) load(cc + 4 + k, b[k]);
#pragma unroll
            for (int k = 0; k < 4; ++k) store(cc + k, a[k]);
            if (cc + 8 < cc0 + kEnd) {
#pragma unroll
                for (int k = 0; k < 4; ++k) load(cc + 8 + k, a[k]);
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) store(cc + 4 + k, b[k]);
        }
    } else {
        // kBatch chunks at a time: their ldmatrix first, then the permutes and stores (the asm
        // statements keep program order, so a load after a store would wait for it).
        // (Unrolled, with immediate offsets, it measured 11% slower.)
#pragma unroll 1
        for (int cc = cc0; cc < cc0 + kEnd; cc += kBuildBatch) {
            u32 v[kBuildBatch][4];
#pragma unroll
            for (int k = 0; k < kBuildBatch; ++k) load(cc + k, v[k]);
#pragma unroll
            for (int k = 0; k < kBuildBatch; ++k) store(cc + k, v[k]);
        }
    }
}

}  // namespace sparse_mla

template <int D_QK, bool HAVE_TOPK_LENGTH, bool HAVE_SINK>
__global__ void EXP_CLUSTER_DIMS __launch_bounds__(sparse_mla::kThreads, 1)
    sparse_mla_prefill_kernel(const SparseMlaParams p) {
    using namespace sparse_mla;
    using L = Smem<D_QK>;
    static_assert(D_QK == 512 || D_QK == 576, "D_QK must be 512 or 576");
    static_assert(!HAVE_SINK || HAVE_TOPK_LENGTH, "attn_sink requires topk_length");

    extern __shared__ __align__(1024) u8 smem[];
    const u32 smem_base = smem_addr(smem);
    const u32 sq = smem_base + L::kQ;
    const u32 sk = smem_base + L::kK;
    const u32 svt = smem_base + L::kVt;
    const u32 sp = smem_base + L::kP;
    const u32 bars = smem_base + L::kBars;

    // kCluster2: an idle CTA pads an odd grid (it shares nothing: only two head tiles a row
    // share their gathers, and their grid is even).
    if (kCluster2 && blockIdx.x >= (unsigned)(p.head_tiles * p.s_q)) return;
    const int tile = blockIdx.x % p.head_tiles;
    const int row_i = blockIdx.x / p.head_tiles;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;

    int valid_len = p.topk;
    if (HAVE_TOPK_LENGTH) valid_len = min(max(__ldg(p.topk_length + row_i), 0), p.topk);
    const int num_blocks = HAVE_TOPK_LENGTH ? ((valid_len + 127) / 128) * 2 : p.topk / 64;
    const int num_pairs = num_blocks / 2;

    const bool share = kCluster2 && p.head_tiles == 2;
    const u32 rank = (u32)tile;  // with two tiles a row, the CTA's rank in its cluster
    if (threadIdx.x == 0) {
        mbar_init(bars + kBarQFull * 8, 128);
        for (int s = 0; s < kKSlots; ++s) {
            // 128 cp.async-tracked + 128 plain (+ 1 with the peer's copy's bytes when shared)
            mbar_init(bars + (kBarKFull + s) * 8, share ? 257 : 256);
            if (kCluster2) {
                mbar_init(bars + (kBarHalfFull + s) * 8, 128);
                mbar_init(bars + (kBarPeerFree + s) * 8, 1);
            }
            mbar_init(bars + (kBarKEmpty + s) * 8, 256);  // owner warpgroup + V^T build
            if (kSplitLR) {
                mbar_init(bars + (kBarKFullR + s) * 8, 256);
                mbar_init(bars + (kBarKEmptyR + s) * 8, 256);
            }
        }
        for (int s = 0; s < kVtSlots; ++s) {
            mbar_init(bars + (kBarVtFull + s) * 8, 128);
            mbar_init(bars + (kBarVtEmpty + s) * 8, 256);
        }
        if (kCluster2) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (share) cluster_sync();  // the peer's barriers exist before any remote arrival or copy

    if (warp >= 8) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
        const int pw = warp & 3;
        const int pt = (threadIdx.x - 256) & 127;  // 0..127 inside the producer warpgroup
        Gather<D_QK> gather;
        gather.k_base = sk;
        gather.bars = bars;
        gather.mask16 = reinterpret_cast<u16*>(smem + L::kMask);
        gather.kv = p.kv;
        gather.idx_row = p.indices + (i64)row_i * p.topk;
        gather.valid_len = valid_len;
        gather.s_kv = p.s_kv;
        gather.pw = pw;
        gather.lane = lane;
        // The index of row grp of this lane in block b (shared gathers: idx[0] is copied here,
        // idx[1] by the peer).
        auto block_index = [&](int b, int grp) -> int {
            if constexpr (kCluster2) {
                if (share) return gather.load_index_shared(b, grp, (int)rank);
            }
            return gather.load_index(b, grp);
        };
        // The gathers of block st wait for K slot st % kKSlots to be released by S and by the
        // V^T build of block st - kKSlots.
        auto gather_step = [&](int st, int (&idx)[2], int (&nxt)[2]) {
            // The next block's indices load while this step waits for its K slot.
#pragma unroll
            for (int grp = 0; grp < 2; ++grp) {
                nxt[grp] = st + 1 < num_blocks ? block_index(st + 1, grp) : -1;
            }
            const int ks = st % kKSlots;
            const u32 parity = (u32)(st / kKSlots - 1) & 1u;
            if (st >= kKSlots) mbar_wait(bars + (kBarKEmpty + ks) * 8, parity);
            if (share) {
                // This CTA's slot is free for the peer's copy; the peer's slot must be free for
                // ours (which also means our copy of block st - kKSlots out of this slot is done).
                const u32 peer_free = bars + (kBarPeerFree + ks) * 8;
                if (st >= kKSlots) {
                    if (pt == 0) mbar_arrive_remote(peer_addr(peer_free, rank ^ 1u));
                    mbar_wait_cluster(peer_free, parity);
                }
                if (pt == 0) {
                    mbar_arrive_expect_tx(bars + (kBarKFull + ks) * 8, 4 * L::kRowGroupBytes);
                }
                gather.issue_shared(st, idx, (int)rank);
            } else if constexpr (kSplitLR) {
                gather.issue_part(st, idx, 0, kLeftQ, bars + (kBarKFull + ks) * 8);
                if (st >= kKSlots) mbar_wait(bars + (kBarKEmptyR + ks) * 8, parity);
                gather.issue_part(st, idx, kLeftQ, L::kChunks / 4, bars + (kBarKFullR + ks) * 8);
            } else {
                gather.issue_block(st, idx);
            }
#pragma unroll
            for (int grp = 0; grp < 2; ++grp) idx[grp] = nxt[grp];
        };
        // Shared gathers: once our rows of block b have landed, one copy of them into the peer's
        // slot (thread 0, a step behind the gathers whatever the build's lag: the peer's k_full
        // must not wait for a build that waits for a V^T slot).
        auto copy_step = [&](int b) {
            const int ks = b % kKSlots;
            if (pt == 0) {
                mbar_wait(bars + (kBarHalfFull + ks) * 8, (u32)(b / kKSlots) & 1u);
                fence_proxy_async();  // cp.async writes, read by the bulk copy (async proxy)
                const u32 peer_full = peer_addr(bars + (kBarKFull + ks) * 8, rank ^ 1u);
                if constexpr (kSw64) {
                    // our 32 rows are the first or second 2 KB of every 4 KB column
                    for (int q = 0; q < L::kChunks / 4; ++q) {
                        const u32 half = sk + ks * L::kTileBytes + q * 4096 + rank * 2048;
                        bulk_copy_s2peer(peer_addr(half, rank ^ 1u), half, 2048, peer_full);
                    }
                } else {
                    const u32 half = sk + ks * L::kTileBytes + rank * 4 * L::kRowGroupBytes;
                    bulk_copy_s2peer(peer_addr(half, rank ^ 1u), half, 4 * L::kRowGroupBytes,
                                     peer_full);
                }
            }
            __syncwarp();
        };
        // V^T of block b from its K slot, once the rows have landed and the V^T slot is free.
        auto build_step = [&](int b) {
            const int ks = b % kKSlots, vs = b % kVtSlots;
            mbar_wait(bars + (kBarKFull + ks) * 8, (u32)(b / kKSlots) & 1u);
            if (kSplitLR) mbar_wait(bars + (kBarKFullR + ks) * 8, (u32)(b / kKSlots) & 1u);
            if (b >= kVtSlots) {
                mbar_wait(bars + (kBarVtEmpty + vs) * 8, (u32)(b / kVtSlots - 1) & 1u);
            }
#ifndef EXP_NO_VT_BUILD
            build_vt<D_QK>(sk + ks * L::kTileBytes, svt + vs * kVtBytes, pw, lane);
#endif
            fence_proxy_async();  // V^T is read by wgmma (async proxy)
            mbar_arrive(bars + (kBarVtFull + vs) * 8);
            mbar_arrive(bars + (kBarKEmpty + ks) * 8);
            if (kSplitLR) mbar_arrive(bars + (kBarKEmptyR + ks) * 8);
        };
        load_q_tile64<D_QK>(p, row_i, tile, sq, pt, num_pairs > 0);
        if (num_pairs > 0) mbar_arrive_cp_async(bars + kBarQFull * 8);
        int idx[2], nxt[2];  // indices of this step's block and of the next one
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) {
            idx[grp] = num_blocks > 0 ? block_index(0, grp) : -1;
        }
        // One loop for the whole warpgroup: step st issues the gathers of block st, then builds
        // V^T of block st - kBuildLag (whose rows have had a step to land). kBuildLag < kKSlots:
        // the gathers of block st need the build of block st - kKSlots, done a step earlier.
        constexpr int kBuildLag = kKSlots - 1;
        for (int st = 0; st < num_blocks + kBuildLag; ++st) {
            if (st < num_blocks) gather_step(st, idx, nxt);
            if (share && st >= 1 && st - 1 < num_blocks) copy_step(st - 1);
            if (st - kBuildLag >= 0) build_step(st - kBuildLag);
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        if (share) cluster_sync();  // no CTA leaves while its peer may still copy into it
        return;
    }

    // -------------------------------------------------------------------- consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    const int wg = warp >> 2;
    const int wwarp = warp & 3;
    const int g = lane >> 2;
    const int t0 = lane & 3;
    const int row0 = 16 * wwarp + g;  // this thread's heads (S and O rows): row0, row0 + 8

    float* max_xchg = reinterpret_cast<float*>(smem + L::kMax);
    float* sum_xchg = reinterpret_cast<float*>(smem + L::kSum);
    float* tmax_xchg = reinterpret_cast<float*>(smem + L::kTmax);
    const u16* mask16 = reinterpret_cast<const u16*>(smem + L::kMask);

    const float q_scale = __ldg(p.q_scale);
    const float kv_scale = __ldg(p.kv_scale);
    const float score_scale = p.sm_scale * q_scale * kv_scale * kLog2e;
    const u64 q_desc = make_smem_desc(sq, 128, L::kRowGroupBytes);

    float o[128];  // O[heads row0, row0 + 8][value columns 256wg + 8j + 2t0 + {0,1}]
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m_ref[2] = {-pos_inf(), -pos_inf()};
    float t_max[2] = {-pos_inf(), -pos_inf()};
    float l_run[2] = {0.f, 0.f};
    float alpha[2] = {1.f, 1.f};
    float headroom = 0.f;
    float s_cur[32], s_next[32];
    u64 s_mask = 0;  // validity of the tokens of the block in s_cur (bit = S column)

    constexpr int kQkSteps = D_QK / 32;
    constexpr int kQkChunks = (kQkSteps + kQkChunkSteps - 1) / kQkChunkSteps;
    static_assert(kQkChunks >= 2, "s_begin releases the two V^T slots after chunks 0 and 1");

    auto issue_qk_chunk = [&](float (&acc)[32], u64 k_desc, int c) {
        fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int ks = c * kQkChunkSteps; ks < (c + 1) * kQkChunkSteps && ks < kQkSteps; ++ks) {
            // K's k-step ks (32 channels): the next core-matrix pair, or with kSw64 half a
            // 64-byte swizzle row, columns 4 KB apart (descriptor units of 16 bytes)
            const u64 k_step = kSw64 ? (u64)((ks >> 1) * 256 + (ks & 1) * 2) : (u64)(ks * 16);
            wgmma_qk(acc, q_desc + (u64)(ks * 16), k_desc + k_step,
                     ks > c * kQkChunkSteps ? 1u : 0u);
        }
        wgmma_commit();
    };
    // V^T of block blk (>= 0) is in slot vt_slot(blk), use vt_use(blk) of that slot. (With two
    // slots, block 2t + kb of pair t is in slot kb, use t: written so, for the measured build.)
    auto vt_slot = [](int blk) { return (int)((u32)blk % (u32)kVtSlots); };
    auto vt_use = [](int blk) { return (u32)blk / (u32)kVtSlots; };
    // P.V of one block of the pair before is complete: its V^T slot goes back to the producer.
    auto pv_release = [&](int slot) {
        mbar_arrive(bars + (kBarVtEmpty + slot) * 8);
    };
    // S of block b: every chunk issued, all but the last summed; the last is left in flight
    // (s_finish adds it once the caller has waited for it). Chunk c lands in s_cur when
    // (kQkChunks - 1 - c) is even, so the complete sum ends in s_cur.
    auto s_begin = [&](int b, bool release_pv) {
        const int slot = b % kKSlots;
        mbar_wait(bars + (kBarKFull + slot) * 8, (u32)(b / kKSlots) & 1u);
        fence_proxy_async();
        // The validity mask is read now: s_finish releases the slot, and with it the mask.
        s_mask = *reinterpret_cast<const u64*>(mask16 + slot * 4);
        const u64 k_desc = kSw64 ? make_smem_desc_sw64(sk + slot * L::kTileBytes, 512)
                                 : make_smem_desc(sk + slot * L::kTileBytes, 128, L::kRowGroupBytes);
#pragma unroll
        for (int c = 0; c < kQkChunks; ++c) {
            float (&dst)[32] = (kQkChunks - 1 - c) % 2 == 0 ? s_cur : s_next;
            float (&src)[32] = (kQkChunks - 1 - c) % 2 == 0 ? s_next : s_cur;
            if (c >= 2) {
                // Chunk c - 1 (in src) is done: the running sum of chunks 0 … c - 2 (in dst)
                // goes into it, and dst is free for chunk c.
                wgmma_wait<0>();
                fence_regs(dst);
                fence_regs(src);
#pragma unroll
                for (int i = 0; i < 32; ++i) src[i] += dst[i];
            }
            if (kSplitLR && c == kLeftChunks) {
                // S is past the left part (every chunk before this one is done): it goes back
                // to the producer, and the right part must have landed.
                mbar_arrive(bars + (kBarKEmpty + slot) * 8);
                mbar_wait(bars + (kBarKFullR + slot) * 8, (u32)(b / kKSlots) & 1u);
                fence_proxy_async();
            }
            issue_qk_chunk(dst, k_desc, c);
            // P.V of the pair before went in as one commit group per block: once the group of
            // block c is done, its V^T slot goes back to the producer.
            if (c < 2 && release_pv) {
                wgmma_wait<2>();
                // block 2t + c of the pair t before
                pv_release(kVtSlots == 2 ? c : vt_slot(b - wg - 2 + c));
            }
        }
    };
    // The last chunk is done (waited for by the caller): the sum of all of them in s_cur.
    auto s_finish = [&](int b) {
        fence_regs(s_cur);
        fence_regs(s_next);
        if (kQkChunks >= 2) {
#pragma unroll
            for (int i = 0; i < 32; ++i) s_cur[i] += s_next[i];
        }
        mbar_arrive(bars + ((kSplitLR ? kBarKEmptyR : kBarKEmpty) + b % kKSlots) * 8);
    };

    // ---- softmax of this warpgroup's block of pair t (S in s_cur): P -> P tile t % 2 (e4m3,
    // positions 64wg …), row sums, and the reference max. Returns whether O needs a rescale
    // (alpha, only after a vote that moved m_ref; P.V of pair t - 1 is complete by then).
    auto softmax = [&](int t) -> bool {
        const u64 mask = s_mask;
        float mx[2] = {-pos_inf(), -pos_inf()};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int col = 8 * (i >> 2) + 2 * t0 + (i & 1);
            const float x = ((mask >> col) & 1ull) ? s_cur[i] * score_scale : -pos_inf();
            s_cur[i] = x;
            mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], x);
        }
        bool grow = false;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            t_max[h] = fmaxf(t_max[h], mx[h]);
            grow |= mx[h] > m_ref[h] + headroom;  // any valid score while m_ref is -inf
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
        if (t0 == 0) {
            max_xchg[wg * 64 + row0] = mx[0];
            max_xchg[wg * 64 + row0 + 8] = mx[1];
        }
        const u32 p_base = sp + (u32)((t & 1) * kPBytes) + (u32)(2 * wwarp * 1024 + g * 16 + 4 * t0);
        float lsum[2];
        // Weights against m_sub, packed into the P tile: register a of k-step ks holds the
        // positions 4t0 … 4t0 + 3 of 16-position chunk 4wg + 2ks + (a >> 1), row row0 + 8(a & 1).
        auto write_p = [&](const float (&m_sub)[2]) {
            lsum[0] = 0.f;
            lsum[1] = 0.f;
            float w[32];
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                w[i] = fast_exp2(s_cur[i] - m_sub[(i >> 1) & 1]);
                lsum[(i >> 1) & 1] += w[i];
            }
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const int i0 = 16 * ks + 8 * (a >> 1) + 2 * (a & 1);
                    const u32 word = (u32)pack_e4m3x2(w[i0], w[i0 + 1]) |
                                     ((u32)pack_e4m3x2(w[i0 + 4], w[i0 + 5]) << 16);
                    st_shared_u32(p_base + (u32)((a & 1) * 1024 + (4 * wg + 2 * ks + (a >> 1)) * 128),
                                  word);
                }
            }
            fence_proxy_async();  // P is read by wgmma (async proxy)
        };
        float m_sub[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) m_sub[h] = m_ref[h] == -pos_inf() ? 0.f : m_ref[h];
        write_p(m_sub);
        const bool exchange = named_barrier_any(kBarConsumers, 256, grow);
        bool rescale = false;
        if (exchange) {
            // m_ref moves to the max over both blocks of the pair (the same in both warpgroups).
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float pm = max_xchg[(1 - wg) * 64 + row0 + 8 * h];
                const float m_new = fmaxf(m_ref[h], fmaxf(mx[h], pm));
                m_sub[h] = m_new == -pos_inf() ? 0.f : m_new;
                alpha[h] = fast_exp2(m_ref[h] - m_sub[h]);  // 0 while m_ref is -inf
                rescale |= alpha[h] != 1.f;
                m_ref[h] = m_new;
                l_run[h] *= alpha[h];
            }
            write_p(m_sub);
            // New headroom: log2 of 1/16 of a lower bound of both rows' denominators (this
            // warpgroup's part of them), at most kMaxHeadroom.
            float lw[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                lw[h] = l_run[h] + lsum[h];
                lw[h] += __shfl_xor_sync(0xffffffffu, lw[h], 1);
                lw[h] += __shfl_xor_sync(0xffffffffu, lw[h], 2);
            }
            headroom = fminf(fmaxf(__log2f(fminf(lw[0], lw[1])) - kLog2ShareLimit, 0.f), kMaxHeadroom);
            named_barrier_sync(kBarConsumers, 256);
        }
        l_run[0] += lsum[0];
        l_run[1] += lsum[1];
        return __any_sync(0xffffffffu, rescale);
    };
    auto rescale_o = [&]() {
        fence_regs(o);  // P.V of the pair before is complete (waited for in s_begin)
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    };

    // ---- O[:, 256wg …] += P . V^T of pair t (both blocks, two k-steps each), one commit group.
    auto pv_issue = [&](int t) {
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
            if constexpr (kVtSlots == 2) {
                mbar_wait(bars + (kBarVtFull + kb) * 8, (u32)t & 1u);
            } else {
                mbar_wait(bars + (kBarVtFull + vt_slot(2 * t + kb)) * 8, vt_use(2 * t + kb) & 1u);
            }
        }
        const u64 p_desc = make_smem_desc(sp + (u32)((t & 1) * kPBytes), 128, 1024);
        fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
            const int vs = kVtSlots == 2 ? kb : vt_slot(2 * t + kb);
            const u64 vt_desc =
                make_smem_desc(svt + (u32)(vs * kVtBytes + wg * (kVtBytes / 2)), 128,
                               kVtGroupStride);
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                wgmma_pv(o, p_desc + (u64)((2 * kb + ks) * 16), vt_desc + (u64)(ks * 16));
            }
            wgmma_commit();  // one group per block (s_begin releases its V^T slot)
        }
    };

    if (num_pairs > 0) {
        mbar_wait(bars + kBarQFull * 8, 0);
        fence_proxy_async();
        s_begin(wg, false);
        wgmma_wait<0>();
        s_finish(wg);
        softmax(0);  // O is still zero: no rescale
    }
    for (int t = 0; t < num_pairs; ++t) {
        pv_issue(t);
        if (t + 1 < num_pairs) {
            // S of the next pair queues behind P.V: the first chunk wait inside s_begin
            // (chunk 2) retires P.V too, so the V^T slots go back to the producer early.
            s_begin(2 * (t + 1) + wg, true);
            wgmma_wait<0>();
            s_finish(2 * (t + 1) + wg);
            if (softmax(t + 1)) rescale_o();
        } else {
            wgmma_wait<0>();
            fence_regs(o);
        }
    }

    // ---------------------------------------------------------------- epilogue
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
        t_max[h] = fmaxf(t_max[h], __shfl_xor_sync(0xffffffffu, t_max[h], 1));
        t_max[h] = fmaxf(t_max[h], __shfl_xor_sync(0xffffffffu, t_max[h], 2));
    }
    if (t0 == 0) {
        sum_xchg[wg * 64 + row0] = l_run[0];
        sum_xchg[wg * 64 + row0 + 8] = l_run[1];
        tmax_xchg[wg * 64 + row0] = t_max[0];
        tmax_xchg[wg * 64 + row0 + 8] = t_max[1];
    }
    named_barrier_sync(kBarConsumers, 256);
    float out_scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        const int head = tile * kHeadsPerTile + row;
        const float l_total = l_run[h] + sum_xchg[(1 - wg) * 64 + row];
        const bool empty = m_ref[h] == -pos_inf();
        float denom = l_total;
        if (HAVE_SINK && head < p.h_q) {
            denom += fast_exp2(__ldg(p.attn_sink + head) * kLog2e - (empty ? 0.f : m_ref[h]));
        }
        out_scale[h] = empty ? 0.f : kv_scale / denom;
        if (wg == h && t0 == 0 && head < p.h_q) {
            const float m_true = fmaxf(t_max[h], tmax_xchg[(1 - wg) * 64 + row]);
            const i64 out_row = (i64)row_i * p.h_q + head;
            p.max_logits[out_row] = empty ? -pos_inf() : m_true * kLn2;
            p.lse[out_row] = empty ? pos_inf() : (m_ref[h] + log2f(l_total)) * kLn2;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int head = tile * kHeadsPerTile + row0 + 8 * h;
        if (head >= p.h_q) continue;
        bf16_t* out = p.out + ((i64)row_i * p.h_q + head) * kDV + 256 * wg + 2 * t0;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            *reinterpret_cast<u32*>(out + 8 * j) =
                pack_bf16x2(o[4 * j + 2 * h] * out_scale[h], o[4 * j + 2 * h + 1] * out_scale[h]);
        }
    }
    if (share) cluster_sync();  // no CTA leaves while its peer may still copy into it
}
