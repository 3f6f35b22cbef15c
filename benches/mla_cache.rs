//! Benchmark of the FP8 sparse MLA cache (`kernels/mla_cache.cu`): the store (bf16 rows in, 656
//! bytes a token out) and the gather (656 bytes a slot in, 576 e4m3 bytes a row out), in GB/s
//! of bytes read plus written, beside the device copy bandwidth measured in the same run. The
//! store of 262144 tokens (the whole cache: 474 MB moved, far beyond L2), a prefill chunk of
//! 16384 tokens and a decode step (128 sequences × 2 tokens) into a cache of 4096 pages; the
//! gather of sequences of 262144, 65536 and 8192 tokens whose pages lie scattered over the
//! cache (page-table order). Run on the H200 through
//! `scripts/gpu-bundle.sh` (`run.sh bench`); needs `--features gpu-tests`.

mod common;

use common::{Record, copy_bandwidth_gbs, gpu, sequence_slots, time_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM, MLA_FP8_ROW_BYTES, MlaLatentKv};
use shapeproof::ops::mla_cache::{MlaCacheGather, MlaCacheStore, MlaKvRows};
use shapeproof::tensor::Tensor;

/// Pages of the benchmark's cache (262144 slots, 172 MB).
const PAGES: usize = 4096;

fn report(
    what: &str,
    name: String,
    n: usize,
    bytes: f64,
    us: f64,
    copy: f64,
    records: &mut Vec<Record>,
) {
    let gbs = bytes / (us * 1e-6) / 1e9;
    println!(
        "| {what} | {n} | {us:.1} | {gbs:.0} | {:.0}% |",
        100.0 * gbs / copy
    );
    records.push(Record {
        name,
        fields: vec![
            ("rows", n as f64),
            ("us", us),
            ("gbs", gbs),
            ("of_copy", gbs / copy),
        ],
    });
}

fn bench_store(
    g: &Cuda,
    rng: &mut StdRng,
    cache: &mut DeepSeekV32KvCache<Cuda>,
    tokens: usize,
    copy: f64,
    records: &mut Vec<Record>,
) {
    let kv: Vec<bf16> = (0..tokens * MLA_CACHE_DIM)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    let loc: Vec<i64> = sequence_slots(rng, PAGES, tokens)
        .into_iter()
        .map(|s| s as i64)
        .collect();
    let rows = MlaKvRows::new(
        Tensor::from_host(g, "kv", &kv, tokens).unwrap(),
        Tensor::from_host(g, "loc", &loc, tokens).unwrap(),
    )
    .unwrap();
    let store = MlaCacheStore::<64, 128>::new();
    let us = time_us(g, 3, 21, |_| store.run(g, &rows, cache, None).unwrap());
    let bytes = (tokens * (MLA_CACHE_DIM * 2 + 8 + MLA_FP8_ROW_BYTES)) as f64;
    report(
        "store",
        format!("store_t{tokens}"),
        tokens,
        bytes,
        us,
        copy,
        records,
    );
}

fn bench_gather(
    g: &Cuda,
    rng: &mut StdRng,
    cache: &DeepSeekV32KvCache<Cuda>,
    rows: usize,
    copy: f64,
    records: &mut Vec<Record>,
) {
    let index: Vec<i32> = sequence_slots(rng, PAGES, rows)
        .into_iter()
        .map(|s| s as i32)
        .collect();
    let index = Tensor::from_host(g, "index", &index, rows).unwrap();
    let mut workspace = MlaLatentKv::<Cuda, MLA_CACHE_DIM>::new(
        g,
        g.zeros(rows * MLA_CACHE_DIM).unwrap(),
        rows,
        1.0,
    )
    .unwrap();
    let gather = MlaCacheGather::<64, 128>::new();
    let us = time_us(g, 3, 21, |_| {
        gather.run(g, cache, &index, &mut workspace, None).unwrap()
    });
    let bytes = (rows * (4 + MLA_FP8_ROW_BYTES + MLA_CACHE_DIM)) as f64;
    report(
        "gather",
        format!("gather_n{rows}"),
        rows,
        bytes,
        us,
        copy,
        records,
    );
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0xCAC4E);
    println!("# FP8 sparse MLA cache benchmark on {}", g.describe());
    let copy = copy_bandwidth_gbs(&g);
    println!("copy bandwidth, same run: {copy:.0} GB/s");
    let mut records = vec![Record {
        name: "copy".into(),
        fields: vec![("gbs", copy)],
    }];
    let mut cache = DeepSeekV32KvCache::<Cuda>::zeros(&g, PAGES).unwrap();
    println!("\n| op | rows | µs | GB/s | of copy |");
    println!("|---|---|---|---|---|");
    bench_store(&g, &mut rng, &mut cache, 262144, copy, &mut records);
    bench_store(&g, &mut rng, &mut cache, 16384, copy, &mut records);
    bench_store(&g, &mut rng, &mut cache, 256, copy, &mut records);
    bench_gather(&g, &mut rng, &cache, 262144, copy, &mut records);
    bench_gather(&g, &mut rng, &cache, 65536, copy, &mut records);
    bench_gather(&g, &mut rng, &cache, 8192, copy, &mut records);
    common::write_json("mla_cache.json", &records);
}
