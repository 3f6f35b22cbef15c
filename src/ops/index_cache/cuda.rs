//! CUDA launch of [`IndexKeyStore`] (`kernels/index_cache.cu`), and its CUDA-only entry
//! [`IndexKeyStore::record`].

use std::marker::PhantomData;

use super::launch::{IndexCacheEntry, IndexGatherCall, IndexStoreCall};
use super::{IndexKeyGather, IndexKeyRows, IndexKeyStore, RunIndexCache};
use crate::backend::Cuda;
use crate::backend::cuda::{
    CudaKernel, DeviceArgs, GraphRead, GraphRecorder, IsCuda, LaunchShape, Recorded, read_ref,
};
use crate::dim::Dim;
use crate::dtype::F8E4M3;
use crate::error::Result;
use crate::layout::INDEX_KEY_DIM;
use crate::layout::IndexKeyCache;
use crate::ops::counter::ErrorCounter;
use crate::tensor::{Cols, Scalar, Storage, StorageMut, Tensor};

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

crate::param_block! {
    /// The gather's parameter block (`struct IndexKeyGatherParams`), field for field.
    pub struct IndexKeyGatherParams {
        cache: u64,
        index: u64,
        k: u64,
        k_scale: u64,
        skipped: u64,
        rows: i32,
        slots: i32,
    }
}

/// `index_key_gather_kernel<PAGE>`: one row a warp.
pub struct IndexKeyGatherKernel<const PAGE: usize>(PhantomData<Dim<PAGE>>);

impl<const PAGE: usize> CudaKernel for IndexKeyGatherKernel<PAGE> {
    const SOURCE: &'static str = include_str!("../../../kernels/index_cache.cu");
    type Params = IndexKeyGatherParams;
    fn instantiation() -> String {
        format!("index_key_gather_kernel<{PAGE}>")
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

    unsafe fn index_key_gather<const PAGE: usize>(
        &self,
        call: IndexGatherCall<'_, Cuda>,
    ) -> Result<()> {
        let IndexGatherCall {
            rows,
            slots,
            cache,
            index,
            mut k,
            mut k_scale,
            mut skipped,
        } = call;
        if rows == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = IndexKeyGatherParams {
            cache: args.read_vectors("index_cache", &cache)?,
            index: args.read("index", &index)?,
            k: args.write_vectors("k", &mut k)?,
            k_scale: args.write("k_scale", &mut k_scale)?,
            skipped: args.write_opt("skipped", skipped.as_mut())?,
            rows: rows as i32,
            slots: slots as i32,
        };
        let shape = LaunchShape {
            grid: (rows.div_ceil(TOKENS_PER_BLOCK) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: index holds `rows` slots, k rows × 128 bytes and k_scale `rows` values (tied
        // by `run`), the cache slots / 64 pages of 8448 bytes; the kernel reads the cache only
        // for 0 <= slot < slots and touches no row at or past `rows`.
        unsafe { args.launch::<IndexKeyGatherKernel<PAGE>>(shape, &params) }
    }
}

impl<const PAGE: usize> IndexKeyStore<PAGE> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the keys, the cache and the counter until it is dropped, so none can
    /// be freed or swapped while it can replay.
    ///
    /// Returns the cache, read-only for the graph's life and readable only by later `record`s
    /// ([`Recorded`]): what the step's later launches in the
    /// same graph read it through (the paged indexer's `record_paged`, the gather's `record`),
    /// so one graph holds a decode step's store and its reads.
    pub fn record<'g, B: RunIndexCache + IsCuda, SR: Storage<B>, SC: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        rows: &'g IndexKeyRows<B, SR>,
        cache: &'g mut IndexKeyCache<B, PAGE, SC>,
        skipped: Option<&'g mut ErrorCounter<B>>,
    ) -> Result<Recorded<'g, IndexKeyCache<B, PAGE, SC>>> {
        graph.record(|cuda: &B| self.run(cuda, rows, &mut *cache, skipped))?;
        Ok(Recorded::new(cache))
    }
}

impl<const PAGE: usize> IndexKeyGather<PAGE> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the cache, the slots, the outputs and the counter until it is dropped.
    pub fn record<'g, B, SC, SI, SK>(
        &self,
        graph: &mut GraphRecorder<'g>,
        cache: impl Into<GraphRead<'g, IndexKeyCache<B, PAGE, SC>>>,
        index: &'g Tensor<B, i32, Scalar, SI>,
        k: &'g mut Tensor<B, F8E4M3, Cols<INDEX_KEY_DIM>, SK>,
        k_scale: &'g mut Tensor<B, f32, Scalar, SK>,
        skipped: Option<&'g mut ErrorCounter<B>>,
    ) -> Result<()>
    where
        B: RunIndexCache + IsCuda,
        SC: Storage<B> + 'g,
        SI: Storage<B>,
        SK: StorageMut<B>,
    {
        let cache = read_ref(cache);
        graph.record(|cuda: &B| self.run(cuda, cache, index, k, k_scale, skipped))
    }
}
