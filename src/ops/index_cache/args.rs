//! The store's checked argument: the index keys of a step's tokens and the slots they go to.

use crate::backend::Backend;
use crate::dtype::bf16;
use crate::error::{Error, Result};
use crate::layout::INDEX_KEY_DIM;
use crate::ops::checked::checked_struct;
use crate::tensor::{Cols, Scalar, Storage, Tensor};

checked_struct! {
    /// The index keys of `T` tokens and the cache slot of each, tied to one token count.
    ///
    /// The fields are private: the tie made by [`new`](Self::new) holds until the tensors are
    /// given back with [`into_parts`](Self::into_parts).
    pub struct IndexKeyRows [] []
    impl where []
    {
        /// Each token's index key, `[T, 128]` bf16 (the indexer's `wk` projection after its
        /// norm, RoPE and rotation).
        k: tensor(bf16, Cols<INDEX_KEY_DIM>) / k_mut,
        /// Each token's cache slot, `[T]` (`page · PAGE + offset`; negative: not stored).
        loc: tensor(i64, Scalar) / loc_mut,
    }
    /// The tensors of an [`IndexKeyRows`], given back by [`IndexKeyRows::into_parts`].
    parts IndexKeyRowParts;
    /// The keys as the call reads them.
    slices IndexKeyRowSlices: read;
}

impl<B: Backend, S: Storage<B>> IndexKeyRows<B, S> {
    /// Ties the keys and their slots to one token count `T` (at most `i32::MAX`).
    pub fn new(
        k: Tensor<B, bf16, Cols<INDEX_KEY_DIM>, S>,
        loc: Tensor<B, i64, Scalar, S>,
    ) -> Result<Self> {
        loc.expect_rows("loc", "tokens (as k)", k.rows())?;
        Error::to_i32("T", k.rows())?;
        Ok(Self { k, loc })
    }

    /// Tokens, `T`.
    pub fn tokens(&self) -> usize {
        self.k.rows()
    }
}
