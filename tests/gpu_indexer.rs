//! The lightning indexer on the GPU against the exact logits and the CPU reference: 32 and 64
//! index heads, top-k 128, 512 and 2048, causal ragged ranges over up to 20k keys of history
//! (rows shorter than TOPK, empty rows, garbage range ends, an odd token count so a CTA holds
//! one token), four score distributions (noise, peaked rows, exact ties, monotone rows that make
//! every key beat the threshold); outputs poisoned, every element checked. A row must hold
//! exactly `min(TOPK, valid)` distinct ascending positions inside its range and -1 after them,
//! and its set must equal the exact top-k except within `LOGIT_RTOL` (2^-12) of the row's
//! largest product magnitude around the TOPK-th logit (`tests/common/indexer.rs`: the FP8 tensor
//! cores sum 128 exact products in f32). Two runs give the same bytes.
//! The paged form (decode, MTP verify) over shuffled pages with garbage block-table tails,
//! next_n 1 to 4, sequences empty, shorter than next_n, shorter than TOPK, ragged, full and past
//! the block table: its slots, mapped back to positions, pass the same checks against the same
//! keys in rows; pages outside the cache are never selected.
//! Compiled only with `--features gpu-tests`; run on the H200 (`scripts/gpu-bundle.sh`).
#![cfg(feature = "gpu-tests")]

mod common;

use common::indexer::{
    IndexerScenario, PAGE, PagedScenario, Scores, check_rows, check_rows_skip_bad_pages, garbage,
};
use shapeproof::backend::{Cpu, Cuda};
use shapeproof::dim::Dim;
use shapeproof::ops::indexer::LightningIndexer;
use shapeproof::rules::{IndexerHeads, IndexerTopk};

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

/// Prints how many of the GPU's rows differ from the exact set (inside the band) and how many
/// equal the CPU's.
fn report(what: &str, differing: usize, got: &[i32], cpu: &[i32], topk: usize) {
    let rows = got.len() / topk;
    let same = got
        .chunks_exact(topk)
        .zip(cpu.chunks_exact(topk))
        .filter(|(g, c)| g == c)
        .count();
    eprintln!(
        "{what}: {differing} rows differ from the exact set inside the band, {same}/{rows} rows equal the CPU's"
    );
}

fn case<const H: usize, const TOPK: usize>(tokens: usize, history: usize, scores: Scores)
where
    Dim<H>: IndexerHeads,
    Dim<TOPK>: IndexerTopk,
{
    let cuda = gpu();
    let what = format!("H {H} TOPK {TOPK} T {tokens} history {history} {scores:?}");
    let mut rng = common::rng(&what);
    let s = IndexerScenario::causal(&mut rng, H, tokens, history, TOPK / 2, scores);
    let indexer = LightningIndexer::<H, TOPK>::new();
    let got = s.run(&cuda, &indexer);
    let differing = check_rows(&what, &s, &got, TOPK);
    report(&what, differing, &got, &s.run(&Cpu, &indexer), TOPK);
    assert_eq!(s.run(&cuda, &indexer), got, "{what}: a second run differs");
}

#[test]
fn heads_64_topk_2048() {
    for scores in [Scores::Noise, Scores::Peaked, Scores::Ties, Scores::Rising] {
        case::<64, 2048>(77, 6000, scores);
    }
}

#[test]
fn heads_64_long_history() {
    case::<64, 2048>(48, 20000, Scores::Noise);
    case::<64, 2048>(48, 20000, Scores::Rising);
}

#[test]
fn heads_32_topk_2048() {
    for scores in [Scores::Noise, Scores::Peaked, Scores::Ties, Scores::Rising] {
        case::<32, 2048>(65, 5000, scores);
    }
}

/// Rows whose best keys sit on the blocks the selection samples first: the sample misleads
/// the long rows, which are selected again in a second pass (their rows still exact). The
/// kernel reports no pass count; what shows the second pass ran is the rows themselves: after
/// a misled sample fewer than TOPK candidates are left, so without it these rows would come out
/// short (the selection model's "no second pass" variant fails on the same peaks).
#[test]
fn a_misleading_sample_takes_the_second_pass() {
    case::<64, 2048>(77, 12000, Scores::PeaksOnSample);
    case::<32, 2048>(65, 12000, Scores::PeaksOnSample);
    case::<64, 128>(101, 3000, Scores::PeaksOnSample);
}

#[test]
fn narrow_topk() {
    for scores in [Scores::Noise, Scores::Ties, Scores::Rising] {
        case::<64, 128>(101, 3000, scores);
        case::<32, 512>(99, 3000, scores);
    }
}

#[test]
fn more_ctas_than_the_gpu_holds() {
    // More CTAs than SMs (132 on an H100 or H200): a second wave on SMs the first has left.
    // 700 tokens at 64 heads (four a CTA) are 175 CTAs; 1000 at 32 (six a CTA) 167.
    case::<64, 256>(700, 500, Scores::Noise);
    case::<32, 128>(1000, 300, Scores::Ties);
}

#[test]
fn garbage_ranges_are_clamped_on_the_device() {
    let cuda = gpu();
    let mut rng = common::rng("garbage_ranges_are_clamped_on_the_device");
    let mut s = IndexerScenario::causal(&mut rng, 64, 40, 3000, 100, Scores::Noise);
    s.key_start = garbage(&mut rng, 40);
    s.key_end = garbage(&mut rng, 40);
    for t in 0..10 {
        // Some ranges that are valid but odd: a single key, the last key, past the end.
        s.key_start[t] = (s.s_kv - 1 - t) as i32;
        s.key_end[t] = s.key_start[t] + 1 + (t as i32) * 1000;
    }
    let got = s.run(&cuda, &LightningIndexer::<64, 256>::new());
    check_rows("garbage ranges", &s, &got, 256);
}

#[test]
fn no_keys_gives_rows_of_minus_one() {
    let cuda = gpu();
    let mut rng = common::rng("no_keys_gives_rows_of_minus_one");
    let mut s = IndexerScenario::causal(&mut rng, 32, 5, 0, 1, Scores::Noise);
    s.k.clear();
    s.k_scale.clear();
    s.s_kv = 0;
    let got = s.run(&cuda, &LightningIndexer::<32, 128>::new());
    assert!(got.iter().all(|&v| v == -1));
}

fn paged_case<const H: usize, const TOPK: usize>(
    lens: &[i32],
    next_n: usize,
    max_pages: usize,
    scores: Scores,
) where
    Dim<H>: IndexerHeads,
    Dim<TOPK>: IndexerTopk,
{
    let cuda = gpu();
    let what = format!("paged H {H} TOPK {TOPK} next_n {next_n} max_pages {max_pages} {scores:?}");
    let mut rng = common::rng(&what);
    let s = PagedScenario::new(&mut rng, H, lens, next_n, max_pages, scores);
    let indexer = LightningIndexer::<H, TOPK>::new();
    let got = s.run(&cuda, &indexer);
    let flat = s.to_flat(&what, &got, TOPK);
    let differing = check_rows(&what, &s.flat, &flat, TOPK);
    report(&what, differing, &got, &s.run(&Cpu, &indexer), TOPK);
    assert_eq!(s.run(&cuda, &indexer), got, "{what}: a second run differs");
}

#[test]
fn paged_every_next_n() {
    let lens = [0, 1, 64, 100, 700, 6 * 64, 333, 1_000_000, 2500, 5000];
    for next_n in 1..=4 {
        for scores in [Scores::Noise, Scores::Peaked, Scores::Ties, Scores::Rising] {
            paged_case::<64, 256>(&lens, next_n, 80, scores);
        }
    }
}

#[test]
fn paged_long_sequences_topk_2048() {
    // One sequence of the benchmark's 65536 positions: 256 splits of 4 pages, their lists of
    // at most 256 entries merged 64 to a CTA, then the row (two levels).
    paged_case::<64, 2048>(&[65536], 2, 1024, Scores::Noise);
    // A top-k that does not divide the merge's 16384 candidates (15360 of 1536 held): the
    // host's fan must be the kernel's, or trailing lists (the highest positions, the best
    // under rising scores) would be left out.
    paged_case::<64, 1536>(&[16384, 9000], 2, 256, Scores::Rising);
    // A decode batch at long context: 20k and 9k positions, shuffled pages.
    paged_case::<64, 2048>(&[20000, 9000, 2047, 2049], 2, 320, Scores::Noise);
    paged_case::<64, 2048>(&[20000, 9000], 1, 320, Scores::Rising);
    paged_case::<32, 2048>(&[16000, 3000, 0], 3, 256, Scores::Peaked);
    paged_case::<32, 512>(&[8000, 600, 1], 4, 128, Scores::Ties);
}

/// A batch in few splits of long ranges (128 sequences of 16000 positions: two splits of 8000),
/// where each split's selection samples every 8th page first: noise, and peaks on the sampled
/// pages (the first split's sample misleads it: a second pass).
#[test]
fn paged_splits_long_enough_to_sample() {
    paged_case::<64, 2048>(&[16000; 128], 1, 256, Scores::Noise);
    paged_case::<64, 2048>(&[16000; 128], 1, 256, Scores::PeaksOnSample);
}

#[test]
fn paged_full_batch_is_not_split() {
    // 300 sequences of one token: more pairs than two CTAs a SM, one CTA each, no merge.
    let lens: Vec<i32> = (0..300).map(|b: i32| 1 + b * 37 % 900).collect();
    paged_case::<64, 256>(&lens, 1, 15, Scores::Noise);
    paged_case::<32, 128>(&lens, 1, 15, Scores::Ties);
}

#[test]
fn paged_pages_outside_the_cache_are_never_selected() {
    let cuda = gpu();
    let mut rng = common::rng("paged_pages_outside_the_cache_are_never_selected");
    let mut s = PagedScenario::new(&mut rng, 64, &[6 * 64, 300, 1000], 2, 16, Scores::Rising);
    let pages = s.pages as i32;
    for (i, bad) in [
        (1, -7),
        (4, pages),
        (16, i32::MAX),
        (33, i32::MIN),
        (40, pages + 1),
    ] {
        s.block_table[i] = bad;
    }
    let indexer = LightningIndexer::<64, 256>::new();
    let got = s.run(&cuda, &indexer);
    check_rows_skip_bad_pages("bad pages (GPU)", &s, &got, 256);
    let cpu = s.run(&Cpu, &indexer);
    check_rows_skip_bad_pages("bad pages (CPU)", &s, &cpu, 256);
}

#[test]
fn a_recorded_paged_call_replays_to_the_direct_calls_rows() {
    use shapeproof::layout::IndexKeyCache;
    use shapeproof::ops::indexer::{
        PagedIndexerQueries, PagedIndexerWorkspace, merge_lists_a_cta, paged_indexer_split,
    };
    use shapeproof::tensor::{Cols, Tensor};
    let g = gpu();
    let mut rng = common::rng("a_recorded_paged_call_replays_to_the_direct_calls_rows");
    // Two sequences: the pages split over CTAs and merged in two levels, through the workspace.
    let s = PagedScenario::new(&mut rng, 64, &[60000, 30000], 2, 1000, Scores::Noise);
    let indexer = LightningIndexer::<64, 2048>::new();
    let want = s.run(&g, &indexer);
    let tokens = s.batch * s.next_n;
    let queries = PagedIndexerQueries::new(
        Tensor::from_host(&g, "q", &s.flat.q, tokens).unwrap(),
        Tensor::from_host(&g, "weights", &s.flat.weights, tokens).unwrap(),
        Tensor::from_host(&g, "block_table", &s.block_table, s.block_table.len()).unwrap(),
        s.max_pages,
        Tensor::from_host(&g, "seq_lens", &s.seq_lens, s.batch).unwrap(),
        s.next_n,
    )
    .unwrap();
    let cache = IndexKeyCache::<Cuda, PAGE>::from_tensor(
        Tensor::from_host(&g, "cache", &s.cache, s.pages).unwrap(),
    )
    .unwrap();
    let mut ws =
        PagedIndexerWorkspace::<Cuda, 2048>::new(&g, s.batch, s.next_n, s.max_pages).unwrap();
    let (splits, pages_a_split) = paged_indexer_split(g.sm_count() as usize, 2, s.max_pages);
    assert_eq!(ws.splits(), splits);
    assert!(
        splits > merge_lists_a_cta(2048, (pages_a_split * PAGE).min(2048)),
        "a merge of more than one level"
    );
    let mut indices: Tensor<Cuda, i32, Cols<2048>> = Tensor::filled(&g, tokens, -7).unwrap();
    let mut recorder = g.record_graph().unwrap();
    indexer
        .record_paged(&mut recorder, &queries, &cache, &mut ws, &mut indices)
        .unwrap();
    let graph = recorder.finish().unwrap();
    graph.replay().unwrap();
    graph.replay().unwrap();
    drop(graph);
    assert_eq!(indices.to_host(&g).unwrap(), want, "replayed rows");
}
