//! Lightning-indexer scenarios (random queries, keys, weights and ranges of several score
//! distributions) and the checks of a backend's selected rows against the exact logits.

use rand::Rng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use shapeproof::dtype::{F8E4M3, e4m3_to_f32};
use shapeproof::layout::{IndexKeyCache, index_key_offsets};
use shapeproof::ops::indexer::{
    INDEX_HEAD_DIM, IndexKeys, IndexerQueries, LightningIndexer, PagedIndexerQueries,
    PagedIndexerWorkspace, RunIndexer, indexer_logit, order_key,
};
use shapeproof::tensor::{Cols, Tensor};

use super::e4m3_normal;

const D: usize = INDEX_HEAD_DIM;

/// How the scores of a scenario are distributed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scores {
    /// q and k N(0, 1) in e4m3: dense, similar logits.
    Noise,
    /// Noise, plus keys that copy a head of some query token (a few logits far above the rest).
    Peaked,
    /// Keys drawn from 12 distinct rows with one shared scale: many exactly equal logits, so the
    /// tie rule (lower position first) decides the cut.
    Ties,
    /// One key row for every position with a scale that grows with the position: each row's
    /// logits rise (or fall) monotonically, so every key beats the threshold (many cuts).
    Rising,
    /// Noise with the scales of every 8th block of 64 positions 16 times larger: the blocks the
    /// prefill's selection samples first (from a CTA's first position, 0 for most CTAs here),
    /// so its sample ranks too high and a long row takes the second pass.
    PeaksOnSample,
}

/// One call's inputs, on the host.
pub struct IndexerScenario {
    pub tokens: usize,
    pub s_kv: usize,
    pub heads: usize,
    pub q: Vec<F8E4M3>,      // [T, H, 128]
    pub weights: Vec<f32>,   // [T, H]
    pub key_start: Vec<i32>, // [T]
    pub key_end: Vec<i32>,   // [T]
    pub k: Vec<F8E4M3>,      // [s_kv, 128]
    pub k_scale: Vec<f32>,   // [s_kv]
}

impl IndexerScenario {
    /// `tokens` query tokens of a causal chunk over `history` earlier keys (the chunk's own keys
    /// follow them: s_kv = history + tokens), ragged: every token sees `[0, history + t + 1)`
    /// except every 7th token starts later (a second sequence), every 11th is empty, every 13th
    /// has a range of garbage ends (negative start, end past s_kv), and every 5th sees fewer
    /// positions than `short` (rows shorter than TOPK).
    pub fn causal(
        rng: &mut StdRng,
        heads: usize,
        tokens: usize,
        history: usize,
        short: usize,
        scores: Scores,
    ) -> Self {
        let s_kv = history + tokens;
        let q = e4m3_normal(rng, tokens * heads * D, 1.0);
        let w = Normal::new(0.0f32, 0.125).unwrap();
        let weights: Vec<f32> = (0..tokens * heads).map(|_| w.sample(rng)).collect();
        let (mut k, mut k_scale): (Vec<F8E4M3>, Vec<f32>) = match scores {
            Scores::Ties => {
                let rows = e4m3_normal(rng, 12 * D, 1.0);
                let k = (0..s_kv)
                    .flat_map(|_| {
                        let r = rng.random_range(0..12);
                        rows[r * D..(r + 1) * D].to_vec()
                    })
                    .collect();
                (k, vec![0.0125; s_kv])
            }
            Scores::Rising => {
                let row = e4m3_normal(rng, D, 1.0);
                let k = (0..s_kv).flat_map(|_| row.clone()).collect();
                (k, (0..s_kv).map(|s| 0.001 + s as f32 * 1e-6).collect())
            }
            _ => (
                e4m3_normal(rng, s_kv * D, 1.0),
                (0..s_kv)
                    .map(|_| rng.random_range(0.005f32..0.02))
                    .collect(),
            ),
        };
        if scores == Scores::PeaksOnSample {
            for (s, scale) in k_scale.iter_mut().enumerate() {
                if (s / 64) % 8 == 0 {
                    *scale *= 16.0;
                }
            }
        }
        if scores == Scores::Peaked {
            for _ in 0..(s_kv / 16).max(4) {
                let (t, h, s) = (
                    rng.random_range(0..tokens),
                    rng.random_range(0..heads),
                    rng.random_range(0..s_kv),
                );
                let head = q[(t * heads + h) * D..(t * heads + h + 1) * D].to_vec();
                k[s * D..(s + 1) * D].copy_from_slice(&head);
                k_scale[s] = 0.02;
            }
        }
        let mut weights = weights;
        if scores == Scores::Peaked {
            // Token 0 weighs one head far above the others: a very peaked row.
            for (h, w) in weights[..heads].iter_mut().enumerate() {
                *w = if h == 0 { 4.0 } else { *w * 1e-3 };
            }
        }
        let mut key_start = vec![0i32; tokens];
        let mut key_end = vec![0i32; tokens];
        for t in 0..tokens {
            let end = (history + t + 1) as i32;
            key_end[t] = end;
            if t % 7 == 3 {
                key_start[t] = (history as i32 / 2).min(end - 1);
            }
            if t % 5 == 2 {
                key_start[t] = (end - rng.random_range(1..=short.max(1)) as i32).max(0);
            }
            if t % 11 == 6 {
                key_start[t] = end;
            }
            if t % 13 == 9 {
                key_start[t] = -5 - rng.random_range(0..1000);
                key_end[t] = (s_kv + rng.random_range(1..1000)) as i32;
            }
        }
        Self {
            tokens,
            s_kv,
            heads,
            q,
            weights,
            key_start,
            key_end,
            k,
            k_scale,
        }
    }

    /// Runs the indexer on `backend` into a poisoned `[T, TOPK]` output and returns its rows.
    pub fn run<B: RunIndexer, const H: usize, const TOPK: usize>(
        &self,
        backend: &B,
        indexer: &LightningIndexer<H, TOPK>,
    ) -> Vec<i32> {
        assert_eq!(self.heads, H);
        let queries = IndexerQueries::new(
            Tensor::from_host(backend, "q", &self.q, self.tokens).unwrap(),
            Tensor::from_host(backend, "weights", &self.weights, self.tokens).unwrap(),
            Tensor::from_host(backend, "key_start", &self.key_start, self.tokens).unwrap(),
            Tensor::from_host(backend, "key_end", &self.key_end, self.tokens).unwrap(),
        )
        .unwrap();
        let keys = IndexKeys::new(
            Tensor::from_host(backend, "k", &self.k, self.s_kv).unwrap(),
            Tensor::from_host(backend, "k_scale", &self.k_scale, self.s_kv).unwrap(),
        )
        .unwrap();
        let mut indices: Tensor<B, i32, Cols<TOPK>> =
            Tensor::filled(backend, self.tokens, POISON).unwrap();
        indexer.run(backend, &queries, &keys, &mut indices).unwrap();
        indices.to_host(backend).unwrap()
    }

    /// A token's clamped range, as both backends clamp it.
    pub fn range(&self, t: usize) -> (usize, usize) {
        let lo = (self.key_start[t].max(0) as usize).min(self.s_kv);
        let hi = (self.key_end[t].max(0) as usize).clamp(lo, self.s_kv);
        (lo, hi)
    }

    /// A token's exact logits over its range and, beside each, the magnitude its f32 sums can
    /// round against: `|k_scale| · Σ_h |w_h| · Σ_d |q_hd · k_d|`.
    pub fn logits(&self, t: usize) -> Vec<(usize, f32, f64)> {
        let (lo, hi) = self.range(t);
        let h = self.heads;
        let q: Vec<f32> = self.q[t * h * D..(t + 1) * h * D]
            .iter()
            .map(|&v| e4m3_to_f32(v))
            .collect();
        let w = &self.weights[t * h..(t + 1) * h];
        (lo..hi)
            .map(|s| {
                let k: Vec<f32> = self.k[s * D..(s + 1) * D]
                    .iter()
                    .map(|&v| e4m3_to_f32(v))
                    .collect();
                let mag: f64 = q
                    .chunks_exact(D)
                    .zip(w)
                    .map(|(qh, &wh)| {
                        wh.abs() as f64
                            * qh.iter()
                                .zip(&k)
                                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                                .sum::<f64>()
                    })
                    .sum::<f64>()
                    * self.k_scale[s].abs() as f64;
                (s, indexer_logit(&q, w, &k, self.k_scale[s]), mag)
            })
            .collect()
    }

    /// The exact rows, by a full sort of every token's logits (independent of either backend's
    /// selection): best first by order key then lower position, cut to TOPK, ascending, -1 after.
    pub fn exact_rows(&self, topk: usize) -> Vec<i32> {
        use rayon::prelude::*;
        let rows: Vec<Vec<i32>> = (0..self.tokens)
            .into_par_iter()
            .map(|t| {
                let mut all: Vec<(u32, usize)> = self
                    .logits(t)
                    .into_iter()
                    .map(|(s, l, _)| (order_key(l), s))
                    .collect();
                all.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                all.truncate(topk);
                all.sort_by_key(|&(_, s)| s);
                let mut row: Vec<i32> = all.iter().map(|&(_, s)| s as i32).collect();
                row.resize(topk, -1);
                row
            })
            .collect();
        rows.concat()
    }
}

/// What the output holds before a run: a value no row may keep.
pub const POISON: i32 = 0x5a5a_5a5a;

/// Relative tolerance of a logit against its magnitude (see [`check_rows`]).
pub const LOGIT_RTOL: f64 = 1.0 / 4096.0;

/// Checks every row of `got` (`[T, TOPK]`): the positions are distinct, ascending, inside the
/// token's range, as many as `min(TOPK, valid)`, then -1 to the end; and the set is the exact
/// top-k except for positions whose exact logit lies within `LOGIT_RTOL` of the row's largest
/// magnitude of the TOPK-th logit (f32 accumulation on the tensor cores rounds against the sum
/// of the products' magnitudes, not against the logit). Returns the number of rows whose set
/// differs from the exact one at all (inside that band).
pub fn check_rows(what: &str, s: &IndexerScenario, got: &[i32], topk: usize) -> usize {
    super::par_sum(s.tokens, |t| check_row(what, s, got, topk, t))
}

/// [`check_rows`] for token `t`: 1 when its set differs from the exact one (inside the band).
fn check_row(what: &str, s: &IndexerScenario, got: &[i32], topk: usize, t: usize) -> usize {
    let row = &got[t * topk..(t + 1) * topk];
    let (lo, hi) = s.range(t);
    let want_n = topk.min(hi - lo);
    let n = row.iter().take_while(|&&v| v >= 0).count();
    assert_eq!(
        n, want_n,
        "{what}: token {t} has {n} positions, range {lo}..{hi} holds {want_n} of TOPK {topk}"
    );
    assert!(
        row[n..].iter().all(|&v| v == -1),
        "{what}: token {t}: padding not all -1: {:?}",
        &row[n..]
    );
    for w in row[..n].windows(2) {
        assert!(
            w[0] < w[1],
            "{what}: token {t}: positions not strictly ascending ({} then {})",
            w[0],
            w[1]
        );
    }
    for &p in &row[..n] {
        let p = p as usize;
        assert!(
            p >= lo && p < hi,
            "{what}: token {t}: position {p} outside its range {lo}..{hi}"
        );
    }
    let logits = s.logits(t);
    if logits.len() <= topk {
        return 0; // every valid position, checked above
    }
    let mut order: Vec<(u32, usize, f32, f64)> = logits
        .iter()
        .map(|&(s, l, m)| (order_key(l), s, l, m))
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let kth = order[topk - 1].2 as f64;
    let mag = order.iter().map(|o| o.3).fold(0.0f64, f64::max);
    let band = LOGIT_RTOL * mag;
    let by_pos: std::collections::HashMap<usize, f32> =
        logits.iter().map(|&(s, l, _)| (s, l)).collect();
    let chosen: std::collections::HashSet<usize> = row[..n].iter().map(|&p| p as usize).collect();
    for &p in &chosen {
        let l = by_pos[&p] as f64;
        assert!(
            l >= kth - band,
            "{what}: token {t}: chose position {p} with logit {l}, below the TOPK-th {kth} by more than {band}"
        );
    }
    for o in &order {
        if (o.2 as f64) > kth + band {
            assert!(
                chosen.contains(&o.1),
                "{what}: token {t}: left out position {} with logit {}, above the TOPK-th {kth} by more than {band}",
                o.1,
                o.2
            );
        }
    }
    let exact: std::collections::HashSet<usize> = order[..topk].iter().map(|o| o.1).collect();
    usize::from(exact != chosen)
}

/// Uniformly random i32 values (for hostile ranges).
pub fn garbage(rng: &mut StdRng, n: usize) -> Vec<i32> {
    (0..n).map(|_| rng.random()).collect()
}

/// A backend's rows of a scenario equal the exact rows (used where no rounding differs).
pub fn rows_equal_exact(what: &str, s: &IndexerScenario, got: &[i32], topk: usize) {
    let want = s.exact_rows(topk);
    for t in 0..s.tokens {
        assert_eq!(
            &got[t * topk..(t + 1) * topk],
            &want[t * topk..(t + 1) * topk],
            "{what}: token {t}"
        );
    }
}

/// Tokens of an index-cache page.
pub const PAGE: usize = 64;

/// A paged indexer call (decode, MTP verify) on the host, built from a contiguous scenario
/// `flat` that holds the same keys in rows: position `s` of sequence `b` is row `base[b] + s`
/// of `flat`, and token `(b, j)` of the paged call is token `b · next_n + j` of `flat` with the
/// range `[base[b], base[b] + seen(b, j))`. The pages of all sequences are shuffled over the
/// cache (with spare pages of random bytes between them), and the block-table entries past a
/// sequence's last page are garbage (never read: no position reaches them).
pub struct PagedScenario {
    pub flat: IndexerScenario,
    pub batch: usize,
    pub next_n: usize,
    pub max_pages: usize,
    pub pages: usize,
    pub seq_lens: Vec<i32>,    // [B]
    pub block_table: Vec<i32>, // [B, max_pages]
    pub cache: Vec<u8>,        // [pages, 64 · 132]
    pub base: Vec<usize>,      // [B] first row of each sequence in `flat`
    /// The (sequence, page number) each cache page holds, or none for a spare page.
    pub owner: Vec<Option<(usize, usize)>>,
}

impl PagedScenario {
    /// Sequences of the given lengths (`seq_lens`, which may be 0, shorter than `next_n`, or
    /// past `64 · max_pages`), each holding `min(ceil(len / 64), max_pages)` pages.
    pub fn new(
        rng: &mut StdRng,
        heads: usize,
        seq_lens: &[i32],
        next_n: usize,
        max_pages: usize,
        scores: Scores,
    ) -> Self {
        let batch = seq_lens.len();
        let used: Vec<usize> = seq_lens
            .iter()
            .map(|&l| (l.max(0) as usize).div_ceil(PAGE).min(max_pages))
            .collect();
        let mut base = Vec::with_capacity(batch);
        let mut rows = 0;
        for &u in &used {
            base.push(rows);
            rows += u * PAGE;
        }
        // The same key distributions as the prefill's scenarios, over all sequences' rows.
        let tokens = batch * next_n;
        let mut flat =
            IndexerScenario::causal(rng, heads, tokens, rows.saturating_sub(tokens), 1, scores);
        assert_eq!(flat.s_kv, rows.max(tokens));
        flat.s_kv = rows;
        flat.k.truncate(rows * D);
        flat.k_scale.truncate(rows);
        for b in 0..batch {
            for j in 0..next_n {
                let seen = seen(seq_lens[b], next_n, j, max_pages);
                flat.key_start[b * next_n + j] = base[b] as i32;
                flat.key_end[b * next_n + j] = (base[b] + seen) as i32;
            }
        }
        // Pages: every used page and a few spare ones, shuffled.
        let spare = 3;
        let pages = used.iter().sum::<usize>() + spare;
        let mut order: Vec<Option<(usize, usize)>> = (0..batch)
            .flat_map(|b| (0..used[b]).map(move |i| Some((b, i))))
            .chain(std::iter::repeat_n(None, spare))
            .collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let mut block_table: Vec<i32> = (0..batch * max_pages).map(|_| rng.random()).collect();
        let mut cache = super::random_bytes(rng, pages * PAGE * (D + 4));
        for (page, owner) in order.iter().enumerate() {
            let Some((b, i)) = *owner else { continue };
            block_table[b * max_pages + i] = page as i32;
            for r in 0..PAGE {
                let row = base[b] + i * PAGE + r;
                let (key_at, scale_at) = index_key_offsets::<PAGE>(page * PAGE + r);
                for c in 0..D {
                    cache[key_at + c] = flat.k[row * D + c].to_bits();
                }
                cache[scale_at..scale_at + 4].copy_from_slice(&flat.k_scale[row].to_le_bytes());
            }
        }
        Self {
            flat,
            batch,
            next_n,
            max_pages,
            pages,
            seq_lens: seq_lens.to_vec(),
            block_table,
            cache,
            base,
            owner: order,
        }
    }

    /// Runs the paged indexer on `backend` into a poisoned `[B · next_n, TOPK]` output and
    /// returns its rows (cache slots).
    pub fn run<B: RunIndexer, const H: usize, const TOPK: usize>(
        &self,
        backend: &B,
        indexer: &LightningIndexer<H, TOPK>,
    ) -> Vec<i32> {
        let tokens = self.batch * self.next_n;
        let queries = PagedIndexerQueries::new(
            Tensor::from_host(backend, "q", &self.flat.q, tokens).unwrap(),
            Tensor::from_host(backend, "weights", &self.flat.weights, tokens).unwrap(),
            Tensor::from_host(
                backend,
                "block_table",
                &self.block_table,
                self.block_table.len(),
            )
            .unwrap(),
            self.max_pages,
            Tensor::from_host(backend, "seq_lens", &self.seq_lens, self.batch).unwrap(),
            self.next_n,
        )
        .unwrap();
        let cache = IndexKeyCache::<B, PAGE>::from_tensor(
            Tensor::from_host(backend, "cache", &self.cache, self.pages).unwrap(),
        )
        .unwrap();
        let mut workspace =
            PagedIndexerWorkspace::<B, TOPK>::new(backend, self.batch, self.next_n, self.max_pages)
                .unwrap();
        let mut indices: Tensor<B, i32, Cols<TOPK>> =
            Tensor::filled(backend, tokens, POISON).unwrap();
        indexer
            .run_paged(backend, &queries, &cache, &mut workspace, &mut indices)
            .unwrap();
        eprintln!("paged call: {} split(s) a query pair", workspace.splits());
        indices.to_host(backend).unwrap()
    }

    /// Paged rows (cache slots) as rows of `flat` (-1 kept): a slot must lie in a page of the
    /// row's own sequence.
    pub fn to_flat(&self, what: &str, got: &[i32], topk: usize) -> Vec<i32> {
        got.chunks_exact(topk)
            .enumerate()
            .flat_map(|(t, row)| {
                let b = t / self.next_n;
                row.iter()
                    .map(|&slot| {
                        if slot == -1 {
                            return -1;
                        }
                        assert!(
                            slot >= 0 && (slot as usize) < self.pages * PAGE,
                            "{what}: token {t}: slot {slot} outside the cache"
                        );
                        let (page, offset) = (slot as usize / PAGE, slot as usize % PAGE);
                        match self.owner[page] {
                            Some((owner, i)) if owner == b => (self.base[b] + i * PAGE + offset) as i32,
                            other => panic!(
                                "{what}: token {t} of sequence {b}: slot {slot} is in page {page}, held by {other:?}"
                            ),
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// Checks paged rows (`[B · next_n, topk]` slots) of a scenario whose block table was given
/// entries outside the cache: each row holds as many slots as its token sees positions on valid
/// pages (capped at `topk`), -1 after them, and only slots of its own sequence's pages.
pub fn check_rows_skip_bad_pages(what: &str, s: &PagedScenario, got: &[i32], topk: usize) {
    let pages = s.pages as i32;
    for (t, row) in got.chunks_exact(topk).enumerate() {
        let b = t / s.next_n;
        let table = &s.block_table[b * s.max_pages..(b + 1) * s.max_pages];
        let valid = (0..seen(s.seq_lens[b], s.next_n, t % s.next_n, s.max_pages))
            .filter(|p| (0..pages).contains(&table[p / PAGE]))
            .count();
        let n = row.iter().take_while(|&&v| v >= 0).count();
        assert_eq!(n, valid.min(topk), "{what}: token {t}");
        assert!(row[n..].iter().all(|&v| v == -1), "{what}: token {t}");
        for &slot in &row[..n] {
            assert!(
                table.contains(&(slot / PAGE as i32)),
                "{what}: token {t}: slot {slot} not in its sequence's pages"
            );
        }
    }
}

/// The positions token `j` of a sequence of length `seq_len` sees: `[0, seq_len − next_n + j
/// + 1)` clamped to `[0, 64 · max_pages]`.
pub fn seen(seq_len: i32, next_n: usize, j: usize, max_pages: usize) -> usize {
    (seq_len as i64 - next_n as i64 + j as i64 + 1).clamp(0, (max_pages * PAGE) as i64) as usize
}
