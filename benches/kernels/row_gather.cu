// shapeproof benchmark — the row-gather limit of a sparse MLA decode step: every cache row the
// step's slots name (656 bytes: 41 16-byte words) read once from global memory and folded
// into a checksum that is written only if it takes a value it never takes, so the time is the
// rows' reads alone: no math, no writes. A warp takes ROWS slots at a time (4: 164 words, up to
// six 16-byte loads a lane in flight); slots outside [0, slots) are not read. Launch: 256-thread
// blocks, any grid (grid-stride).
// Prepended by the library: common.cuh (u8, u32, i32, i64).

// Mirrored by `RowGatherParams` in benches/mla_decode.rs.
struct RowGatherParams {
    const u8* cache;   // [slots, 656]
    const i32* slot;   // [positions] cache slots
    u32* sink;         // [1] written only by a checksum no input produces in practice
    i64 positions;
    i32 slots;
};

template <int ROWS>
__global__ void __launch_bounds__(256) row_gather_kernel(const RowGatherParams p) {
    constexpr int kWords = 656 / 16;    // 41 words a row
    constexpr int kRows = ROWS;         // rows a warp at a time
    constexpr int kLoads = (kRows * kWords + 31) / 32;  // 6 loads a lane
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
    u32 acc = 0;
    for (i64 base = warp * kRows; base < p.positions; base += warps * kRows) {
        i32 s[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const i64 at = base + r;
            const i32 v = at < p.positions ? p.slot[at] : -1;
            s[r] = (v >= 0 && v < p.slots) ? v : -1;
        }
        uint4 w[kLoads];
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
            const int word = lane + 32 * j;
            const int r = word / kWords, c = word % kWords;
            w[j] = make_uint4(0, 0, 0, 0);
            if (word < kRows * kWords && s[r] >= 0) {
                w[j] = reinterpret_cast<const uint4*>(p.cache + (i64)s[r] * 656)[c];
            }
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
            acc ^= w[j].x ^ w[j].y ^ w[j].z ^ w[j].w;
        }
    }
    if (acc == 0x9e3779b9u) {
        p.sink[0] = acc;
    }
}
