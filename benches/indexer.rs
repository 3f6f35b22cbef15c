//! Benchmark of the lightning indexer (logits and top-k fused, `kernels/lightning_indexer_prefill.cu`
//! and, paged, `kernels/lightning_indexer.cu`):
//! TFLOP/s of the logits counted as `2·H_IDX·128` per valid (query token, key) pair, at
//! (T 4096 over 65536 keys of history plus the chunk causal, H_IDX 64, TOPK 2048), DeepSeek
//! V3.2's prefill chunk, and at (32768 tokens causal over themselves, H_IDX 32, TOPK 2048),
//! where a published fused H200 indexer takes 16.1 ms; each beside the same CTA without the
//! selection on the same inputs ("logits alone": the product, head sums and scales of every
//! key), the time the selection adds. Beside them, measured in the same run:
//! the FP8 matmul rate (`scripts/fp8_matmul_rate.py`, PyTorch `_scaled_mm`, when present) and
//! the device copy bandwidth.
//! The paged form (decode) at (B 128, next_n 2, seq_len 65536, H_IDX 64, TOPK 2048), the
//! decode step of a full batch, and at B 1 and 8: its figure is the cache bytes read (`B ·
//! seq_len · 132`) per second against the copy bandwidth, pages shuffled over the cache. The
//! index-key store: bytes moved (`T · (256 + 132)`) per second.
//! Inputs: random e4m3 bytes (NaN patterns avoided), N(0, 1/64) weights, key scales in
//! [0.005, 0.02). Run on the H200 through `scripts/gpu-bundle.sh` (`run.sh bench`); needs
//! `--features gpu-tests`.

mod common;

use common::{Record, copy_bandwidth_gbs, fp8_matmul_limit, gpu, time_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::cuda::{CudaKernel, DeviceArgs};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::F8E4M3;
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32IndexCache, INDEX_KEY_ROW_BYTES};
use shapeproof::ops::index_cache::{IndexKeyRows, IndexKeyStore};
use shapeproof::ops::indexer::{
    IndexKeys, IndexerParams, IndexerQueries, LightningIndexer, LightningIndexerKernel,
    PagedIndexerQueries, PagedIndexerWorkspace, prefill_indexer_launch_shape,
    prefill_indexer_smem_bytes,
};
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

/// The prefill CTA without the selection (`lightning_indexer_kernel<H, TOPK, true>`): the
/// product, head sums and scales of every key, each thread's largest logit written as bits into
/// `indices`, no admission, vote, cut or sort, the key blocks in the fused kernel's order (its
/// sample's blocks first). Timed beside the fused kernel, it is the "logits
/// alone" the fused kernel's time is read against; the library never launches it.
struct LogitsAlone<const H: usize, const TOPK: usize>;

impl<const H: usize, const TOPK: usize> CudaKernel for LogitsAlone<H, TOPK> {
    const SOURCE: &'static str = LightningIndexerKernel::<H, TOPK>::SOURCE;
    const DYNAMIC_SMEM_BYTES: u32 = prefill_indexer_smem_bytes(H, TOPK);
    type Params = IndexerParams;
    fn instantiation() -> String {
        format!("lightning_indexer_kernel<{H}, {TOPK}, true>")
    }
}

/// Times one shape: `tokens` query tokens whose ranges are `[0, history + t + 1)` over
/// `history + tokens` keys; then the same inputs through the logits-alone kernel.
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
    let q_host = e4m3_bytes(rng, tokens * H * 128);
    let queries = IndexerQueries::new(
        Tensor::from_host(g, "q", &q_host, tokens).unwrap(),
        Tensor::from_host(g, "weights", &weights, tokens).unwrap(),
        Tensor::from_host(g, "key_start", &starts, tokens).unwrap(),
        Tensor::from_host(g, "key_end", &ends, tokens).unwrap(),
    )
    .unwrap();
    let scales: Vec<f32> = (0..s_kv)
        .map(|_| rng.random_range(0.005f32..0.02))
        .collect();
    let k_host = e4m3_bytes(rng, s_kv * 128);
    let keys = IndexKeys::new(
        Tensor::from_host(g, "k", &k_host, s_kv).unwrap(),
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

    // The same inputs through the logits-alone kernel, launched raw (the bench's own copies of
    // the tensors; the fused call's are inside its checked structs).
    let q = Tensor::<Cuda, F8E4M3, Cols<128>>::from_host(g, "q", &q_host, tokens * H).unwrap();
    let w = Tensor::<Cuda, f32, Cols<1>>::from_host(g, "weights", &weights, tokens * H).unwrap();
    let ks = Tensor::<Cuda, i32, Cols<1>>::from_host(g, "key_start", &starts, tokens).unwrap();
    let ke = Tensor::<Cuda, i32, Cols<1>>::from_host(g, "key_end", &ends, tokens).unwrap();
    let k = Tensor::<Cuda, F8E4M3, Cols<128>>::from_host(g, "k", &k_host, s_kv).unwrap();
    let kscale = Tensor::<Cuda, f32, Cols<1>>::from_host(g, "k_scale", &scales, s_kv).unwrap();
    let mut out: Tensor<Cuda, i32, Cols<TOPK>> = Tensor::zeros(g, tokens).unwrap();
    let shape = prefill_indexer_launch_shape(tokens, H, TOPK);
    let logits_us = time_us(g, 2, 7, |_| {
        let (qv, wv, sv, ev, kv, scv) = (
            q.as_slice(),
            w.as_slice(),
            ks.as_slice(),
            ke.as_slice(),
            k.as_slice(),
            kscale.as_slice(),
        );
        let mut ov = out.as_slice_mut();
        let mut args = DeviceArgs::new(g).unwrap();
        let k_addr = args.read_vectors("k", &kv).unwrap();
        let params = IndexerParams {
            q: args.read_vectors("q", &qv).unwrap(),
            weights: args.read("weights", &wv).unwrap(),
            key_start: args.read("key_start", &sv).unwrap(),
            key_end: args.read("key_end", &ev).unwrap(),
            k: k_addr,
            k_scale: args.read("k_scale", &scv).unwrap(),
            indices: args.write("indices", &mut ov).unwrap(),
            tokens: tokens as i32,
            s_kv: s_kv as i32,
            k_map: shapeproof::backend::cuda::TensorMap::rows_of_128_bytes("k", k_addr, s_kv, 64)
                .unwrap(),
        };
        // SAFETY: the buffers hold what the fused call's do (q tokens × H × 128 bytes, weights
        // tokens × H, the ranges tokens, k s_kv × 128 bytes, k_scale s_kv, indices tokens ×
        // TOPK), and the kernel is the fused one's CTA under its launch shape; it writes
        // indices[t, 0 .. 128) of each token only.
        unsafe { args.launch::<LogitsAlone<H, TOPK>>(shape, &params).unwrap() }
    });
    println!(
        "| ({tokens}, {history} + chunk causal, {H}, 128, {TOPK}) | {:.3} | {tflops:.0} | {:.0}% | {:.3} | {:.2} |",
        us / 1e3,
        of_limit * 100.0,
        logits_us / 1e3,
        us / logits_us
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
            ("logits_alone_ms", logits_us / 1e3),
            ("over_logits_alone", us / logits_us),
        ],
    });
}

/// Times one paged (decode) shape: `batch` sequences of `seq_len` positions, `next_n` query
/// tokens each, every sequence's pages a random permutation of the cache's.
fn bench_paged<const H: usize, const TOPK: usize>(
    g: &Cuda,
    rng: &mut StdRng,
    batch: usize,
    next_n: usize,
    seq_len: usize,
    copy_gbs: f64,
    records: &mut Vec<Record>,
) where
    Dim<H>: IndexerHeads,
    Dim<TOPK>: IndexerTopk,
{
    let per_seq = seq_len.div_ceil(64);
    let pages = batch * per_seq;
    // A block of 64 random pages (keys without NaN patterns, scales in [0.005, 0.02)) tiled
    // over the cache: every page is read from memory, none is a special value.
    let mut template = Vec::with_capacity(64 * 8448);
    for _ in 0..64 {
        template.extend(e4m3_bytes(rng, 64 * 128).iter().map(|b| b.to_bits()));
        for _ in 0..64 {
            template.extend(rng.random_range(0.005f32..0.02).to_le_bytes());
        }
    }
    let bytes: Vec<u8> = template
        .iter()
        .copied()
        .cycle()
        .take(pages * 8448)
        .collect();
    let cache = DeepSeekV32IndexCache::<Cuda>::from_tensor(
        Tensor::from_host(g, "cache", &bytes, pages).unwrap(),
    )
    .unwrap();
    let mut table: Vec<i32> = (0..pages as i32).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, rng.random_range(0..=i));
    }
    let rows = batch * next_n;
    let weights: Vec<f32> = (0..rows * H)
        .map(|_| rng.random_range(-0.25f32..0.25))
        .collect();
    let queries = PagedIndexerQueries::new(
        Tensor::from_host(g, "q", &e4m3_bytes(rng, rows * H * 128), rows).unwrap(),
        Tensor::from_host(g, "weights", &weights, rows).unwrap(),
        Tensor::from_host(g, "block_table", &table, pages).unwrap(),
        per_seq,
        Tensor::from_host(g, "seq_lens", &vec![seq_len as i32; batch], batch).unwrap(),
        next_n,
    )
    .unwrap();
    let mut indices: Tensor<Cuda, i32, Cols<TOPK>> = Tensor::zeros(g, rows).unwrap();
    let mut workspace =
        PagedIndexerWorkspace::<Cuda, TOPK>::new(g, batch, next_n, per_seq).unwrap();
    let splits = workspace.splits();
    let indexer = LightningIndexer::<H, TOPK>::new();
    let us = time_us(g, 2, 7, |_| {
        indexer
            .run_paged(g, &queries, &cache, &mut workspace, &mut indices)
            .unwrap()
    });
    let cache_bytes = (batch * seq_len * INDEX_KEY_ROW_BYTES) as f64;
    let gbs = cache_bytes / (us * 1e-6) / 1e9;
    let pairs: u64 = (0..next_n)
        .map(|j| (batch * (seq_len - next_n + j + 1)) as u64)
        .sum();
    let tflops = LightningIndexer::<H, TOPK>::flops(pairs) / (us * 1e-6) / 1e12;
    println!(
        "| ({batch}, {next_n}, {seq_len}, {H}, {TOPK}) | {splits} | {us:.1} | {gbs:.0} | {:.0}% | {tflops:.0} |",
        gbs / copy_gbs * 100.0
    );
    records.push(Record {
        name: format!("indexer_paged_b{batch}_n{next_n}_len{seq_len}_h{H}_topk{TOPK}"),
        fields: vec![
            ("batch", batch as f64),
            ("next_n", next_n as f64),
            ("seq_len", seq_len as f64),
            ("heads", H as f64),
            ("topk", TOPK as f64),
            ("splits", splits as f64),
            ("us", us),
            ("gbs", gbs),
            ("of_copy", gbs / copy_gbs),
            ("tflops", tflops),
        ],
    });
}

/// Times the index-key store of `tokens` keys into distinct random slots of a cache with room
/// for four times as many.
fn bench_store(
    g: &Cuda,
    rng: &mut StdRng,
    tokens: usize,
    copy_gbs: f64,
    records: &mut Vec<Record>,
) {
    let pages = (4 * tokens).div_ceil(64);
    let mut cache = DeepSeekV32IndexCache::<Cuda>::zeros(g, pages).unwrap();
    let k: Vec<bf16> = (0..tokens * 128)
        .map(|_| bf16::from_f32(rng.random_range(-4.0f32..4.0)))
        .collect();
    let mut slots: Vec<i64> = (0..(pages * 64) as i64).collect();
    for i in (1..slots.len()).rev() {
        slots.swap(i, rng.random_range(0..=i));
    }
    slots.truncate(tokens);
    let rows = IndexKeyRows::new(
        Tensor::from_host(g, "k", &k, tokens).unwrap(),
        Tensor::from_host(g, "loc", &slots, tokens).unwrap(),
    )
    .unwrap();
    let store = IndexKeyStore::<64>::new();
    let us = time_us(g, 3, 11, |_| store.run(g, &rows, &mut cache, None).unwrap());
    let moved = (tokens * (256 + 8 + INDEX_KEY_ROW_BYTES)) as f64;
    let gbs = moved / (us * 1e-6) / 1e9;
    println!(
        "| store {tokens} | {us:.1} | {gbs:.0} | {:.0}% | |",
        gbs / copy_gbs * 100.0
    );
    records.push(Record {
        name: format!("index_store_t{tokens}"),
        fields: vec![
            ("tokens", tokens as f64),
            ("us", us),
            ("gbs", gbs),
            ("of_copy", gbs / copy_gbs),
        ],
    });
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0x1D5E);
    println!("# lightning indexer benchmark on {}", g.describe());
    // `INDEXER_PROFILE="T,HISTORY,H"`: only that prefill row (T query tokens over HISTORY keys
    // plus the chunk causal, H 32 or 64, TOPK 2048: the fused kernel, then the logits alone), for
    // a profiler, e.g. `INDEXER_PROFILE=32768,0,32 ncu --kernel-name-base demangled
    // --kernel-name 'regex:lightning_indexer_kernel<\(int\)32, .*\(bool\)0>' --launch-count 1 …`.
    if let Some([tokens, history, heads]) = common::profile_row("INDEXER_PROFILE", "T,HISTORY,H") {
        let mut records = Vec::new();
        println!(
            "\n| (T, S_kv, H_IDX, D, TOPK) | ms | TFLOP/s | of FP8 matmul | logits alone ms | over logits alone |"
        );
        println!("|---|---|---|---|---|---|");
        match heads {
            64 => bench::<64, 2048>(&g, &mut rng, tokens, history, None, &mut records),
            32 => bench::<32, 2048>(&g, &mut rng, tokens, history, None, &mut records),
            h => panic!("INDEXER_PROFILE: {h} heads (32 or 64)"),
        }
        return;
    }
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
    println!(
        "\n| (T, S_kv, H_IDX, D, TOPK) | ms | TFLOP/s | of FP8 matmul | logits alone ms | over logits alone |"
    );
    println!("|---|---|---|---|---|---|");
    bench::<64, 2048>(&g, &mut rng, 4096, 65536, limit, &mut records);
    bench::<32, 2048>(&g, &mut rng, 32768, 0, limit, &mut records);
    bench::<64, 2048>(&g, &mut rng, 4096, 8192, limit, &mut records);
    println!(
        "\n| paged (B, next_n, seq_len, H_IDX, TOPK) | splits | µs | cache GB/s | of copy | TFLOP/s |"
    );
    println!("|---|---|---|---|---|---|");
    bench_paged::<64, 2048>(&g, &mut rng, 128, 2, 65536, copy, &mut records);
    bench_paged::<64, 2048>(&g, &mut rng, 8, 2, 65536, copy, &mut records);
    bench_paged::<64, 2048>(&g, &mut rng, 1, 2, 65536, copy, &mut records);
    bench_paged::<64, 2048>(&g, &mut rng, 1, 1, 65536, copy, &mut records);
    bench_paged::<64, 2048>(&g, &mut rng, 128, 1, 8192, copy, &mut records);
    bench_store(&g, &mut rng, 256, copy, &mut records);
    bench_store(&g, &mut rng, 65536, copy, &mut records);
    common::write_json("indexer.json", &records);
}
