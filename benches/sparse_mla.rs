//! Benchmark of the FP8 sparse MLA prefill: TFLOP/s counted as `2·s_q·h·topk·(d_qk + 512)` over
//! the real heads h (h = h_q but for the DeepSeek TP8 row) at s_q = 4096, h_q = 128, d_qk = 576,
//! top-k 2048, s_kv ∈ {8192, 32768, 65536}; at h_q = 64, d_qk = 512, top-k 512; and DeepSeek
//! V3.2 at TP8 (16 real heads padded to 64); each with the default head tiling
//! (`HeadTiling::Fastest`: the 64-head kernel for the 64- and 128-head shapes, a 16-head narrow
//! tile for DeepSeek TP8) and with `HeadTiling::Tiles64` (the 64-head kernel) on the same shapes
//! in the same run. The limit beside it is the FP8 matmul rate of the same GPU, measured in the same run by
//! `fp8_matmul_rate.py` (PyTorch `_scaled_mm`) when Python with PyTorch is present.
//!
//! Narrow head tiles (8, 16, 32 heads per rank) at (4096, 32768, h, 576, 2048) and
//! (4096, 32768, h, 512, 512): the narrow kernel, the same inputs run padded in one 64-head tile,
//! TFLOP/s on the real heads, and beside them the gather limits of the same run: two gather-only
//! kernels over the same indices' rows (top-k rows of d_qk bytes per query row), one with plain
//! 16-byte loads into registers and one with bulk copies into shared memory (the narrow kernel's
//! path); the faster of the two is the limit.
//! Inputs: N(0, 0.05²) cast to e4m3, random valid indices, rotated between two sets.
//! Beside every time, the accuracy of that kernel's output on input set 0 (poisoned before the
//! run): max |Δout| and the cosine distance against an f64 softmax reference on the dequantised
//! inputs, over 8 query rows spread across the chunk and every real head (for the narrow tiles
//! also of the padded 64-head run on the same inputs).
//! Run on the H200 through `scripts/gpu-bundle.sh` (`run.sh bench`); needs `--features gpu-tests`.

mod common;

use common::{Record, fp8_matmul_limit, gpu, time_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::cuda::{CudaKernel, LaunchShape};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32, e4m3_to_f32};
use shapeproof::layout::MlaLatentKv;
use shapeproof::ops::sparse_mla::*;
use shapeproof::rules::{HeadTile, MlaHeadDim, PadsTo, TopkWidth};
use shapeproof::tensor::{Cols, Tensor};

const S_Q: usize = 4096;
const SM_SCALE: f32 = 0.1352;
/// Query rows the accuracy check samples, spread over the chunk.
const SAMPLE_ROWS: [usize; 8] = [0, 585, 1170, 1755, 2340, 2925, 3510, 4095];

/// Host copies of input set 0, for the accuracy check.
struct HostSet {
    q: Vec<F8E4M3>,    // [S_Q, heads, d_qk]
    kv: Vec<F8E4M3>,   // [s_kv, d_qk]
    indices: Vec<i32>, // [S_Q, topk]
}

/// max |Δout| and cosine distance of `out` (`[S_Q, heads, 512]` bf16) against an f64 softmax
/// reference on the dequantised inputs (unit scales), over `SAMPLE_ROWS` and every head. A NaN
/// in `out` gives an infinite max |Δout|.
fn accuracy(host: &HostSet, out: &[bf16], heads: usize, d: usize, topk: usize) -> (f64, f64) {
    let lut: Vec<f64> = (0..=255u8)
        .map(|b| e4m3_to_f32(F8E4M3::from_bits(b)) as f64)
        .collect();
    let deq = |v: F8E4M3| lut[v.to_bits() as usize];
    let s_kv = host.kv.len() / d;
    let (mut max_abs, mut dot, mut n_out, mut n_ref) = (0f64, 0f64, 0f64, 0f64);
    for &i in &SAMPLE_ROWS {
        let rows: Vec<usize> = host.indices[i * topk..(i + 1) * topk]
            .iter()
            .filter(|&&x| x >= 0 && (x as usize) < s_kv)
            .map(|&x| x as usize)
            .collect();
        for h in 0..heads {
            let q: Vec<f64> = host.q[(i * heads + h) * d..][..d]
                .iter()
                .map(|&v| deq(v))
                .collect();
            let scores: Vec<f64> = rows
                .iter()
                .map(|&r| {
                    let k = &host.kv[r * d..][..d];
                    SM_SCALE as f64 * q.iter().zip(k).map(|(a, &b)| a * deq(b)).sum::<f64>()
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut acc = [0f64; 512]; // Σ w·v over the row's tokens
            let mut z = 0f64;
            for (&r, &sc) in rows.iter().zip(&scores) {
                let w = (sc - m).exp();
                z += w;
                for (a, &v) in acc.iter_mut().zip(&host.kv[r * d..][..512]) {
                    *a += w * deq(v);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                let r = a / z;
                let o = out[(i * heads + h) * 512 + c].to_f32() as f64;
                let err = if o.is_nan() {
                    f64::INFINITY
                } else {
                    (o - r).abs()
                };
                max_abs = max_abs.max(err);
                dot += o * r;
                n_out += o * o;
                n_ref += r * r;
            }
        }
    }
    (max_abs, 1.0 - dot / (n_out.sqrt() * n_ref.sqrt()))
}

struct Set<const D: usize, const HEADS: usize, const TOPK: usize> {
    inputs: SparseMlaInputs<Cuda, D, HEADS, TOPK, Plain>,
    kv: MlaLatentKv<Cuda, D>,
}

fn e4m3(rng: &mut StdRng, n: usize) -> Vec<F8E4M3> {
    (0..n)
        .map(|_| e4m3_from_f32((rng.random::<f32>() - 0.5) * 0.17))
        .collect()
}

/// Runs `kernel` once on `set` into an output poisoned with NaN and returns its accuracy
/// against the f64 reference (see `accuracy`).
fn accuracy_of<const D: usize, const HQ: usize, const HEADS: usize, const TOPK: usize>(
    g: &Cuda,
    kernel: &SparseMlaPrefill<D, HQ, TOPK, Plain, HEADS>,
    set: &Set<D, HEADS, TOPK>,
    host: &HostSet,
) -> (f64, f64)
where
    Dim<D>: MlaHeadDim,
    Dim<HQ>: HeadTile,
    Dim<TOPK>: TopkWidth,
    Dim<HEADS>: PadsTo<HQ>,
{
    let mut out = Tensor::<Cuda, bf16, OutRow<HEADS>>::filled(g, S_Q, bf16::NAN).unwrap();
    let mut ml = Tensor::<Cuda, f32, Cols<HEADS>>::zeros(g, S_Q).unwrap();
    let mut lse = Tensor::<Cuda, f32, Cols<HEADS>>::zeros(g, S_Q).unwrap();
    kernel
        .run(g, &set.inputs, &set.kv, &mut out, &mut ml, &mut lse)
        .unwrap();
    accuracy(host, &out.to_host(g).unwrap(), HEADS, D, TOPK)
}

/// One random input set on the host: q `[S_Q, heads, d]`, latent KV `[s_kv, d]`, indices
/// `[S_Q, topk]` (all valid).
fn host_set(rng: &mut StdRng, heads: usize, d: usize, topk: usize, s_kv: usize) -> HostSet {
    let indices = (0..S_Q * topk)
        .map(|_| rng.random_range(0..s_kv as i32))
        .collect();
    HostSet {
        q: e4m3(rng, S_Q * heads * d),
        kv: e4m3(rng, s_kv * d),
        indices,
    }
}

/// Uploads one host set as the kernel's inputs and latent KV.
fn upload_set<const D: usize, const HEADS: usize, const TOPK: usize>(
    g: &Cuda,
    h: &HostSet,
) -> Set<D, HEADS, TOPK>
where
    Dim<D>: MlaHeadDim,
    Dim<TOPK>: TopkWidth,
{
    Set {
        inputs: SparseMlaInputs::new(
            Tensor::from_host(g, "q", &h.q, S_Q).unwrap(),
            Tensor::from_host(g, "q_scale", &[1.0f32], 1).unwrap(),
            Tensor::from_host(g, "indices", &h.indices, S_Q).unwrap(),
            SM_SCALE,
        )
        .unwrap(),
        kv: MlaLatentKv::new(g, g.upload(&h.kv).unwrap(), h.kv.len() / D, 1.0).unwrap(),
    }
}

fn bench<const D: usize, const HQ: usize, const HEADS: usize, const TOPK: usize>(
    g: &Cuda,
    rng: &mut StdRng,
    s_kv: usize,
    tiling: HeadTiling,
    limit: Option<f64>,
    records: &mut Vec<Record>,
) where
    Dim<D>: MlaHeadDim,
    Dim<HQ>: HeadTile,
    Dim<TOPK>: TopkWidth,
    Dim<HEADS>: PadsTo<HQ>,
{
    let hosts: Vec<HostSet> = (0..2)
        .map(|_| host_set(rng, HEADS, D, TOPK, s_kv))
        .collect();
    let sets: Vec<Set<D, HEADS, TOPK>> = hosts.iter().map(|h| upload_set(g, h)).collect();
    let mut out = Tensor::<Cuda, bf16, OutRow<HEADS>>::zeros(g, S_Q).unwrap();
    let mut ml = Tensor::<Cuda, f32, Cols<HEADS>>::zeros(g, S_Q).unwrap();
    let mut lse = Tensor::<Cuda, f32, Cols<HEADS>>::zeros(g, S_Q).unwrap();
    let kernel = SparseMlaPrefill::<D, HQ, TOPK, Plain, HEADS>::new().with_tiling(tiling);
    let us = time_us(g, 3, 20, |i| {
        let s = &sets[i % 2];
        kernel
            .run(g, &s.inputs, &s.kv, &mut out, &mut ml, &mut lse)
            .unwrap()
    });
    let (max_abs, cos_dist) = accuracy_of(g, &kernel, &sets[0], &hosts[0]);
    // Counted over the real heads (the h_q of the published figures, where HEADS = HQ): with
    // fewer real heads the default tiling computes only the narrow tile(s) that hold them.
    let flops =
        SparseMlaPrefill::<D, HQ, TOPK, Plain, HEADS>::flops(S_Q) * HEADS as f64 / HQ as f64;
    let tflops = flops / (us * 1e-6) / 1e12;
    let of_limit = limit.map_or("—".to_string(), |l| format!("{:.0}%", 100.0 * tflops / l));
    println!(
        "| ({S_Q}, {s_kv}, {HQ} [{HEADS} real], {D}, {TOPK}) | {tiling:?} | {:.3} | {tflops:.0} | {of_limit} | {max_abs:.2e} | {cos_dist:.1e} |",
        us / 1e3
    );
    records.push(Record {
        name: match tiling {
            HeadTiling::Fastest => format!("sq{S_Q}_skv{s_kv}_hq{HQ}_heads{HEADS}_d{D}_topk{TOPK}"),
            HeadTiling::Tiles64 => {
                format!("sq{S_Q}_skv{s_kv}_hq{HQ}_heads{HEADS}_d{D}_topk{TOPK}_tiles64")
            }
        },
        fields: vec![
            ("ms", us / 1e3),
            ("tflops", tflops),
            ("limit_tflops", limit.unwrap_or(f64::NAN)),
            ("max_abs_dout", max_abs),
            ("cos_distance", cos_dist),
        ],
    });
}

/// Gather-only limit kernel: per query row (one 256-thread block), every valid index's row of
/// `D` bytes, read with 16-byte loads, one warp instruction per 512 contiguous bytes of a row
/// (the 64 RoPE bytes of d_qk 576 eight rows per instruction); the data only feeds an XOR.
const GATHER_LIMIT_SOURCE: &str = r#"
struct GatherLimitParams {
    const u8* kv;        // [s_kv, D]
    const i32* indices;  // [s_q, topk]
    u32* sink;           // [1], written only if the XOR of every byte read hits a magic value
    i32 topk;
    i32 s_kv;
};

__device__ __forceinline__ uint4 load_16(const u8* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <int D>
__global__ void __launch_bounds__(256) gather_limit_kernel(const GatherLimitParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i32* idx_row = p.indices + (i64)blockIdx.x * p.topk;
    u32 acc = 0;
    for (int r0 = warp * 8; r0 < p.topk; r0 += 64) {  // 8 rows per warp and step
        const int mine = lane < 8 ? idx_row[r0 + lane] : -1;
        uint4 v[9];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int id = __shfl_sync(0xffffffffu, mine, k);
            v[k] = (id >= 0 && id < p.s_kv) ? load_16(p.kv + (i64)id * D + lane * 16)
                                            : make_uint4(0, 0, 0, 0);
        }
        v[8] = make_uint4(0, 0, 0, 0);
        if (D > 512) {
            const int id = __shfl_sync(0xffffffffu, mine, lane >> 2);
            if (id >= 0 && id < p.s_kv) v[8] = load_16(p.kv + (i64)id * D + 512 + (lane & 3) * 16);
        }
#pragma unroll
        for (int k = 0; k < 9; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x9E3779B9u) p.sink[0] = acc;
}
"#;

/// Gather-only limit through the bulk-copy engine (the copies the narrow kernel issues):
/// `gridDim.x` CTAs (one per SM) of six warps stream the query rows (row = CTA, CTA + grid, ...);
/// each warp copies 32 rows at a time, one `cp.async.bulk` of `D` bytes per valid row into one
/// of its two 32-row slots, and reuses a slot once its previous copies have landed (transaction
/// bytes on the slot's mbarrier): twelve 32-row stages in flight per SM. No data is read back:
/// this is the rate at which the GPU lands the gathered rows in shared memory. Compiled after
/// `kernels/sparse_mla_common.cuh`, whose mbarrier and bulk-copy helpers the narrow kernel uses.
const GATHER_BULK_LIMIT_SOURCE: &str = concat!(
    include_str!("../kernels/sparse_mla_common.cuh"),
    "\n",
    r#"
struct GatherLimitParams {
    const u8* kv;        // [s_kv, D]
    const i32* indices;  // [s_q, topk]
    u32* sink;           // unused here
    i32 topk;
    i32 s_kv;
    i32 s_q;
};

template <int D>
__global__ void __launch_bounds__(192, 1) gather_bulk_limit_kernel(const GatherLimitParams p) {
    constexpr int kWarps = 6;
    constexpr int kPitch = D + 16;             // the narrow kernel's row pitch
    constexpr int kSlot = 32 * kPitch;         // one slot: 32 rows
    extern __shared__ __align__(128) u8 smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 base = smem_addr(smem);
    const u32 bars = base + 2 * kWarps * kSlot;  // [kWarps][2 slots] mbarriers
    if (lane == 0) {
        for (int s = 0; s < 2; ++s) mbar_init(bars + (2 * warp + s) * 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    const int stages_per_row = p.topk / 32;
    int k = 0;  // this warp's stages so far
    for (int row = blockIdx.x; row < p.s_q; row += gridDim.x) {
        for (int st = warp; st < stages_per_row; st += kWarps, ++k) {
            const int slot = k & 1;
            const u32 bar = bars + (2 * warp + slot) * 8;
            if (k >= 2) mbar_wait(bar, (u32)((k >> 1) - 1) & 1u);  // the slot's last copies landed
            const int idx = __ldg(p.indices + (i64)row * p.topk + st * 32 + lane);
            const bool valid = idx >= 0 && idx < p.s_kv;
            const u32 bits = __ballot_sync(0xffffffffu, valid);
            if (lane == 0) {
                mbar_expect_tx(bar, (u32)__popc(bits) * (u32)D);
                mbar_arrive(bar);
            }
            __syncwarp();
            if (valid) {
                bulk_copy_g2s(base + (2 * warp + slot) * kSlot + lane * kPitch,
                              p.kv + (i64)idx * D, (u32)D, bar);
            }
        }
    }
    // Wait for the last copies of both slots before the CTA's shared memory goes away.
    for (int slot = 0; slot < 2; ++slot) {
        const int uses = (k + 1 - slot) / 2;  // stages of this warp that used the slot
        if (uses > 0) mbar_wait(bars + (2 * warp + slot) * 8, (u32)(uses - 1) & 1u);
    }
}
"#
);

shapeproof::param_block! {
    /// `struct GatherLimitParams` of the gather-limit kernels (`s_q` is read by the bulk-copy
    /// limit only).
    struct GatherLimitParams {
        kv: u64,
        indices: u64,
        sink: u64,
        topk: i32,
        s_kv: i32,
        s_q: i32,
    }
}

struct GatherLimit<const D: usize>;
impl<const D: usize> CudaKernel for GatherLimit<D> {
    const SOURCE: &'static str = GATHER_LIMIT_SOURCE;
    type Params = GatherLimitParams;
    fn instantiation() -> String {
        format!("gather_limit_kernel<{D}>")
    }
}

/// Shared memory of the bulk-copy limit: 12 slots (six warps, two each) of 32 rows at a pitch of
/// `D + 16` bytes, then 12 mbarriers.
const fn gather_bulk_smem_bytes(d: usize) -> u32 {
    (12 * 32 * (d + 16) + 12 * 8) as u32
}

struct GatherBulkLimit<const D: usize>;
impl<const D: usize> CudaKernel for GatherBulkLimit<D> {
    const SOURCE: &'static str = GATHER_BULK_LIMIT_SOURCE;
    type Params = GatherLimitParams;
    const DYNAMIC_SMEM_BYTES: u32 = gather_bulk_smem_bytes(D);
    fn instantiation() -> String {
        format!("gather_bulk_limit_kernel<{D}>")
    }
}

/// A narrow head tile `H` (8, 16, 32 real heads): the narrow kernel, the same inputs in one
/// 64-head tile, and the gather limit over the same indices.
fn bench_narrow<const D: usize, const H: usize, const TOPK: usize>(
    g: &Cuda,
    rng: &mut StdRng,
    s_kv: usize,
    records: &mut Vec<Record>,
) where
    Dim<D>: MlaHeadDim,
    Dim<H>: HeadTile + PadsTo<H> + PadsTo<64>,
    Dim<TOPK>: TopkWidth,
{
    let hosts: Vec<HostSet> = (0..2).map(|_| host_set(rng, H, D, TOPK, s_kv)).collect();
    let sets: Vec<Set<D, H, TOPK>> = hosts.iter().map(|h| upload_set(g, h)).collect();
    // (kv bytes, indices) of each set, for the gather limits
    let raw: Vec<_> = hosts
        .iter()
        .map(|h| {
            let kv_bytes: Vec<u8> = h.kv.iter().map(|v| v.to_bits()).collect();
            (g.upload(&kv_bytes).unwrap(), g.upload(&h.indices).unwrap())
        })
        .collect();
    let mut out = Tensor::<Cuda, bf16, OutRow<H>>::zeros(g, S_Q).unwrap();
    let mut ml = Tensor::<Cuda, f32, Cols<H>>::zeros(g, S_Q).unwrap();
    let mut lse = Tensor::<Cuda, f32, Cols<H>>::zeros(g, S_Q).unwrap();
    let narrow = SparseMlaPrefill::<D, H, TOPK, Plain, H>::new();
    let padded = SparseMlaPrefill::<D, 64, TOPK, Plain, H>::new().with_tiling(HeadTiling::Tiles64);
    let us = time_us(g, 3, 20, |i| {
        let s = &sets[i % 2];
        narrow
            .run(g, &s.inputs, &s.kv, &mut out, &mut ml, &mut lse)
            .unwrap()
    });
    let us_padded = time_us(g, 3, 20, |i| {
        let s = &sets[i % 2];
        padded
            .run(g, &s.inputs, &s.kv, &mut out, &mut ml, &mut lse)
            .unwrap()
    });
    let sink = g.upload(&[0u32]).unwrap();
    // Both gather limits read input set i % 2 with the same parameter block.
    let limit_params = |i: usize| {
        let (kv, idx) = &raw[i % 2];
        GatherLimitParams {
            kv: g.ptr(kv),
            indices: g.ptr(idx),
            sink: g.ptr(&sink),
            topk: TOPK as i32,
            s_kv: s_kv as i32,
            s_q: S_Q as i32,
        }
    };
    let us_gather = time_us(g, 3, 20, |i| {
        let shape = LaunchShape {
            grid: (S_Q as u32, 1, 1),
            block: (256, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: kv holds s_kv rows of D bytes, indices S_Q rows of TOPK; rows outside
        // [0, s_kv) are skipped; sink is one u32.
        unsafe { g.launch::<GatherLimit<D>>(shape, &limit_params(i)).unwrap() }
    });
    let us_bulk = time_us(g, 3, 20, |i| {
        let shape = LaunchShape {
            grid: (g.sm_count(), 1, 1), // one CTA per SM, streaming the rows
            block: (192, 1, 1),
            smem_bytes: GatherBulkLimit::<D>::DYNAMIC_SMEM_BYTES,
        };
        // SAFETY: as above; the copies land in the CTA's own shared memory, which the kernel
        // waits for before it exits.
        unsafe {
            g.launch::<GatherBulkLimit<D>>(shape, &limit_params(i))
                .unwrap()
        }
    });
    // Both kernels on the same input set, so their accuracy columns compare.
    let (max_abs, cos_dist) = accuracy_of::<D, H, H, TOPK>(g, &narrow, &sets[0], &hosts[0]);
    let (max_abs_padded, cos_dist_padded) =
        accuracy_of::<D, 64, H, TOPK>(g, &padded, &sets[0], &hosts[0]);
    let flops = SparseMlaPrefill::<D, H, TOPK, Plain, H>::flops(S_Q);
    let tflops = flops / (us * 1e-6) / 1e12;
    let gather_tbs = (S_Q * TOPK * D) as f64 / (us_gather * 1e-6) / 1e12;
    let bulk_tbs = (S_Q * TOPK * D) as f64 / (us_bulk * 1e-6) / 1e12;
    let us_limit = us_gather.min(us_bulk);
    println!(
        "| ({S_Q}, {s_kv}, {H}, {D}, {TOPK}) | {:.3} | {tflops:.0} | {:.3} | {:.2}× | {:.3} ({gather_tbs:.2} TB/s) | {:.3} ({bulk_tbs:.2} TB/s) | {:.2}× | {max_abs:.2e} | {cos_dist:.1e} | {max_abs_padded:.2e} | {cos_dist_padded:.1e} |",
        us / 1e3,
        us_padded / 1e3,
        us_padded / us,
        us_gather / 1e3,
        us_bulk / 1e3,
        us / us_limit
    );
    records.push(Record {
        name: format!("narrow_sq{S_Q}_skv{s_kv}_heads{H}_d{D}_topk{TOPK}"),
        fields: vec![
            ("ms", us / 1e3),
            ("real_head_tflops", tflops),
            ("padded_tile_ms", us_padded / 1e3),
            ("gather_limit_ms", us_gather / 1e3),
            ("gather_limit_tbs", gather_tbs),
            ("bulk_gather_limit_ms", us_bulk / 1e3),
            ("bulk_gather_limit_tbs", bulk_tbs),
            ("max_abs_dout", max_abs),
            ("cos_distance", cos_dist),
            ("padded_tile_max_abs_dout", max_abs_padded),
            ("padded_tile_cos_distance", cos_dist_padded),
        ],
    });
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0x5EED);
    println!("# sparse MLA prefill benchmark on {}", g.describe());
    let limit = fp8_matmul_limit();
    match limit {
        Some(l) => println!(
            "FP8 matmul rate (torch._scaled_mm, e4m3, 8192³), same GPU, same run: {l:.0} TFLOP/s"
        ),
        None => println!("FP8 matmul rate: not measured (no python3 with PyTorch here)"),
    }
    let mut records = vec![Record {
        name: "fp8_matmul".into(),
        fields: vec![("tflops", limit.unwrap_or(f64::NAN))],
    }];
    println!(
        "\n| (s_q, s_kv, h_q, d_qk, topk) | head tiling | ms | TFLOP/s | of FP8 matmul | max |Δout| | cos distance |"
    );
    println!("|---|---|---|---|---|---|---|");
    for tiling in [HeadTiling::Fastest, HeadTiling::Tiles64] {
        for s_kv in [8192, 32768, 65536] {
            bench::<576, 128, 128, 2048>(&g, &mut rng, s_kv, tiling, limit, &mut records);
        }
        for s_kv in [8192, 32768] {
            bench::<512, 64, 64, 512>(&g, &mut rng, s_kv, tiling, limit, &mut records);
        }
        bench::<576, 64, 16, 2048>(&g, &mut rng, 65536, tiling, limit, &mut records);
    }

    println!(
        "\n| narrow (s_q, s_kv, h, d_qk, topk) | ms | TFLOP/s (real heads) | 64-head tile ms | speed-up | plain-load gather ms | bulk-copy gather ms | over the faster gather | max |Δout| | cos distance | 64-head tile max |Δout| | 64-head tile cos distance |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    bench_narrow::<576, 8, 2048>(&g, &mut rng, 32768, &mut records);
    bench_narrow::<576, 16, 2048>(&g, &mut rng, 32768, &mut records);
    bench_narrow::<576, 32, 2048>(&g, &mut rng, 32768, &mut records);
    bench_narrow::<512, 8, 512>(&g, &mut rng, 32768, &mut records);
    bench_narrow::<512, 16, 512>(&g, &mut rng, 32768, &mut records);
    bench_narrow::<512, 32, 512>(&g, &mut rng, 32768, &mut records);
    common::write_json("sparse_mla.json", &records);
}
