//! CPU reference of [`super::LightningIndexer`]: every logit exactly (f64 sums of the exact
//! e4m3 products, rounded once to f32), then an exact selection.

use rayon::prelude::*;

use super::INDEX_HEAD_DIM;
use super::launch::{IndexerCall, IndexerEntry, PagedIndexerCall, PagedPlan};
use crate::backend::Cpu;
use crate::dtype::{F8E4M3, e4m3_to_f32};
use crate::error::Result;
use crate::layout::{INDEX_KEY_DIM, index_key_offsets};

/// The CPU reference runs the op.
impl super::RunIndexer for Cpu {}

/// The `u32` whose unsigned order is the order the indexer ranks logits by: the f32 order, with
/// -0 below +0 and NaN below every number (as -inf). Both backends rank by it.
pub fn order_key(logit: f32) -> u32 {
    let v = if logit.is_nan() {
        f32::NEG_INFINITY
    } else {
        logit
    };
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The reference logit of one (query token, key) pair:
/// `k_scale · Σ_h w[h] · relu(q[h] · k)` in f64 (each e4m3 product is exact), rounded to f32.
/// `q` is the token's `[H_IDX, 128]` decoded values, `weights` its `[H_IDX]`, `k` one decoded
/// key row `[128]`. `relu(NaN)` is 0 (the kernel's `fmaxf`), so a NaN logit comes only from
/// a NaN weight or scale.
pub fn indexer_logit(q: &[f32], weights: &[f32], k: &[f32], k_scale: f32) -> f32 {
    let sum: f64 = q
        .chunks_exact(INDEX_HEAD_DIM)
        .zip(weights)
        .map(|(qh, &w)| {
            let dot: f64 = qh.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
            w as f64 * dot.max(0.0)
        })
        .sum();
    (sum * k_scale as f64) as f32
}

/// A token's valid key rows: `[key_start, key_end)` clamped to `[0, s_kv]` (an inverted range is
/// empty), as the kernel clamps them.
pub(crate) fn clamped_range(start: i32, end: i32, s_kv: usize) -> (usize, usize) {
    let lo = (start.max(0) as usize).min(s_kv);
    let hi = (end.max(0) as usize).clamp(lo, s_kv);
    (lo, hi)
}

fn decode(v: &[F8E4M3]) -> Vec<f32> {
    let lut: [f32; 256] = std::array::from_fn(|b| e4m3_to_f32(float8::F8E4M3::from_bits(b as u8)));
    v.iter().map(|x| lut[x.to_bits() as usize]).collect()
}

impl IndexerEntry for Cpu {
    unsafe fn lightning_indexer<const H_IDX: usize, const TOPK: usize>(
        &self,
        call: IndexerCall<'_, Cpu>,
    ) -> Result<()> {
        let IndexerCall {
            s_kv,
            queries,
            keys,
            indices,
            ..
        } = call;
        let k = decode(keys.k); // [s_kv, 128]
        let width = H_IDX * INDEX_HEAD_DIM;
        indices
            .par_chunks_mut(TOPK)
            .enumerate()
            .for_each(|(t, row)| {
                let (lo, hi) = clamped_range(queries.key_start[t], queries.key_end[t], s_kv);
                let q = decode(&queries.q[t * width..(t + 1) * width]); // [H_IDX, 128]
                let w = &queries.weights[t * H_IDX..(t + 1) * H_IDX];
                let mut scored: Vec<(u32, i32)> = (lo..hi)
                    .map(|s| {
                        let k_row = &k[s * INDEX_HEAD_DIM..(s + 1) * INDEX_HEAD_DIM];
                        let logit = indexer_logit(&q, w, k_row, keys.k_scale[s]);
                        (order_key(logit), s as i32)
                    })
                    .collect();
                select_top(&mut scored, TOPK);
                for (slot, out) in row.iter_mut().enumerate() {
                    *out = scored.get(slot).map_or(-1, |&(_, s)| s);
                }
            });
        Ok(())
    }

    /// The reference selects each row whole: no split, no scratch.
    fn paged_indexer_plan(
        &self,
        _batch: usize,
        _next_n: usize,
        max_pages: usize,
        _topk: usize,
    ) -> PagedPlan {
        PagedPlan {
            splits: 1,
            blocks_per_split: max_pages,
            merged_lists: 0,
        }
    }

    unsafe fn paged_lightning_indexer<const H_IDX: usize, const TOPK: usize, const PAGE: usize>(
        &self,
        call: PagedIndexerCall<'_, Cpu>,
    ) -> Result<()> {
        paged_reference::<H_IDX, TOPK, PAGE>(call);
        Ok(())
    }
}

/// The positions token `j` of a sequence of length `seq_len` sees in a paged call:
/// `[0, seq_len − next_n + j + 1)` clamped to `[0, 64 · max_pages]`, as the kernel clamps it.
pub(crate) fn paged_range(seq_len: i32, next_n: usize, j: usize, positions: usize) -> usize {
    let end = seq_len as i64 - next_n as i64 + j as i64 + 1;
    end.clamp(0, positions as i64) as usize
}

/// The paged reference: each token's logits over its sequence's positions whose page lies in
/// the cache, the same exact selection, positions turned into slots at the end.
pub(crate) fn paged_reference<const H_IDX: usize, const TOPK: usize, const PAGE: usize>(
    call: PagedIndexerCall<'_, Cpu>,
) {
    let PagedIndexerCall {
        pages,
        queries,
        cache,
        indices,
        ..
    } = call;
    let (max_pages, next_n) = (queries.max_pages, queries.next_n);
    let width = H_IDX * INDEX_HEAD_DIM;
    let lut: [f32; 256] = std::array::from_fn(|b| e4m3_to_f32(float8::F8E4M3::from_bits(b as u8)));
    indices
        .par_chunks_mut(TOPK)
        .enumerate()
        .for_each(|(t, row)| {
            let (b, j) = (t / next_n, t % next_n);
            let table = &queries.block_table[b * max_pages..(b + 1) * max_pages]; // [max_pages]
            let hi = paged_range(queries.seq_lens[b], next_n, j, max_pages * PAGE);
            let q = decode(&queries.q[t * width..(t + 1) * width]); // [H_IDX, 128]
            let w = &queries.weights[t * H_IDX..(t + 1) * H_IDX];
            let slot_of = |s: usize| {
                let page = table[s / PAGE];
                (page >= 0 && (page as usize) < pages).then(|| page as usize * PAGE + s % PAGE)
            };
            // The candidates held stay at most 2 · TOPK however long the row's range (which
            // the block table, not the cache, bounds): compacted to the best TOPK when full.
            let mut scored: Vec<(u32, i32)> = Vec::with_capacity(2 * TOPK);
            for s in 0..hi {
                let Some(slot) = slot_of(s) else { continue };
                let (key_at, scale_at) = index_key_offsets::<PAGE>(slot);
                let k: Vec<f32> = cache[key_at..key_at + INDEX_KEY_DIM]
                    .iter()
                    .map(|&byte| lut[byte as usize])
                    .collect();
                let scale =
                    f32::from_le_bytes(cache[scale_at..scale_at + 4].try_into().expect("4 bytes"));
                push_candidate(
                    &mut scored,
                    (order_key(indexer_logit(&q, w, &k, scale)), s as i32),
                    TOPK,
                );
            }
            select_top(&mut scored, TOPK);
            for (i, out) in row.iter_mut().enumerate() {
                *out = scored.get(i).map_or(-1, |&(_, s)| {
                    slot_of(s as usize).expect("a selected position has a page") as i32
                });
            }
        });
}

/// Keeps the `topk` best of `(order key, position)` pairs (larger key first, then the lower
/// position) and sorts them by position.
pub(crate) fn select_top(scored: &mut Vec<(u32, i32)>, topk: usize) {
    keep_best(scored, topk);
    scored.sort_unstable_by_key(|&(_, s)| s);
}

/// Keeps the `topk` best pairs (in no order). The rank is a total order (positions are
/// distinct), so keeping the best of a prefix loses none of the best of the whole.
fn keep_best(scored: &mut Vec<(u32, i32)>, topk: usize) {
    let rank = |a: &(u32, i32), b: &(u32, i32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
    if scored.len() > topk {
        if topk == 0 {
            scored.clear();
            return;
        }
        scored.select_nth_unstable_by(topk - 1, rank);
        scored.truncate(topk);
    }
}

/// Adds a candidate to a row's list, first compacting it to the best `topk` when it holds
/// `2 · topk`: a row's memory stays bounded by its top-k, not by the positions it scans.
fn push_candidate(scored: &mut Vec<(u32, i32)>, item: (u32, i32), topk: usize) {
    if scored.len() >= 2 * topk.max(1) {
        keep_best(scored, topk);
    }
    scored.push(item);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's candidate list never holds more than 2 · topk, and what it keeps is the exact
    /// top-k of everything pushed (ties to the lower position).
    #[test]
    fn pushed_candidates_stay_bounded_and_keep_the_exact_top_k() {
        let topk = 5;
        let items: Vec<(u32, i32)> = (0..1000).map(|i| ((i * 7919 % 97) as u32, i)).collect();
        let mut held = Vec::new();
        for &item in &items {
            push_candidate(&mut held, item, topk);
            assert!(held.len() <= 2 * topk);
        }
        select_top(&mut held, topk);
        let mut all = items.clone();
        select_top(&mut all, topk);
        assert_eq!(held, all);
    }
}
