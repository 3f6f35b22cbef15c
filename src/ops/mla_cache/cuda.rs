//! CUDA launches of [`MlaCacheStore`] and [`MlaCacheGather`] (`kernels/mla_cache.cu`), and
//! their CUDA-only entries `record`.

use std::marker::PhantomData;

use super::launch::{MlaCacheEntry, MlaGatherCall, MlaStoreCall};
use super::{MlaCacheGather, MlaCacheStore, MlaKvRows, RunMlaCache};
use crate::backend::Cuda;
use crate::backend::cuda::{
    CudaKernel, DeviceArgs, GraphRead, GraphRecorder, IsCuda, LaunchShape, Recorded, read_ref,
};
use crate::dim::Dim;
use crate::error::Result;
use crate::layout::{MLA_CACHE_DIM, MlaFp8KvCache, MlaLatentKv};
use crate::ops::counter::ErrorCounter;
use crate::tensor::{Scalar, Storage, StorageMut, Tensor};

/// Threads per block of both kernels: eight warps.
const THREADS: u32 = 256;
/// Warps a block.
const WARPS: usize = (THREADS / 32) as usize;
/// Consecutive rows a warp takes in a long call (its loads all in flight together); a short
/// call takes one a warp, to spread over as many SMs as it can.
const LONG_ROWS_PER_WARP: usize = 4;
/// Rows from which a call is long: four rows a warp still fill every SM of an H200 (132 SMs ×
/// 8 blocks of 8 warps).
const LONG_CALL_ROWS: usize = 132 * 8 * WARPS * LONG_ROWS_PER_WARP;

crate::param_block! {
    /// The store's parameter block (`struct MlaCacheStoreParams`), field for field.
    pub struct MlaCacheStoreParams {
        kv: u64,
        loc: u64,
        cache: u64,
        skipped: u64,
        tokens: i32,
        slots: i32,
    }
}

crate::param_block! {
    /// The gather's parameter block (`struct MlaCacheGatherParams`), field for field.
    pub struct MlaCacheGatherParams {
        cache: u64,
        index: u64,
        data: u64,
        scale: u64,
        skipped: u64,
        rows: i32,
        slots: i32,
    }
}

/// `mla_cache_store_kernel<GROUP, ROWS>`: `ROWS` tokens a warp, 16-byte loads.
pub struct MlaCacheStoreKernel<const GROUP: usize, const ROWS: usize>(
    PhantomData<(Dim<GROUP>, Dim<ROWS>)>,
);

impl<const GROUP: usize, const ROWS: usize> CudaKernel for MlaCacheStoreKernel<GROUP, ROWS> {
    const SOURCE: &'static str = include_str!("../../../kernels/mla_cache.cu");
    type Params = MlaCacheStoreParams;
    fn instantiation() -> String {
        format!("mla_cache_store_kernel<{GROUP}, {ROWS}>")
    }
}

/// `mla_cache_gather_kernel<GROUP, ROWS>`: `ROWS` rows a warp, 16-byte loads and stores.
pub struct MlaCacheGatherKernel<const GROUP: usize, const ROWS: usize>(
    PhantomData<(Dim<GROUP>, Dim<ROWS>)>,
);

impl<const GROUP: usize, const ROWS: usize> CudaKernel for MlaCacheGatherKernel<GROUP, ROWS> {
    const SOURCE: &'static str = include_str!("../../../kernels/mla_cache.cu");
    type Params = MlaCacheGatherParams;
    fn instantiation() -> String {
        format!("mla_cache_gather_kernel<{GROUP}, {ROWS}>")
    }
}

/// The launch shape of `rows` rows, `per_warp` a warp (at least one block, so the gather
/// always sets the workspace's scale).
fn shape(rows: usize, per_warp: usize) -> LaunchShape {
    LaunchShape {
        grid: (rows.div_ceil(WARPS * per_warp).max(1) as u32, 1, 1),
        block: (THREADS, 1, 1),
        smem_bytes: 0,
    }
}

/// The CUDA launches run the ops.
impl RunMlaCache for Cuda {}

impl MlaCacheEntry for Cuda {
    unsafe fn mla_cache_store<const GROUP: usize>(
        &self,
        call: MlaStoreCall<'_, Cuda>,
    ) -> Result<()> {
        let MlaStoreCall {
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
        let params = MlaCacheStoreParams {
            kv: args.read_vectors("kv", &rows.kv)?,
            loc: args.read("loc", &rows.loc)?,
            cache: args.write_vectors("kv_cache", &mut cache)?,
            skipped: args.write_opt("skipped", skipped.as_mut())?,
            tokens: tokens as i32,
            slots: slots as i32,
        };
        // SAFETY: kv holds tokens × 576 values and loc tokens slots (tied by `MlaKvRows`), the
        // cache slots × 656 bytes; the kernel writes a row only for 0 <= loc < slots and
        // touches no token at or past `tokens`.
        unsafe {
            if tokens >= LONG_CALL_ROWS {
                args.launch::<MlaCacheStoreKernel<GROUP, LONG_ROWS_PER_WARP>>(
                    shape(tokens, LONG_ROWS_PER_WARP),
                    &params,
                )
            } else {
                args.launch::<MlaCacheStoreKernel<GROUP, 1>>(shape(tokens, 1), &params)
            }
        }
    }

    unsafe fn mla_cache_gather<const GROUP: usize>(
        &self,
        call: MlaGatherCall<'_, Cuda>,
    ) -> Result<()> {
        let MlaGatherCall {
            rows,
            slots,
            cache,
            index,
            mut data,
            mut scale,
            mut skipped,
        } = call;
        let mut args = DeviceArgs::new(self)?;
        let params = MlaCacheGatherParams {
            cache: args.read_vectors("kv_cache", &cache)?,
            index: args.read("index", &index)?,
            data: args.write_vectors("workspace", &mut data)?,
            scale: args.write("workspace scale", &mut scale)?,
            skipped: args.write_opt("skipped", skipped.as_mut())?,
            rows: rows as i32,
            slots: slots as i32,
        };
        // SAFETY: index holds `rows` slots and data rows × 576 bytes (tied by `run`), scale one
        // value, the cache slots × 656 bytes; the kernel reads a cache row only for
        // 0 <= index < slots and touches no row at or past `rows`.
        unsafe {
            if rows >= LONG_CALL_ROWS {
                args.launch::<MlaCacheGatherKernel<GROUP, LONG_ROWS_PER_WARP>>(
                    shape(rows, LONG_ROWS_PER_WARP),
                    &params,
                )
            } else {
                args.launch::<MlaCacheGatherKernel<GROUP, 1>>(shape(rows, 1), &params)
            }
        }
    }
}

impl<const PAGE: usize, const GROUP: usize> MlaCacheStore<PAGE, GROUP> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the rows, the cache and the counter until it is dropped, so none can
    /// be freed or swapped while it can replay.
    ///
    /// Returns the cache, read-only for the graph's life and readable only by later `record`s
    /// ([`Recorded`]): what the step's later launches in the
    /// same graph read it through (the decode's `record`, the gather's), so one graph holds a
    /// decode step's store and its attention.
    pub fn record<'g, B: RunMlaCache + IsCuda, SR: Storage<B>, SC: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        rows: &'g MlaKvRows<B, SR>,
        cache: &'g mut MlaFp8KvCache<B, PAGE, GROUP, SC>,
        skipped: Option<&'g mut ErrorCounter<B>>,
    ) -> Result<Recorded<'g, MlaFp8KvCache<B, PAGE, GROUP, SC>>> {
        graph.record(|cuda: &B| self.run(cuda, rows, &mut *cache, skipped))?;
        Ok(Recorded::new(cache))
    }
}

impl<const PAGE: usize, const GROUP: usize> MlaCacheGather<PAGE, GROUP> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the cache, the slots, the workspace and the counter until it is
    /// dropped.
    pub fn record<
        'g,
        B: RunMlaCache + IsCuda,
        SC: Storage<B> + 'g,
        SI: Storage<B>,
        SW: StorageMut<B>,
    >(
        &self,
        graph: &mut GraphRecorder<'g>,
        cache: impl Into<GraphRead<'g, MlaFp8KvCache<B, PAGE, GROUP, SC>>>,
        index: &'g Tensor<B, i32, Scalar, SI>,
        workspace: &'g mut MlaLatentKv<B, MLA_CACHE_DIM, SW>,
        skipped: Option<&'g mut ErrorCounter<B>>,
    ) -> Result<()> {
        let cache = read_ref(cache);
        graph.record(|cuda: &B| self.run(cuda, cache, index, workspace, skipped))
    }
}
