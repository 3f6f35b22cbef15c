//! The lightning indexer's CPU reference: its rows equal a full sort of the exact logits on
//! every score distribution (ties to the lower position, ascending rows, -1 padding, clamped
//! ranges), a hand-computed case, NaN logits ranked below every number, and a clear `Err`
//! naming the parameter for every extent that disagrees.

mod common;

use common::boundary::names;
use common::indexer::{
    IndexerScenario, PagedScenario, Scores, check_rows, check_rows_skip_bad_pages,
    rows_equal_exact, seen,
};
use shapeproof::backend::Cpu;
use shapeproof::dtype::{F8E4M3, e4m3_from_f32, e4m3_to_f32};
use shapeproof::layout::DeepSeekV32IndexCache;
use shapeproof::ops::indexer::{
    IndexKeys, IndexerQueries, LightningIndexer, PagedIndexerQueries, PagedIndexerWorkspace,
};
use shapeproof::tensor::{Cols, Tensor};

#[test]
fn reference_rows_equal_a_full_sort() {
    let mut rng = common::rng("reference_rows_equal_a_full_sort");
    let indexer = LightningIndexer::<32, 128>::new();
    for scores in [Scores::Noise, Scores::Peaked, Scores::Ties, Scores::Rising] {
        let s = IndexerScenario::causal(&mut rng, 32, 37, 500, 100, scores);
        let got = s.run(&Cpu, &indexer);
        rows_equal_exact(&format!("{scores:?}"), &s, &got, 128);
        assert_eq!(check_rows(&format!("{scores:?}"), &s, &got, 128), 0);
    }
}

#[test]
fn a_hand_computed_row() {
    // One real head (the others zero): head 0 of q is 1.0 in channel 0, so a key's logit is
    // k_scale · relu(k[0]). Keys 0..300 with k[0] = (s mod 23) - 11: the 128 best are the
    // largest k[0] values, and among equal values the lower positions; negative k[0] gives 0.
    const H: usize = 32;
    let s_kv = 300;
    let mut q = vec![e4m3_from_f32(0.0); H * 128];
    q[0] = e4m3_from_f32(1.0);
    let mut weights = vec![0.0f32; H];
    weights[0] = 1.0;
    let mut k = vec![e4m3_from_f32(0.0); s_kv * 128];
    for s in 0..s_kv {
        k[s * 128] = e4m3_from_f32((s % 23) as f32 - 11.0);
    }
    let value = |s: usize| e4m3_to_f32(k[s * 128]).max(0.0);
    let mut want: Vec<usize> = (0..s_kv).collect();
    want.sort_by(|&a, &b| value(b).total_cmp(&value(a)).then(a.cmp(&b)));
    want.truncate(128);
    want.sort();
    let queries = IndexerQueries::new(
        Tensor::from_host(&Cpu, "q", &q, 1).unwrap(),
        Tensor::from_host(&Cpu, "weights", &weights, 1).unwrap(),
        Tensor::from_host(&Cpu, "key_start", &[0], 1).unwrap(),
        Tensor::from_host(&Cpu, "key_end", &[s_kv as i32], 1).unwrap(),
    )
    .unwrap();
    let keys = IndexKeys::new(
        Tensor::from_host(&Cpu, "k", &k, s_kv).unwrap(),
        Tensor::from_host(&Cpu, "k_scale", &vec![0.5f32; s_kv], s_kv).unwrap(),
    )
    .unwrap();
    let mut out: Tensor<Cpu, i32, Cols<128>> = Tensor::filled(&Cpu, 1, 7).unwrap();
    LightningIndexer::<H, 128>::new()
        .run(&Cpu, &queries, &keys, &mut out)
        .unwrap();
    let got: Vec<usize> = out
        .to_host(&Cpu)
        .unwrap()
        .iter()
        .map(|&v| v as usize)
        .collect();
    assert_eq!(got, want);
}

#[test]
fn nan_logits_rank_below_every_number() {
    const H: usize = 32;
    let mut rng = common::rng("nan_logits_rank_below_every_number");
    let mut s = IndexerScenario::causal(&mut rng, H, 4, 400, 10, Scores::Noise);
    // Key 5 has a NaN scale: its logit is NaN for every token.
    s.k_scale[5] = f32::NAN;
    // Key 9 is NaN in every channel: relu takes the number of max(NaN, 0) as both backends'
    // fmax does, so its dot products count 0 and its logit is 0 (a number).
    for b in &mut s.k[9 * 128..10 * 128] {
        *b = F8E4M3::from_bits(0x7f);
    }
    // Token 0 sees three keys (the NaN one among them): all three are returned.
    s.key_start[0] = 4;
    s.key_end[0] = 7;
    // Token 1 sees all: the NaN key is never chosen over a number.
    s.key_start[1] = 0;
    s.key_end[1] = s.s_kv as i32;
    let got = s.run(&Cpu, &LightningIndexer::<H, 128>::new());
    assert_eq!(&got[..4], &[4, 5, 6, -1]);
    assert!(!got[128..256].contains(&5));
    // Token 2 sees keys 5..10 only: NaN last, the 0 of key 9 among the numbers.
    s.key_start[2] = 5;
    s.key_end[2] = 10;
    let got = s.run(&Cpu, &LightningIndexer::<H, 128>::new());
    assert_eq!(&got[256..262], &[5, 6, 7, 8, 9, -1]);
}

#[test]
fn no_tokens_and_no_keys() {
    const H: usize = 64;
    let mut rng = common::rng("no_tokens_and_no_keys");
    let mut s = IndexerScenario::causal(&mut rng, H, 3, 0, 1, Scores::Noise);
    s.k.clear();
    s.k_scale.clear();
    s.s_kv = 0;
    let got = s.run(&Cpu, &LightningIndexer::<H, 256>::new());
    assert!(got.iter().all(|&v| v == -1));
    s.tokens = 0;
    s.q.clear();
    s.weights.clear();
    s.key_start.clear();
    s.key_end.clear();
    assert!(s.run(&Cpu, &LightningIndexer::<H, 256>::new()).is_empty());
}

#[test]
fn extents_that_disagree_are_errors_naming_the_parameter() {
    const H: usize = 32;
    let q = |t: usize| {
        Tensor::<Cpu, F8E4M3, _>::from_host(&Cpu, "q", &vec![e4m3_from_f32(1.0); t * H * 128], t)
            .unwrap()
    };
    let f = |t: usize, cols: usize| vec![0.0f32; t * cols];
    let w =
        |t: usize| Tensor::<Cpu, f32, Cols<H>>::from_host(&Cpu, "weights", &f(t, H), t).unwrap();
    let r = |t: usize| Tensor::<Cpu, i32, Cols<1>>::from_host(&Cpu, "r", &vec![0; t], t).unwrap();
    names(IndexerQueries::new(q(4), w(3), r(4), r(4)), "weights");
    names(IndexerQueries::new(q(4), w(4), r(5), r(4)), "key_start");
    names(IndexerQueries::new(q(4), w(4), r(4), r(2)), "key_end");
    let k = Tensor::<Cpu, F8E4M3, Cols<128>>::from_host(
        &Cpu,
        "k",
        &vec![e4m3_from_f32(1.0); 10 * 128],
        10,
    )
    .unwrap();
    let ks = Tensor::<Cpu, f32, Cols<1>>::from_host(&Cpu, "k_scale", &f(9, 1), 9).unwrap();
    names(IndexKeys::new(k, ks), "k_scale");
    names(
        Tensor::<Cpu, F8E4M3, Cols<128>>::from_host(&Cpu, "k", &[e4m3_from_f32(1.0); 100], 1),
        "k",
    );
    let queries = IndexerQueries::new(q(4), w(4), r(4), r(4)).unwrap();
    let keys = IndexKeys::new(
        Tensor::from_host(&Cpu, "k", &vec![e4m3_from_f32(1.0); 8 * 128], 8).unwrap(),
        Tensor::from_host(&Cpu, "k_scale", &f(8, 1), 8).unwrap(),
    )
    .unwrap();
    let mut out: Tensor<Cpu, i32, Cols<128>> = Tensor::filled(&Cpu, 3, 0).unwrap();
    names(
        LightningIndexer::<H, 128>::new().run(&Cpu, &queries, &keys, &mut out),
        "indices",
    );
}

#[test]
fn flops_count_the_valid_pairs() {
    assert_eq!(
        LightningIndexer::<64, 2048>::flops(1000),
        2.0 * 64.0 * 128.0 * 1000.0
    );
}

/// Sequence lengths with every edge: empty, shorter than next_n, one page, shorter than TOPK,
/// a ragged last page, every page full, and one past the block table (clamped).
const PAGED_LENS: [i32; 8] = [0, 1, 64, 100, 700, 6 * 64, 333, 1_000_000];

#[test]
fn paged_rows_are_the_contiguous_rows_of_the_same_keys() {
    let mut rng = common::rng("paged_rows_are_the_contiguous_rows_of_the_same_keys");
    let indexer = LightningIndexer::<32, 128>::new();
    for next_n in 1..=4 {
        for scores in [Scores::Noise, Scores::Peaked, Scores::Ties, Scores::Rising] {
            let what = format!("next_n {next_n} {scores:?}");
            let s = PagedScenario::new(&mut rng, 32, &PAGED_LENS, next_n, 6, scores);
            let got = s.run(&Cpu, &indexer);
            let flat = s.to_flat(&what, &got, 128);
            rows_equal_exact(&what, &s.flat, &flat, 128);
            assert_eq!(flat, s.flat.run(&Cpu, &indexer), "{what}");
            // Token j of a sequence sees seq_len - next_n + j + 1 positions (clamped).
            for (b, &len) in PAGED_LENS.iter().enumerate() {
                for j in 0..next_n {
                    let row = &flat[(b * next_n + j) * 128..(b * next_n + j + 1) * 128];
                    let n = row.iter().filter(|&&v| v >= 0).count();
                    assert_eq!(n, seen(len, next_n, j, 6).min(128), "{what}: b {b} j {j}");
                }
            }
        }
    }
}

#[test]
fn pages_outside_the_cache_are_never_selected() {
    let mut rng = common::rng("pages_outside_the_cache_are_never_selected");
    let mut s = PagedScenario::new(&mut rng, 64, &[6 * 64, 300], 2, 6, Scores::Rising);
    // Sequence 0's pages 1 and 4 and sequence 1's page 0 point outside the cache.
    let pages = s.pages as i32;
    s.block_table[1] = -7;
    s.block_table[4] = pages;
    s.block_table[6] = i32::MAX;
    let got = s.run(&Cpu, &LightningIndexer::<64, 256>::new());
    check_rows_skip_bad_pages("bad pages", &s, &got, 256);
}

#[test]
fn paged_extents_that_disagree_are_errors_naming_the_parameter() {
    const H: usize = 32;
    let q = |t: usize| {
        Tensor::<Cpu, F8E4M3, _>::from_host(&Cpu, "q", &vec![e4m3_from_f32(1.0); t * H * 128], t)
            .unwrap()
    };
    let w = |t: usize| {
        Tensor::<Cpu, f32, Cols<H>>::from_host(&Cpu, "weights", &vec![0.0; t * H], t).unwrap()
    };
    let r = |n: usize| Tensor::<Cpu, i32, Cols<1>>::from_host(&Cpu, "r", &vec![0; n], n).unwrap();
    // B = 3 sequences, next_n 2, max_pages 4.
    names(
        PagedIndexerQueries::new(q(6), w(6), r(12), 4, r(3), 0),
        "next_n",
    );
    names(
        PagedIndexerQueries::new(q(6), w(6), r(12), 4, r(3), 5),
        "next_n",
    );
    names(PagedIndexerQueries::new(q(5), w(6), r(12), 4, r(3), 2), "q");
    names(
        PagedIndexerQueries::new(q(6), w(4), r(12), 4, r(3), 2),
        "weights",
    );
    names(
        PagedIndexerQueries::new(q(6), w(6), r(11), 4, r(3), 2),
        "block_table",
    );
    names(
        PagedIndexerQueries::new(q(0), w(0), r(0), usize::MAX / 2, r(0), 2),
        "max_pages",
    );
    let queries = PagedIndexerQueries::new(q(6), w(6), r(12), 4, r(3), 2).unwrap();
    let cache = DeepSeekV32IndexCache::<Cpu>::zeros(&Cpu, 2).unwrap();
    let indexer = LightningIndexer::<H, 128>::new();
    let mut ws = PagedIndexerWorkspace::<Cpu, 128>::new(&Cpu, 3, 2, 4).unwrap();
    let mut out: Tensor<Cpu, i32, Cols<128>> = Tensor::filled(&Cpu, 5, 0).unwrap();
    names(
        indexer.run_paged(&Cpu, &queries, &cache, &mut ws, &mut out),
        "indices",
    );
    // A workspace made for another batch shape.
    let mut out: Tensor<Cpu, i32, Cols<128>> = Tensor::filled(&Cpu, 6, 0).unwrap();
    for (b, n, pages) in [(2, 2, 4), (3, 1, 4), (3, 2, 5)] {
        let mut other = PagedIndexerWorkspace::<Cpu, 128>::new(&Cpu, b, n, pages).unwrap();
        names(
            indexer.run_paged(&Cpu, &queries, &cache, &mut other, &mut out),
            "workspace",
        );
    }
    names(
        PagedIndexerWorkspace::<Cpu, 128>::new(&Cpu, 3, 0, 4),
        "next_n",
    );
    // The workspace takes the queries' rules: a block table wider than i32 positions, or a
    // batch past i32, is the same `Err` on every backend (the CUDA plan never sees it).
    for pages in [i32::MAX as usize / 64 + 1, usize::MAX] {
        let err = PagedIndexerWorkspace::<Cpu, 128>::new(&Cpu, 1, 1, pages);
        assert!(
            err.as_ref()
                .is_err_and(|e| e.to_string().contains(&pages.to_string())),
            "the error shows the value passed"
        );
        names(err, "max_pages");
    }
    names(
        PagedIndexerWorkspace::<Cpu, 128>::new(&Cpu, i32::MAX as usize + 1, 1, 4),
        "B",
    );
    indexer
        .run_paged(&Cpu, &queries, &cache, &mut ws, &mut out)
        .unwrap();
}

#[test]
fn the_paged_split_covers_every_page_once_and_leaves_a_full_batch_unsplit() {
    use shapeproof::ops::indexer::{merge_fan, paged_indexer_split};
    for sms in [1, 78, 132] {
        for pairs in [1, 2, 7, 64, 128, 263, 264, 1000] {
            for max_pages in [0, 1, 3, 4, 5, 6, 7, 8, 9, 17, 1024, 2049, 65536, 100_003] {
                let (splits, per) = paged_indexer_split(sms, pairs, max_pages);
                let what = format!("sms {sms} pairs {pairs} max_pages {max_pages}");
                assert!(splits >= 1 && per >= 1, "{what}: ({splits}, {per})");
                assert!(splits * per >= max_pages, "{what}: pages left over");
                assert!(
                    (splits - 1) * per < max_pages.max(1),
                    "{what}: an empty split"
                );
                if pairs >= 2 * sms {
                    assert_eq!(splits, 1, "{what}: a full batch is split");
                }
                if splits > 1 {
                    assert!(per >= 4, "{what}: splits of fewer than 4 pages");
                }
                // Modelled time (waves of CTAs in the 2 · sms slots × a CTA's pages and a fixed
                // 4) no worse than any other split count the rule allows.
                let slots = 2 * sms;
                let time = |s: usize, per: usize| (pairs * s).div_ceil(slots) * (per + 4);
                if pairs < slots {
                    for other in 1..=(max_pages / 4).max(1) {
                        let other_per = max_pages.div_ceil(other).max(1);
                        assert!(
                            time(splits, per)
                                <= time(max_pages.div_ceil(other_per).max(1), other_per),
                            "{what}: {splits} splits of {per} pages model slower than {other}"
                        );
                    }
                }
            }
        }
    }
    // Any table width plans in at most 2 · sms steps, without overflow.
    for sms in [1, 132] {
        for max_pages in [usize::MAX / 2, usize::MAX] {
            let (splits, per) = paged_indexer_split(sms, 1, max_pages);
            assert!(splits >= 1 && per >= 1 && splits.saturating_mul(per) >= max_pages);
        }
    }
    // The benchmark's full batch of pairs on an H100 / H200: one wave of 2 splits, not two
    // waves of 3.
    assert_eq!(paged_indexer_split(132, 128, 1024), (2, 512));
    assert_eq!(merge_fan(2048), 8);
    assert_eq!(merge_fan(128), 128);
}

/// A merge level's fan (`merge_lists_a_cta`) is the kernel's: its lists of at most `cap`
/// entries fit the CTA's candidate buffer (16384 rounded down to a multiple of TOPK, as the
/// kernel's `C`), it takes no fewer lists than a level of full lists (so the merged buffer,
/// sized by `merge_fan`, holds every level), and it takes every list that fits.
#[test]
fn a_merge_level_takes_the_lists_its_candidates_hold() {
    use shapeproof::ops::indexer::{merge_fan, merge_lists_a_cta};
    for topk in (128..=2048).step_by(128) {
        let held = merge_fan(topk) * topk; // the kernel's C
        assert!(
            held <= 16384 && held + topk > 16384,
            "TOPK {topk}: C = {held}"
        );
        for cap in (64..=topk).step_by(64) {
            let fan = merge_lists_a_cta(topk, cap);
            let what = format!("TOPK {topk}, lists of {cap}: {fan} a CTA");
            assert!(fan * cap <= held, "{what}: more than the buffer holds");
            assert!((fan + 1) * cap > held, "{what}: one more list would fit");
            assert!(
                fan >= merge_fan(topk),
                "{what}: fewer than a level of full lists"
            );
        }
    }
    // B 1 at 65536 positions (256 splits of 4 pages): 64 lists a CTA, two levels.
    assert_eq!(merge_lists_a_cta(2048, 256), 64);
    // TOPK 1536 holds 15360 candidates: 60 lists of 256, not 64.
    assert_eq!(merge_lists_a_cta(1536, 256), 60);
}
