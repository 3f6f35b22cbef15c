//! The launch layer: the checked calls as plain slices, and the sealed entry that takes them.
//! The module is private, so none can be named, built or called from outside the crate.

use super::args::MlaKvRowSlices;
use crate::backend::Backend;
use crate::error::Result;

/// One checked store; extents in the comments. Made only by `MlaCacheStore::run`.
pub struct MlaStoreCall<'a, B: Backend> {
    pub(crate) tokens: usize,                         // T
    pub(crate) slots: usize,                          // cache slots, pages × PAGE
    pub(crate) rows: MlaKvRowSlices<'a, B>,           // kv [T, 576], loc [T]
    pub(crate) cache: B::SliceMut<'a, u8>,            // [slots, ROW_BYTES]
    pub(crate) skipped: Option<B::SliceMut<'a, u32>>, // [1]
}

/// One checked gather; extents in the comments. Made only by `MlaCacheGather::run`.
pub struct MlaGatherCall<'a, B: Backend> {
    pub(crate) rows: usize,                                 // n, rows gathered
    pub(crate) slots: usize,                                // cache slots, pages × PAGE
    pub(crate) cache: B::Slice<'a, u8>,                     // [slots, ROW_BYTES]
    pub(crate) index: B::Slice<'a, i32>,                    // [n] cache slot of each row
    pub(crate) data: B::SliceMut<'a, crate::dtype::F8E4M3>, // [n, 576]
    pub(crate) scale: B::SliceMut<'a, f32>,                 // [1]
    pub(crate) skipped: Option<B::SliceMut<'a, u32>>,       // [1]
}

/// The per-backend entry: the private supertrait of [`RunMlaCache`](super::RunMlaCache).
pub trait MlaCacheEntry: Backend + Sized {
    /// Quantizes and writes one checked store.
    ///
    /// # Safety
    /// `call` was assembled by `MlaCacheStore::run`: `GROUP` is 128, so rows are 656 bytes;
    /// the slices hold the extents in `MlaStoreCall`'s comments; `tokens` and `slots` are at
    /// most `i32::MAX`.
    unsafe fn mla_cache_store<const GROUP: usize>(
        &self,
        call: MlaStoreCall<'_, Self>,
    ) -> Result<()>;

    /// Gathers one checked call's rows into the e4m3 workspace.
    ///
    /// # Safety
    /// `call` was assembled by `MlaCacheGather::run`: `GROUP` is 128; the slices hold the
    /// extents in `MlaGatherCall`'s comments; `rows` and `slots` are at most `i32::MAX`.
    unsafe fn mla_cache_gather<const GROUP: usize>(
        &self,
        call: MlaGatherCall<'_, Self>,
    ) -> Result<()>;
}
