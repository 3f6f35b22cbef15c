//! DeepSeek V3.2's FP8 sparse MLA cache, written and read (docs/kernels/mla_cache.md):
//! [`MlaCacheStore`] quantizes a step's latent rows into their slots of an
//! [`MlaFp8KvCache`], and [`MlaCacheGather`] builds the e4m3 workspace the sparse MLA prefill
//! reads ([`MlaLatentKv`], identity scale) from a list of slots — a sequence's tokens in
//! order, so the indexer's positions index the workspace as they are.
//!
//! Both are exact: the GPU writes the bytes the CPU reference writes. Slots not named are never
//! touched; a slot past the cache is skipped (the gather writes a zero row) and counted.
//!
//! Files: this module the op types and their `run`; `args.rs` the store's checked rows;
//! `launch.rs` the calls and the sealed entry; `cpu.rs` the reference; `cuda.rs` the launches
//! (and the CUDA-only `record`).

mod args;
mod cpu;
mod cuda;
mod launch;

pub use args::{MlaKvRowParts, MlaKvRows};
pub use cuda::{MlaCacheGatherKernel, MlaCacheStoreKernel};

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::error::{Error, Result};
use crate::layout::{MLA_CACHE_DIM, MlaFp8KvCache, MlaLatentKv};
use crate::ops::counter::ErrorCounter;
use crate::rules::{MlaCachePage, MlaScaleGroup};
use crate::tensor::{Scalar, Storage, StorageMut, Tensor};

/// Writes tokens' latent rows into an FP8 sparse MLA cache of pages of `PAGE` tokens and scale
/// groups of `GROUP` channels (64 and 128: DeepSeek V3.2's format).
#[derive(Clone, Copy, Debug)]
pub struct MlaCacheStore<const PAGE: usize, const GROUP: usize> {
    _dims: PhantomData<(Dim<PAGE>, Dim<GROUP>)>,
}

/// Gathers rows of an FP8 sparse MLA cache into the e4m3 workspace of the sparse MLA prefill.
#[derive(Clone, Copy, Debug)]
pub struct MlaCacheGather<const PAGE: usize, const GROUP: usize> {
    _dims: PhantomData<(Dim<PAGE>, Dim<GROUP>)>,
}

/// A backend that can write and read the FP8 sparse MLA cache: the CPU reference and CUDA.
/// Sealed: its entry takes calls only the ops' `run` can assemble.
pub trait RunMlaCache: Backend + Sized + launch::MlaCacheEntry {}

impl<const PAGE: usize, const GROUP: usize> MlaCacheStore<PAGE, GROUP> {
    /// The store. Checked: the cache format's page size and scale groups.
    pub fn new() -> Self
    where
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        Self { _dims: PhantomData }
    }

    /// Quantizes every token of `rows` into its slot `loc[t]` of `cache`
    /// (docs/kernels/mla_cache.md §2). A negative `loc` is not stored; a `loc` at or past the
    /// cache's slots is not stored and is counted in `skipped` (when given). Slots no token
    /// names keep their bytes. Two tokens of one call naming the same slot leave it holding,
    /// 16 bytes at a time, bytes of either (on the CPU: the later token's row).
    pub fn run<B: RunMlaCache, SR: Storage<B>, SC: StorageMut<B>>(
        &self,
        backend: &B,
        rows: &MlaKvRows<B, SR>,
        cache: &mut MlaFp8KvCache<B, PAGE, GROUP, SC>,
        skipped: Option<&mut ErrorCounter<B>>,
    ) -> Result<()> {
        // SAFETY: the rules hold (`new`'s bounds: rows of 656 bytes); `rows` ties kv and loc to
        // T ≤ i32::MAX tokens and the cache holds `slots` ≤ i32::MAX rows (both checked when
        // made); the counter is one value.
        unsafe {
            backend.mla_cache_store::<GROUP>(launch::MlaStoreCall {
                tokens: rows.tokens(),
                slots: cache.slots(),
                rows: rows.slices(),
                cache: cache.slice_mut(),
                skipped: skipped.map(|c| c.slice_mut()),
            })
        }
    }
}

impl<const PAGE: usize, const GROUP: usize> MlaCacheGather<PAGE, GROUP> {
    /// The gather. Checked: the cache format's page size and scale groups.
    pub fn new() -> Self
    where
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        Self { _dims: PhantomData }
    }

    /// Writes row `i` of `workspace` from slot `index[i]` of `cache` (docs/kernels/mla_cache.md
    /// §3): each latent value dequantized (`e4m3 · scale`) and cast back to e4m3, each RoPE
    /// value cast from bf16 to e4m3 (round to nearest even, saturating at ±448), and the
    /// workspace's scale set to 1. A negative slot gives a zero row; a slot at or past the
    /// cache's slots gives a zero row and is counted in `skipped` (when given).
    ///
    /// `workspace` must have exactly one row a slot of `index`.
    pub fn run<B: RunMlaCache, SC: Storage<B>, SI: Storage<B>, SW: StorageMut<B>>(
        &self,
        backend: &B,
        cache: &MlaFp8KvCache<B, PAGE, GROUP, SC>,
        index: &Tensor<B, i32, Scalar, SI>,
        workspace: &mut MlaLatentKv<B, MLA_CACHE_DIM, SW>,
        skipped: Option<&mut ErrorCounter<B>>,
    ) -> Result<()> {
        Error::check_extent(
            "workspace",
            "rows (one a slot of index)",
            index.rows(),
            workspace.len(),
        )?;
        let (data, scale) = workspace.slices_mut();
        // SAFETY: the rules hold (`new`'s bounds); `workspace` has a row of 576 for each of the
        // `index.rows()` ≤ i32::MAX slots (checked above and when it was made) and one scale;
        // the cache holds `slots` ≤ i32::MAX rows of 656 bytes.
        unsafe {
            backend.mla_cache_gather::<GROUP>(launch::MlaGatherCall {
                rows: index.rows(),
                slots: cache.slots(),
                cache: cache.slice(),
                index: index.as_slice(),
                data,
                scale,
                skipped: skipped.map(|c| c.slice_mut()),
            })
        }
    }
}
