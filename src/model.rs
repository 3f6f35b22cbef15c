//! Tensor-parallel sharding of a model's heads, as types.
//!
//! A model definition (the `model!` macro, or hand-written types) asks for the per-rank head
//! counts here; the degree must divide the query heads, and either divide the KV heads or be a
//! multiple of them (KV heads are then replicated, docs/kernels/models.md §4.1).

use crate::dim::Dim;
use crate::rules::{ShardsHeads, ShardsKvHeads};

/// Tensor parallelism of degree `TP`.
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorParallel<const TP: usize>;

impl<const TP: usize> TensorParallel<TP> {
    /// Query heads on each rank: `HEADS / TP`.
    pub const fn heads_per_rank<const HEADS: usize>() -> usize
    where
        Dim<TP>: ShardsHeads<HEADS>,
    {
        <Dim<TP> as ShardsHeads<HEADS>>::PER_RANK
    }

    /// KV heads on each rank: `max(1, KV_HEADS / TP)` (replicated when `TP > KV_HEADS`).
    pub const fn kv_heads_per_rank<const KV_HEADS: usize>() -> usize
    where
        Dim<TP>: ShardsKvHeads<KV_HEADS>,
    {
        <Dim<TP> as ShardsKvHeads<KV_HEADS>>::PER_RANK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inkling (docs/kernels/models.md §4.1): 64 q heads; 8 global / 16 SWA KV heads.
    #[test]
    fn inkling_per_rank_heads() {
        assert_eq!(TensorParallel::<8>::heads_per_rank::<64>(), 8);
        assert_eq!(TensorParallel::<8>::kv_heads_per_rank::<8>(), 1);
        assert_eq!(TensorParallel::<8>::kv_heads_per_rank::<16>(), 2);
        assert_eq!(TensorParallel::<16>::kv_heads_per_rank::<8>(), 1);
        assert_eq!(TensorParallel::<1>::kv_heads_per_rank::<8>(), 8);
    }
}
