//! The store's checked argument: the rows of a step's tokens and the slots they go to.

use crate::backend::Backend;
use crate::dtype::bf16;
use crate::error::{Error, Result};
use crate::layout::MLA_CACHE_DIM;
use crate::ops::checked::checked_struct;
use crate::tensor::{Cols, Scalar, Storage, Tensor};

checked_struct! {
    /// The latent rows of `T` tokens and the cache slot of each, tied to one token count.
    ///
    /// The fields are private: the tie made by [`new`](Self::new) holds until the tensors are
    /// given back with [`into_parts`](Self::into_parts).
    pub struct MlaKvRows [] []
    impl where []
    {
        /// Each token's latent and RoPE values, `[T, 576]` bf16 (`kv_a_proj` after its norm,
        /// RoPE applied to the last 64).
        kv: tensor(bf16, Cols<MLA_CACHE_DIM>) / kv_mut,
        /// Each token's cache slot, `[T]` (`page · PAGE + offset`; negative: not stored).
        loc: tensor(i64, Scalar) / loc_mut,
    }
    /// The tensors of an [`MlaKvRows`], given back by [`MlaKvRows::into_parts`].
    parts MlaKvRowParts;
    /// The rows as the call reads them.
    slices MlaKvRowSlices: read;
}

impl<B: Backend, S: Storage<B>> MlaKvRows<B, S> {
    /// Ties the rows and their slots to one token count `T` (at most `i32::MAX`).
    pub fn new(
        kv: Tensor<B, bf16, Cols<MLA_CACHE_DIM>, S>,
        loc: Tensor<B, i64, Scalar, S>,
    ) -> Result<Self> {
        loc.expect_rows("loc", "tokens (as kv)", kv.rows())?;
        Error::to_i32("T", kv.rows())?;
        Ok(Self { kv, loc })
    }

    /// Tokens, `T`.
    pub fn tokens(&self) -> usize {
        self.kv.rows()
    }
}
