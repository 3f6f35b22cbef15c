//! Benchmark of the lightning indexer (logits and top-k fused, `kernels/lightning_indexer.cu`):
//! TFLOP/s of the logits counted as `2·H_IDX·128` per valid (query token, key) pair, at
//! (T 4096 over 65536 keys of history plus the chunk causal, H_IDX 64, TOPK 2048), DeepSeek
//! V3.2's prefill chunk, and at (32768 tokens causal over themselves, H_IDX 32, TOPK 2048),
//! where a published fused H200 indexer takes 16.1 ms. Beside them, measured in the same run:
//! the FP8 matmul rate (`scripts/fp8_matmul_rate.py`, PyTorch `_scaled_mm`, when present) and
//! the device copy bandwidth.
//! Inputs: random e4m3 bytes (NaN patterns avoided), N(0, 1/64) weights, key scales in
//! [0.005, 0.02). Run on the H200 through `scripts/gpu-bundle.sh` (`run.sh bench`); needs
//! `--features gpu-tests`.

mod common;

use common::{Record, copy_bandwidth_gbs, fp8_matmul_limit, gpu, time_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::F8E4M3;
use shapeproof::ops::indexer::{IndexKeys, IndexerQueries, LightningIndexer};
use shapeproof::rules::{IndexerHeads, IndexerTopk};
use shapeproof::tensor::{Cols, Tensor};

/// `n` random e4m3 values, never a NaN pattern (0x7f / 0xff).
fn e4m3_bytes(rng: &mut StdRng, n: usize) -> Vec<F8E4M3> {
    (0..n)
        .map(|_| {
            let b: u8 = rng.random();
            F8E4M3::from_bits(if b & 0x7f == 0x7f { b ^ 1 } else { b })
        })
        .collect()
}

/// Times one shape: `tokens` query tokens whose ranges are `[0, history + t + 1)` over
/// `history + tokens` keys.
fn bench<const H: usize, const TOPK: usize>(
    g: &Cuda,
    rng: &mut StdRng,
    tokens: usize,
    history: usize,
    limit: Option<f64>,
    records: &mut Vec<Record>,
) where
    Dim<H>: IndexerHeads,
    Dim<TOPK>: IndexerTopk,
{
    let s_kv = history + tokens;
    let starts = vec![0i32; tokens];
    let ends: Vec<i32> = (0..tokens).map(|t| (history + t + 1) as i32).collect();
    let pairs: u64 = ends.iter().map(|&e| e as u64).sum();
    let weights: Vec<f32> = (0..tokens * H)
        .map(|_| rng.random_range(-0.25f32..0.25))
        .collect();
    let queries = IndexerQueries::new(
        Tensor::from_host(g, "q", &e4m3_bytes(rng, tokens * H * 128), tokens).unwrap(),
        Tensor::from_host(g, "weights", &weights, tokens).unwrap(),
        Tensor::from_host(g, "key_start", &starts, tokens).unwrap(),
        Tensor::from_host(g, "key_end", &ends, tokens).unwrap(),
    )
    .unwrap();
    let scales: Vec<f32> = (0..s_kv)
        .map(|_| rng.random_range(0.005f32..0.02))
        .collect();
    let keys = IndexKeys::new(
        Tensor::from_host(g, "k", &e4m3_bytes(rng, s_kv * 128), s_kv).unwrap(),
        Tensor::from_host(g, "k_scale", &scales, s_kv).unwrap(),
    )
    .unwrap();
    let mut indices: Tensor<Cuda, i32, Cols<TOPK>> = Tensor::zeros(g, tokens).unwrap();
    let indexer = LightningIndexer::<H, TOPK>::new();
    let us = time_us(g, 2, 7, |_| {
        indexer.run(g, &queries, &keys, &mut indices).unwrap()
    });
    let tflops = LightningIndexer::<H, TOPK>::flops(pairs) / (us * 1e-6) / 1e12;
    let of_limit = limit.map_or(f64::NAN, |l| tflops / l);
    println!(
        "| ({tokens}, {history} + chunk causal, {H}, 128, {TOPK}) | {:.3} | {tflops:.0} | {:.0}% |",
        us / 1e3,
        of_limit * 100.0
    );
    records.push(Record {
        name: format!("indexer_t{tokens}_hist{history}_h{H}_topk{TOPK}"),
        fields: vec![
            ("tokens", tokens as f64),
            ("history", history as f64),
            ("heads", H as f64),
            ("topk", TOPK as f64),
            ("ms", us / 1e3),
            ("tflops", tflops),
            ("of_fp8_matmul", of_limit),
        ],
    });
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0x1D5E);
    println!("# lightning indexer benchmark on {}", g.describe());
    let limit = fp8_matmul_limit();
    match limit {
        Some(l) => {
            println!("FP8 matmul rate (torch._scaled_mm, e4m3, 8192³), same run: {l:.0} TFLOP/s")
        }
        None => println!("FP8 matmul rate: not measured (no python3 with PyTorch here)"),
    }
    let copy = copy_bandwidth_gbs(&g);
    println!("copy bandwidth, same run: {copy:.0} GB/s");
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
    println!("\n| (T, S_kv, H_IDX, D, TOPK) | ms | TFLOP/s | of FP8 matmul |");
    println!("|---|---|---|---|");
    bench::<64, 2048>(&g, &mut rng, 4096, 65536, limit, &mut records);
    bench::<32, 2048>(&g, &mut rng, 32768, 0, limit, &mut records);
    bench::<64, 2048>(&g, &mut rng, 4096, 8192, limit, &mut records);
    common::write_json("indexer.json", &records);
}
