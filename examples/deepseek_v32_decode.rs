//! DeepSeek V3.2 at tensor-parallel degree 8, one sequence served on this library alone: the
//! prompt's latent rows are stored into the FP8 cache (656 bytes a token), then decode steps of
//! `next_n = 2` tokens (a multi-token-prediction verify): each step stores its two new rows,
//! runs the lightning indexer for its two queries over every key so far, and the sparse MLA
//! decode of the rank's 16 heads over the cache slots the indexer chose. The sequence's pages
//! are the cache's first ones, in order, so an indexer position is its cache slot.
//!
//! On an H200 every step runs on the GPU and on the CPU reference, and the GPU's indexer rows
//! and decode outputs are checked against the CPU's (the decode with the GPU's rows, within the
//! tolerances of `tests/gpu_mla_decode.rs`); elsewhere it runs on the CPU reference alone, with
//! a shorter prompt.
//! `cargo run --release --example deepseek_v32_decode`

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32};
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::indexer::{IndexKeys, IndexerQueries, RunIndexer};
use shapeproof::ops::mla_cache::{MlaCacheStore, MlaKvRows, RunMlaCache};
use shapeproof::ops::sparse_mla_decode::{DecodeQueries, RunDecode};
use shapeproof::tensor::{Cols, Tensor};

shapeproof::model! {
    /// DeepSeek V3.2 on 8 ranks, from its Hugging Face config.
    pub mod deepseek_v32_tp8 {
        config: "examples/models/deepseek_v32.json",
        tensor_parallel: 8,
    }
}

use deepseek_v32_tp8 as ds;

/// Tokens a decode step adds (the draft and the token it verifies).
const NEXT_N: usize = 2;
/// Decode steps.
const STEPS: usize = 4;

/// The sequence on the host: every token's latent row, index key and key scale, generated as the
/// sequence grows.
struct Sequence {
    rng: StdRng,
    latent: Vec<bf16>,     // [tokens, 576]
    index_k: Vec<F8E4M3>,  // [tokens, 128]
    index_scale: Vec<f32>, // [tokens]
}

impl Sequence {
    fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            latent: Vec::new(),
            index_k: Vec::new(),
            index_scale: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        self.index_scale.len()
    }

    /// Appends `n` tokens; returns their latent rows.
    fn grow(&mut self, n: usize) -> Vec<bf16> {
        let rng = &mut self.rng;
        let rows: Vec<bf16> = (0..n * MLA_CACHE_DIM)
            .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
            .collect();
        self.latent.extend_from_slice(&rows);
        self.index_k
            .extend((0..n * 128).map(|_| e4m3_from_f32(rng.random_range(-2.0f32..2.0))));
        self.index_scale
            .extend((0..n).map(|_| rng.random_range(0.005f32..0.02)));
        rows
    }

    /// One step's queries: the indexer's (q, weights) and the decode's q, for `n` tokens.
    fn queries(&mut self, n: usize) -> (Vec<F8E4M3>, Vec<f32>, Vec<bf16>) {
        let rng = &mut self.rng;
        let iq = (0..n * ds::INDEX_HEADS * 128)
            .map(|_| e4m3_from_f32(rng.random_range(-2.0f32..2.0)))
            .collect();
        let w = (0..n * ds::INDEX_HEADS)
            .map(|_| rng.random_range(-0.1f32..0.1))
            .collect();
        let q = (0..n * ds::HQ * MLA_CACHE_DIM)
            .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
            .collect();
        (iq, w, q)
    }
}

/// Stores `rows` (`[n, 576]`) at slots `first..first + n` of `cache`.
fn store<B: RunMlaCache>(b: &B, cache: &mut DeepSeekV32KvCache<B>, rows: &[bf16], first: usize) {
    let n = rows.len() / MLA_CACHE_DIM;
    let loc: Vec<i64> = (first as i64..(first + n) as i64).collect();
    let rows = MlaKvRows::new(
        Tensor::from_host(b, "kv", rows, n).unwrap(),
        Tensor::from_host(b, "loc", &loc, n).unwrap(),
    )
    .unwrap();
    MlaCacheStore::<64, 128>::new()
        .run(b, &rows, cache, None)
        .unwrap();
}

/// The indexer's `[NEXT_N, TOPK]` rows for the step's tokens: token `i` of the step sees the
/// keys `[0, len - NEXT_N + i + 1)`.
fn select<B: RunIndexer>(b: &B, seq: &Sequence, iq: &[F8E4M3], w: &[f32]) -> Vec<i32> {
    let len = seq.len();
    let ends: Vec<i32> = (0..NEXT_N).map(|i| (len - NEXT_N + i + 1) as i32).collect();
    let queries = IndexerQueries::<B, { ds::INDEX_HEADS }>::new(
        Tensor::from_host(b, "q", iq, NEXT_N).unwrap(),
        Tensor::from_host(b, "weights", w, NEXT_N).unwrap(),
        Tensor::from_host(b, "key_start", &[0; NEXT_N], NEXT_N).unwrap(),
        Tensor::from_host(b, "key_end", &ends, NEXT_N).unwrap(),
    )
    .unwrap();
    let keys = IndexKeys::new(
        Tensor::from_host(b, "k", &seq.index_k, len).unwrap(),
        Tensor::from_host(b, "k_scale", &seq.index_scale, len).unwrap(),
    )
    .unwrap();
    let mut rows: Tensor<B, i32, Cols<{ ds::TOPK }>> = Tensor::filled(b, NEXT_N, -7).unwrap();
    ds::Indexer::new()
        .run(b, &queries, &keys, &mut rows)
        .unwrap();
    rows.to_host(b).unwrap()
}

/// The decode of the step's queries over `cache` at the indexer's positions (= slots).
fn decode<B: RunDecode>(
    b: &B,
    cache: &DeepSeekV32KvCache<B>,
    q: &[bf16],
    slots: &[i32],
) -> (Vec<f32>, Vec<f32>) {
    let queries = DecodeQueries::new(
        Tensor::from_host(b, "q", q, NEXT_N).unwrap(),
        Tensor::from_host(b, "indices", slots, NEXT_N).unwrap(),
        ds::SM_SCALE,
    )
    .unwrap();
    let mut out = Tensor::filled(b, NEXT_N, bf16::NAN).unwrap();
    let mut lse = Tensor::filled(b, NEXT_N, f32::NAN).unwrap();
    ds::Decode::new()
        .run(b, &queries, cache, &mut out, &mut lse)
        .unwrap();
    let out = out.to_host(b).unwrap().iter().map(|v| v.to_f32()).collect();
    (out, lse.to_host(b).unwrap())
}

fn main() {
    // SAFETY: a single-stream program: every buffer lives and is used on the backend's stream.
    let gpu = unsafe { Cuda::new_untracked(0) }.ok();
    let prompt = if gpu.is_some() { 16384 } else { 2048 };
    let pages = (prompt + NEXT_N * STEPS).div_ceil(64);
    println!(
        "DeepSeek V3.2, TP{}: {} heads a rank, top-{}; prompt {prompt}, {STEPS} decode steps of {NEXT_N} tokens, on {}",
        ds::TENSOR_PARALLEL,
        ds::HQ,
        ds::TOPK,
        gpu.as_ref()
            .map_or("the CPU reference".to_string(), |g| g.describe())
    );
    let mut seq = Sequence::new(3);
    let rows = seq.grow(prompt);
    let mut cpu_cache = DeepSeekV32KvCache::<Cpu>::zeros(&Cpu, pages).unwrap();
    store(&Cpu, &mut cpu_cache, &rows, 0);
    let mut gpu_cache = gpu.as_ref().map(|g| {
        let mut c = DeepSeekV32KvCache::<Cuda>::zeros(g, pages).unwrap();
        store(g, &mut c, &rows, 0);
        c
    });
    for step in 0..STEPS {
        let first = seq.len();
        let new_rows = seq.grow(NEXT_N);
        let (iq, w, q) = seq.queries(NEXT_N);
        store(&Cpu, &mut cpu_cache, &new_rows, first);
        let cpu_slots = select(&Cpu, &seq, &iq, &w);
        let Some((g, cache)) = gpu.as_ref().zip(gpu_cache.as_mut()) else {
            let (_, lse) = decode(&Cpu, &cpu_cache, &q, &cpu_slots);
            assert!(lse.iter().all(|l| l.is_finite()), "every row has keys");
            println!(
                "step {step}: {} keys; lse of token 0, head 0: {:.4}",
                seq.len(),
                lse[0]
            );
            continue;
        };
        store(g, cache, &new_rows, first);
        let slots = select(g, &seq, &iq, &w);
        let equal = (0..NEXT_N)
            .filter(|&i| {
                slots[i * ds::TOPK..(i + 1) * ds::TOPK]
                    == cpu_slots[i * ds::TOPK..(i + 1) * ds::TOPK]
            })
            .count();
        let (out, lse) = decode(g, cache, &q, &slots);
        let (want_out, want_lse) = decode(&Cpu, &cpu_cache, &q, &slots);
        let d_lse = lse
            .iter()
            .zip(&want_lse)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let d_out = out
            .iter()
            .zip(&want_out)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(d_lse <= 1e-3 + 1e-4 * want_lse.iter().fold(0.0f32, |m, v| m.max(v.abs())));
        assert!(
            out.iter()
                .zip(&want_out)
                .all(|(a, b)| (a - b).abs() <= 1e-2 + 1e-2 * b.abs())
        );
        println!(
            "step {step}: {} keys; indexer rows equal to the CPU's {equal}/{NEXT_N}; decode max |Δlse| {d_lse:.1e}, max |Δout| {d_out:.1e}",
            seq.len()
        );
    }
}
