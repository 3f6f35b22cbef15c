//! Benchmark of the FP8 sparse MLA prefill: TFLOP/s counted as `2·s_q·h_q·topk·(d_qk + 512)` at
//! s_q = 4096, h_q = 128, d_qk = 576, top-k 2048, s_kv ∈ {8192, 32768, 65536}; at h_q = 64,
//! d_qk = 512, top-k 512; and DeepSeek V3.2 at TP8 (16 real heads in one 64-head tile). The
//! limit beside it is the FP8 matmul rate of the same GPU, measured in the same run by
//! `fp8_matmul_rate.py` (PyTorch `_scaled_mm`) when Python with PyTorch is present.
//! Inputs: N(0, 0.05²) cast to e4m3, random valid indices, rotated between two sets.
//! Run on the H200 through `scripts/gpu-bundle.sh` (`run.sh bench`); needs `--features gpu-tests`.

mod common;

use common::{Record, gpu, time_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32};
use shapeproof::layout::MlaLatentKv;
use shapeproof::ops::sparse_mla::*;
use shapeproof::rules::{HeadTile, MlaHeadDim, PadsTo, TopkWidth};
use shapeproof::tensor::{Cols, Tensor};

const S_Q: usize = 4096;

struct Set<const D: usize, const HEADS: usize, const TOPK: usize> {
    inputs: SparseMlaInputs<Cuda, D, HEADS, TOPK, Plain>,
    kv: MlaLatentKv<Cuda, D>,
}

fn e4m3(rng: &mut StdRng, n: usize) -> Vec<F8E4M3> {
    (0..n)
        .map(|_| e4m3_from_f32((rng.random::<f32>() - 0.5) * 0.17))
        .collect()
}

fn bench<const D: usize, const HQ: usize, const HEADS: usize, const TOPK: usize>(
    g: &Cuda,
    rng: &mut StdRng,
    s_kv: usize,
    limit: Option<f64>,
    records: &mut Vec<Record>,
) where
    Dim<D>: MlaHeadDim,
    Dim<HQ>: HeadTile,
    Dim<TOPK>: TopkWidth,
    Dim<HEADS>: PadsTo<HQ>,
{
    let sets: Vec<Set<D, HEADS, TOPK>> = (0..2)
        .map(|_| {
            let indices: Vec<i32> = (0..S_Q * TOPK)
                .map(|_| rng.random_range(0..s_kv as i32))
                .collect();
            Set {
                inputs: SparseMlaInputs::new(
                    Tensor::from_host(g, "q", &e4m3(rng, S_Q * HEADS * D), S_Q).unwrap(),
                    Tensor::from_host(g, "q_scale", &[1.0f32], 1).unwrap(),
                    Tensor::from_host(g, "indices", &indices, S_Q).unwrap(),
                    0.1352,
                )
                .unwrap(),
                kv: MlaLatentKv::new(g, g.upload(&e4m3(rng, s_kv * D)).unwrap(), s_kv, 1.0)
                    .unwrap(),
            }
        })
        .collect();
    let mut out = Tensor::<Cuda, bf16, OutRow<HEADS>>::zeros(g, S_Q).unwrap();
    let mut ml = Tensor::<Cuda, f32, Cols<HEADS>>::zeros(g, S_Q).unwrap();
    let mut lse = Tensor::<Cuda, f32, Cols<HEADS>>::zeros(g, S_Q).unwrap();
    let kernel = SparseMlaPrefill::<D, HQ, TOPK, Plain, HEADS>::new();
    let us = time_us(g, 3, 20, |i| {
        let s = &sets[i % 2];
        kernel
            .run(g, &s.inputs, &s.kv, &mut out, &mut ml, &mut lse)
            .unwrap()
    });
    let flops = SparseMlaPrefill::<D, HQ, TOPK, Plain, HEADS>::flops(S_Q);
    let tflops = flops / (us * 1e-6) / 1e12;
    let of_limit = limit.map_or("—".to_string(), |l| format!("{:.0}%", 100.0 * tflops / l));
    println!(
        "| ({S_Q}, {s_kv}, {HQ} [{HEADS} real], {D}, {TOPK}) | {:.3} | {tflops:.0} | {of_limit} |",
        us / 1e3
    );
    records.push(Record {
        name: format!("sq{S_Q}_skv{s_kv}_hq{HQ}_heads{HEADS}_d{D}_topk{TOPK}"),
        fields: vec![
            ("ms", us / 1e3),
            ("tflops", tflops),
            ("limit_tflops", limit.unwrap_or(f64::NAN)),
        ],
    });
}

fn fp8_matmul_limit() -> Option<f64> {
    let script = std::env::current_exe()
        .ok()?
        .parent()?
        .parent()?
        .join("fp8_matmul_rate.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
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
    println!("\n| (s_q, s_kv, h_q, d_qk, topk) | ms | TFLOP/s | of FP8 matmul |");
    println!("|---|---|---|---|");
    for s_kv in [8192, 32768, 65536] {
        bench::<576, 128, 128, 2048>(&g, &mut rng, s_kv, limit, &mut records);
    }
    for s_kv in [8192, 32768] {
        bench::<512, 64, 64, 512>(&g, &mut rng, s_kv, limit, &mut records);
    }
    bench::<576, 64, 16, 2048>(&g, &mut rng, 65536, limit, &mut records);
    common::write_json("sparse_mla.json", &records);
}
