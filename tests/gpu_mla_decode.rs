//! The sparse MLA decode on the GPU against the CPU reference (f64 on the dequantized cache):
//! every head count (8, 16, 32, 64, 128), top-k 128 and 2048, one row (the top-k split over
//! CTAs and combined) up to hundreds of rows (not split), flat and peaked scores, padding,
//! slots past the cache, repeated slots, per-row lengths with empty rows; outputs poisoned
//! (NaN) before the run and every element checked. Tolerances: `lse` within 1e-3 + 1e-4·|lse|
//! (f32 sums of exact products against f64), `out` within 1e-2 + 1e-2·|out| (P rounded to bf16,
//! 2^-9 a weight, and the output to bf16); an empty row is exactly `out = 0`, `lse = +inf`.
//! A step recorded into a CUDA graph (split, so the workspace carries the partials) replays to
//! the bytes of the same step run directly. The step through the prefill (`DecodeThroughPrefill`)
//! against the same route on the CPU, with the prefill's tolerances and, for `lse`, a term in
//! the magnitude of the scores' terms (`THROUGH_PREFILL_ACCUMULATION`). An `out` view off a 16-byte
//! boundary is an `Err` naming it, and changes nothing.
//! Compiled only with `--features gpu-tests`; run on the H200 (`scripts/gpu-bundle.sh`).
#![cfg(feature = "gpu-tests")]

mod common;

use cudarc::driver::CudaSlice;
use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dim::Dim;
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::mla_cache::{MlaCacheStore, MlaKvRows};
use shapeproof::ops::sparse_mla::OutRow;
use shapeproof::ops::sparse_mla_decode::{
    DecodeQueries, DecodeThroughPrefill, DecodeWorkspace, PrefillDecodeWorkspace, RunDecode,
    SparseMlaDecode,
};
use shapeproof::rules::{DecodeHeads, HeadTile, PadsTo, TopkWidth};
use shapeproof::tensor::{Cols, Tensor, TensorViewMut};

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

/// One decode step's inputs on the host.
struct Step {
    pages: usize,
    cache_rows: Vec<bf16>, // [pages · 64, 576]
    q: Vec<bf16>,          // [rows, H, 576]
    indices: Vec<i32>,     // [rows, TOPK]
    lengths: Vec<i32>,     // [rows]
}

/// A cache of `pages` pages on `b` holding `rows` (`[pages · 64, 576]` bf16) in slot order,
/// through the store.
fn stored_cache<B: shapeproof::ops::mla_cache::RunMlaCache>(
    b: &B,
    rows: &[bf16],
    pages: usize,
) -> DeepSeekV32KvCache<B> {
    let slots = pages * 64;
    let mut cache = DeepSeekV32KvCache::<B>::zeros(b, pages).unwrap();
    let loc: Vec<i64> = (0..slots as i64).collect();
    let rows_in = MlaKvRows::new(
        Tensor::from_host(b, "kv", rows, slots).unwrap(),
        Tensor::from_host(b, "loc", &loc, slots).unwrap(),
    )
    .unwrap();
    MlaCacheStore::<64, 128>::new()
        .run(b, &rows_in, &mut cache, None)
        .unwrap();
    cache
}

/// Step `s` on `b`: its rows stored into a cache of its pages, and its queries.
fn cache_and_queries<
    B: shapeproof::ops::mla_cache::RunMlaCache,
    const H: usize,
    const TOPK: usize,
>(
    b: &B,
    s: &Step,
) -> (DeepSeekV32KvCache<B>, DecodeQueries<B, H, TOPK>)
where
    Dim<H>: DecodeHeads,
    Dim<TOPK>: TopkWidth,
{
    let cache = stored_cache(b, &s.cache_rows, s.pages);
    let rows = s.lengths.len();
    let queries = DecodeQueries::new(
        Tensor::from_host(b, "q", &s.q, rows).unwrap(),
        Tensor::from_host(b, "indices", &s.indices, rows).unwrap(),
        1.0 / (MLA_CACHE_DIM as f32).sqrt(),
    )
    .unwrap()
    .with_lengths(Tensor::from_host(b, "lengths", &s.lengths, rows).unwrap())
    .unwrap();
    (cache, queries)
}

/// Output tensors of `rows` rows, poisoned (NaN) before a run.
fn poisoned<B: RunDecode, const H: usize>(
    b: &B,
    rows: usize,
) -> (Tensor<B, bf16, OutRow<H>>, Tensor<B, f32, Cols<H>>) {
    (
        Tensor::filled(b, rows, bf16::NAN).unwrap(),
        Tensor::filled(b, rows, f32::NAN).unwrap(),
    )
}

/// `out` (as f32) and `lse` on the host.
fn on_host<B: RunDecode, const H: usize>(
    b: &B,
    out: &Tensor<B, bf16, OutRow<H>>,
    lse: &Tensor<B, f32, Cols<H>>,
) -> (Vec<f32>, Vec<f32>) {
    let out = out.to_host(b).unwrap().iter().map(|v| v.to_f32()).collect();
    (out, lse.to_host(b).unwrap())
}

/// Every `lse` against the reference's: +inf exactly where the reference's row is empty, else
/// within `abs + rel · |want|`. Returns the largest difference.
fn check_lse(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) -> f32 {
    check_lse_within(what, got, want, |_, w| abs + rel * w.abs())
}

/// Every `lse` against the reference's: +inf exactly where the reference's row is empty, else
/// within `allowed(i, want)` of entry `i`. Returns the largest difference.
fn check_lse_within(
    what: &str,
    got: &[f32],
    want: &[f32],
    allowed: impl Fn(usize, f32) -> f32,
) -> f32 {
    let mut worst = 0.0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if *w == f32::INFINITY {
            assert_eq!(*g, f32::INFINITY, "{what}: lse {i} of an empty row");
            continue;
        }
        let d = (g - w).abs();
        worst = worst.max(d);
        let a = allowed(i, *w);
        assert!(d <= a, "{what}: lse {i}: {g} vs {w} (allowed {a})");
    }
    worst
}

/// A replayed graph's `out` and `lse` against the direct step's, bit for bit.
fn assert_replayed_bytes<const H: usize>(
    g: &Cuda,
    out: &Tensor<Cuda, bf16, OutRow<H>>,
    lse: &Tensor<Cuda, f32, Cols<H>>,
    want_out: &[bf16],
    want_lse: &[f32],
) {
    let got_out = out.to_host(g).unwrap();
    assert!(
        got_out
            .iter()
            .zip(want_out)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "replayed out differs from the direct step"
    );
    assert_eq!(lse.to_host(g).unwrap(), want_lse, "replayed lse");
}

fn run<B: RunDecode + shapeproof::ops::mla_cache::RunMlaCache, const H: usize, const TOPK: usize>(
    b: &B,
    s: &Step,
) -> (Vec<f32>, Vec<f32>)
where
    Dim<H>: DecodeHeads,
    Dim<TOPK>: TopkWidth,
{
    let (cache, queries) = cache_and_queries::<B, H, TOPK>(b, s);
    let (mut out, mut lse) = poisoned::<B, H>(b, s.lengths.len());
    let mut ws = DecodeWorkspace::new(b, s.lengths.len()).unwrap();
    SparseMlaDecode::<H, TOPK>::new()
        .run(b, &queries, &cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    on_host(b, &out, &lse)
}

fn case<const H: usize, const TOPK: usize>(rows: usize, pages: usize, peaked: bool)
where
    Dim<H>: DecodeHeads,
    Dim<TOPK>: TopkWidth,
{
    let what = format!("H {H} TOPK {TOPK} rows {rows} pages {pages} peaked {peaked}");
    let mut rng = common::rng(&what);
    let slots = pages * 64;
    let cache_rows = common::bf16_normal(&mut rng, slots * MLA_CACHE_DIM, 0.0, 1.0);
    let q_std = if peaked { 4.0 } else { 1.0 };
    let q = common::bf16_normal(&mut rng, rows * H * MLA_CACHE_DIM, 0.0, q_std);
    let indices: Vec<i32> = (0..rows * TOPK)
        .map(|i| match rng.random_range(0..20) {
            0 => -1,
            1 => slots as i32 + rng.random_range(0..50),
            2 if i > 0 => (i as i32 - 1) % slots as i32, // repeats appear across rows
            _ => rng.random_range(0..slots as i32),
        })
        .collect();
    let lengths: Vec<i32> = (0..rows)
        .map(|r| match r % 7 {
            3 => 0,
            5 => rng.random_range(1..TOPK as i32),
            6 => TOPK as i32 + 9, // clamped
            _ => TOPK as i32,
        })
        .collect();
    let s = Step {
        pages,
        cache_rows,
        q,
        indices,
        lengths,
    };
    let (out, lse) = run::<_, H, TOPK>(&gpu(), &s);
    let (want_out, want_lse) = run::<_, H, TOPK>(&Cpu, &s);
    let mut worst = (check_lse(&what, &lse, &want_lse, 1e-3, 1e-4), 0.0f32);
    for (i, (g, w)) in out.iter().zip(&want_out).enumerate() {
        let d = (g - w).abs();
        worst.1 = worst.1.max(d);
        assert!(
            d <= 1e-2 + 1e-2 * w.abs(),
            "{what}: out {i} (row {}): {g} vs {w}",
            i / (H * 512)
        );
    }
    eprintln!(
        "{what}: max |Δlse| {:.2e}, max |Δout| {:.2e}",
        worst.0, worst.1
    );
}

#[test]
fn one_row_split_and_combined() {
    case::<16, 2048>(1, 64, false);
    case::<8, 2048>(1, 64, true);
    case::<128, 2048>(1, 64, false);
}

/// A top-k wider than 2048 at one row: more 64-position blocks than the combine's 32 splits,
/// so a split takes several blocks (every block must still reach the output).
#[test]
fn one_row_of_a_top_k_wider_than_2048() {
    case::<16, 4096>(1, 80, false);
    case::<8, 8192>(1, 160, true);
}

#[test]
fn every_head_count() {
    case::<8, 2048>(40, 64, false);
    case::<16, 2048>(21, 64, true);
    case::<32, 2048>(9, 64, false);
    case::<64, 2048>(7, 64, true);
    case::<128, 2048>(5, 64, false);
}

#[test]
fn batches_that_fill_the_gpu() {
    // rows × head groups ≥ 264 CTAs: not split.
    case::<8, 2048>(300, 128, false);
    case::<128, 256>(40, 16, true);
}

#[test]
fn short_top_k() {
    case::<16, 128>(13, 4, false);
    case::<64, 128>(3, 2, true);
}

/// Inputs of the byte-level tests on `g`: a cache of `pages` pages of normal rows, and `rows`
/// query rows of normal q whose indices are drawn uniformly from `lowest..slots` (-1 = no
/// slot), softmax scale 0.0417.
fn uniform_step<const H: usize, const TOPK: usize>(
    g: &Cuda,
    rng: &mut StdRng,
    pages: usize,
    rows: usize,
    lowest: i32,
) -> (DeepSeekV32KvCache<Cuda>, DecodeQueries<Cuda, H, TOPK>)
where
    Dim<H>: DecodeHeads,
    Dim<TOPK>: TopkWidth,
{
    let slots = pages * 64;
    let kv = common::bf16_normal(rng, slots * MLA_CACHE_DIM, 0.0, 1.0);
    let cache = stored_cache(g, &kv, pages);
    let q = common::bf16_normal(rng, rows * H * MLA_CACHE_DIM, 0.0, 1.0);
    let indices: Vec<i32> = (0..rows * TOPK)
        .map(|_| rng.random_range(lowest..slots as i32))
        .collect();
    let queries = DecodeQueries::new(
        Tensor::from_host(g, "q", &q, rows).unwrap(),
        Tensor::from_host(g, "indices", &indices, rows).unwrap(),
        0.0417,
    )
    .unwrap();
    (cache, queries)
}

/// The bytes of one step of `decode` run directly into poisoned outputs, the reference of the
/// byte-level tests; the step must split its top-k (`why` says why it does), so the workspace
/// carries partials and the combine runs.
fn direct_split_step<const H: usize, const TOPK: usize>(
    g: &Cuda,
    decode: &SparseMlaDecode<H, TOPK>,
    queries: &DecodeQueries<Cuda, H, TOPK>,
    cache: &DeepSeekV32KvCache<Cuda>,
    rows: usize,
    why: &str,
) -> (Vec<bf16>, Vec<f32>)
where
    Dim<H>: DecodeHeads,
    Dim<TOPK>: TopkWidth,
{
    let mut ws = DecodeWorkspace::new(g, rows).unwrap();
    assert!(ws.splits() > 1, "{why}");
    let (mut out, mut lse) = poisoned::<Cuda, H>(g, rows);
    decode
        .run(g, queries, cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    (out.to_host(g).unwrap(), lse.to_host(g).unwrap())
}

#[test]
fn a_recorded_step_replays_to_the_direct_steps_bytes() {
    const H: usize = 16;
    const TOPK: usize = 2048;
    let g = gpu();
    let mut rng = common::rng("a_recorded_step_replays_to_the_direct_steps_bytes");
    let (pages, rows) = (64, 2);
    let (cache, queries) = uniform_step::<H, TOPK>(&g, &mut rng, pages, rows, 0);
    let decode = SparseMlaDecode::<H, TOPK>::new();
    let (want_out, want_lse) = direct_split_step(
        &g,
        &decode,
        &queries,
        &cache,
        rows,
        "two rows split their top-k",
    );
    let (mut out, mut lse) = poisoned::<Cuda, H>(&g, rows);
    let mut ws = DecodeWorkspace::new(&g, rows).unwrap();
    let mut recorder = g.record_graph().unwrap();
    decode
        .record(&mut recorder, &queries, &cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    let graph = recorder.finish().unwrap();
    graph.replay().unwrap();
    graph.replay().unwrap();
    drop(graph);
    assert_replayed_bytes(&g, &out, &lse, &want_out, &want_lse);
}

/// `out` lent at an offset that is not a multiple of 16 bytes is an `Err` naming it before
/// anything is queued (the combine writes `out` in 8-byte vectors: a misaligned store would
/// poison the CUDA context), and neither output changes; at a 16-byte offset the step writes the
/// owned run's bytes there and nothing before or after them.
#[test]
fn an_out_view_off_a_16_byte_boundary_is_an_error() {
    const H: usize = 16;
    const TOPK: usize = 2048;
    let g = gpu();
    let mut rng = common::rng("an_out_view_off_a_16_byte_boundary_is_an_error");
    let (pages, rows) = (16, 1);
    let (cache, queries) = uniform_step::<H, TOPK>(&g, &mut rng, pages, rows, 0);
    let decode = SparseMlaDecode::<H, TOPK>::new();
    let (want_out, want_lse) = direct_split_step(
        &g,
        &decode,
        &queries,
        &cache,
        rows,
        "one row is split and combined",
    );
    let mut ws = DecodeWorkspace::new(&g, rows).unwrap();

    let n = rows * H * 512; // out's values: [rows, H, 512]
    let pad = 16; // values of room around the view
    let mut out_buf = g.upload(&vec![bf16::NAN; n + 2 * pad]).unwrap();
    let mut lse_buf = g.upload(&vec![f32::NAN; rows * H]).unwrap();
    // The step with `out` lent at value offset `at` of `out_buf`.
    let mut step = |out_buf: &mut CudaSlice<bf16>, lse_buf: &mut CudaSlice<f32>, at: usize| {
        let mut out = TensorViewMut::<Cuda, bf16, OutRow<H>>::from_slice_mut(
            "out",
            Cuda::slice_range_mut(out_buf, at..at + n).unwrap(),
            rows,
        )
        .unwrap();
        let mut lse = TensorViewMut::<Cuda, f32, Cols<H>>::from_slice_mut(
            "lse",
            Cuda::slice_range_mut(lse_buf, 0..rows * H).unwrap(),
            rows,
        )
        .unwrap();
        decode.run(&g, &queries, &cache, &mut ws, &mut out, &mut lse)
    };
    for at in [1, 2, 4] {
        // 2, 4 and 8 bytes past a 16-byte boundary
        common::boundary::names(step(&mut out_buf, &mut lse_buf, at), "out");
    }
    g.synchronize().unwrap();
    assert!(
        g.download(&out_buf).unwrap().iter().all(|v| v.is_nan()),
        "a refused step wrote out"
    );
    assert!(
        g.download(&lse_buf).unwrap().iter().all(|v| v.is_nan()),
        "a refused step wrote lse"
    );

    step(&mut out_buf, &mut lse_buf, 8).expect("a 16-byte offset is accepted");
    let got = g.download(&out_buf).unwrap();
    assert!(
        got[..8].iter().chain(&got[8 + n..]).all(|v| v.is_nan()),
        "out changed outside its view"
    );
    assert!(
        got[8..8 + n]
            .iter()
            .zip(&want_out)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "out through a view differs from the owned run"
    );
    assert_eq!(
        g.download(&lse_buf).unwrap(),
        want_lse,
        "lse through a view"
    );
}

/// The step through the prefill (`DecodeThroughPrefill`) on `b`: the same inputs as `run`.
fn run_through_prefill<B, const H: usize, const TOPK: usize>(
    b: &B,
    s: &Step,
) -> (Vec<f32>, Vec<f32>)
where
    B: RunDecode
        + shapeproof::ops::mla_cache::RunMlaCache
        + shapeproof::ops::sparse_mla::RunSparseMla,
    Dim<H>: DecodeHeads + HeadTile + PadsTo<H>,
    Dim<TOPK>: TopkWidth,
{
    let (cache, queries) = cache_and_queries::<B, H, TOPK>(b, s);
    let (mut out, mut lse) = poisoned::<B, H>(b, s.lengths.len());
    let mut ws = PrefillDecodeWorkspace::new(b, s.lengths.len()).unwrap();
    DecodeThroughPrefill::<H, TOPK>::new()
        .run(b, &queries, &cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    on_host(b, &out, &lse)
}

/// A step's slots and lengths for the routes through the prefill: slots -1, past the cache
/// (`slots` and up) and repeated (slot 7) among random ones; row `r`'s length full, empty,
/// short, full, negative (empty) or past `topk` (clamped) by `r % 6`.
fn prefill_step_indices(
    rng: &mut impl Rng,
    rows: usize,
    topk: usize,
    slots: usize,
) -> (Vec<i32>, Vec<i32>) {
    let indices = (0..rows * topk)
        .map(|_| match rng.random_range(0..20) {
            0 => -1,
            1 => slots as i32 + rng.random_range(0..50),
            2 => 7,
            _ => rng.random_range(0..slots as i32),
        })
        .collect();
    let lengths = (0..rows)
        .map(|r| match r % 6 {
            1 => 0,
            2 => rng.random_range(1..topk as i32),
            4 => -5,
            5 => topk as i32 + 17,
            _ => topk as i32,
        })
        .collect();
    (indices, lengths)
}

/// The share of the scores' magnitude (`score_magnitudes`) that the step through the prefill's
/// `lse` may differ by, beyond the prefill's 2e-3 + 2e-3·|lse|. The FP8 tensor cores add
/// products in less than f32's precision (the prefill promotes its partial sums to f32 every
/// 96 channels), so a score's error follows the magnitude of its terms, not of the score: a row
/// whose large terms cancel (this test's q has entries of ±1000, cast to ±448) can end with a
/// small `lse` and an error far above 2e-3·|lse|: an H100 run (16 heads, a short row, seed
/// 1796645489890192497) found |Δlse| 2.3e-2 at an `lse` of −7.66, 2.7e-4 of that row's
/// magnitude 83.9. Over 15 more runs (45 cases, fresh seeds) the largest |Δlse| / magnitude of
/// a case was 3.7e-4 … 8.2e-4 (counting errors the other terms already allow); 2^-9 keeps a
/// margin of 2.4 over the largest.
const THROUGH_PREFILL_ACCUMULATION: f32 = 1.0 / 512.0;

/// Per `lse` entry (row, head): the softmax scale times the largest, over the row's valid keys,
/// of `Σ_i |q_i · k_i|` over the 576 channels, from the unquantized values with q clamped at
/// e4m3's ±448 (the route's cast saturates there). What the score errors of a reduced-precision
/// accumulation scale with. Empty rows get 0.
fn score_magnitudes<const H: usize>(s: &Step, topk: usize) -> Vec<f32> {
    let scale = 1.0 / (MLA_CACHE_DIM as f32).sqrt();
    let slots = s.pages * 64;
    let k_abs: Vec<f32> = s.cache_rows.iter().map(|v| v.to_f32().abs()).collect();
    let rows = s.lengths.len();
    let mut out = vec![0.0f32; rows * H];
    for r in 0..rows {
        let len = s.lengths[r].clamp(0, topk as i32) as usize;
        let keys: Vec<usize> = s.indices[r * topk..r * topk + len]
            .iter()
            .filter(|&&i| i >= 0 && (i as usize) < slots)
            .map(|&i| i as usize)
            .collect();
        for h in 0..H {
            let q: Vec<f32> = s.q[(r * H + h) * MLA_CACHE_DIM..(r * H + h + 1) * MLA_CACHE_DIM]
                .iter()
                .map(|v| v.to_f32().abs().min(448.0))
                .collect();
            let mut largest = 0.0f32;
            for &k in &keys {
                let row = &k_abs[k * MLA_CACHE_DIM..(k + 1) * MLA_CACHE_DIM];
                let sum: f32 = q.iter().zip(row).map(|(a, b)| a * b).sum();
                largest = largest.max(sum);
            }
            out[r * H + h] = scale * largest;
        }
    }
    out
}

/// The step through the prefill on the GPU against the same route on the CPU (the prefill's
/// reference over the gathered workspace), with the prefill's tolerances (tests/gpu_sparse_mla.rs:
/// out 8e-2 + max|v| / 16 absolute and 8e-2 relative for the e4m3 softmax weights, and each
/// (row, head) output vector within relative L2 error 0.25 — the elementwise bound alone is
/// loose for outputs this small; lse 2e-3 + 2e-3 relative, plus `THROUGH_PREFILL_ACCUMULATION`
/// of the scores' magnitude), every element; empty rows exactly
/// `out = 0`, `lse = +inf`. q holds values the cast saturates (±1000) and rounds in e4m3's
/// subnormal range (±2^-10); lengths include negative and past-TOPK ones.
fn through_prefill_case<const H: usize, const TOPK: usize>(rows: usize, pages: usize)
where
    Dim<H>: DecodeHeads + HeadTile + PadsTo<H>,
    Dim<TOPK>: TopkWidth,
{
    let what = format!("through the prefill: H {H} TOPK {TOPK} rows {rows} pages {pages}");
    let mut rng = common::rng(&what);
    let slots = pages * 64;
    let cache_rows = common::bf16_normal(&mut rng, slots * MLA_CACHE_DIM, 0.0, 1.0);
    let v_max = cache_rows
        .iter()
        .map(|v| v.to_f32().abs())
        .fold(0.0f32, f32::max);
    let mut q = common::bf16_normal(&mut rng, rows * H * MLA_CACHE_DIM, 0.0, 1.0);
    for v in q.iter_mut().step_by(97) {
        *v = bf16::from_f32(match rng.random_range(0..4) {
            0 => 1000.0,
            1 => -1000.0,
            2 => 2f32.powi(-10),
            _ => -(2f32.powi(-10)),
        });
    }
    let (indices, lengths) = prefill_step_indices(&mut rng, rows, TOPK, slots);
    let s = Step {
        pages,
        cache_rows,
        q,
        indices,
        lengths,
    };
    let (out, lse) = run_through_prefill::<_, H, TOPK>(&gpu(), &s);
    let (want_out, want_lse) = run_through_prefill::<_, H, TOPK>(&Cpu, &s);
    let magnitudes = score_magnitudes::<H>(&s, TOPK);
    let mut worst = (
        check_lse_within(&what, &lse, &want_lse, |i, w| {
            2e-3 + 2e-3 * w.abs() + THROUGH_PREFILL_ACCUMULATION * magnitudes[i]
        }),
        0.0f32,
    );
    // What calibrates THROUGH_PREFILL_ACCUMULATION: the largest error as a share of the
    // magnitude (empty rows, +inf on both sides, left out).
    let worst_share = (lse.iter().zip(&want_lse).zip(&magnitudes))
        .filter(|((_, w), _)| w.is_finite())
        .map(|((g, w), m)| (g - w).abs() / m.max(f32::MIN_POSITIVE))
        .fold(0.0f32, f32::max);
    eprintln!("{what}: largest |Δlse| / scores' magnitude {worst_share:.2e}");
    for (i, (g, w)) in out.iter().zip(&want_out).enumerate() {
        let d = (g - w).abs();
        worst.1 = worst.1.max(d);
        assert!(
            d <= 8e-2 + v_max / 16.0 + 8e-2 * w.abs(),
            "{what}: out {i} (row {}): {g} vs {w}",
            i / (H * 512)
        );
    }
    let mut worst_rel = 0.0f64;
    for (v, (gv, cv)) in out
        .chunks_exact(512)
        .zip(want_out.chunks_exact(512))
        .enumerate()
    {
        let num: f64 = gv
            .iter()
            .zip(cv)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum();
        let den: f64 = cv.iter().map(|&b| (b as f64).powi(2)).sum();
        if den == 0.0 {
            // An empty row (or one whose keys all have zero values): exactly zero.
            assert!(num == 0.0, "{what}: out vector {v} should be 0");
            continue;
        }
        let rel = (num / den).sqrt();
        worst_rel = worst_rel.max(if rel.is_nan() { f64::INFINITY } else { rel });
        assert!(
            rel <= 0.25,
            "{what}: out vector {v} (row {}) relative L2 error {rel:.3}",
            v / H
        );
    }
    for r in (0..rows).filter(|r| r % 6 == 1 || r % 6 == 4) {
        assert!(
            out[r * H * 512..(r + 1) * H * 512]
                .iter()
                .all(|&v| v == 0.0),
            "{what}: row {r} is empty: out 0"
        );
    }
    eprintln!(
        "{what}: max |Δlse| {:.2e}, max |Δout| {:.2e}, worst relative L2 of an output vector {worst_rel:.3}",
        worst.0, worst.1
    );
}

#[test]
fn the_step_through_the_prefill_matches_its_reference() {
    through_prefill_case::<128, 2048>(6, 64);
    through_prefill_case::<64, 2048>(12, 64);
    through_prefill_case::<16, 128>(13, 4);
}

#[test]
fn a_recorded_step_through_the_prefill_replays_to_the_direct_steps_bytes() {
    const H: usize = 64;
    const TOPK: usize = 256;
    let g = gpu();
    let mut rng = common::rng("a_recorded_step_through_the_prefill_replays");
    let (pages, rows) = (16, 3);
    let (cache, queries) = uniform_step::<H, TOPK>(&g, &mut rng, pages, rows, -1);
    let route = DecodeThroughPrefill::<H, TOPK>::new();
    let mut ws = PrefillDecodeWorkspace::new(&g, rows).unwrap();
    let (mut out, mut lse) = poisoned::<Cuda, H>(&g, rows);
    route
        .run(&g, &queries, &cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    let (want_out, want_lse) = (out.to_host(&g).unwrap(), lse.to_host(&g).unwrap());
    let (mut out, mut lse) = poisoned::<Cuda, H>(&g, rows);
    let mut ws = PrefillDecodeWorkspace::new(&g, rows).unwrap();
    let mut recorder = g.record_graph().unwrap();
    route
        .record(&mut recorder, &queries, &cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    let graph = recorder.finish().unwrap();
    graph.replay().unwrap();
    graph.replay().unwrap();
    drop(graph);
    assert_replayed_bytes(&g, &out, &lse, &want_out, &want_lse);
}

/// The group scales of a test cache (`hostile_cache_bytes`).
#[derive(Clone, Copy)]
enum CacheScales {
    /// Every kind a hostile buffer can hold: the store's powers of two (2^-24 … 2^15, the paged
    /// kernel's f16 arithmetic), and what it must take in f32 — powers from 2^16 up, scales
    /// that are not powers of two, zero and an f32 subnormal.
    Hostile,
    /// Powers of two from 2^-22 to 2^7 only (what the store writes for values up to 2^15), so
    /// every thread of the paged kernel's latent conversion whose two tokens are valid takes
    /// its conversion-free path (an invalid slot's row has zero scales: the f16 path).
    StorePowersOfTwo,
}

/// A cache of `pages` pages of random bytes: finite e4m3 latent values (NaN bytes remapped),
/// RoPE values normal and up to ±600 (the e4m3 cast saturates some), and group scales as
/// `scales` says.
fn hostile_cache_bytes(rng: &mut impl Rng, pages: usize, scales: CacheScales) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..pages * 64 * 656).map(|_| rng.random()).collect();
    for row in bytes.chunks_exact_mut(656) {
        for b in &mut row[..512] {
            if *b & 0x7F == 0x7F {
                *b &= 0xFE; // NaN → ±448
            }
        }
        for g in 0..4 {
            let scale: f32 = match (scales, rng.random_range(0..10)) {
                (CacheScales::StorePowersOfTwo, _) => 2f32.powi(rng.random_range(-22..=7)),
                (_, 0) => 0.0,
                (_, 1) => f32::from_bits(rng.random_range(1..0x0080_0000)),
                (_, 2) => 1.37 * 2f32.powi(rng.random_range(-20..4)),
                (_, 3) => 2f32.powi(rng.random_range(16..24)),
                _ => 2f32.powi(rng.random_range(-24..16)),
            };
            row[512 + 4 * g..516 + 4 * g].copy_from_slice(&scale.to_le_bytes());
        }
        for r in 0..64 {
            let v = bf16::from_f32(
                rng.random_range(-600.0f32..600.0) * 2f32.powi(-rng.random_range(0..12)),
            );
            row[528 + 2 * r..530 + 2 * r].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    bytes
}

/// The paged prefill reads the values the cache gather writes: the step through the prefill
/// against the same step composed of the public ops it replaced — q cast on the host, the
/// step's slots gathered into an e4m3 workspace (`MlaCacheGather`), the 64-head prefill over it
/// (`HeadTiling::Tiles64`) — bit for bit in `out` and `lse`, on a cache of hostile bytes
/// (`hostile_cache_bytes`: scales the kernel takes in f16 and in f32), with invalid and
/// repeated slots and every row-length case; outputs poisoned before both runs.
#[test]
fn the_paged_prefill_reads_the_values_the_gather_writes() {
    paged_prefill_against_the_gather(
        "the_paged_prefill_reads_the_values_the_gather_writes",
        CacheScales::Hostile,
    );
}

/// The same with the store's powers of two only: every thread whose tokens are valid takes the
/// conversion-free path for a quarter of its words (hostile latent bytes, every scale it
/// admits), still bit for bit the gather's.
#[test]
fn the_paged_prefill_reads_the_gathers_values_at_the_stores_scales() {
    paged_prefill_against_the_gather(
        "the_paged_prefill_reads_the_gathers_values_at_the_stores_scales",
        CacheScales::StorePowersOfTwo,
    );
}

fn paged_prefill_against_the_gather(name: &str, scales: CacheScales) {
    use shapeproof::backend::Backend;
    use shapeproof::dtype::{F8E4M3, e4m3_from_f32};
    use shapeproof::layout::MlaLatentKv;
    use shapeproof::ops::mla_cache::MlaCacheGather;
    use shapeproof::ops::sparse_mla::{HeadTiling, SparseMlaInputs, SparseMlaPrefill};
    const H: usize = 128;
    const TOPK: usize = 512;
    let g = gpu();
    let mut rng = common::rng(name);
    let (pages, rows) = (8, 7);
    let slots = pages * 64;
    let bytes = hostile_cache_bytes(&mut rng, pages, scales);
    let cache = DeepSeekV32KvCache::<Cuda>::from_buffer(g.upload(&bytes).unwrap(), pages).unwrap();
    let q = common::bf16_normal(&mut rng, rows * H * MLA_CACHE_DIM, 0.0, 1.0);
    let (indices, lengths) = prefill_step_indices(&mut rng, rows, TOPK, slots);
    let sm_scale = 1.0 / (MLA_CACHE_DIM as f32).sqrt();
    let queries = DecodeQueries::<Cuda, H, TOPK>::new(
        Tensor::from_host(&g, "q", &q, rows).unwrap(),
        Tensor::from_host(&g, "indices", &indices, rows).unwrap(),
        sm_scale,
    )
    .unwrap()
    .with_lengths(Tensor::from_host(&g, "lengths", &lengths, rows).unwrap())
    .unwrap();
    let (mut out, mut lse) = poisoned::<Cuda, H>(&g, rows);
    let mut ws = PrefillDecodeWorkspace::new(&g, rows).unwrap();
    DecodeThroughPrefill::<H, TOPK>::new()
        .run(&g, &queries, &cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    let (got_out, got_lse) = (out.to_host(&g).unwrap(), lse.to_host(&g).unwrap());

    // The same step through a workspace: row r · TOPK + j holds position j of row r.
    let mut slot_of = vec![-1i32; rows * TOPK];
    let mut position = vec![-1i32; rows * TOPK];
    for (r, &length) in lengths.iter().enumerate() {
        let length = length.clamp(0, TOPK as i32) as usize;
        for j in 0..length {
            let at = r * TOPK + j;
            if (0..slots as i32).contains(&indices[at]) {
                slot_of[at] = indices[at];
                position[at] = at as i32;
            }
        }
    }
    let n = rows * TOPK;
    let mut kv = MlaLatentKv::<Cuda, 576>::new(
        &g,
        g.upload(&vec![F8E4M3::from_bits(0x7F); n * 576]).unwrap(),
        n,
        7.0,
    )
    .unwrap();
    MlaCacheGather::<64, 128>::new()
        .run(
            &g,
            &cache,
            &Tensor::from_host(&g, "index", &slot_of, n).unwrap(),
            &mut kv,
            None,
        )
        .unwrap();
    let q8: Vec<F8E4M3> = q.iter().map(|v| e4m3_from_f32(v.to_f32())).collect();
    let inputs = SparseMlaInputs::new(
        Tensor::from_host(&g, "q", &q8, rows).unwrap(),
        Tensor::from_host(&g, "q_scale", &[1.0f32], 1).unwrap(),
        Tensor::from_host(&g, "indices", &position, rows).unwrap(),
        sm_scale,
    )
    .unwrap();
    let (mut want_out, mut want_lse) = poisoned::<Cuda, H>(&g, rows);
    let mut max_logits = Tensor::filled(&g, rows, f32::NAN).unwrap();
    SparseMlaPrefill::<576, H, TOPK>::new()
        .with_tiling(HeadTiling::Tiles64)
        .run(
            &g,
            &inputs,
            &kv,
            &mut want_out,
            &mut max_logits,
            &mut want_lse,
        )
        .unwrap();
    let (want_out, want_lse) = (want_out.to_host(&g).unwrap(), want_lse.to_host(&g).unwrap());
    for (i, (a, b)) in got_out.iter().zip(&want_out).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "out {i} (row {}): {a} vs {b}",
            i / (H * 512)
        );
    }
    for (i, (a, b)) in got_lse.iter().zip(&want_lse).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "lse {i}: {a} vs {b}");
    }
    assert!(got_out.iter().all(|v| !v.is_nan()), "every output finite");
}
