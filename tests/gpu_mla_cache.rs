//! The FP8 sparse MLA cache store and gather on the GPU: the cache and the workspace are the
//! CPU reference's bytes exactly (every byte of the whole poisoned cache compared, so a slot
//! no token names must stay as it was), and the skipped-slot counts agree. Token counts that do
//! not fill a block, one token, no token, tens of thousands of tokens over a large cache,
//! awkward groups (zeros, NaN, huge, tiny, power-of-two boundaries), padding and slots past the
//! cache in both ops; a store and a gather recorded into graphs, one each and both in one,
//! replay to the same bytes.
//! Compiled only with `--features gpu-tests`; run on the H200 (`scripts/gpu-bundle.sh`).
#![cfg(feature = "gpu-tests")]

mod common;

use common::mla_cache::{CacheScenario, assert_same};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dtype::F8E4M3;
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM, MlaLatentKv};
use shapeproof::ops::mla_cache::{MlaCacheGather, MlaCacheStore, MlaKvRows};
use shapeproof::tensor::Tensor;

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

fn case(pages: usize, tokens: usize, gathered: usize) {
    let what = format!("pages {pages} tokens {tokens} gathered {gathered}");
    let mut rng = common::rng(&what);
    let s = CacheScenario::new(&mut rng, pages, tokens, gathered);
    let got = s.run(&gpu());
    let want = s.run(&Cpu);
    assert_same(&what, &got, &want);
    assert_eq!(got.store_skipped, s.bad_loc(), "{what}");
    assert_eq!(got.gather_skipped, s.bad_index(), "{what}");
}

#[test]
fn store_and_gather_match_the_cpu_byte_for_byte() {
    case(4, 203, 301);
    case(1, 1, 1);
    case(2, 8, 9);
}

#[test]
fn no_token_and_no_row() {
    // Nothing to store leaves the poisoned cache as it was; an empty gather still sets the
    // workspace's scale.
    case(3, 0, 0);
}

#[test]
fn a_large_cache() {
    // 40k tokens into 1024 pages (65536 slots), 70k rows gathered: long calls, four rows a
    // warp (the other cases take one).
    case(1024, 40000, 70000);
}

/// A scenario's inputs on the GPU: the poisoned cache, the rows to store, the slots to
/// gather and a poisoned workspace for them.
struct OnGpu {
    cache: DeepSeekV32KvCache<Cuda>,
    rows: MlaKvRows<Cuda>,
    index: Tensor<Cuda, i32>,
    workspace: MlaLatentKv<Cuda, MLA_CACHE_DIM>,
}

fn on_gpu(g: &Cuda, s: &CacheScenario) -> OnGpu {
    let n = s.index.len();
    let poison = vec![F8E4M3::from_bits(0x5A); n * MLA_CACHE_DIM];
    OnGpu {
        cache: DeepSeekV32KvCache::<Cuda>::from_buffer(g.upload(&s.poison).unwrap(), s.pages)
            .unwrap(),
        rows: MlaKvRows::new(
            Tensor::from_host(g, "kv", &s.kv, s.tokens()).unwrap(),
            Tensor::from_host(g, "loc", &s.loc, s.tokens()).unwrap(),
        )
        .unwrap(),
        index: Tensor::from_host(g, "index", &s.index, n).unwrap(),
        workspace: MlaLatentKv::new(g, g.upload(&poison).unwrap(), n, 7.0).unwrap(),
    }
}

/// The gathered workspace's bytes.
fn workspace_bytes(g: &Cuda, workspace: &MlaLatentKv<Cuda, MLA_CACHE_DIM>) -> Vec<u8> {
    workspace
        .data()
        .to_host(g)
        .unwrap()
        .iter()
        .map(|b| b.to_bits())
        .collect()
}

#[test]
fn recorded_store_and_gather_replay_to_the_same_bytes() {
    let g = gpu();
    let mut rng = common::rng("recorded_store_and_gather_replay_to_the_same_bytes");
    let s = CacheScenario::new(&mut rng, 4, 150, 200);
    let want = s.run(&Cpu);
    let OnGpu {
        mut cache,
        rows,
        index,
        mut workspace,
    } = on_gpu(&g, &s);
    let mut recorder = g.record_graph().unwrap();
    MlaCacheStore::<64, 128>::new()
        .record(&mut recorder, &rows, &mut cache, None)
        .unwrap();
    let graph = recorder.finish().unwrap();
    // The graph borrows the cache mutably until dropped: no read can race its replays.
    graph.replay().unwrap();
    graph.replay().unwrap();
    drop(graph);
    let mut recorder = g.record_graph().unwrap();
    MlaCacheGather::<64, 128>::new()
        .record(&mut recorder, &cache, &index, &mut workspace, None)
        .unwrap();
    let graph = recorder.finish().unwrap();
    graph.replay().unwrap();
    drop(graph);
    assert_eq!(cache.bytes().to_host(&g).unwrap(), want.cache);
    assert_eq!(workspace_bytes(&g, &workspace), want.workspace);
    assert_eq!(workspace.scale().to_host(&g).unwrap(), vec![1.0]);
}

#[test]
fn a_store_and_its_gather_in_one_graph_replay_to_the_reference() {
    let g = gpu();
    let mut rng = common::rng("a_store_and_its_gather_in_one_graph");
    let s = CacheScenario::new(&mut rng, 4, 150, 200);
    let want = s.run(&Cpu);
    let OnGpu {
        mut cache,
        rows,
        index,
        mut workspace,
    } = on_gpu(&g, &s);
    let mut recorder = g.record_graph().unwrap();
    // The store hands the cache back read-only for the graph's life: the gather (as a decode
    // step's attention would) reads it in the same graph.
    let stored = MlaCacheStore::<64, 128>::new()
        .record(&mut recorder, &rows, &mut cache, None)
        .unwrap();
    MlaCacheGather::<64, 128>::new()
        .record(&mut recorder, stored, &index, &mut workspace, None)
        .unwrap();
    let graph = recorder.finish().unwrap();
    // One replay: the gather must see this replay's store (a second one would hide a missing
    // order, reading the first's). Dropping the graph waits for it.
    graph.replay().unwrap();
    drop(graph);
    assert_eq!(cache.bytes().to_host(&g).unwrap(), want.cache);
    assert_eq!(workspace_bytes(&g, &workspace), want.workspace);
    assert_eq!(workspace.scale().to_host(&g).unwrap(), vec![1.0]);
}
