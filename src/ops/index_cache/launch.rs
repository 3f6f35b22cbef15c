//! The launch layer: the checked call as plain slices, and the sealed entry that takes it.
//! The module is private, so neither can be named, built or called from outside the crate.

use super::args::IndexKeyRowSlices;
use crate::backend::Backend;
use crate::dtype::F8E4M3;
use crate::error::Result;

/// One checked store; extents in the comments. Made only by `IndexKeyStore::run`.
pub struct IndexStoreCall<'a, B: Backend> {
    pub(crate) tokens: usize,                         // T
    pub(crate) slots: usize,                          // cache slots, pages × PAGE
    pub(crate) rows: IndexKeyRowSlices<'a, B>,        // k [T, 128], loc [T]
    pub(crate) cache: B::SliceMut<'a, u8>,            // [slots / PAGE, PAGE · 132]
    pub(crate) skipped: Option<B::SliceMut<'a, u32>>, // [1]
}

/// One checked gather; extents in the comments. Made only by `IndexKeyGather::run`.
pub struct IndexGatherCall<'a, B: Backend> {
    pub(crate) rows: usize,                           // n, rows gathered
    pub(crate) slots: usize,                          // cache slots, pages × PAGE
    pub(crate) cache: B::Slice<'a, u8>,               // [slots / PAGE, PAGE · 132]
    pub(crate) index: B::Slice<'a, i32>,              // [n] cache slot of each row
    pub(crate) k: B::SliceMut<'a, F8E4M3>,            // [n, 128]
    pub(crate) k_scale: B::SliceMut<'a, f32>,         // [n]
    pub(crate) skipped: Option<B::SliceMut<'a, u32>>, // [1]
}

/// The per-backend entry: the private supertrait of [`RunIndexCache`](super::RunIndexCache).
pub trait IndexCacheEntry: Backend + Sized {
    /// Quantizes and writes one checked store.
    ///
    /// # Safety
    /// `call` was assembled by `IndexKeyStore::run`: `PAGE` is 64; the slices hold the extents
    /// in `IndexStoreCall`'s comments; `tokens` and `slots` are at most `i32::MAX`.
    unsafe fn index_key_store<const PAGE: usize>(
        &self,
        call: IndexStoreCall<'_, Self>,
    ) -> Result<()>;

    /// Copies one checked gather's keys and scales out of the cache.
    ///
    /// # Safety
    /// `call` was assembled by `IndexKeyGather::run`: `PAGE` is 64; the slices hold the
    /// extents in `IndexGatherCall`'s comments; `rows` and `slots` are at most `i32::MAX`.
    unsafe fn index_key_gather<const PAGE: usize>(
        &self,
        call: IndexGatherCall<'_, Self>,
    ) -> Result<()>;
}
