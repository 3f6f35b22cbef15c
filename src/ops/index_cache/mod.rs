//! The lightning indexer's paged key cache, written and read (docs/kernels/indexer.md §7.8):
//! [`IndexKeyStore`] quantizes a step's index keys into their slots of an [`IndexKeyCache`],
//! which [`LightningIndexer::run_paged`](crate::ops::indexer::LightningIndexer::run_paged)
//! reads; [`IndexKeyGather`] copies a list of slots back into the rows of keys and scales the
//! prefill form takes ([`IndexKeys`](crate::ops::indexer::IndexKeys)), for a chunk whose
//! history is in the cache.
//!
//! Both are exact: the GPU writes the bytes the CPU reference writes. Slots not named are never
//! touched; a slot past the cache is skipped (the gather writes a zero row) and counted.
//!
//! Files: this module the op type and its `run`; `args.rs` the checked keys; `launch.rs` the
//! call and the sealed entry; `cpu.rs` the reference; `cuda.rs` the launch (and the CUDA-only
//! `record`).

mod args;
mod cpu;
mod cuda;
mod launch;

pub use args::{IndexKeyRowParts, IndexKeyRows};
pub use cuda::{IndexKeyGatherKernel, IndexKeyStoreKernel};

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::dtype::F8E4M3;
use crate::error::Error;
use crate::error::Result;
use crate::layout::INDEX_KEY_DIM;
use crate::layout::IndexKeyCache;
use crate::ops::counter::ErrorCounter;
use crate::rules::IndexCachePage;
use crate::tensor::{Cols, Scalar, Storage, StorageMut, Tensor};

/// Writes tokens' index keys into an index-key cache of pages of `PAGE` tokens (64: DeepSeek
/// V3.2's and GLM-5's).
#[derive(Clone, Copy, Debug)]
pub struct IndexKeyStore<const PAGE: usize> {
    _dims: PhantomData<Dim<PAGE>>,
}

/// Copies rows of an index-key cache of pages of `PAGE` tokens into contiguous keys and scales.
#[derive(Clone, Copy, Debug)]
pub struct IndexKeyGather<const PAGE: usize> {
    _dims: PhantomData<Dim<PAGE>>,
}

/// A backend that can write the index-key cache: the CPU reference and CUDA. Sealed: its entry
/// takes calls only [`IndexKeyStore::run`] can assemble.
pub trait RunIndexCache: Backend + Sized + launch::IndexCacheEntry {}

impl<const PAGE: usize> IndexKeyStore<PAGE> {
    /// The store. Checked: the cache's page size.
    pub fn new() -> Self
    where
        Dim<PAGE>: IndexCachePage,
    {
        Self { _dims: PhantomData }
    }

    /// Quantizes every token's key of `rows` into its slot `loc[t]` of `cache`
    /// (docs/kernels/indexer.md §6): the key's e4m3 bytes and its power-of-two scale
    /// ([`index_key_encode`](crate::layout::index_key_encode)). A negative `loc` is not stored;
    /// a `loc` at or past the cache's slots is not stored and is counted in `skipped` (when
    /// given). Slots no token names keep their bytes. Two tokens of one call naming the same
    /// slot leave it holding bytes of either (on the CPU: the later token's).
    pub fn run<B: RunIndexCache, SR: Storage<B>, SC: StorageMut<B>>(
        &self,
        backend: &B,
        rows: &IndexKeyRows<B, SR>,
        cache: &mut IndexKeyCache<B, PAGE, SC>,
        skipped: Option<&mut ErrorCounter<B>>,
    ) -> Result<()> {
        // SAFETY: the rule holds (`new`'s bound: pages of 64 slots); `rows` ties k and loc to
        // T ≤ i32::MAX tokens and the cache holds `slots` ≤ i32::MAX slots (both checked when
        // made); the counter is one value.
        unsafe {
            backend.index_key_store::<PAGE>(launch::IndexStoreCall {
                tokens: rows.tokens(),
                slots: cache.slots(),
                rows: rows.slices(),
                cache: cache.slice_mut(),
                skipped: skipped.map(|c| c.slice_mut()),
            })
        }
    }
}

impl<const PAGE: usize> IndexKeyGather<PAGE> {
    /// The gather. Checked: the cache's page size.
    pub fn new() -> Self
    where
        Dim<PAGE>: IndexCachePage,
    {
        Self { _dims: PhantomData }
    }

    /// Writes row `i` of `k` (`[n, 128]`) and of `k_scale` (`[n]`) from slot `index[i]` of
    /// `cache`, byte for byte. A negative slot gives a zero row and scale; a slot at or past the
    /// cache's slots gives a zero row and scale and is counted in `skipped` (when given). Then
    /// `IndexKeys::new(k, k_scale)` is the prefill indexer's keys.
    pub fn run<B: RunIndexCache, SC: Storage<B>, SI: Storage<B>, SK: StorageMut<B>>(
        &self,
        backend: &B,
        cache: &IndexKeyCache<B, PAGE, SC>,
        index: &Tensor<B, i32, Scalar, SI>,
        k: &mut Tensor<B, F8E4M3, Cols<INDEX_KEY_DIM>, SK>,
        k_scale: &mut Tensor<B, f32, Scalar, SK>,
        skipped: Option<&mut ErrorCounter<B>>,
    ) -> Result<()> {
        let rows = index.rows();
        k.expect_rows("k", "rows (one a slot of index)", rows)?;
        k_scale.expect_rows("k_scale", "rows (one a slot of index)", rows)?;
        Error::to_i32("index", rows)?;
        // SAFETY: the rule holds (`new`'s bound); k has a row of 128 bytes and k_scale a value
        // for each of the `rows` ≤ i32::MAX slots of index; the cache holds `slots` ≤ i32::MAX
        // slots; the counter is one value.
        unsafe {
            backend.index_key_gather::<PAGE>(launch::IndexGatherCall {
                rows,
                slots: cache.slots(),
                cache: cache.slice(),
                index: index.as_slice(),
                k: k.as_slice_mut(),
                k_scale: k_scale.as_slice_mut(),
                skipped: skipped.map(|c| c.slice_mut()),
            })
        }
    }
}
