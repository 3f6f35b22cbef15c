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

/// The store a head dim (`Self = Dim<HD>`) gets with pages of `PAGE` tokens: MXFP8 where it
/// can, bf16 otherwise.
#[diagnostic::on_unimplemented(
    message = "head dim `{Self}` has no fused-prologue KV store",
    label = "the fused prologue takes head dims 64, 128 or 256",
    note = "128-channel heads get the MXFP8 store where the page size allows it, 64 and 256 the bf16 store"
)]
pub trait PreferMxfp8<const PAGE: usize> {
    /// The chosen store.
    type Store: Store;
}

/// The store [`PreferMxfp8`] picks for head dim `HD` and pages of `PAGE` tokens.
pub type PreferredStore<const HD: usize, const PAGE: usize> = <Dim<HD> as PreferMxfp8<PAGE>>::Store;

impl<const PAGE: usize> PreferMxfp8<PAGE> for Dim<64>
where
    Dim<PAGE>: Mxfp8IfPageAllows,
{
    type Store = Bf16Store<PAGE>;
}
impl<const PAGE: usize> PreferMxfp8<PAGE> for Dim<128>
where
    Dim<PAGE>: Mxfp8IfPageAllows,
{
    type Store = <Dim<PAGE> as Mxfp8IfPageAllows>::Store;
}
impl<const PAGE: usize> PreferMxfp8<PAGE> for Dim<256>
where
    Dim<PAGE>: Mxfp8IfPageAllows,
{
    type Store = Bf16Store<PAGE>;
}

/// The store a 128-channel head gets with pages of `Self` tokens: MXFP8 for whole 128-token
/// scale tiles, bf16 for the other multiples of 32.
#[diagnostic::on_unimplemented(
    message = "page size `{Self}` is not a positive multiple of 32",
    label = "KV page sizes must be positive multiples of 32 tokens (up to 4096)",
    note = "pages are tiled in 32-token scale chunks; use 32, 64, 128, …"
)]
pub trait Mxfp8IfPageAllows {
    /// The chosen store.
    type Store: Store;
}

/// For each `k`, pages of `128·k` tokens take MXFP8 and the three multiples of 32 below them
/// take bf16; `k` runs to 32, the end of the `PageSize` table (4096).
macro_rules! page_stores {
    ($($k:literal)*) => {$(
        #[diagnostic::do_not_recommend]
        impl Mxfp8IfPageAllows for Dim<{ $k * 128 }> {
            type Store = Mxfp8Store<{ $k * 128 }>;
        }
        #[diagnostic::do_not_recommend]
        impl Mxfp8IfPageAllows for Dim<{ $k * 128 - 32 }> {
            type Store = Bf16Store<{ $k * 128 - 32 }>;
        }
        #[diagnostic::do_not_recommend]
        impl Mxfp8IfPageAllows for Dim<{ $k * 128 - 64 }> {
            type Store = Bf16Store<{ $k * 128 - 64 }>;
        }
        #[diagnostic::do_not_recommend]
        impl Mxfp8IfPageAllows for Dim<{ $k * 128 - 96 }> {
            type Store = Bf16Store<{ $k * 128 - 96 }>;
        }
    )*};
}
page_stores!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);

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
