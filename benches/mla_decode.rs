//! Benchmark of the sparse MLA decode over the FP8 cache (`kernels/sparse_mla_decode.cu`):
//! TFLOP/s counted as `2·B·s_q·h_q·TOPK·(576 + 512)` at (B 128, s_q 2, h_q 128 / 16 / 8,
//! TOPK 2048), and GPU time at B = 1, 8, 32 for h_q 16, s_q 1 and 2, with the FP8 matmul rate
//! (`scripts/fp8_matmul_rate.py`, when PyTorch is present) and the copy bandwidth of the same
//! run beside them. Each step's indices are random slots of a cache of 8192 pages (524288
//! tokens), so the rows come from HBM. Each shape is timed launched step by step (`us`, each
//! step with its launch gaps) and as 20 steps of one CUDA graph (`graph_us`, GPU time alone,
//! which is what a small batch's latency target is about). Beside each, the row-gather limit
//! of the same run (`row_gather_us`, `benches/kernels/row_gather.cu`): the cache rows of the
//! step's slots read once, no math and no writes, and the graph step's time over it.
//!
//! Beside the decode kernel, the two routes through the FP8 sparse MLA prefill that an engine
//! can build from this library's ops today, timed in the same run:
//! - **A decode step through the prefill** (64 and 128 heads, B 128, s_q 2;
//!   `DecodeThroughPrefill`): q cast to e4m3, the step's `rows · TOPK` slots gathered into an
//!   e4m3 workspace (one row a (row, position)), the prefill over it; timed whole, with the
//!   gather alone beside it. Beside the time, the route's output against the decode kernel's
//!   output of the same step (max |Δout|, cosine distance): what the e4m3 q and RoPE cost.
//! - **The prefill fed from the cache** at its headline shape (4096, 32768, 128, 576, 2048):
//!   the sequence's 32768 tokens gathered from pages scattered over the cache, then the
//!   prefill; the gather's share bounds what a prefill reading the paged rows directly could
//!   gain.
//!
//! Run on the H200 (`run.sh bench`); needs `--features gpu-tests`.

mod common;

use common::{Record, copy_bandwidth_gbs, fp8_matmul_limit, gpu, graph_call_us, time_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::cuda::{DeviceArgs, LaunchShape};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32};
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM, MlaLatentKv};
use shapeproof::ops::mla_cache::MlaCacheGather;
use shapeproof::ops::sparse_mla::{HeadTiling, OutRow, Plain, SparseMlaInputs, SparseMlaPrefill};
use shapeproof::ops::sparse_mla_decode::{
    DecodeQueries, DecodeThroughPrefill, DecodeWorkspace, PrefillDecodeWorkspace, SparseMlaDecode,
};
use shapeproof::rules::{DecodeHeads, HeadTile, PadsTo};
use shapeproof::tensor::{Cols, Scalar, Tensor};

/// The row-gather limit of a step (`benches/kernels/row_gather.cu`): the cache rows its slots
/// name, read once with `ROWS` rows a warp in flight, no math and no writes.
struct RowGather<const ROWS: usize>;

shapeproof::cuda_kernel! {
    impl CudaKernel for RowGather<const ROWS: usize> {
        source: include_str!("kernels/row_gather.cu"),
        instantiation: "row_gather_kernel<{ROWS}>",
        params: struct RowGatherParams { cache: u64, slot: u64, sink: u64, positions: i64, slots: i32 },
    }
}

/// GPU time of reading the cache rows of `slots` (`[positions]` cache slots) once: a step of
/// `GRAPH_STEPS` steps of one captured graph, as the decode's `graph_us` (no launch gaps).
fn row_gather_us(g: &Cuda, cache: &DeepSeekV32KvCache<Cuda>, slots: &[i32]) -> f64 {
    let slot: Tensor<Cuda, i32, Scalar> = Tensor::from_host(g, "slot", slots, slots.len()).unwrap();
    let mut sink: Tensor<Cuda, u32, Scalar> = Tensor::zeros(g, 1).unwrap();
    let (bytes, slot_view) = (cache.bytes().as_slice(), slot.as_slice());
    let mut sink_view = sink.as_slice_mut();
    let mut args = DeviceArgs::new(g).unwrap();
    let params = RowGatherParams {
        cache: args.read_vectors("cache", &bytes).unwrap(),
        slot: args.read("slot", &slot_view).unwrap(),
        sink: args.write("sink", &mut sink_view).unwrap(),
        positions: slots.len() as i64,
        slots: (cache.pages() * 64) as i32,
    };
    let shape = LaunchShape {
        grid: (g.sm_count() * 8, 1, 1),
        block: (256, 1, 1),
        smem_bytes: 0,
    };
    let function = g.function::<RowGather<4>>().unwrap();
    // SAFETY: the kernel reads the rows of slots in [0, slots) of the cache (its pages × 64 rows
    // of 656 bytes), `positions` slots and one sink word, every access guarded by those
    // extents (grid-stride); the admitted buffers outlive the graph.
    common::raw_graph_call_us(g, GRAPH_STEPS, |_| unsafe {
        common::raw_launch(g, function, shape, &params)
    })
}

const PAGES: usize = 8192;
const TOPK: usize = 2048;
const SM_SCALE: f32 = 0.0417;
/// Steps of one timed graph.
const GRAPH_STEPS: usize = 20;

fn bench<const H: usize>(
    g: &Cuda,
    rng: &mut StdRng,
    cache: &DeepSeekV32KvCache<Cuda>,
    batch: usize,
    s_q: usize,
    limit: Option<f64>,
    records: &mut Vec<Record>,
) -> Step
where
    Dim<H>: DecodeHeads,
{
    let rows = batch * s_q;
    let q: Vec<bf16> = (0..rows * H * MLA_CACHE_DIM)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    let indices: Vec<i32> = (0..rows * TOPK)
        .map(|_| rng.random_range(0..(PAGES * 64) as i32))
        .collect();
    let queries = DecodeQueries::new(
        Tensor::from_host(g, "q", &q, rows).unwrap(),
        Tensor::from_host(g, "indices", &indices, rows).unwrap(),
        SM_SCALE,
    )
    .unwrap();
    let mut out = Tensor::zeros(g, rows).unwrap();
    let mut lse = Tensor::zeros(g, rows).unwrap();
    let decode = SparseMlaDecode::<H, TOPK>::new();
    let mut ws = DecodeWorkspace::new(g, rows).unwrap();
    let us = time_us(g, 3, 15, |_| {
        decode
            .run(g, &queries, cache, &mut ws, &mut out, &mut lse)
            .unwrap()
    });
    // The same step as GRAPH_STEPS steps of one graph: GPU time without launch gaps (a small
    // batch's step is shorter than its launches).
    let mut steps: Vec<_> = (0..GRAPH_STEPS)
        .map(|_| {
            let ws = DecodeWorkspace::new(g, rows).unwrap();
            (
                ws,
                Tensor::zeros(g, rows).unwrap(),
                Tensor::zeros(g, rows).unwrap(),
            )
        })
        .collect();
    let mut recorder = g.record_graph().unwrap();
    for (ws, out, lse) in &mut steps {
        decode
            .record(&mut recorder, &queries, cache, ws, out, lse)
            .unwrap();
    }
    let graph = recorder.finish().unwrap();
    let graph_us = graph_call_us(g, &graph, GRAPH_STEPS);
    drop(graph);
    let tflops = SparseMlaDecode::<H, TOPK>::flops(rows) / (us * 1e-6) / 1e12;
    let of = limit.map_or(f64::NAN, |l| tflops / l);
    // The same slots' rows read alone (the row-gather limit), in the same run.
    let gather_us = row_gather_us(g, cache, &indices);
    println!(
        "| ({batch}, {s_q}, {H}, {TOPK}) | {us:.1} | {graph_us:.1} | {tflops:.0} | {:.0}% | {gather_us:.1} | {:.2}× |",
        of * 100.0,
        graph_us / gather_us
    );
    records.push(Record {
        name: format!("decode_b{batch}_sq{s_q}_h{H}_topk{TOPK}"),
        fields: vec![
            ("us", us),
            ("graph_us", graph_us),
            ("tflops", tflops),
            ("of_fp8_matmul", of),
            ("row_gather_us", gather_us),
        ],
    });
    Step {
        q,
        indices,
        out: out.to_host(g).unwrap(),
    }
}

/// One decode step's host inputs and the decode kernel's output.
struct Step {
    q: Vec<bf16>,      // [rows, h_q, 576]
    indices: Vec<i32>, // [rows, TOPK] cache slots, all valid
    out: Vec<bf16>,    // [rows, h_q, 512]
}

/// max |Δ| and cosine distance of `a` against `b`.
fn difference(a: &[bf16], b: &[bf16]) -> (f64, f64) {
    let (mut max_abs, mut dot, mut na, mut nb) = (0f64, 0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.to_f32() as f64, y.to_f32() as f64);
        max_abs = max_abs.max(if x.is_nan() {
            f64::INFINITY
        } else {
            (x - y).abs()
        });
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    (max_abs, 1.0 - dot / (na.sqrt() * nb.sqrt()))
}

/// The decode step `step` (H heads, `rows` query rows) through the FP8 prefill
/// (`DecodeThroughPrefill`: q cast, gather, prefill), timed whole and its gather alone, the
/// output compared with the decode kernel's.
fn bench_through_prefill<const H: usize>(
    g: &Cuda,
    cache: &DeepSeekV32KvCache<Cuda>,
    step: &Step,
    batch: usize,
    s_q: usize,
    limit: Option<f64>,
    records: &mut Vec<Record>,
) where
    Dim<H>: DecodeHeads + HeadTile + PadsTo<H>,
{
    let rows = batch * s_q;
    let queries = DecodeQueries::new(
        Tensor::from_host(g, "q", &step.q, rows).unwrap(),
        Tensor::from_host(g, "indices", &step.indices, rows).unwrap(),
        SM_SCALE,
    )
    .unwrap();
    let route = DecodeThroughPrefill::<H, TOPK>::new();
    let mut ws = PrefillDecodeWorkspace::new(g, rows).unwrap();
    let mut out = Tensor::<Cuda, bf16, OutRow<H>>::filled(g, rows, bf16::NAN).unwrap();
    let mut lse = Tensor::<Cuda, f32, Cols<H>>::zeros(g, rows).unwrap();
    route
        .run(g, &queries, cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    let (max_abs, cos) = difference(&out.to_host(g).unwrap(), &step.out);
    let us = time_us(g, 3, 15, |_| {
        route
            .run(g, &queries, cache, &mut ws, &mut out, &mut lse)
            .unwrap()
    });
    // The gather alone, over the same slots (all valid here, so the route's masked slots are
    // these).
    let slots = Tensor::from_host(g, "slots", &step.indices, rows * TOPK).unwrap();
    let mut kv = gather_workspace(g, rows * TOPK);
    let gather = MlaCacheGather::<64, 128>::new();
    let gather_us = time_us(g, 3, 15, |_| {
        gather.run(g, cache, &slots, &mut kv, None).unwrap()
    });
    // The route the paged prefill replaced: the gather into that workspace, then the 64-head
    // prefill over it (q cast on the host beforehand, not timed; position j of row r is
    // workspace row r · TOPK + j).
    let q8: Vec<F8E4M3> = step.q.iter().map(|v| e4m3_from_f32(v.to_f32())).collect();
    let positions: Vec<i32> = (0..(rows * TOPK) as i32).collect();
    let inputs = e4m3_inputs::<H>(g, &q8, &positions, rows);
    let prefill =
        SparseMlaPrefill::<MLA_CACHE_DIM, H, TOPK>::new().with_tiling(HeadTiling::Tiles64);
    let mut max_logits = Tensor::<Cuda, f32, Cols<H>>::zeros(g, rows).unwrap();
    let workspace_route_us = time_us(g, 3, 15, |_| {
        gather.run(g, cache, &slots, &mut kv, None).unwrap();
        prefill
            .run(g, &inputs, &kv, &mut out, &mut max_logits, &mut lse)
            .unwrap()
    });
    let tflops = SparseMlaDecode::<H, TOPK>::flops(rows) / (us * 1e-6) / 1e12;
    let of = limit.map_or(f64::NAN, |l| tflops / l);
    println!(
        "| ({batch}, {s_q}, {H}, {TOPK}) | {us:.1} | {workspace_route_us:.1} | {gather_us:.1} | {tflops:.0} | {:.0}% | {max_abs:.4} | {cos:.1e} |",
        of * 100.0
    );
    records.push(Record {
        name: format!("through_prefill_b{batch}_sq{s_q}_h{H}_topk{TOPK}"),
        fields: vec![
            ("us", us),
            ("workspace_route_us", workspace_route_us),
            ("gather_us", gather_us),
            ("tflops", tflops),
            ("of_fp8_matmul", of),
            ("max_abs_vs_decode", max_abs),
            ("cos_dist_vs_decode", cos),
        ],
    });
}

/// The prefill's headline shape fed from the cache: the sequence's `S_KV` tokens (pages in a
/// random order over the cache) gathered into its workspace, then the prefill over them with
/// random positions; the gather, the prefill and both timed in the same run.
fn bench_prefill_from_cache(
    g: &Cuda,
    rng: &mut StdRng,
    cache: &DeepSeekV32KvCache<Cuda>,
    limit: Option<f64>,
    records: &mut Vec<Record>,
) {
    const S_Q: usize = 4096;
    const S_KV: usize = 32768;
    const H: usize = 128;
    let seq_slots: Vec<i32> = common::sequence_slots(rng, PAGES, S_KV)
        .into_iter()
        .map(|s| s as i32)
        .collect();
    let q8: Vec<F8E4M3> = (0..S_Q * H * MLA_CACHE_DIM)
        .map(|_| e4m3_from_f32((rng.random::<f32>() - 0.5) * 0.17))
        .collect();
    let positions: Vec<i32> = (0..S_Q * TOPK)
        .map(|_| rng.random_range(0..S_KV as i32))
        .collect();
    let inputs = e4m3_inputs::<H>(g, &q8, &positions, S_Q);
    let slots = Tensor::from_host(g, "slots", &seq_slots, S_KV).unwrap();
    let mut ws = gather_workspace(g, S_KV);
    let gather = MlaCacheGather::<64, 128>::new();
    let prefill = SparseMlaPrefill::<MLA_CACHE_DIM, H, TOPK, Plain, H>::new();
    let mut out = Tensor::<Cuda, bf16, OutRow<H>>::zeros(g, S_Q).unwrap();
    let mut ml = Tensor::<Cuda, f32, Cols<H>>::zeros(g, S_Q).unwrap();
    let mut lse = Tensor::<Cuda, f32, Cols<H>>::zeros(g, S_Q).unwrap();
    let gather_us = time_us(g, 3, 15, |_| {
        gather.run(g, cache, &slots, &mut ws, None).unwrap()
    });
    let prefill_us = time_us(g, 3, 15, |_| {
        prefill
            .run(g, &inputs, &ws, &mut out, &mut ml, &mut lse)
            .unwrap()
    });
    let both_us = time_us(g, 3, 15, |_| {
        gather.run(g, cache, &slots, &mut ws, None).unwrap();
        prefill
            .run(g, &inputs, &ws, &mut out, &mut ml, &mut lse)
            .unwrap();
    });
    let flops = SparseMlaPrefill::<MLA_CACHE_DIM, H, TOPK, Plain, H>::flops(S_Q);
    let tflops = flops / (both_us * 1e-6) / 1e12;
    let of = limit.map_or(f64::NAN, |l| tflops / l);
    println!(
        "| ({S_Q}, {S_KV}, {H}, 576, {TOPK}) | {gather_us:.1} | {prefill_us:.1} | {both_us:.1} | {:.2}% | {tflops:.0} | {:.0}% |",
        100.0 * gather_us / both_us,
        of * 100.0
    );
    records.push(Record {
        name: format!("prefill_from_cache_sq{S_Q}_skv{S_KV}_h{H}_topk{TOPK}"),
        fields: vec![
            ("gather_us", gather_us),
            ("prefill_us", prefill_us),
            ("us", both_us),
            ("tflops", tflops),
            ("of_fp8_matmul", of),
        ],
    });
}

/// Prefill inputs of `rows` query rows: e4m3 `q` (`[rows, H, 576]`) at identity scale and
/// `positions` (`[rows, TOPK]`) into a gathered workspace, at the benchmark's softmax scale.
fn e4m3_inputs<const H: usize>(
    g: &Cuda,
    q8: &[F8E4M3],
    positions: &[i32],
    rows: usize,
) -> SparseMlaInputs<Cuda, MLA_CACHE_DIM, H, TOPK, Plain>
where
    Dim<H>: HeadTile,
{
    SparseMlaInputs::new(
        Tensor::from_host(g, "q", q8, rows).unwrap(),
        Tensor::from_host(g, "q_scale", &[1.0f32], 1).unwrap(),
        Tensor::from_host(g, "indices", positions, rows).unwrap(),
        SM_SCALE,
    )
    .unwrap()
}

/// An e4m3 workspace of `rows` rows at identity scale: what the cache gather writes into.
fn gather_workspace(g: &Cuda, rows: usize) -> MlaLatentKv<Cuda, MLA_CACHE_DIM> {
    MlaLatentKv::new(g, g.zeros(rows * MLA_CACHE_DIM).unwrap(), rows, 1.0).unwrap()
}

/// A cache of `PAGES` pages of random e4m3 bytes (never NaN) with scales 1/64 and small RoPE
/// values.
fn random_cache(g: &Cuda, rng: &mut StdRng) -> DeepSeekV32KvCache<Cuda> {
    let mut bytes: Vec<u8> = (0..PAGES * 64 * 656)
        .map(|_| rng.random::<u8>() & 0xF7)
        .collect();
    for row in bytes.chunks_exact_mut(656) {
        for s in 0..4 {
            row[512 + 4 * s..516 + 4 * s].copy_from_slice(&(1.0f32 / 64.0).to_le_bytes());
        }
        for r in 0..64 {
            let v = bf16::from_f32((r as f32 - 32.0) / 64.0)
                .to_bits()
                .to_le_bytes();
            row[528 + 2 * r..530 + 2 * r].copy_from_slice(&v);
        }
    }
    DeepSeekV32KvCache::<Cuda>::from_buffer(g.upload(&bytes).unwrap(), PAGES).unwrap()
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0xDEC0);
    println!("# sparse MLA decode benchmark on {}", g.describe());
    // `MLA_DECODE_PROFILE="B,S_Q,H"`: only that decode step's row (H one of 8, 16, 64, 128), for
    // a profiler, e.g. `ncu --kernel-name regex:sparse_mla_decode_kernel --launch-skip 5
    // --launch-count 1 …`.
    if let Some([batch, s_q, heads]) = common::profile_row("MLA_DECODE_PROFILE", "B,S_Q,H") {
        let cache = random_cache(&g, &mut rng);
        let mut records = Vec::new();
        println!(
            "\n| (B, s_q, h_q, TOPK) | µs | µs a step in a graph | TFLOP/s | of FP8 matmul | rows read alone µs | graph over rows read |"
        );
        match heads {
            8 => drop(bench::<8>(
                &g,
                &mut rng,
                &cache,
                batch,
                s_q,
                None,
                &mut records,
            )),
            16 => drop(bench::<16>(
                &g,
                &mut rng,
                &cache,
                batch,
                s_q,
                None,
                &mut records,
            )),
            64 => drop(bench::<64>(
                &g,
                &mut rng,
                &cache,
                batch,
                s_q,
                None,
                &mut records,
            )),
            128 => drop(bench::<128>(
                &g,
                &mut rng,
                &cache,
                batch,
                s_q,
                None,
                &mut records,
            )),
            h => panic!("MLA_DECODE_PROFILE: {h} heads (8, 16, 64 or 128)"),
        }
        return;
    }
    let limit = fp8_matmul_limit();
    let copy = copy_bandwidth_gbs(&g);
    println!("FP8 matmul rate, same run: {limit:?} TFLOP/s; copy bandwidth {copy:.0} GB/s");
    let mut records = vec![
        Record {
            name: "fp8_matmul".into(),
            fields: vec![("tflops", limit.unwrap_or(f64::NAN))],
        },
        Record {
            name: "copy".into(),
            fields: vec![("gbs", copy)],
        },
    ];
    let cache = random_cache(&g, &mut rng);
    println!(
        "\n| (B, s_q, h_q, TOPK) | µs | µs a step in a graph | TFLOP/s | of FP8 matmul | rows read alone µs | graph over rows read |"
    );
    println!("|---|---|---|---|---|---|---|");
    let step128 = bench::<128>(&g, &mut rng, &cache, 128, 2, limit, &mut records);
    let step64 = bench::<64>(&g, &mut rng, &cache, 128, 2, limit, &mut records);
    bench::<16>(&g, &mut rng, &cache, 128, 2, limit, &mut records);
    bench::<8>(&g, &mut rng, &cache, 128, 2, limit, &mut records);
    for batch in [1, 8, 32] {
        for s_q in [1, 2] {
            bench::<16>(&g, &mut rng, &cache, batch, s_q, limit, &mut records);
        }
    }
    println!(
        "\nThe same steps through the FP8 prefill (`DecodeThroughPrefill`: prepare, then the prefill reading the cache rows):"
    );
    println!(
        "\n| (B, s_q, h_q, TOPK) | µs (prepare + paged prefill) | gather + workspace prefill µs | the gather alone µs | TFLOP/s | of FP8 matmul | max |Δout| vs decode | cosine distance vs decode |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    bench_through_prefill::<128>(&g, &cache, &step128, 128, 2, limit, &mut records);
    bench_through_prefill::<64>(&g, &cache, &step64, 128, 2, limit, &mut records);
    drop((step128, step64));
    println!("\nThe prefill fed from the cache:");
    println!(
        "\n| (s_q, s_kv, h_q, d_qk, TOPK) | gather µs | prefill µs | gather + prefill µs | gather's share | TFLOP/s | of FP8 matmul |"
    );
    println!("|---|---|---|---|---|---|---|");
    bench_prefill_from_cache(&g, &mut rng, &cache, limit, &mut records);
    common::write_json("mla_decode.json", &records);
}
