//! DeepSeek V3.2 (docs/kernels/models.md §4.3) at tensor-parallel degree 8: one 4096-token prefill
//! chunk from the KV cache to the sparse MLA output. The sequence's latent rows (bf16: 512 latent
//! and 64 RoPE values) are stored into the FP8 cache (656 bytes a token, docs/kernels/mla_cache.md) at
//! the slots of its pages, scattered over the cache as a page table leaves them; the gather
//! builds the prefill's e4m3 workspace from those slots in token order, so workspace row `p` is
//! token `p`. The indexer (64 index heads, docs/kernels/indexer.md) picks every query row's
//! top-2048 of the rows it may see, over index keys that took the same road (stored into the
//! paged index-key cache at the same slots, 132 bytes a token, and gathered back in token
//! order); its `[s_q, 2048]` output goes to the FP8 sparse MLA prefill
//! as it is (d_qk 576). Each rank has 16 query heads; the model definition selects the 16-head
//! tile, so the kernel type runs them with the narrow kernel, not padded to 64 heads.
//!
//! On an H200 it times every step of the whole chunk and checks a sample of query rows against
//! the CPU reference (the indexer's rows, then the prefill on the GPU's rows, each backend
//! storing and gathering its own cache); elsewhere it runs them all on the CPU reference at a
//! reduced size.
//! `cargo run --release --example deepseek_v32_prefill`

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32};
use shapeproof::layout::{DeepSeekV32IndexCache, DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::index_cache::{IndexKeyGather, IndexKeyRows, IndexKeyStore, RunIndexCache};
use shapeproof::ops::indexer::{IndexKeys, IndexerQueries, RunIndexer};
use shapeproof::ops::mla_cache::{MlaCacheGather, MlaCacheStore, MlaKvRows, RunMlaCache};
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

/// Pages of the layer's FP8 cache (the sequence takes `s_kv / 64` of them).
const CACHE_PAGES: usize = 1024;

/// One prefill chunk: `s_q` new tokens after `prefix` cached ones; query row `i` may see the
/// `prefix + i + 1` rows up to itself, and the indexer picks up to TOPK of them.
struct Chunk {
    s_q: usize,
    s_kv: usize,
    q: Vec<F8E4M3>,          // [s_q, HQ, D_QK]
    latent: Vec<bf16>,       // [s_kv, 576] each token's latent and RoPE values
    slots: Vec<i32>,         // [s_kv] each token's cache slot (its page's, scattered)
    index_q: Vec<F8E4M3>,    // [s_q, INDEX_HEADS, 128]
    index_weights: Vec<f32>, // [s_q, INDEX_HEADS]
    index_k: Vec<bf16>,      // [s_kv, 128] each token's index key (after its norm and RoPE)
    index_end: Vec<i32>,     // [s_q]: prefix + i + 1
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
        let q = cast(s_q * ds::HQ * ds::D_QK);
        let latent = (0..s_kv * MLA_CACHE_DIM)
            .map(|_| bf16::from_f32((rng.random::<f32>() - 0.5) * 0.17))
            .collect();
        // The sequence's pages: a random choice of the cache's, in a random order.
        let mut pages: Vec<usize> = (0..CACHE_PAGES).collect();
        for i in 0..pages.len() {
            let j = rng.random_range(i..pages.len());
            pages.swap(i, j);
        }
        let slots = (0..s_kv)
            .map(|t| (pages[t / 64] * 64 + t % 64) as i32)
            .collect();
        let unit = |rng: &mut StdRng, n: usize| -> Vec<F8E4M3> {
            (0..n)
                .map(|_| e4m3_from_f32((rng.random::<f32>() - 0.5) * 4.0))
                .collect()
        };
        let index_q = unit(&mut rng, s_q * ds::INDEX_HEADS * 128);
        let index_k = (0..s_kv * 128)
            .map(|_| bf16::from_f32((rng.random::<f32>() - 0.5) * 4.0))
            .collect();
        let index_weights = (0..s_q * ds::INDEX_HEADS)
            .map(|_| (rng.random::<f32>() - 0.5) / 8.0)
            .collect();
        Self {
            s_q,
            s_kv,
            q,
            latent,
            slots,
            index_q,
            index_weights,
            index_k,
            index_end: (0..s_q).map(|i| (prefix + i + 1) as i32).collect(),
        }
    }

    /// The first `rows` query rows as a chunk of their own (same latent rows).
    fn head(&self, rows: usize) -> Self {
        Self {
            s_q: rows,
            s_kv: self.s_kv,
            q: self.q[..rows * ds::HQ * ds::D_QK].to_vec(),
            latent: self.latent.clone(),
            slots: self.slots.clone(),
            index_q: self.index_q[..rows * ds::INDEX_HEADS * 128].to_vec(),
            index_weights: self.index_weights[..rows * ds::INDEX_HEADS].to_vec(),
            index_k: self.index_k.clone(),
            index_end: self.index_end[..rows].to_vec(),
        }
    }
}

/// The indexer's inputs of a chunk on `b`: every row sees `[0, prefix + i + 1)`; the keys are
/// stored into a fresh index-key cache at the tokens' slots and gathered back in token order.
fn indexer_inputs<B: RunIndexCache>(
    b: &B,
    c: &Chunk,
) -> (IndexerQueries<B, { ds::INDEX_HEADS }>, IndexKeys<B>) {
    let queries = IndexerQueries::new(
        Tensor::from_host(b, "q", &c.index_q, c.s_q).unwrap(),
        Tensor::from_host(b, "weights", &c.index_weights, c.s_q).unwrap(),
        Tensor::from_host(b, "key_start", &vec![0; c.s_q], c.s_q).unwrap(),
        Tensor::from_host(b, "key_end", &c.index_end, c.s_q).unwrap(),
    )
    .unwrap();
    let mut cache = DeepSeekV32IndexCache::<B>::zeros(b, CACHE_PAGES).unwrap();
    let loc: Vec<i64> = c.slots.iter().map(|&s| s as i64).collect();
    let rows = IndexKeyRows::new(
        Tensor::from_host(b, "k", &c.index_k, c.s_kv).unwrap(),
        Tensor::from_host(b, "loc", &loc, c.s_kv).unwrap(),
    )
    .unwrap();
    IndexKeyStore::<64>::new()
        .run(b, &rows, &mut cache, None)
        .unwrap();
    let index = Tensor::from_host(b, "index", &c.slots, c.s_kv).unwrap();
    let (mut k, mut k_scale) = (
        Tensor::zeros(b, c.s_kv).unwrap(),
        Tensor::zeros(b, c.s_kv).unwrap(),
    );
    IndexKeyGather::<64>::new()
        .run(b, &cache, &index, &mut k, &mut k_scale, None)
        .unwrap();
    (queries, IndexKeys::new(k, k_scale).unwrap())
}

/// The indexer's `[s_q, TOPK]` rows of a chunk on `b`: the prefill's indices.
fn select<B: RunIndexer + RunIndexCache>(b: &B, c: &Chunk) -> Tensor<B, i32, Cols<{ ds::TOPK }>> {
    let (queries, keys) = indexer_inputs(b, c);
    let mut indices = Tensor::filled(b, c.s_q, i32::MIN).unwrap();
    ds::Indexer::new()
        .run(b, &queries, &keys, &mut indices)
        .unwrap();
    indices
}

/// Outputs of one run: `out [s_q, HQ, 512]`, `max_logits`, `lse` `[s_q, HQ]`.
struct Outputs<B: Backend> {
    out: Tensor<B, bf16, OutRow<{ ds::HQ }>>,
    max_logits: Tensor<B, f32, Cols<{ ds::HQ }>>,
    lse: Tensor<B, f32, Cols<{ ds::HQ }>>,
}

/// The chunk's latent rows stored into a fresh FP8 cache at their slots, then gathered in token
/// order into the prefill's workspace (identity scale).
fn cache_and_gather<B: RunMlaCache>(b: &B, c: &Chunk) -> ds::KvCache<B> {
    let mut cache = DeepSeekV32KvCache::<B>::zeros(b, CACHE_PAGES).unwrap();
    let loc: Vec<i64> = c.slots.iter().map(|&s| s as i64).collect();
    let rows = MlaKvRows::new(
        Tensor::from_host(b, "kv", &c.latent, c.s_kv).unwrap(),
        Tensor::from_host(b, "loc", &loc, c.s_kv).unwrap(),
    )
    .unwrap();
    MlaCacheStore::<64, 128>::new()
        .run(b, &rows, &mut cache, None)
        .unwrap();
    let index = Tensor::from_host(b, "index", &c.slots, c.s_kv).unwrap();
    let mut workspace =
        ds::KvCache::new(b, b.zeros(c.s_kv * ds::D_QK).unwrap(), c.s_kv, 0.0).unwrap();
    MlaCacheGather::<64, 128>::new()
        .run(b, &cache, &index, &mut workspace, None)
        .unwrap();
    workspace
}

/// Uploads the chunk with the indexer's rows and returns a closure-ready set of inputs, KV
/// (through the cache) and outputs.
fn prepare<B: RunMlaCache>(
    b: &B,
    c: &Chunk,
    indices: Tensor<B, i32, Cols<{ ds::TOPK }>>,
) -> (
    SparseMlaInputs<B, { ds::D_QK }, { ds::HQ }, { ds::TOPK }, shapeproof::ops::sparse_mla::Plain>,
    ds::KvCache<B>,
    Outputs<B>,
) {
    let inputs = SparseMlaInputs::new(
        Tensor::from_host(b, "q", &c.q, c.s_q).unwrap(),
        Tensor::from_host(b, "q_scale", &[1.0f32], 1).unwrap(),
        indices,
        SM_SCALE,
    )
    .unwrap();
    let kv = cache_and_gather(b, c);
    let outputs = Outputs {
        out: Tensor::filled(b, c.s_q, bf16::NAN).unwrap(),
        max_logits: Tensor::filled(b, c.s_q, f32::NAN).unwrap(),
        lse: Tensor::filled(b, c.s_q, f32::NAN).unwrap(),
    };
    (inputs, kv, outputs)
}

fn run<B: RunSparseMla + RunMlaCache>(
    b: &B,
    c: &Chunk,
    indices: Tensor<B, i32, Cols<{ ds::TOPK }>>,
) -> Outputs<B> {
    let (inputs, kv, mut o) = prepare(b, c, indices);
    ds::SparseMla::new()
        .run(b, &inputs, &kv, &mut o.out, &mut o.max_logits, &mut o.lse)
        .unwrap();
    o
}

/// The indexer's rows on the GPU against the CPU reference's (rows equal, and positions in
/// the rows that differ), then the prefill's largest deviation from the CPU reference on the
/// GPU's rows, as a fraction of the spec's tolerances (out 8e-2, max_logits 1e-2, lse 2e-3).
fn check(g: &Cuda, c: &Chunk) -> (usize, usize, f32) {
    let gpu_rows = select(g, c);
    let host_rows = gpu_rows.to_host(g).unwrap();
    let cpu_rows = select(&Cpu, c).to_host(&Cpu).unwrap();
    let mut equal = 0;
    let mut moved = 0;
    for (a, b) in host_rows.chunks(ds::TOPK).zip(cpu_rows.chunks(ds::TOPK)) {
        let visible = a.iter().filter(|&&v| v >= 0).count();
        assert_eq!(
            visible,
            b.iter().filter(|&&v| v >= 0).count(),
            "row lengths differ"
        );
        assert!(a[..visible].windows(2).all(|w| w[0] < w[1]), "rows ascend");
        if a == b {
            equal += 1;
        } else {
            moved += a.iter().filter(|v| !b.contains(v)).count();
        }
    }
    let cpu_indices = Tensor::from_host(&Cpu, "indices", &host_rows, c.s_q).unwrap();
    let (gpu, cpu) = (run(g, c, gpu_rows), run(&Cpu, c, cpu_indices));
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
    (equal, moved, out.max(ml).max(lse))
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
            let (equal, moved, worst) = check(&g, &sample);
            println!(
                "sample of 32 query rows: indexer rows equal to the CPU reference's {equal}/32 ({moved} positions differ, ties within the f32 rounding of the logits); prefill worst deviation from the CPU reference {:.0}% of the spec tolerance",
                100.0 * worst
            );
            assert!(worst <= 1.0);
            let ev = || {
                g.context()
                    .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .unwrap()
            };
            let (queries, keys) = indexer_inputs(&g, &chunk);
            let mut indices = Tensor::filled(&g, chunk.s_q, -1).unwrap();
            let indexer = ds::Indexer::new();
            let (start, end) = (ev(), ev());
            indexer.run(&g, &queries, &keys, &mut indices).unwrap();
            start.record(g.stream()).unwrap();
            for _ in 0..3 {
                indexer.run(&g, &queries, &keys, &mut indices).unwrap();
            }
            end.record(g.stream()).unwrap();
            end.synchronize().unwrap();
            let pairs: u64 = chunk.index_end.iter().map(|&e| e as u64).sum();
            let ms = start.elapsed_ms(&end).unwrap() as f64 / 3.0;
            println!(
                "indexer, {} index heads, top-{}: {ms:.3} ms, {:.0} TFLOP/s on the logits",
                ds::INDEX_HEADS,
                ds::TOPK,
                ds::Indexer::flops(pairs) / (ms * 1e-3) / 1e12
            );
            let (start_c, end_c) = (ev(), ev());
            start_c.record(g.stream()).unwrap();
            let kv_check = cache_and_gather(&g, &chunk);
            end_c.record(g.stream()).unwrap();
            end_c.synchronize().unwrap();
            drop(kv_check);
            println!(
                "FP8 cache of {} tokens: store + gather (with the cache's allocation and the rows' upload) {:.3} ms",
                chunk.s_kv,
                start_c.elapsed_ms(&end_c).unwrap()
            );
            let (inputs, kv, mut o) = prepare(&g, &chunk, indices);
            let kernel = ds::SparseMla::new();
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
            let indices = select(&Cpu, &chunk);
            let o = run(&Cpu, &chunk, indices);
            let lse = o.lse.to_host(&Cpu).unwrap();
            println!(
                "{} query rows x {} heads over {} KV rows, cache store and gather, indexer and prefill, in {:.0} ms on the CPU reference; lse of row 0, head 0: {:.4}",
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
