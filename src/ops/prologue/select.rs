//! Compile-time choice of the prologue's KV store: MXFP8 where the dims allow it, bf16
//! otherwise.
//!
//! The MXFP8 store halves the KV cache but needs 128-channel heads (one scale atom per head)
//! and pages of whole 128-token scale tiles. [`PreferMxfp8`] maps a head dim (and the page
//! size) to the store a layer gets, so a model definition can say "MXFP8 if possible" and let
//! the type checker decide, per layer kind:
//!
//! | head dim | page size        | store                 |
//! |----------|------------------|-----------------------|
//! | 128      | multiple of 128  | [`Mxfp8Store<PAGE>`]  |
//! | 128      | other ×32        | [`Bf16Store<PAGE>`]   |
//! | 64, 256  | any ×32          | [`Bf16Store<PAGE>`]   |
//!
//! `model!` uses it for `kv_store: auto`; `kv_store: mxfp8` instead demands MXFP8 and reports
//! the rule a configuration breaks.
//!
//! ```
//! use shapeproof::ops::prologue::{Bf16Store, Mxfp8Store, PreferredStore};
//! static_assertions::assert_type_eq_all!(PreferredStore<128, 128>, Mxfp8Store<128>);
//! static_assertions::assert_type_eq_all!(PreferredStore<128, 64>, Bf16Store<64>);
//! static_assertions::assert_type_eq_all!(PreferredStore<64, 128>, Bf16Store<128>);
//! ```

use super::{Bf16Store, Mxfp8Store, Store};
use crate::dim::Dim;
use crate::rules::{PageSize, PrologueHeadDim};
use typenum::{B0, B1};

/// The store a head dim (`Self = Dim<HD>`) gets with pages of `PAGE` tokens: MXFP8 where it
/// can, bf16 otherwise.
///
/// Implemented for every head dim of [`PrologueHeadDim`] and page size of [`PageSize`]; a value
/// outside them reports that rule. Which store a pair gets follows the rules' own flags
/// ([`PrologueHeadDim::Mxfp8`], [`PageSize::Mxfp8`]), so no value is listed here.
pub trait PreferMxfp8<const PAGE: usize> {
    /// The chosen store.
    type Store: Store;
}

/// The store [`PreferMxfp8`] picks for head dim `HD` and pages of `PAGE` tokens.
pub type PreferredStore<const HD: usize, const PAGE: usize> = <Dim<HD> as PreferMxfp8<PAGE>>::Store;

impl<const HD: usize, const PAGE: usize> PreferMxfp8<PAGE> for Dim<HD>
where
    Dim<HD>: PrologueHeadDim,
    Dim<PAGE>: PageSize,
    <Dim<HD> as PrologueHeadDim>::Mxfp8: StoreFor<PAGE, <Dim<PAGE> as PageSize>::Mxfp8>,
{
    type Store = <<Dim<HD> as PrologueHeadDim>::Mxfp8 as StoreFor<
        PAGE,
        <Dim<PAGE> as PageSize>::Mxfp8,
    >>::Store;
}

/// The store for pages of `PAGE` tokens, chosen by whether the head dim (`Self`) and the page
/// (`P`) take MXFP8: MXFP8 when both do, bf16 otherwise.
pub trait StoreFor<const PAGE: usize, P> {
    /// The chosen store.
    type Store: Store;
}
impl<const PAGE: usize, P> StoreFor<PAGE, P> for B0 {
    type Store = Bf16Store<PAGE>;
}
impl<const PAGE: usize> StoreFor<PAGE, B0> for B1 {
    type Store = Bf16Store<PAGE>;
}
impl<const PAGE: usize> StoreFor<PAGE, B1> for B1 {
    type Store = Mxfp8Store<PAGE>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use static_assertions::assert_type_eq_all;

    // The table of the module docs, row by row.
    assert_type_eq_all!(PreferredStore<128, 128>, Mxfp8Store<128>);
    assert_type_eq_all!(PreferredStore<128, 4096>, Mxfp8Store<4096>);
    assert_type_eq_all!(PreferredStore<128, 32>, Bf16Store<32>);
    assert_type_eq_all!(PreferredStore<128, 4000>, Bf16Store<4000>);
    assert_type_eq_all!(PreferredStore<64, 128>, Bf16Store<128>);
    assert_type_eq_all!(PreferredStore<256, 256>, Bf16Store<256>);
}
