//! CUDA launch of [`IndexKeyStore`] (`kernels/index_cache.cu`), and its CUDA-only entry
//! [`IndexKeyStore::record`].

use std::marker::PhantomData;

use super::launch::{IndexCacheEntry, IndexStoreCall};
use super::{IndexKeyRows, IndexKeyStore, RunIndexCache};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::dim::Dim;
use crate::error::Result;
use crate::layout::IndexKeyCache;
use crate::ops::counter::ErrorCounter;
use crate::tensor::{Storage, StorageMut};

/// Threads per block: eight warps, one token each.
const THREADS: u32 = 256;
/// Tokens a block.
const TOKENS_PER_BLOCK: usize = (THREADS / 32) as usize;

crate::param_block! {
    /// The store's parameter block (`struct IndexKeyStoreParams`), field for field.
    pub struct IndexKeyStoreParams {
        k: u64,
        loc: u64,
        cache: u64,
        skipped: u64,
        tokens: i32,
        slots: i32,
    }
}

/// `index_key_store_kernel<PAGE>`: one token a warp.
pub struct IndexKeyStoreKernel<const PAGE: usize>(PhantomData<Dim<PAGE>>);

impl<const PAGE: usize> CudaKernel for IndexKeyStoreKernel<PAGE> {
    const SOURCE: &'static str = include_str!("../../../kernels/index_cache.cu");
    type Params = IndexKeyStoreParams;
    fn instantiation() -> String {
        format!("index_key_store_kernel<{PAGE}>")
    }
}

/// The CUDA launch runs the op.
impl RunIndexCache for Cuda {}

impl IndexCacheEntry for Cuda {
    unsafe fn index_key_store<const PAGE: usize>(
        &self,
        call: IndexStoreCall<'_, Cuda>,
    ) -> Result<()> {
        let IndexStoreCall {
            tokens,
            slots,
            rows,
            mut cache,
            mut skipped,
        } = call;
        if tokens == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = IndexKeyStoreParams {
            k: args.read_vectors("k", &rows.k)?,
            loc: args.read("loc", &rows.loc)?,
            cache: args.write_vectors("index_cache", &mut cache)?,
            skipped: args.write_opt("skipped", skipped.as_mut())?,
            tokens: tokens as i32,
            slots: slots as i32,
        };
        let shape = LaunchShape {
            grid: (tokens.div_ceil(TOKENS_PER_BLOCK) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: k holds tokens × 128 values and loc tokens slots (tied by `IndexKeyRows`),
        // the cache slots / 64 pages of 8448 bytes; the kernel writes a key only for
        // 0 <= loc < slots and touches no token at or past `tokens`.
        unsafe { args.launch::<IndexKeyStoreKernel<PAGE>>(shape, &params) }
    }
}

impl<const PAGE: usize> IndexKeyStore<PAGE> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the keys, the cache and the counter until it is dropped, so none can
    /// be freed or swapped while it can replay.
    pub fn record<'g, B: RunIndexCache + IsCuda, SR: Storage<B>, SC: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        rows: &'g IndexKeyRows<B, SR>,
        cache: &'g mut IndexKeyCache<B, PAGE, SC>,
        skipped: Option<&'g mut ErrorCounter<B>>,
    ) -> Result<()> {
        graph.record(|cuda: &B| self.run(cuda, rows, cache, skipped))
    }
}
