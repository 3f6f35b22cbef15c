//! The top-k on the GPU: every row equals the CPU reference's and the semantics stated as a
//! full sort, over poisoned outputs, at the widths DeepSeek Sparse Attention selects from
//! (65536 and 131072 columns at top-2048) and small ones; scores of every kind (distinct,
//! peaked, eight values so that thousands tie at the cut, NaN / ±inf / ±0) and ranges of every
//! kind (whole, partial, shorter than TOPK, empty, clamped), rows too wide for the kernel's
//! shared-memory cache; a recorded call replays to the same rows, also a backend's first call. Compiled only with `--features gpu-tests`; run on the H200
//! (`scripts/gpu-bundle.sh`).
#![cfg(feature = "gpu-tests")]

mod common;

use common::topk::{Scores, TopkScenario};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dim::Dim;
use shapeproof::ops::topk::{MAX_CLUSTERS, TopK, TopkScores};
use shapeproof::prelude::Cols;
use shapeproof::rules::IndexerTopk;
use shapeproof::tensor::Tensor;

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

const KINDS: [Scores; 4] = [Scores::Noise, Scores::Peaked, Scores::Ties, Scores::Awkward];

/// Runs `s` on the GPU and checks every row against the semantics (a full sort) and against
/// the CPU reference's rows.
fn check_on_gpu<const TOPK: usize>(g: &Cuda, what: &str, s: &TopkScenario)
where
    Dim<TOPK>: IndexerTopk,
{
    let got = s.run::<Cuda, TOPK>(g);
    s.check(what, &got, TOPK);
    assert_eq!(got, s.run::<Cpu, TOPK>(&Cpu), "{what}: GPU against CPU");
}

#[test]
fn top_2048_of_long_rows() {
    let g = gpu();
    for scores in KINDS {
        let what = format!("{scores:?} 65536");
        let mut rng = common::rng(&what);
        let s = TopkScenario::new(&mut rng, 12, 65536, 2048, scores);
        check_on_gpu::<2048>(&g, &what, &s);
    }
    let mut rng = common::rng("131072");
    let s = TopkScenario::new(&mut rng, 6, 131072, 2048, Scores::Noise);
    s.check("Noise 131072", &s.run::<Cuda, 2048>(&g), 2048);
}

/// Rows wider than eight CTAs' shared memory holds (8 × 32768 columns): the kernel reads the
/// slices from global memory again every pass instead of caching them.
#[test]
fn rows_too_wide_to_cache() {
    let g = gpu();
    for scores in [Scores::Noise, Scores::Ties, Scores::Awkward] {
        let what = format!("{scores:?} 300000");
        let mut rng = common::rng(&what);
        let s = TopkScenario::new(&mut rng, 6, 300_000, 2048, scores);
        check_on_gpu::<2048>(&g, &what, &s);
    }
}

/// Batches of 1 to 100 rows: on a GPU of 132 SMs they take clusters of 16 (while the device
/// holds every row's cluster at once), 8, 4, 2 and 1 CTAs a row (the launch halves the
/// cluster until the batch fits one wave).
#[test]
fn every_cluster_size() {
    let g = gpu();
    for rows in [1, 5, 12, 20, 40, 100] {
        for scores in [Scores::Noise, Scores::Ties] {
            let what = format!("{scores:?} {rows} rows");
            let mut rng = common::rng(&what);
            let s = TopkScenario::new(&mut rng, rows, 40_000, 2048, scores);
            check_on_gpu::<2048>(&g, &what, &s);
        }
    }
}

/// More rows than one launch makes clusters: a cluster selects several rows in turn.
#[test]
fn more_rows_than_clusters() {
    let g = gpu();
    let mut rng = common::rng("more_rows_than_clusters");
    let s = TopkScenario::new(&mut rng, MAX_CLUSTERS + 77, 300, 128, Scores::Noise);
    check_on_gpu::<128>(&g, "more rows than clusters", &s);
}

#[test]
fn narrow_top_k_and_short_rows() {
    let g = gpu();
    for scores in KINDS {
        let what = format!("{scores:?} narrow");
        let mut rng = common::rng(&what);
        let s = TopkScenario::new(&mut rng, 30, 5000, 128, scores);
        s.check(&format!("{what} top-128"), &s.run::<Cuda, 128>(&g), 128);
        let s = TopkScenario::new(&mut rng, 7, 20000, 512, scores);
        s.check(&format!("{what} top-512"), &s.run::<Cuda, 512>(&g), 512);
        // Rows barely wider than TOPK: a single last-pass tile, ties at the edge.
        let s = TopkScenario::new(&mut rng, 13, 600, 512, scores);
        s.check(&format!("{what} width 600"), &s.run::<Cuda, 512>(&g), 512);
    }
}

#[test]
fn a_recorded_call_replays_to_the_direct_calls_rows() {
    let g = gpu();
    let mut rng = common::rng("a_recorded_call_replays_to_the_direct_calls_rows");
    let s = TopkScenario::new(&mut rng, 8, 65536, 2048, Scores::Peaked);
    let want = s.run::<Cuda, 2048>(&g);
    let rows = s.rows();
    let scores = TopkScores::new(
        Tensor::from_host(&g, "scores", &s.scores, rows * s.width).unwrap(),
        s.width,
        Tensor::from_host(&g, "starts", &s.starts, rows).unwrap(),
        Tensor::from_host(&g, "ends", &s.ends, rows).unwrap(),
    )
    .unwrap();
    let poison = vec![i32::MIN; rows * 2048];
    let mut out = Tensor::<Cuda, i32, Cols<2048>>::from_host(&g, "out", &poison, rows).unwrap();
    let topk = TopK::<2048>::new();
    let mut recorder = g.record_graph().unwrap();
    topk.record(&mut recorder, &scores, &mut out).unwrap();
    let graph = recorder.finish().unwrap();
    graph.replay().unwrap();
    graph.replay().unwrap();
    drop(graph);
    g.synchronize().unwrap();
    assert_eq!(out.to_host(&g).unwrap(), want);
}

/// A backend's first top-k call made inside a graph recording, at one row: the launch loads the
/// 16-CTA kernel and asks the device how many such clusters it holds while the stream captures
/// (relaxed capture allows both); the replay gives the semantics' rows.
#[test]
fn a_first_call_recorded_at_one_row_replays_to_the_semantics() {
    let g = gpu(); // a fresh backend: no kernel of it loaded yet
    let mut rng = common::rng("a_first_call_recorded_at_one_row_replays_to_the_semantics");
    let s = TopkScenario::new(&mut rng, 1, 65536, 2048, Scores::Noise);
    let scores = TopkScores::new(
        Tensor::from_host(&g, "scores", &s.scores, s.width).unwrap(),
        s.width,
        Tensor::from_host(&g, "starts", &s.starts, 1).unwrap(),
        Tensor::from_host(&g, "ends", &s.ends, 1).unwrap(),
    )
    .unwrap();
    let poison = vec![i32::MIN; 2048];
    let mut out = Tensor::<Cuda, i32, Cols<2048>>::from_host(&g, "out", &poison, 1).unwrap();
    let topk = TopK::<2048>::new();
    let mut recorder = g.record_graph().unwrap();
    topk.record(&mut recorder, &scores, &mut out).unwrap();
    let graph = recorder.finish().unwrap();
    graph.replay().unwrap();
    drop(graph);
    g.synchronize().unwrap();
    s.check("first call recorded", &out.to_host(&g).unwrap(), 2048);
}
