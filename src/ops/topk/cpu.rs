//! CPU reference of [`super::TopK`].

use super::launch::{TopkCall, TopkEntry};
use crate::backend::Cpu;
use crate::error::Result;
use crate::ops::indexer::{order_key, select_top};

/// The CPU reference runs the op.
impl super::RunTopk for Cpu {}

impl TopkEntry for Cpu {
    unsafe fn topk<const TOPK: usize>(&self, call: TopkCall<'_, Cpu>) -> Result<()> {
        let TopkCall {
            rows,
            scores,
            indices,
        } = call;
        let width = scores.width;
        for r in 0..rows {
            let row = &scores.scores[r * width..(r + 1) * width]; // [width]
            let chosen = select_row(row, scores.starts[r], scores.ends[r], TOPK);
            let out = &mut indices[r * TOPK..(r + 1) * TOPK]; // [TOPK]
            for (i, o) in out.iter_mut().enumerate() {
                *o = chosen.get(i).copied().unwrap_or(-1);
            }
        }
        Ok(())
    }
}

/// The selection of one row (the reference both backends follow): the at most `topk` columns
/// of `[start, end)` (clamped to `[0, row.len()]`) with the largest scores by [`order_key`],
/// ties to the lower column, in ascending order.
pub fn select_row(row: &[f32], start: i32, end: i32, topk: usize) -> Vec<i32> {
    if topk == 0 {
        return Vec::new();
    }
    let width = row.len() as i64;
    let a = (start as i64).clamp(0, width);
    let b = (end as i64).clamp(a, width);
    let mut scored: Vec<(u32, i32)> = (a..b)
        .map(|s| (order_key(row[s as usize]), s as i32))
        .collect();
    select_top(&mut scored, topk);
    scored.into_iter().map(|(_, s)| s).collect()
}
