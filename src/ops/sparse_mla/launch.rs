//! The launch layer: the checked call as plain slices, and the sealed entry that takes it.
//! The module is private, so neither can be named, built or called from outside the crate.

use super::{HeadTiling, Options};
use crate::backend::Backend;
use crate::dtype::{F8E4M3, bf16};
use crate::error::Result;

/// One checked call as plain slices, in three parts: what the query rows bring, the latent
/// KV, the outputs. Made only by `SparseMlaPrefill::run`.
pub struct SparseMlaCall<'a, B: Backend> {
    pub(crate) s_q: usize,                            // query rows
    pub(crate) s_kv: usize,                           // latent KV rows
    pub(crate) tiling: HeadTiling,                    // which CUDA kernel runs the heads
    pub(crate) queries: SparseMlaQuerySlices<'a, B>,  // q, its scale, indices, options
    pub(crate) kv: LatentKvSlices<'a, B>,             // rows and scale
    pub(crate) outputs: SparseMlaOutputSlices<'a, B>, // out, max_logits, lse
}

/// The query side of a call (from `SparseMlaInputs`); extents in the comments.
pub struct SparseMlaQuerySlices<'a, B: Backend> {
    pub(crate) q: B::Slice<'a, F8E4M3>,    // [s_q, HEADS, D_QK]
    pub(crate) q_scale: B::Slice<'a, f32>, // [1]
    pub(crate) indices: B::Slice<'a, i32>, // [s_q, TOPK]
    pub(crate) topk_length: Option<B::Slice<'a, i32>>, // [s_q] or none
    pub(crate) sink: Option<B::Slice<'a, f32>>, // [HEADS] or none
    pub(crate) sm_scale: f32,              // natural-log units
}

/// The latent KV of a call (from `MlaLatentKv`).
pub struct LatentKvSlices<'a, B: Backend> {
    pub(crate) data: B::Slice<'a, F8E4M3>, // [s_kv, D_QK]
    pub(crate) scale: B::Slice<'a, f32>,   // [1]
}

/// The outputs of a call: three distinct mutable borrows.
pub struct SparseMlaOutputSlices<'a, B: Backend> {
    pub(crate) out: B::SliceMut<'a, bf16>, // [s_q, HEADS, 512]
    pub(crate) max_logits: B::SliceMut<'a, f32>, // [s_q, HEADS]
    pub(crate) lse: B::SliceMut<'a, f32>,  // [s_q, HEADS]
}

/// The per-backend entry of the prefill: the private supertrait of
/// [`RunSparseMla`](super::RunSparseMla).
pub trait SparseMlaEntry: Backend + Sized {
    /// Runs one checked call.
    ///
    /// # Safety
    /// `call` was assembled by `SparseMlaPrefill::run`, whose rules and extent checks are
    /// what the kernel relies on (slice lengths as in the field comments, `s_q` and
    /// `s_kv` at most `i32::MAX`).
    unsafe fn sparse_mla<
        const D_QK: usize,
        const H_Q: usize,
        const TOPK: usize,
        O: Options,
        const HEADS: usize,
    >(
        &self,
        call: SparseMlaCall<'_, Self>,
    ) -> Result<()>;
}
