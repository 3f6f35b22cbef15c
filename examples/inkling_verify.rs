//! Inkling (docs/kernels/models.md §4.1) at tensor-parallel degree 8: the verify-step prologue of one global and
//! one sliding-window layer with the MXFP8 KV store, 4 draft tokens per sequence.
//!
//! On a machine with an H200 it runs the CUDA kernels (a batch of 64 sequences), checks them
//! against the CPU reference on a sample batch byte for byte, and times them; elsewhere it runs
//! the CPU reference at a reduced size. `cargo run --release --example inkling_verify`

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::bf16;
use shapeproof::layout::Mxfp8KvCache;
use shapeproof::ops::prologue::*;
use shapeproof::rules::Mxfp8Width;
use shapeproof::tensor::Tensor;

shapeproof::model! {
    /// Inkling at tensor-parallel degree 8 with the MXFP8 KV store, from its config file.
    pub mod inkling_tp8 {
        config: "examples/models/inkling.json",
        tensor_parallel: 8,
        page_size: 128,
        kv_store: mxfp8,
    }
}

use inkling_tp8::{global, sliding};

const DRAFT_TOKENS: usize = 4;
const PAGE: usize = inkling_tp8::global::PAGE;
const TP: usize = inkling_tp8::TENSOR_PARALLEL;
const HQ: usize = global::HQ;
type GlobalLayer = global::VerifyPrologue;
type SwaLayer = sliding::VerifyPrologue;

/// One layer's state and one verify batch, on backend `B`.
struct Layer<B: Backend, const DKV: usize, L> {
    weights: PrologueWeights<B, 128, DKV, InklingConv>,
    conv: ConvState<B, DKV, InklingConv>,
    batch: VerifyBatch<B, L>,
    windows: VerifyWindows<B, DKV, InklingConv>,
    out: Mxfp8Outputs<B, 1024, DKV>,
    kv: Mxfp8KvCache<B, PAGE, DKV>,
}

fn layer<B: Backend, const DKV: usize, L: QkvrLayout<1024, DKV>>(
    b: &B,
    seed: u64,
    seqs: usize,
    with_tau: bool,
) -> Layer<B, DKV, L>
where
    Dim<DKV>: Mxfp8Width,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let mut normal = |n: usize, mean: f32, std: f32| -> Vec<bf16> {
        (0..n)
            .map(|_| {
                bf16::from_f32(
                    mean + std
                        * (rng.random::<f32>() + rng.random::<f32>() + rng.random::<f32>() - 1.5),
                )
            })
            .collect()
    };
    let tokens = seqs * DRAFT_TOKENS;
    let pages = 4 * tokens.div_ceil(PAGE);
    let weights = PrologueWeights::from_host(
        b,
        &normal(128, 1.0, 0.2),
        &normal(128, 1.0, 0.2),
        &normal(DKV * 4, 0.0, 0.5),
        &normal(DKV * 4, 0.0, 0.5),
        1e-6,
    )
    .unwrap();
    let conv = ConvState::new(
        Tensor::from_host(b, "k_cache", &normal(seqs * 3 * DKV, 0.0, 1.0), seqs).unwrap(),
        Tensor::from_host(b, "v_cache", &normal(seqs * 3 * DKV, 0.0, 1.0), seqs).unwrap(),
    )
    .unwrap();
    // Positions past 128k tokens turn the log-scaling temperature on (global layers only).
    let tau: Vec<f32> = (0..tokens)
        .map(|t| log_scaling_tau(200_000 + 1000 * t as u64, 128_000.0, 0.1))
        .collect();
    let loc: Vec<i64> = (0..tokens as i64).map(|t| 3 * t + 1).collect();
    let batch = VerifyBatch::new(
        Tensor::from_host(b, "qkvr", &normal(tokens * L::ROW, 0.0, 1.0), tokens).unwrap(),
        Tensor::from_host(
            b,
            "cache_indices",
            &(0..seqs as i32).collect::<Vec<_>>(),
            seqs,
        )
        .unwrap(),
        Tensor::from_host(b, "cache_mask", &vec![1u8; seqs], seqs).unwrap(),
        Tensor::from_host(b, "loc", &loc, tokens).unwrap(),
        with_tau.then(|| Tensor::from_host(b, "tau", &tau, tokens).unwrap()),
        DRAFT_TOKENS,
    )
    .unwrap();
    Layer {
        weights,
        conv,
        batch,
        windows: VerifyWindows::zeros(b, seqs, DRAFT_TOKENS).unwrap(),
        out: Mxfp8Outputs::zeros(b, tokens).unwrap(),
        kv: Mxfp8KvCache::zeros(b, pages).unwrap(),
    }
}

impl<B: RunPrologue, const DKV: usize, L: QkvrLayout<1024, DKV>> Layer<B, DKV, L> {
    fn run(&mut self, b: &B, kernel: &Mxfp8Prologue<Verify, 1024, DKV, L, InklingConv, PAGE>) {
        kernel
            .run(
                b,
                &self.weights,
                &mut self.conv,
                (&self.batch, &mut self.windows),
                PrologueTargets {
                    out: &mut self.out,
                    kv: &mut self.kv,
                    errors: None,
                },
            )
            .unwrap();
    }

    /// Every output byte of the call, for comparing backends.
    fn bytes(&self, b: &B) -> Vec<u8> {
        let mut all: Vec<u8> = self
            .out
            .q()
            .to_host(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        all.extend(self.out.q_scales().to_host(b).unwrap().iter().map(|v| v.0));
        for t in [&self.out.k(), &self.out.v()] {
            all.extend(
                t.to_host(b)
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_bits().to_le_bytes()),
            );
        }
        for t in [&self.kv.k(), &self.kv.v()] {
            all.extend(t.to_host(b).unwrap().iter().map(|v| v.to_bits()));
        }
        for t in [&self.kv.k_scales(), &self.kv.v_scales()] {
            all.extend(t.to_host(b).unwrap().iter().map(|v| v.0));
        }
        for t in [&self.windows.k(), &self.windows.v()] {
            all.extend(
                t.to_host(b)
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_bits().to_le_bytes()),
            );
        }
        all
    }
}

/// Runs one layer kind on the GPU: a byte-for-byte check against the CPU reference on a sample
/// batch, then the GPU time per call at the realistic batch.
fn gpu_layer<const DKV: usize, L: QkvrLayout<1024, DKV>>(
    g: &Cuda,
    name: &str,
    kernel: Mxfp8Prologue<Verify, 1024, DKV, L, InklingConv, PAGE>,
    tau: bool,
) where
    Dim<DKV>: Mxfp8Width,
{
    let (sample, batch) = (8, 64);
    let mut on_gpu = layer::<Cuda, DKV, L>(g, 7, sample, tau);
    let mut on_cpu = layer::<Cpu, DKV, L>(&Cpu, 7, sample, tau);
    on_gpu.run(g, &kernel);
    on_cpu.run(&Cpu, &kernel);
    let (gb, cb) = (on_gpu.bytes(g), on_cpu.bytes(&Cpu));
    let differing = gb.iter().zip(&cb).filter(|(a, b)| a != b).count();
    println!(
        "{name}: sample of {sample} sequences x {DRAFT_TOKENS} tokens: {} of {} output bytes differ from the CPU reference",
        differing,
        gb.len()
    );
    assert_eq!(differing, 0, "GPU and CPU reference disagree");

    let mut l = layer::<Cuda, DKV, L>(g, 11, batch, tau);
    let start = g
        .context()
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    let end = g
        .context()
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    for _ in 0..20 {
        l.run(g, &kernel);
    }
    let calls = 500;
    start.record(g.stream()).unwrap();
    for _ in 0..calls {
        l.run(g, &kernel);
    }
    end.record(g.stream()).unwrap();
    end.synchronize().unwrap();
    let us = start.elapsed_ms(&end).unwrap() as f64 * 1e3 / calls as f64;
    println!(
        "{name}: batch of {batch} sequences ({} tokens): {us:.2} µs per call (back-to-back launches, GPU time)",
        batch * DRAFT_TOKENS
    );
}

/// Runs one layer kind on the CPU reference: the MXFP8 store decoded agrees with the bf16
/// values it encodes within the spec's MXFP8 tolerance.
fn cpu_layer<const DKV: usize, L: QkvrLayout<1024, DKV>>(
    name: &str,
    kernel: Mxfp8Prologue<Verify, 1024, DKV, L, InklingConv, PAGE>,
    tau: bool,
) where
    Dim<DKV>: Mxfp8Width,
{
    let seqs = 8;
    let mut l = layer::<Cpu, DKV, L>(&Cpu, 7, seqs, tau);
    let t0 = Instant::now();
    l.run(&Cpu, &kernel);
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    // K stored at loc[t] = 3t + 1 decodes to k_out[t] within MXFP8 rounding.
    let k_out = l.out.k().to_host(&Cpu).unwrap();
    let (data, scales) = (
        l.kv.k().to_host(&Cpu).unwrap(),
        l.kv.k_scales().to_host(&Cpu).unwrap(),
    );
    let mut worst = 0.0f32;
    for t in 0..seqs * DRAFT_TOKENS {
        let slot = 3 * t + 1;
        for c in 0..DKV {
            let scale = scales[shapeproof::layout::scale_plane_offset(slot, c, PAGE, DKV / 128)];
            let x = shapeproof::dtype::mxfp8_decode(data[slot * DKV + c], scale);
            let want = k_out[t * DKV + c].to_f32();
            worst = worst.max((x - want).abs() / (8e-2 + 0.3 * want.abs()));
        }
    }
    println!(
        "{name}: {seqs} sequences x {DRAFT_TOKENS} tokens on the CPU reference in {ms:.1} ms; stored K decodes within {:.0}% of the MXFP8 tolerance",
        100.0 * worst
    );
    assert!(worst <= 1.0);
}

fn main() {
    println!(
        "Inkling verify prologue, TP{TP}: {HQ} q heads per rank; KV heads {} (global), {} (sliding window); MXFP8 KV store, page {PAGE}",
        global::HKV,
        sliding::HKV
    );
    // SAFETY: a single-stream program: every buffer lives and is used on the backend's stream.
    let gpu = unsafe { Cuda::new_untracked(0) };
    match gpu {
        Ok(g) => {
            println!("running on {}", g.describe());
            gpu_layer(&g, "global layer (tau on)", GlobalLayer::new(), true);
            gpu_layer(&g, "sliding-window layer", SwaLayer::new(), false);
        }
        Err(e) => {
            println!("no GPU ({e}); running the CPU reference at a reduced size");
            cpu_layer("global layer (tau on)", GlobalLayer::new(), true);
            cpu_layer("sliding-window layer", SwaLayer::new(), false);
        }
    }
}
