//! The launch layer: the checked call and the sealed entry that takes it. The module is
//! private, so neither can be named, built or called from outside the crate.

use super::args::TopkScoreSlices;
use crate::backend::Backend;
use crate::error::Result;

/// One checked call; made only by `TopK::run`.
pub struct TopkCall<'a, B: Backend> {
    pub(crate) rows: usize,                    // rows, each at most i32::MAX
    pub(crate) scores: TopkScoreSlices<'a, B>, // [rows, width], [rows], [rows], width
    pub(crate) indices: B::SliceMut<'a, i32>,  // [rows, TOPK]
}

/// The per-backend entry: the private supertrait of [`RunTopk`](super::RunTopk).
pub trait TopkEntry: Backend + Sized {
    /// Selects one checked call's rows.
    ///
    /// # Safety
    /// `call` was assembled by `TopK::run`: `TOPK` a multiple of 128 up to 2048, `scores` of
    /// `rows × width` values with `width` at most `i32::MAX`, `starts` and `ends` of `rows`
    /// values, `indices` of `rows × TOPK`.
    unsafe fn topk<const TOPK: usize>(&self, call: TopkCall<'_, Self>) -> Result<()>;
}
