//! DeepSeek V3.2 at tensor-parallel degree 8, one sequence served on this library alone, as an
//! engine holds it: its pages scattered over two paged caches that share one block table — the
//! FP8 sparse MLA cache (656 bytes a token) and the indexer's key cache (132 bytes a token).
//! The prompt's latent rows and index keys are stored into both, then decode steps of
//! `next_n = 2` tokens (a multi-token-prediction verify): each step stores its two new rows and
//! keys, runs the paged lightning indexer for its two queries over every key so far (its rows
//! are cache slots), and the sparse MLA decode of the rank's 16 heads over those slots.
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
use shapeproof::layout::{DeepSeekV32IndexCache, DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::index_cache::{IndexKeyRows, IndexKeyStore, RunIndexCache};
use shapeproof::ops::indexer::{PagedIndexerQueries, PagedIndexerWorkspace, RunIndexer};
use shapeproof::ops::mla_cache::{MlaCacheStore, MlaKvRows, RunMlaCache};
use shapeproof::ops::sparse_mla_decode::{DecodeQueries, DecodeWorkspace, RunDecode};
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

/// The sequence: its length, its pages (the block table, one row) and the generator of its
/// tokens.
struct Sequence {
    rng: StdRng,
    len: usize,
    block_table: Vec<i32>, // [max_pages] the cache page of each 64 positions
}

/// One step's new tokens: latent rows, index keys and their cache slots.
struct NewTokens {
    latent: Vec<bf16>,  // [n, 576]
    index_k: Vec<bf16>, // [n, 128]
    loc: Vec<i64>,      // [n]
}

impl Sequence {
    /// A sequence whose `max_pages` pages are a shuffle of the cache's.
    fn new(seed: u64, max_pages: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut block_table: Vec<i32> = (0..max_pages as i32).collect();
        for i in (1..max_pages).rev() {
            block_table.swap(i, rng.random_range(0..=i));
        }
        Self {
            rng,
            len: 0,
            block_table,
        }
    }

    /// Appends `n` tokens: their rows, keys and slots.
    fn grow(&mut self, n: usize) -> NewTokens {
        let rng = &mut self.rng;
        let latent = (0..n * MLA_CACHE_DIM)
            .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
            .collect();
        let index_k = (0..n * 128)
            .map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0)))
            .collect();
        let loc = (self.len..self.len + n)
            .map(|p| (self.block_table[p / 64] as usize * 64 + p % 64) as i64)
            .collect();
        self.len += n;
        NewTokens {
            latent,
            index_k,
            loc,
        }
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

/// A backend's two caches of the sequence.
struct Caches<B: Backend> {
    kv: DeepSeekV32KvCache<B>,
    index: DeepSeekV32IndexCache<B>,
}

impl<B: RunMlaCache + RunIndexCache> Caches<B> {
    fn new(b: &B, pages: usize) -> Self {
        Self {
            kv: DeepSeekV32KvCache::zeros(b, pages).unwrap(),
            index: DeepSeekV32IndexCache::zeros(b, pages).unwrap(),
        }
    }

    /// Stores the new tokens' latent rows and index keys at their slots of both caches.
    fn store(&mut self, b: &B, new: &NewTokens) {
        let n = new.loc.len();
        let rows = MlaKvRows::new(
            Tensor::from_host(b, "kv", &new.latent, n).unwrap(),
            Tensor::from_host(b, "loc", &new.loc, n).unwrap(),
        )
        .unwrap();
        MlaCacheStore::<64, 128>::new()
            .run(b, &rows, &mut self.kv, None)
            .unwrap();
        let keys = IndexKeyRows::new(
            Tensor::from_host(b, "k", &new.index_k, n).unwrap(),
            Tensor::from_host(b, "loc", &new.loc, n).unwrap(),
        )
        .unwrap();
        IndexKeyStore::<64>::new()
            .run(b, &keys, &mut self.index, None)
            .unwrap();
    }
}

/// The paged indexer's `[NEXT_N, TOPK]` cache slots for the step's tokens: token `i` of the
/// step sees the positions `[0, len - NEXT_N + i + 1)`.
fn select<B: RunIndexer>(
    b: &B,
    caches: &Caches<B>,
    seq: &Sequence,
    iq: &[F8E4M3],
    w: &[f32],
) -> Vec<i32> {
    let queries = PagedIndexerQueries::<B, { ds::INDEX_HEADS }>::new(
        Tensor::from_host(b, "q", iq, NEXT_N).unwrap(),
        Tensor::from_host(b, "weights", w, NEXT_N).unwrap(),
        Tensor::from_host(b, "block_table", &seq.block_table, seq.block_table.len()).unwrap(),
        seq.block_table.len(),
        Tensor::from_host(b, "seq_lens", &[seq.len as i32], 1).unwrap(),
        NEXT_N,
    )
    .unwrap();
    // Made once per batch shape in an engine; here the shape never changes, so any step's will do.
    let mut workspace = PagedIndexerWorkspace::new(b, 1, NEXT_N, seq.block_table.len()).unwrap();
    let mut rows: Tensor<B, i32, Cols<{ ds::TOPK }>> = Tensor::filled(b, NEXT_N, -7).unwrap();
    ds::Indexer::new()
        .run_paged(b, &queries, &caches.index, &mut workspace, &mut rows)
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
    let mut workspace = DecodeWorkspace::new(b, NEXT_N).unwrap();
    ds::Decode::new()
        .run(b, &queries, cache, &mut workspace, &mut out, &mut lse)
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
    let mut seq = Sequence::new(3, pages);
    let prompt_tokens = seq.grow(prompt);
    let mut cpu_caches = Caches::new(&Cpu, pages);
    cpu_caches.store(&Cpu, &prompt_tokens);
    let mut gpu_caches = gpu.as_ref().map(|g| {
        let mut c = Caches::new(g, pages);
        c.store(g, &prompt_tokens);
        c
    });
    for step in 0..STEPS {
        let new = seq.grow(NEXT_N);
        let (iq, w, q) = seq.queries(NEXT_N);
        cpu_caches.store(&Cpu, &new);
        let cpu_slots = select(&Cpu, &cpu_caches, &seq, &iq, &w);
        let Some((g, caches)) = gpu.as_ref().zip(gpu_caches.as_mut()) else {
            let (_, lse) = decode(&Cpu, &cpu_caches.kv, &q, &cpu_slots);
            assert!(lse.iter().all(|l| l.is_finite()), "every row has keys");
            println!(
                "step {step}: {} keys; lse of token 0, head 0: {:.4}",
                seq.len, lse[0]
            );
            continue;
        };
        caches.store(g, &new);
        let slots = select(g, caches, &seq, &iq, &w);
        let equal = (0..NEXT_N)
            .filter(|&i| {
                slots[i * ds::TOPK..(i + 1) * ds::TOPK]
                    == cpu_slots[i * ds::TOPK..(i + 1) * ds::TOPK]
            })
            .count();
        let (out, lse) = decode(g, &caches.kv, &q, &slots);
        let (want_out, want_lse) = decode(&Cpu, &cpu_caches.kv, &q, &slots);
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
            seq.len
        );
    }
}
