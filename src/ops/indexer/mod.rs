//! The lightning indexer of DeepSeek Sparse Attention, prefill form (docs/kernels/indexer.md):
//! for every query token, the `TOPK` positions of its valid key range with the largest
//! `logit[t, s] = k_scale[s] · Σ_h w[t, h] · relu(q[t, h] · k[s])` (e4m3 q and k of
//! [`INDEX_HEAD_DIM`] channels), as the `[T, TOPK]` i32 rows the sparse MLA prefill takes:
//! [`LightningIndexer::run`] writes a `Tensor<B, i32, Cols<TOPK>>`, which
//! [`SparseMlaInputs::new`](crate::ops::sparse_mla::SparseMlaInputs::new) accepts as it is.
//!
//! [`LightningIndexer::run_paged`] is the decode form: the `next_n` newest tokens of each
//! sequence score the keys of its earlier positions in a paged [`IndexKeyCache`] (written by
//! [`IndexKeyStore`](crate::ops::index_cache::IndexKeyStore)), and the rows it writes are cache
//! slots, the indices [`SparseMlaDecode`](crate::ops::sparse_mla_decode::SparseMlaDecode)
//! takes.
//!
//! The selection is exact and deterministic: ties go to the lower position, the positions of a
//! row are written in ascending order, and -1 fills the row where fewer positions are valid. A
//! logit orders as its f32 value with -0 below +0 and NaN below every number.
//!
//! Files: this module the kernel type, its rules and `run`; `args.rs` the checked queries and
//! keys; `launch.rs` the call and the sealed entry; `cpu.rs` the reference; `cuda.rs` the launch
//! (and the CUDA-only `record`).

mod args;
mod cpu;
mod cuda;
mod launch;

pub use args::{
    IndexKeyParts, IndexKeys, IndexerQueries, IndexerQueryParts, MAX_NEXT_N, PagedIndexerQueries,
    PagedIndexerQueryParts, PagedIndexerWorkspace,
};
pub(crate) use cpu::select_top;
pub use cpu::{indexer_logit, order_key};
pub use cuda::{
    IndexerParams, LightningIndexerKernel, PagedIndexerMergeKernel, PagedLightningIndexerKernel,
    indexer_candidates, indexer_merge_smem_bytes, indexer_smem_bytes, merge_fan, merge_lists_a_cta,
    paged_indexer_split, prefill_indexer_launch_shape, prefill_indexer_smem_bytes,
};

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::error::Result;
use crate::layout::IndexKeyCache;
use crate::rules::{IndexCachePage, IndexerHeads, IndexerTopk};
use crate::tensor::{Cols, RowShape, Storage, StorageMut, Tensor};
use launch::{IndexerCall, PagedIndexerCall};

/// Channels of one index head and of one index key: the e4m3 bytes of a key row.
pub const INDEX_HEAD_DIM: usize = shapeproof_rules::INDEX_HEAD_DIM;

/// One query token of the indexer's q, `[H_IDX, 128]` e4m3.
pub struct IndexQRow<const H_IDX: usize>;
impl<const H_IDX: usize> RowShape for IndexQRow<H_IDX> {
    const COLS: usize = H_IDX * INDEX_HEAD_DIM;
}

/// The lightning indexer with `H_IDX` index heads (32 or 64) selecting `TOPK` positions a query
/// token (a multiple of 128 up to 2048).
#[derive(Clone, Copy, Debug)]
pub struct LightningIndexer<const H_IDX: usize, const TOPK: usize> {
    _dims: PhantomData<(Dim<H_IDX>, Dim<TOPK>)>,
}

/// A backend that can run the lightning indexer: the CPU reference and CUDA. Sealed: its entry
/// takes a call only [`LightningIndexer::run`] can assemble.
pub trait RunIndexer: Backend + Sized + launch::IndexerEntry {}

impl<const H_IDX: usize, const TOPK: usize> LightningIndexer<H_IDX, TOPK> {
    /// The indexer. Checked: `H_IDX` is 32 or 64, `TOPK` a multiple of 128 up to 2048.
    pub fn new() -> Self
    where
        Dim<H_IDX>: IndexerHeads,
        Dim<TOPK>: IndexerTopk,
    {
        Self { _dims: PhantomData }
    }

    /// FLOPs of the logits over `valid_pairs` (query token, key position) pairs, counted as
    /// `2·H_IDX·128` a pair: the q·k products and their sums, as published indexers count them.
    pub fn flops(valid_pairs: u64) -> f64 {
        2.0 * H_IDX as f64 * INDEX_HEAD_DIM as f64 * valid_pairs as f64
    }

    /// Selects every query token's top-`TOPK` key positions into `indices` (`[T, TOPK]`, one
    /// row a query token): the rows of `keys` in the token's range `[key_start, key_end)` (each
    /// clamped to `[0, s_kv]`; an empty range gives a row of -1) with the largest logits.
    ///
    /// The queries, the keys and `indices` can each be owned or views of the caller's buffers.
    ///
    /// # Errors
    /// `indices` without a row for every query token. On CUDA, a view whose address breaks its
    /// copies' alignment: `k` must start on a multiple of 128 bytes (the kernel copies its rows
    /// by TMA in the 128-byte swizzle; an owned buffer and any view starting at a whole row of
    /// one always do), `q` on a multiple of 16; each `Err` names the parameter.
    pub fn run<B: RunIndexer, SQ: Storage<B>, SK: Storage<B>, SO: StorageMut<B>>(
        &self,
        backend: &B,
        queries: &IndexerQueries<B, H_IDX, SQ>,
        keys: &IndexKeys<B, SK>,
        indices: &mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()> {
        let tokens = queries.tokens();
        indices.expect_rows("indices", "query tokens (as q)", tokens)?;
        // SAFETY: the rules hold (`new`'s bounds); the queries and keys tie their own extents
        // (both at most i32::MAX rows) and `indices` has a row for every query token.
        unsafe {
            backend.lightning_indexer::<H_IDX, TOPK>(IndexerCall {
                tokens,
                s_kv: keys.len(),
                queries: queries.slices(),
                keys: keys.slices(),
                indices: indices.as_slice_mut(),
            })
        }
    }

    /// Selects every query token's top-`TOPK` cache slots into `indices` (`[B · next_n, TOPK]`,
    /// one row a query token, a sequence's `next_n` rows together): token `j` of sequence `b`
    /// scores positions `[0, seq_lens[b] − next_n + j + 1)` (clamped to `[0, 64 · max_pages]`),
    /// position `s` being offset `s % 64` of page `block_table[b, s / 64]` of `cache`; a page
    /// outside the cache holds no key and its positions are never selected. A row holds the
    /// chosen positions' slots (`page · 64 + s % 64`) by ascending position, then -1.
    ///
    /// `workspace` is the scratch made for this batch shape
    /// ([`PagedIndexerWorkspace::new`]); a batch too small to fill the GPU splits each
    /// sequence's positions over several CTAs and merges their candidates there.
    ///
    /// # Errors
    /// `indices` without a row for every query token, or `workspace` made for another batch
    /// shape. On CUDA, a view whose address breaks its copies' alignment: the cache's bytes
    /// (`index_cache`) must start on a multiple of 128 bytes (the kernel copies each page's
    /// key tile by TMA in the 128-byte swizzle; an owned cache and any view starting at a
    /// whole page of one always do), `q` on a multiple of 16; each `Err` names the parameter.
    pub fn run_paged<
        B: RunIndexer,
        const PAGE: usize,
        SQ: Storage<B>,
        SK: Storage<B>,
        SO: StorageMut<B>,
    >(
        &self,
        backend: &B,
        queries: &PagedIndexerQueries<B, H_IDX, SQ>,
        cache: &IndexKeyCache<B, PAGE, SK>,
        workspace: &mut PagedIndexerWorkspace<B, TOPK>,
        indices: &mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()>
    where
        Dim<PAGE>: IndexCachePage,
    {
        let tokens = queries.tokens();
        indices.expect_rows("indices", "query tokens (B · next_n, as q)", tokens)?;
        workspace.check(queries)?;
        // SAFETY: the rules hold (`new`'s bounds and this method's); the queries tie q, the
        // weights, the block table and the lengths to one (B, next_n, max_pages) with next_n in
        // 1 ..= 4 and every count within i32, the cache holds `pages` pages of slots within
        // i32, and `indices` has a row for every query token.
        unsafe {
            backend.paged_lightning_indexer::<H_IDX, TOPK, PAGE>(PagedIndexerCall {
                tokens,
                batch: queries.batch(),
                pages: cache.pages(),
                queries: queries.slices(),
                cache: cache.slice(),
                indices: indices.as_slice_mut(),
                workspace: workspace.slices_mut(),
            })
        }
    }
}
