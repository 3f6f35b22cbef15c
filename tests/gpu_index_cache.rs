//! The index-key cache store on the GPU: the cache is the CPU reference's bytes exactly (every
//! byte of the whole poisoned cache compared, so a slot no token names stays as it was), and
//! the skipped-slot counts agree. Token counts that do not fill a block, one token, no token,
//! tens of thousands of tokens; awkward keys (zeros, NaN, huge, tiny, power-of-two boundaries,
//! under the floor), padding and slots past the cache; a recorded store replays to the same
//! bytes, and a store and a gather of the stored cache recorded into one graph replay to the
//! CPU's bytes. The gather of the stored cache gives the CPU's keys, scales and count exactly.
//! Compiled only with `--features gpu-tests`; run on the H200 (`scripts/gpu-bundle.sh`).
#![cfg(feature = "gpu-tests")]

mod common;

use common::index_cache::{IndexStoreScenario, PAGE, assert_same_cache};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dtype::F8E4M3;
use shapeproof::layout::DeepSeekV32IndexCache;
use shapeproof::ops::index_cache::{IndexKeyGather, IndexKeyRows, IndexKeyStore};
use shapeproof::tensor::Tensor;

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

fn case(pages: usize, tokens: usize) {
    let what = format!("pages {pages} tokens {tokens}");
    let mut rng = common::rng(&what);
    let s = IndexStoreScenario::new(&mut rng, pages, tokens);
    let (got, got_skipped) = s.run(&gpu());
    let (want, want_skipped) = s.run(&Cpu);
    assert_same_cache(&what, &got, &want);
    assert_eq!(got_skipped, s.bad_loc(), "{what}");
    assert_eq!(want_skipped, s.bad_loc(), "{what}");
    // The gather of the stored cache: the same bytes, scales and count on both.
    let gathered = s.gather(&gpu(), &want);
    assert_eq!(gathered, s.gather(&Cpu, &want), "{what}: gather");
    assert_eq!(gathered.skipped, s.bad_index(), "{what}: gather count");
}

#[test]
fn the_store_matches_the_cpu_byte_for_byte() {
    case(4, 203);
    case(1, 1);
    case(2, 9);
    case(3, 0);
}

#[test]
fn a_large_cache() {
    case(1024, 50000);
}

/// A scenario's poisoned cache and the rows to store into it, on the GPU.
fn cache_and_rows(
    g: &Cuda,
    s: &IndexStoreScenario,
) -> (DeepSeekV32IndexCache<Cuda>, IndexKeyRows<Cuda>) {
    let cache =
        DeepSeekV32IndexCache::<Cuda>::from_buffer(g.upload(&s.poison).unwrap(), s.pages).unwrap();
    let rows = IndexKeyRows::new(
        Tensor::from_host(g, "k", &s.k, s.tokens()).unwrap(),
        Tensor::from_host(g, "loc", &s.loc, s.tokens()).unwrap(),
    )
    .unwrap();
    (cache, rows)
}

#[test]
fn a_recorded_store_replays_to_the_same_bytes() {
    let g = gpu();
    let mut rng = common::rng("a_recorded_store_replays_to_the_same_bytes");
    let s = IndexStoreScenario::new(&mut rng, 4, 150);
    let (want, _) = s.run(&Cpu);
    let (mut cache, rows) = cache_and_rows(&g, &s);
    let store = IndexKeyStore::<PAGE>::new();
    let mut recorder = g.record_graph().unwrap();
    store
        .record(&mut recorder, &rows, &mut cache, None)
        .unwrap();
    let graph = recorder.finish().unwrap();
    graph.replay().unwrap();
    graph.replay().unwrap();
    drop(graph);
    assert_same_cache("recorded store", &cache.bytes().to_host(&g).unwrap(), &want);
}

#[test]
fn a_store_and_its_gather_in_one_graph_replay_to_the_reference() {
    let g = gpu();
    let mut rng = common::rng("a_store_and_its_gather_in_one_graph");
    let s = IndexStoreScenario::new(&mut rng, 3, 150);
    let (want, _) = s.run(&Cpu);
    let want_gather = s.gather(&Cpu, &want);
    let (mut cache, rows) = cache_and_rows(&g, &s);
    let n = s.index.len();
    let index = Tensor::from_host(&g, "index", &s.index, n).unwrap();
    let mut k = Tensor::from_host(&g, "k", &vec![F8E4M3::from_bits(0x5A); n * 128], n).unwrap();
    let mut k_scale = Tensor::from_host(&g, "k_scale", &vec![f32::NAN; n], n).unwrap();
    let mut recorder = g.record_graph().unwrap();
    // The store hands the cache back read-only for the graph's life: the gather reads it
    // in the same graph.
    let stored = IndexKeyStore::<PAGE>::new()
        .record(&mut recorder, &rows, &mut cache, None)
        .unwrap();
    IndexKeyGather::<PAGE>::new()
        .record(&mut recorder, stored, &index, &mut k, &mut k_scale, None)
        .unwrap();
    let graph = recorder.finish().unwrap();
    // One replay: the gather must see this replay's store (a second one would hide a missing
    // order, reading the first's). Dropping the graph waits for it.
    graph.replay().unwrap();
    drop(graph);
    assert_same_cache(
        "store + gather graph",
        &cache.bytes().to_host(&g).unwrap(),
        &want,
    );
    let k: Vec<u8> = k.to_host(&g).unwrap().iter().map(|b| b.to_bits()).collect();
    assert_eq!(k, want_gather.k, "gathered keys");
    let k_scale: Vec<u32> = k_scale
        .to_host(&g)
        .unwrap()
        .iter()
        .map(|s| s.to_bits())
        .collect();
    assert_eq!(k_scale, want_gather.k_scale, "gathered scales");
}
