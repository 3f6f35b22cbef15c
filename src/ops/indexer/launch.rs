//! The launch layer: the checked call as plain slices, and the sealed entry that takes it.
//! The module is private, so neither can be named, built or called from outside the crate.

use super::args::{IndexKeySlices, IndexerQuerySlices, PagedIndexerQuerySlices};
use crate::backend::Backend;
use crate::error::Result;

/// One checked call; extents in the comments. Made only by `LightningIndexer::run`.
pub struct IndexerCall<'a, B: Backend> {
    pub(crate) tokens: usize,                      // query tokens T
    pub(crate) s_kv: usize,                        // key rows
    pub(crate) queries: IndexerQuerySlices<'a, B>, // q [T, H_IDX, 128], weights [T, H_IDX], ranges [T]
    pub(crate) keys: IndexKeySlices<'a, B>,        // k [s_kv, 128], k_scale [s_kv]
    pub(crate) indices: B::SliceMut<'a, i32>,      // [T, TOPK]
}

/// One checked paged call; extents in the comments. Made only by `LightningIndexer::run_paged`.
pub struct PagedIndexerCall<'a, B: Backend> {
    pub(crate) tokens: usize, // query tokens B · next_n
    pub(crate) batch: usize,  // sequences B
    pub(crate) pages: usize,  // pages of the cache
    pub(crate) queries: PagedIndexerQuerySlices<'a, B>, // q [B·next_n, H_IDX, 128], weights [B·next_n, H_IDX], block_table [B, max_pages], seq_lens [B]
    pub(crate) cache: B::Slice<'a, u8>,                 // [pages, PAGE · 132]
    pub(crate) indices: B::SliceMut<'a, i32>,           // [B · next_n, TOPK]
    pub(crate) workspace: PagedWorkspaceSlices<'a, B>,  // planned for (B, next_n, max_pages)
}

/// How a backend splits a paged call: `splits` CTAs a query pair, `blocks_per_split` pages each
/// (`splits · blocks_per_split ≥ max_pages`), and the lists the first merge level leaves.
#[derive(Clone, Copy, Debug)]
pub struct PagedPlan {
    pub(crate) splits: usize,
    pub(crate) blocks_per_split: usize,
    pub(crate) merged_lists: usize,
}

/// The workspace as a paged call uses it (extents in `PagedIndexerWorkspace`'s comments).
pub struct PagedWorkspaceSlices<'a, B: Backend> {
    pub(crate) splits: usize,
    pub(crate) blocks_per_split: usize,
    pub(crate) keys: B::SliceMut<'a, u32>,
    pub(crate) pos: B::SliceMut<'a, i32>,
    pub(crate) count: B::SliceMut<'a, i32>,
    pub(crate) merged_keys: B::SliceMut<'a, u32>,
    pub(crate) merged_pos: B::SliceMut<'a, i32>,
    pub(crate) merged_count: B::SliceMut<'a, i32>,
}

/// The per-backend entry: the private supertrait of [`RunIndexer`](super::RunIndexer).
pub trait IndexerEntry: Backend + Sized {
    /// Selects one checked call's top-k rows.
    ///
    /// # Safety
    /// `call` was assembled by `LightningIndexer::run`: `H_IDX` is 32 or 64 and `TOPK` a
    /// multiple of 128 up to 2048; the slices hold the extents in `IndexerCall`'s comments;
    /// `tokens` and `s_kv` are at most `i32::MAX`.
    unsafe fn lightning_indexer<const H_IDX: usize, const TOPK: usize>(
        &self,
        call: IndexerCall<'_, Self>,
    ) -> Result<()>;

    /// How this backend splits a paged call of `batch` sequences of `next_n` query tokens
    /// over block tables of `max_pages` pages at top-k `topk`.
    fn paged_indexer_plan(
        &self,
        batch: usize,
        next_n: usize,
        max_pages: usize,
        topk: usize,
    ) -> PagedPlan;

    /// Selects one checked paged call's top-k cache slots.
    ///
    /// # Safety
    /// `call` was assembled by `LightningIndexer::run_paged`: the rules hold as above and
    /// `PAGE` is 64; the slices hold the extents in `PagedIndexerCall`'s comments; `next_n` is
    /// 1 ..= 4, `tokens`, `batch` and `64 · max_pages` are at most `i32::MAX`, the cache's slots
    /// too; the workspace was planned by this backend for this call's `(B, next_n, max_pages)`
    /// and `TOPK`.
    unsafe fn paged_lightning_indexer<const H_IDX: usize, const TOPK: usize, const PAGE: usize>(
        &self,
        call: PagedIndexerCall<'_, Self>,
    ) -> Result<()>;
}
