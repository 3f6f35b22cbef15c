//! The launch layer: the checked call as plain slices, and the sealed entry that takes it.
//! The module is private, so neither can be named, built or called from outside the crate.

use super::args::DecodeQuerySlices;
use crate::backend::Backend;
use crate::dtype::{F8E4M3, bf16};
use crate::error::Result;

/// One checked decode step; extents in the comments. Made only by `SparseMlaDecode::run`.
pub struct DecodeCall<'a, B: Backend> {
    pub(crate) rows: usize,                       // query rows, B · s_q
    pub(crate) slots: usize,                      // cache slots
    pub(crate) queries: DecodeQuerySlices<'a, B>, // q [rows, H_Q, 576], indices [rows, TOPK], lengths [rows]
    pub(crate) cache: B::Slice<'a, u8>,           // [slots, 656]
    pub(crate) out: B::SliceMut<'a, bf16>,        // [rows, H_Q, 512]
    pub(crate) lse: B::SliceMut<'a, f32>,         // [rows, H_Q]
    pub(crate) splits: usize,                     // top-k splits a row, planned for `rows`
    pub(crate) blocks_per_split: usize,           // 64-slot blocks of a split
    pub(crate) part_o: B::SliceMut<'a, f32>,      // [rows, H_Q, splits, 512] when split
    pub(crate) part_lse: B::SliceMut<'a, f32>,    // [rows, H_Q, splits] when split
}

/// One checked preparation of a decode step for the prefill; extents in the comments. Made only
/// by `DecodeThroughPrefill::run`.
pub struct DecodePrepareCall<'a, B: Backend> {
    pub(crate) rows: usize,                       // query rows, B · s_q
    pub(crate) slots: usize,                      // cache slots
    pub(crate) queries: DecodeQuerySlices<'a, B>, // q [rows, H_Q, 576], indices [rows, TOPK], lengths [rows]
    pub(crate) q8: B::SliceMut<'a, F8E4M3>,       // [rows, H_Q, 576]
    pub(crate) slots_out: B::SliceMut<'a, i32>,   // [rows, TOPK]
}

/// One checked prefill over a prepared step, reading the cache's rows directly; extents in the
/// comments. Made only by `DecodeThroughPrefill::run`, from what its prepare call wrote.
pub struct DecodePagedPrefillCall<'a, B: Backend> {
    pub(crate) rows: usize,                      // query rows, B · s_q
    pub(crate) slots: usize,                     // cache slots
    pub(crate) q8: B::Slice<'a, F8E4M3>,         // [rows, H_Q, 576]
    pub(crate) unit_scale: B::Slice<'a, f32>,    // [1], 1.0
    pub(crate) slots_in: B::Slice<'a, i32>,      // [rows, TOPK] cache slots or -1
    pub(crate) cache: B::Slice<'a, u8>,          // [slots, 656]
    pub(crate) sm_scale: f32,                    // natural-log units
    pub(crate) out: B::SliceMut<'a, bf16>,       // [rows, H_Q, 512]
    pub(crate) max_logits: B::SliceMut<'a, f32>, // [rows, H_Q]
    pub(crate) lse: B::SliceMut<'a, f32>,        // [rows, H_Q]
}

/// The per-backend entry: the private supertrait of [`RunDecode`](super::RunDecode).
pub trait DecodeEntry: Backend + Sized {
    /// How a step of `rows` rows of `heads` heads at top-k `topk` splits a row's top-k:
    /// `(splits, blocks_per_split)` (`(1, _)`: not split).
    fn decode_splits(&self, rows: usize, heads: usize, topk: usize) -> (usize, usize);

    /// Runs one checked decode step.
    ///
    /// # Safety
    /// `call` was assembled by `SparseMlaDecode::run`: `H_Q` one of 8, 16, 32, 64, 128 and
    /// `TOPK` a positive multiple of 128; the slices hold the extents in `DecodeCall`'s
    /// comments; `rows · H_Q` and `slots` are at most `i32::MAX`; `(splits, blocks_per_split)` is
    /// this backend's `decode_splits` for `rows`, and the partial buffers hold its extents.
    unsafe fn sparse_mla_decode<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodeCall<'_, Self>,
    ) -> Result<()>;

    /// Casts a step's q to e4m3 and writes its masked slots and the positions' RoPE values in
    /// e4m3 (docs/kernels/mla_cache.md §8.6).
    ///
    /// # Safety
    /// `call` was assembled by `DecodeThroughPrefill::run`: `H_Q` one of 8, 16, 32, 64, 128 and
    /// `TOPK` a positive multiple of 128; the slices hold the extents in `DecodePrepareCall`'s
    /// comments; `rows · TOPK` and `slots` are at most `i32::MAX`.
    unsafe fn sparse_mla_decode_prepare<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodePrepareCall<'_, Self>,
    ) -> Result<()>;

    /// The FP8 prefill of a prepared step over the cache's rows (docs/kernels/mla_cache.md
    /// §8.6): the same values as the prefill over the gathered workspace.
    ///
    /// # Safety
    /// As `sparse_mla_decode_prepare`, with the extents in `DecodePagedPrefillCall`'s comments
    /// (the kernel reads no slot of `slots_in` outside `0 .. slots`, whatever it holds).
    unsafe fn sparse_mla_decode_paged_prefill<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodePagedPrefillCall<'_, Self>,
    ) -> Result<()>;
}
