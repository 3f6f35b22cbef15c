//! The decode's checked argument: the query rows of one step, their top-k cache slots and the
//! optional per-row lengths, tied to one row count.

use super::DecodeQRow;
use crate::backend::Backend;
use crate::dtype::bf16;
use crate::error::{Error, Result};
use crate::ops::checked::checked_struct;
use crate::tensor::{Cols, Scalar, Storage, Tensor};

checked_struct! {
    /// The query side of one decode step: `rows = B · s_q` query rows (each sequence's
    /// `s_q = next_n` tokens, flattened), tied to one row count.
    ///
    /// The fields are private: the tie made by the constructors holds until the tensors are
    /// given back with [`into_parts`](Self::into_parts).
    pub struct DecodeQueries [const H_Q, const TOPK] []
    impl where []
    {
        /// Queries, `[rows, H_Q, 576]` bf16 (the absorbed latent part, then RoPE).
        q: tensor(bf16, DecodeQRow<H_Q>) / q_mut,
        /// Top-k cache slots of each row, `[rows, TOPK]` i32; -1 (or any slot outside the
        /// cache) is no key and never read.
        indices: tensor(i32, Cols<TOPK>) / indices_mut,
        /// Per-row count of leading `indices` to use, `[rows]` (clamped to `[0, TOPK]`), or none.
        lengths: option(i32, Scalar),
        /// Softmax scale (natural-log units).
        sm_scale: value(f32),
    }
    /// The tensors of a [`DecodeQueries`], given back by [`DecodeQueries::into_parts`].
    parts DecodeQueryParts;
    /// The queries as the call reads them.
    slices DecodeQuerySlices: read;
}

/// The kernels count (row, head) pairs in i32 (one combine CTA each): at most
/// `i32::MAX / H_Q` query rows, the rule of [`DecodeQueries::new`] and
/// [`DecodeWorkspace::new`] alike.
fn check_rows<const H_Q: usize>(rows: usize) -> Result<()> {
    Error::check_i32_product("rows", rows, H_Q)
}

impl<B: Backend, const H_Q: usize, const TOPK: usize, S: Storage<B>>
    DecodeQueries<B, H_Q, TOPK, S>
{
    /// Ties q and the indices to one row count (at most `i32::MAX / H_Q`).
    pub fn new(
        q: Tensor<B, bf16, DecodeQRow<H_Q>, S>,
        indices: Tensor<B, i32, Cols<TOPK>, S>,
        sm_scale: f32,
    ) -> Result<Self> {
        indices.expect_rows("indices", "query rows (as q)", q.rows())?;
        check_rows::<H_Q>(q.rows())?;
        Ok(Self {
            q,
            indices,
            lengths: None,
            sm_scale,
        })
    }

    /// The same queries with per-row lengths, `[rows]`: row `r` uses its first
    /// `clamp(lengths[r], 0, TOPK)` slots.
    pub fn with_lengths(self, lengths: Tensor<B, i32, Scalar, S>) -> Result<Self> {
        lengths.expect_rows("lengths", "query rows (as q)", self.q.rows())?;
        Ok(Self {
            lengths: Some(lengths),
            ..self
        })
    }

    /// Query rows, `B · s_q`.
    pub fn rows(&self) -> usize {
        self.q.rows()
    }
}

/// The decode's scratch for one row count: where a step too small to fill the GPU keeps each
/// top-k split's partial output and log-sum-exp for the combine. Made once for a row count `B ·
/// s_q` (as an engine makes its attention metadata) and reused by every step of that count, so
/// a step allocates nothing and can be recorded into a CUDA graph.
///
/// The fields are private: the plan and the buffers' extents stay what `new` made them.
pub struct DecodeWorkspace<B: Backend, const H_Q: usize, const TOPK: usize> {
    pub(crate) rows: usize,
    /// Top-k splits a row (1: not split), of `blocks_per_split` 64-slot blocks each.
    pub(crate) splits: usize,
    pub(crate) blocks_per_split: usize,
    /// Partial outputs `[rows, H_Q, splits, 512]` f32 (one element when not split).
    pub(crate) part_o: Tensor<B, f32, Scalar>,
    /// Partial log-sum-exps `[rows, H_Q, splits]` (one element when not split).
    pub(crate) part_lse: Tensor<B, f32, Scalar>,
}

impl<B: super::RunDecode, const H_Q: usize, const TOPK: usize> DecodeWorkspace<B, H_Q, TOPK> {
    /// The scratch of steps of `rows` query rows, planned for `backend` (the CPU reference
    /// needs none).
    pub fn new(backend: &B, rows: usize) -> Result<Self> {
        check_rows::<H_Q>(rows)?;
        let (splits, blocks_per_split) = backend.decode_splits(rows, H_Q, TOPK);
        let parts = if splits > 1 {
            Error::elements(
                "workspace",
                Error::elements("workspace", rows, H_Q)?,
                splits,
            )?
        } else {
            1
        };
        Ok(Self {
            rows,
            splits,
            blocks_per_split,
            part_o: Tensor::zeros(backend, Error::elements("workspace", parts, 512)?)?,
            part_lse: Tensor::zeros(backend, parts)?,
        })
    }

    /// Top-k splits a row (1: not split).
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// Query rows this scratch serves.
    pub fn rows(&self) -> usize {
        self.rows
    }
}
