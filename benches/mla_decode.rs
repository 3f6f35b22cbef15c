//! Benchmark of the sparse MLA decode over the FP8 cache (`kernels/sparse_mla_decode.cu`):
//! TFLOP/s counted as `2·B·s_q·h_q·TOPK·(576 + 512)` at (B 128, s_q 2, h_q 128 / 16 / 8,
//! TOPK 2048), and GPU time at B = 1, 8, 32 for h_q 16, s_q 1 and 2, with the FP8 matmul rate
//! (`scripts/fp8_matmul_rate.py`, when PyTorch is present) and the copy bandwidth of the same
//! run beside them. Each step's indices are random slots of a cache of 8192 pages (524288
//! tokens), so the rows come from HBM. Each shape is timed launched step by step (`us`, each
//! step with its launch gaps) and as 20 steps of one CUDA graph (`graph_us`, GPU time alone,
//! which is what a small batch's latency target is about). Run on the H200 (`run.sh bench`);
//! needs `--features gpu-tests`.

mod common;

use common::{Record, copy_bandwidth_gbs, fp8_matmul_limit, gpu, graph_call_us, time_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::sparse_mla_decode::{DecodeQueries, DecodeWorkspace, SparseMlaDecode};
use shapeproof::rules::DecodeHeads;
use shapeproof::tensor::Tensor;

const PAGES: usize = 8192;
const TOPK: usize = 2048;
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
) where
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
        0.0417,
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
    println!(
        "| ({batch}, {s_q}, {H}, {TOPK}) | {us:.1} | {graph_us:.1} | {tflops:.0} | {:.0}% |",
        of * 100.0
    );
    records.push(Record {
        name: format!("decode_b{batch}_sq{s_q}_h{H}_topk{TOPK}"),
        fields: vec![
            ("us", us),
            ("graph_us", graph_us),
            ("tflops", tflops),
            ("of_fp8_matmul", of),
        ],
    });
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0xDEC0);
    println!("# sparse MLA decode benchmark on {}", g.describe());
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
    // A cache of random e4m3 bytes (never NaN) with scales 1/64 and small RoPE values.
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
    let cache = DeepSeekV32KvCache::<Cuda>::from_buffer(g.upload(&bytes).unwrap(), PAGES).unwrap();
    println!("\n| (B, s_q, h_q, TOPK) | µs | µs a step in a graph | TFLOP/s | of FP8 matmul |");
    println!("|---|---|---|---|---|");
    bench::<128>(&g, &mut rng, &cache, 128, 2, limit, &mut records);
    bench::<16>(&g, &mut rng, &cache, 128, 2, limit, &mut records);
    bench::<8>(&g, &mut rng, &cache, 128, 2, limit, &mut records);
    for batch in [1, 8, 32] {
        for s_q in [1, 2] {
            bench::<16>(&g, &mut rng, &cache, batch, s_q, limit, &mut records);
        }
    }
    common::write_json("mla_decode.json", &records);
}
