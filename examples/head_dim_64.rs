//! A model with 64-channel heads (GPT-OSS-like attention dims: 64 q heads, 8 KV heads, head dim
//! 64) at tensor-parallel degree 8, with the Inkling-style fused prologue. MXFP8 is refused for
//! it at compile time (its scale atoms are 128 channels, see `tests/ui/fail/`); `kv_store: auto`
//! lets the type checker pick the bf16 store instead — the fused prologue still runs, where an
//! inference server would raise "MXFP8 fused prologue requires head_dim-aligned Q/K/V".
//!
//! On an H200 it checks a decode step against the CPU reference byte for byte and times it;
//! elsewhere it runs the CPU reference. `cargo run --release --example head_dim_64`

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dtype::bf16;
use shapeproof::ops::prologue::*;
use shapeproof::tensor::Tensor;

shapeproof::model! {
    /// 64 q heads, 8 KV heads of 64 channels, on 8 ranks; the store is chosen by head dim.
    pub mod hd64_tp8 {
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 64,
        tensor_parallel: 8,
        kv_store: auto,
    }
}

use hd64_tp8 as m;

/// One decode step's state on backend `B`.
struct Step<B: Backend> {
    weights: PrologueWeights<B, { m::HEAD_DIM }, { m::DKV }, m::Conv>,
    conv: ConvState<B, { m::DKV }, m::Conv>,
    batch: DecodeBatch<B, m::Row>,
    out: Bf16Outputs<B, { m::DQ }, { m::DKV }>,
    kv: m::KvCache<B>,
}

fn step<B: Backend>(b: &B, tokens: usize) -> Step<B> {
    let mut rng = StdRng::seed_from_u64(3);
    let mut normal = |n: usize, mean: f32| -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(mean + rng.random::<f32>() - 0.5))
            .collect()
    };
    let hd = m::HEAD_DIM;
    let w = m::CONV_WIDTH;
    Step {
        weights: PrologueWeights::from_host(
            b,
            &normal(hd, 1.0),
            &normal(hd, 1.0),
            &normal(m::DKV * w, 0.0),
            &normal(m::DKV * w, 0.0),
            1e-6,
        )
        .unwrap(),
        conv: ConvState::new(
            Tensor::from_host(
                b,
                "k_cache",
                &normal(tokens * (w - 1) * m::DKV, 0.0),
                tokens,
            )
            .unwrap(),
            Tensor::from_host(
                b,
                "v_cache",
                &normal(tokens * (w - 1) * m::DKV, 0.0),
                tokens,
            )
            .unwrap(),
        )
        .unwrap(),
        batch: DecodeBatch::new(
            Tensor::from_host(b, "qkvr", &normal(tokens * m::ROW, 0.0), tokens).unwrap(),
            Tensor::from_host(
                b,
                "cache_indices",
                &(0..tokens as i32).collect::<Vec<_>>(),
                tokens,
            )
            .unwrap(),
            Tensor::from_host(b, "cache_mask", &vec![1u8; tokens], tokens).unwrap(),
            Tensor::from_host(
                b,
                "loc",
                &(0..tokens as i64).map(|t| 2 * t).collect::<Vec<_>>(),
                tokens,
            )
            .unwrap(),
            None,
            None,
        )
        .unwrap(),
        out: Bf16Outputs::zeros(b, tokens).unwrap(),
        kv: m::KvCache::zeros(b, (2 * tokens).div_ceil(m::PAGE)).unwrap(),
    }
}

impl<B: RunPrologue> Step<B> {
    fn run(&mut self, b: &B) {
        m::DecodePrologue::new()
            .run(
                b,
                &self.weights,
                &mut self.conv,
                &self.batch,
                PrologueTargets {
                    out: &mut self.out,
                    kv: &mut self.kv,
                    errors: None,
                },
            )
            .unwrap();
    }

    fn bytes(&self, b: &B) -> Vec<u16> {
        let bits = |v: Vec<bf16>| v.into_iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        let mut all = bits(self.out.q().to_host(b).unwrap());
        for t in [&self.out.k(), &self.out.v(), &self.kv.k(), &self.kv.v()] {
            all.extend(bits(t.to_host(b).unwrap()));
        }
        for t in [&self.conv.k(), &self.conv.v()] {
            all.extend(bits(t.to_host(b).unwrap()));
        }
        all
    }
}

fn main() {
    println!(
        "head dim {}: {} q / {} KV heads per rank (TP{}); store chosen at compile time: {}",
        m::HEAD_DIM,
        m::HQ,
        m::HKV,
        m::TENSOR_PARALLEL,
        std::any::type_name::<m::KvStore>()
    );
    // SAFETY: a single-stream program: every buffer lives and is used on the backend's stream.
    let gpu = unsafe { Cuda::new_untracked(0) };
    match gpu {
        Ok(g) => {
            println!("running on {}", g.describe());
            let (mut on_gpu, mut on_cpu) = (step(&g, 64), step(&Cpu, 64));
            on_gpu.run(&g);
            on_cpu.run(&Cpu);
            let (a, c) = (on_gpu.bytes(&g), on_cpu.bytes(&Cpu));
            let differing = a.iter().zip(&c).filter(|(x, y)| x != y).count();
            println!(
                "decode of 64 tokens: {differing} of {} output values differ from the CPU reference",
                a.len()
            );
            assert_eq!(differing, 0);
            let mut s = step(&g, 4096);
            let ev = || {
                g.context()
                    .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .unwrap()
            };
            let (start, end) = (ev(), ev());
            s.run(&g);
            start.record(g.stream()).unwrap();
            for _ in 0..100 {
                s.run(&g);
            }
            end.record(g.stream()).unwrap();
            end.synchronize().unwrap();
            println!(
                "decode of 4096 tokens: {:.2} µs per call",
                start.elapsed_ms(&end).unwrap() as f64 * 10.0
            );
        }
        Err(e) => {
            println!("no GPU ({e}); running the CPU reference");
            let mut s = step(&Cpu, 64);
            s.run(&Cpu);
            let k = s.out.k().to_host(&Cpu).unwrap();
            // k is RMS-normalized per head: its mean square over a head is about gamma², ~1.
            let ms: f32 = k[..m::HEAD_DIM]
                .iter()
                .map(|v| v.to_f32().powi(2))
                .sum::<f32>()
                / m::HEAD_DIM as f32;
            println!(
                "decode of 64 tokens on the CPU reference; token 0 head 0 k mean square {ms:.3}"
            );
        }
    }
}
