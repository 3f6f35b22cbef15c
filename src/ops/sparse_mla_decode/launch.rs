//! The launch layer: the checked call as plain slices, and the sealed entry that takes it.
//! The module is private, so neither can be named, built or called from outside the crate.

use super::args::DecodeQuerySlices;
use crate::backend::Backend;
use crate::dtype::bf16;
use crate::error::Result;

/// One checked decode step; extents in the comments. Made only by `SparseMlaDecode::run`.
pub struct DecodeCall<'a, B: Backend> {
    pub(crate) rows: usize,                       // query rows, B · s_q
    pub(crate) slots: usize,                      // cache slots
    pub(crate) queries: DecodeQuerySlices<'a, B>, // q [rows, H_Q, 576], indices [rows, TOPK], lengths [rows]
    pub(crate) cache: B::Slice<'a, u8>,           // [slots, 656]
    pub(crate) out: B::SliceMut<'a, bf16>,        // [rows, H_Q, 512]
    pub(crate) lse: B::SliceMut<'a, f32>,         // [rows, H_Q]
}

/// The per-backend entry: the private supertrait of [`RunDecode`](super::RunDecode).
pub trait DecodeEntry: Backend + Sized {
    /// Runs one checked decode step.
    ///
    /// # Safety
    /// `call` was assembled by `SparseMlaDecode::run`: `H_Q` one of 8, 16, 32, 64, 128 and
    /// `TOPK` a positive multiple of 128; the slices hold the extents in `DecodeCall`'s
    /// comments; `rows · H_Q` and `slots` are at most `i32::MAX`.
    unsafe fn sparse_mla_decode<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodeCall<'_, Self>,
    ) -> Result<()>;
}
