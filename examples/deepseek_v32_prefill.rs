//! DeepSeek V3.2 (docs/kernels/models.md §4.3) at tensor-parallel degree 8: one 4096-token prefill chunk through
//! the FP8 sparse MLA prefill with top-k 2048 (d_qk 576 = 512 latent + 64 RoPE). Each rank has
//! 16 query heads; the model definition selects the 16-head tile, so the kernel type runs them
//! with the narrow kernel, not padded to 64 heads.
//!
//! On an H200 it times the whole chunk and checks a sample of query rows against the CPU
//! reference; elsewhere it runs the CPU reference at a reduced size.
//! `cargo run --release --example deepseek_v32_prefill`

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32};
use shapeproof::ops::sparse_mla::{OutRow, RunSparseMla, SparseMlaInputs};
use shapeproof::tensor::{Cols, Tensor};

shapeproof::model! {
    /// DeepSeek V3.2 on 8 ranks, from its Hugging Face config.
    pub mod deepseek_v32_tp8 {
        config: "examples/models/deepseek_v32.json",
        tensor_parallel: 8,
    }
}

use deepseek_v32_tp8 as ds;

/// Softmax scale of absorbed MLA, derived by `model!` from the config: 1/sqrt(128 + 64) times the
/// YaRN mscale² (docs/kernels/models.md §4.3), 0.1352.
const SM_SCALE: f32 = ds::SM_SCALE;

/// One prefill chunk: `s_q` new tokens after `prefix` cached ones; query row `i` selects up to
/// TOPK of the `prefix + i + 1` rows it may see (the DSA indexer's choice, here random), padded
/// with -1.
struct Chunk {
    s_q: usize,
    s_kv: usize,
    q: Vec<F8E4M3>,
    kv: Vec<F8E4M3>,
    indices: Vec<i32>,
}

impl Chunk {
    fn random(seed: u64, s_q: usize, prefix: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let s_kv = prefix + s_q;
        let mut cast = |n: usize| -> Vec<F8E4M3> {
            (0..n)
                .map(|_| e4m3_from_f32((rng.random::<f32>() - 0.5) * 0.17))
                .collect()
        };
        let (q, kv) = (cast(s_q * ds::HQ * ds::D_QK), cast(s_kv * ds::D_QK));
        let mut indices = vec![-1i32; s_q * ds::TOPK];
        for (i, row) in indices.chunks_mut(ds::TOPK).enumerate() {
            let visible = prefix + i + 1;
            for (j, slot) in row.iter_mut().enumerate().take(visible.min(ds::TOPK)) {
                *slot = if visible <= ds::TOPK {
                    j as i32
                } else {
                    rng.random_range(0..visible as i32)
                };
            }
        }
        Self {
            s_q,
            s_kv,
            q,
            kv,
            indices,
        }
    }

    /// The first `rows` query rows as a chunk of their own (same latent rows).
    fn head(&self, rows: usize) -> Self {
        Self {
            s_q: rows,
            s_kv: self.s_kv,
            q: self.q[..rows * ds::HQ * ds::D_QK].to_vec(),
            kv: self.kv.clone(),
            indices: self.indices[..rows * ds::TOPK].to_vec(),
        }
    }
}

/// Outputs of one run: `out [s_q, HQ, 512]`, `max_logits`, `lse` `[s_q, HQ]`.
struct Outputs<B: Backend> {
    out: Tensor<B, bf16, OutRow<{ ds::HQ }>>,
    max_logits: Tensor<B, f32, Cols<{ ds::HQ }>>,
    lse: Tensor<B, f32, Cols<{ ds::HQ }>>,
}

/// Uploads the chunk and returns a closure-ready set of inputs, KV and outputs.
fn prepare<B: Backend>(
    b: &B,
    c: &Chunk,
) -> (
    SparseMlaInputs<B, { ds::D_QK }, { ds::HQ }, { ds::TOPK }, shapeproof::ops::sparse_mla::Plain>,
    ds::KvCache<B>,
    Outputs<B>,
) {
    let inputs = SparseMlaInputs::new(
        Tensor::from_host(b, "q", &c.q, c.s_q).unwrap(),
        Tensor::from_host(b, "q_scale", &[1.0f32], 1).unwrap(),
        Tensor::from_host(b, "indices", &c.indices, c.s_q).unwrap(),
        SM_SCALE,
    )
    .unwrap();
    let kv = ds::KvCache::new(b, b.upload(&c.kv).unwrap(), c.s_kv, 1.0).unwrap();
    let outputs = Outputs {
        out: Tensor::filled(b, c.s_q, bf16::NAN).unwrap(),
        max_logits: Tensor::filled(b, c.s_q, f32::NAN).unwrap(),
        lse: Tensor::filled(b, c.s_q, f32::NAN).unwrap(),
    };
    (inputs, kv, outputs)
}

fn run<B: RunSparseMla>(b: &B, c: &Chunk) -> Outputs<B> {
    let (inputs, kv, mut o) = prepare(b, c);
    ds::SparseMla::new()
        .run(b, &inputs, &kv, &mut o.out, &mut o.max_logits, &mut o.lse)
        .unwrap();
    o
}

/// Largest deviation from the CPU reference, as a fraction of the spec's tolerances
/// (out 8e-2, max_logits 1e-2, lse 2e-3).
fn check(g: &Cuda, c: &Chunk) -> f32 {
    let (gpu, cpu) = (run(g, c), run(&Cpu, c));
    let worst = |a: Vec<f32>, b: Vec<f32>, tol: f32| {
        a.iter()
            .zip(&b)
            .map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() / tol })
            .fold(0.0f32, f32::max)
    };
    let f = |t: &Tensor<Cuda, bf16, OutRow<{ ds::HQ }>>| {
        t.to_host(g)
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect::<Vec<_>>()
    };
    let out = worst(
        f(&gpu.out),
        cpu.out
            .to_host(&Cpu)
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        8e-2,
    );
    let ml = worst(
        gpu.max_logits.to_host(g).unwrap(),
        cpu.max_logits.to_host(&Cpu).unwrap(),
        1e-2,
    );
    let lse = worst(
        gpu.lse.to_host(g).unwrap(),
        cpu.lse.to_host(&Cpu).unwrap(),
        2e-3,
    );
    out.max(ml).max(lse)
}

fn main() {
    println!(
        "DeepSeek V3.2 sparse MLA prefill, TP{}: {} of {} heads per rank run as a {}-head tile; d_qk {}, top-k {}",
        ds::TENSOR_PARALLEL,
        ds::HQ,
        ds::HEADS,
        ds::HQ_PADDED,
        ds::D_QK,
        ds::TOPK
    );
    let flops = |s_q: usize| ds::SparseMla::flops(s_q);
    // SAFETY: a single-stream program: every buffer lives and is used on the backend's stream.
    let gpu = unsafe { Cuda::new_untracked(0) };
    match gpu {
        Ok(g) => {
            println!("running on {}", g.describe());
            let chunk = Chunk::random(1, 4096, 28 * 1024);
            let sample = chunk.head(32);
            let worst = check(&g, &sample);
            println!(
                "sample of 32 query rows: worst deviation from the CPU reference {:.0}% of the spec tolerance",
                100.0 * worst
            );
            assert!(worst <= 1.0);
            let (inputs, kv, mut o) = prepare(&g, &chunk);
            let kernel = ds::SparseMla::new();
            let ev = || {
                g.context()
                    .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .unwrap()
            };
            let (start, end) = (ev(), ev());
            for _ in 0..3 {
                kernel
                    .run(&g, &inputs, &kv, &mut o.out, &mut o.max_logits, &mut o.lse)
                    .unwrap();
            }
            start.record(g.stream()).unwrap();
            let runs = 10;
            for _ in 0..runs {
                kernel
                    .run(&g, &inputs, &kv, &mut o.out, &mut o.max_logits, &mut o.lse)
                    .unwrap();
            }
            end.record(g.stream()).unwrap();
            end.synchronize().unwrap();
            let ms = start.elapsed_ms(&end).unwrap() as f64 / runs as f64;
            println!(
                "4096-token chunk over {} KV rows: {ms:.3} ms, {:.0} TFLOP/s on the {}-head tile ({:.0} on the {} real heads)",
                chunk.s_kv,
                flops(4096) / (ms * 1e-3) / 1e12,
                ds::HQ_PADDED,
                flops(4096) * ds::HQ as f64 / ds::HQ_PADDED as f64 / (ms * 1e-3) / 1e12,
                ds::HQ
            );
        }
        Err(e) => {
            println!("no GPU ({e}); running the CPU reference at a reduced size");
            let chunk = Chunk::random(1, 16, 8 * 1024);
            let t0 = Instant::now();
            let o = run(&Cpu, &chunk);
            let lse = o.lse.to_host(&Cpu).unwrap();
            println!(
                "{} query rows x {} heads over {} KV rows in {:.0} ms on the CPU reference; lse of row 0, head 0: {:.4}",
                chunk.s_q,
                ds::HQ,
                chunk.s_kv,
                t0.elapsed().as_secs_f64() * 1e3,
                lse[0]
            );
            assert!(
                lse.iter().all(|v| v.is_finite()),
                "every row has valid indices"
            );
        }
    }
}
