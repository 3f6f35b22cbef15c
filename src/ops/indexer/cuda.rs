//! CUDA launch of [`LightningIndexer`] (`kernels/lightning_indexer.cu`), and its CUDA-only entry
//! [`LightningIndexer::record`].

use std::marker::PhantomData;

use super::launch::{IndexerCall, IndexerEntry, PagedIndexerCall};
use super::{IndexKeys, IndexerQueries, LightningIndexer, PagedIndexerQueries, RunIndexer};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::dim::Dim;
use crate::error::Result;
use crate::layout::IndexKeyCache;
use crate::rules::IndexCachePage;
use crate::tensor::{Cols, Storage, StorageMut, Tensor};

/// Threads per CTA: one warpgroup (`indexer::kThreads`).
const THREADS: u32 = 128;
/// Query tokens a CTA takes (`indexer::kTokens`).
const TOKENS_PER_CTA: usize = 2;

crate::param_block! {
    /// The kernel's parameter block (`struct IndexerParams`), field for field.
    pub struct IndexerParams {
        q: u64,
        weights: u64,
        key_start: u64,
        key_end: u64,
        k: u64,
        k_scale: u64,
        indices: u64,
        tokens: i32,
        s_kv: i32,
    }
}

crate::param_block! {
    /// The paged kernel's parameter block (`struct PagedIndexerParams`), field for field.
    pub struct PagedIndexerParams {
        q: u64,
        weights: u64,
        block_table: u64,
        seq_lens: u64,
        cache: u64,
        indices: u64,
        batch: i32,
        next_n: i32,
        max_pages: i32,
        pages: i32,
    }
}

/// Candidates a token holds in the kernel's shared memory (`indexer::cap_for`): `TOPK` and at
/// least half as many (and 128) more.
pub const fn indexer_candidates(topk: usize) -> usize {
    topk + if topk / 2 > 128 { topk / 2 } else { 128 }
}

/// Dynamic shared memory of one CTA, `2·heads·128 + 5·(8192 + 256) + 8·heads + 16·cap + 64`
/// bytes with `cap = indexer_candidates(topk)` (`indexer::smem_bytes`, which the kernel asserts
/// against its layout): the two tokens' Q rows, a ring of five 64-key blocks with their scales,
/// the head weights, a buffer of `cap` (key, position) pairs a token, and the counters.
pub const fn indexer_smem_bytes(heads: usize, topk: usize) -> u32 {
    (TOKENS_PER_CTA * heads * 128
        + 5 * (64 * 128 + 64 * 4)
        + TOKENS_PER_CTA * heads * 4
        + TOKENS_PER_CTA * indexer_candidates(topk) * 8
        + 64) as u32
}

/// `lightning_indexer_kernel<H_IDX, TOPK>`: logits and top-k fused, two query tokens a CTA.
pub struct LightningIndexerKernel<const H_IDX: usize, const TOPK: usize>(
    PhantomData<(Dim<H_IDX>, Dim<TOPK>)>,
);

impl<const H_IDX: usize, const TOPK: usize> CudaKernel for LightningIndexerKernel<H_IDX, TOPK> {
    const SOURCE: &'static str = concat!(
        include_str!("../../../kernels/sparse_mla_common.cuh"),
        "\n",
        include_str!("../../../kernels/lightning_indexer.cu")
    );
    const DYNAMIC_SMEM_BYTES: u32 = indexer_smem_bytes(H_IDX, TOPK);
    type Params = IndexerParams;
    fn instantiation() -> String {
        format!("lightning_indexer_kernel<{H_IDX}, {TOPK}>")
    }
}

/// `paged_lightning_indexer_kernel<H_IDX, TOPK>`: the same CTA over a sequence's pages, two of
/// its `next_n` tokens a CTA.
pub struct PagedLightningIndexerKernel<const H_IDX: usize, const TOPK: usize>(
    PhantomData<(Dim<H_IDX>, Dim<TOPK>)>,
);

impl<const H_IDX: usize, const TOPK: usize> CudaKernel
    for PagedLightningIndexerKernel<H_IDX, TOPK>
{
    const SOURCE: &'static str = LightningIndexerKernel::<H_IDX, TOPK>::SOURCE;
    const DYNAMIC_SMEM_BYTES: u32 = indexer_smem_bytes(H_IDX, TOPK);
    type Params = PagedIndexerParams;
    fn instantiation() -> String {
        format!("paged_lightning_indexer_kernel<{H_IDX}, {TOPK}>")
    }
}

/// The CUDA launch runs the op.
impl RunIndexer for Cuda {}

impl IndexerEntry for Cuda {
    unsafe fn lightning_indexer<const H_IDX: usize, const TOPK: usize>(
        &self,
        call: IndexerCall<'_, Cuda>,
    ) -> Result<()> {
        let IndexerCall {
            tokens,
            s_kv,
            queries,
            keys,
            mut indices,
        } = call;
        if tokens == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = IndexerParams {
            q: args.read_vectors("q", &queries.q)?,
            weights: args.read("weights", &queries.weights)?,
            key_start: args.read("key_start", &queries.key_start)?,
            key_end: args.read("key_end", &queries.key_end)?,
            k: args.read_vectors("k", &keys.k)?,
            k_scale: args.read("k_scale", &keys.k_scale)?,
            indices: args.write("indices", &mut indices)?,
            tokens: tokens as i32,
            s_kv: s_kv as i32,
        };
        let shape = LaunchShape {
            grid: (tokens.div_ceil(TOKENS_PER_CTA) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: indexer_smem_bytes(H_IDX, TOPK),
        };
        // SAFETY: q holds tokens × H_IDX × 128 bytes, weights tokens × H_IDX, the ranges tokens,
        // k s_kv × 128 bytes, k_scale s_kv and indices tokens × TOPK (tied by the checked
        // structs and `run`); the kernel clamps every range to [0, s_kv] and touches no row of
        // q, weights or indices at or past `tokens`.
        unsafe { args.launch::<LightningIndexerKernel<H_IDX, TOPK>>(shape, &params) }
    }

    unsafe fn paged_lightning_indexer<const H_IDX: usize, const TOPK: usize, const PAGE: usize>(
        &self,
        call: PagedIndexerCall<'_, Cuda>,
    ) -> Result<()> {
        let PagedIndexerCall {
            tokens,
            batch,
            pages,
            queries,
            cache,
            mut indices,
        } = call;
        if tokens == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = PagedIndexerParams {
            q: args.read_vectors("q", &queries.q)?,
            weights: args.read("weights", &queries.weights)?,
            block_table: args.read("block_table", &queries.block_table)?,
            seq_lens: args.read("seq_lens", &queries.seq_lens)?,
            cache: args.read_vectors("index_cache", &cache)?,
            indices: args.write("indices", &mut indices)?,
            batch: batch as i32,
            next_n: queries.next_n as i32,
            max_pages: queries.max_pages as i32,
            pages: pages as i32,
        };
        let per_sequence = queries.next_n.div_ceil(TOKENS_PER_CTA);
        let shape = LaunchShape {
            grid: ((batch * per_sequence) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: indexer_smem_bytes(H_IDX, TOPK),
        };
        // SAFETY: q holds B·next_n × H_IDX × 128 bytes, weights B·next_n × H_IDX, the block
        // table B × max_pages entries, seq_lens B, the cache pages × 8448 bytes and indices
        // B·next_n × TOPK (tied by the checked queries and `run_paged`); the kernel clamps
        // every range to [0, 64 · max_pages], reads a page only when its entry lies in
        // [0, pages), and touches no row at or past B · next_n.
        unsafe { args.launch::<PagedLightningIndexerKernel<H_IDX, TOPK>>(shape, &params) }
    }
}

impl<const H_IDX: usize, const TOPK: usize> LightningIndexer<H_IDX, TOPK> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the queries, keys and `indices` until it is dropped, so none can be
    /// freed or swapped while it can replay.
    pub fn record<'g, B: RunIndexer + IsCuda, SQ: Storage<B>, SK: Storage<B>, SO: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        queries: &'g IndexerQueries<B, H_IDX, SQ>,
        keys: &'g IndexKeys<B, SK>,
        indices: &'g mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()> {
        graph.record(|cuda: &B| self.run(cuda, queries, keys, indices))
    }

    /// Records the same call as [`run_paged`](Self::run_paged) into a CUDA graph (after the same
    /// checks): the graph borrows the queries, the cache and `indices` until it is dropped.
    pub fn record_paged<
        'g,
        B: RunIndexer + IsCuda,
        const PAGE: usize,
        SQ: Storage<B>,
        SK: Storage<B>,
        SO: StorageMut<B>,
    >(
        &self,
        graph: &mut GraphRecorder<'g>,
        queries: &'g PagedIndexerQueries<B, H_IDX, SQ>,
        cache: &'g IndexKeyCache<B, PAGE, SK>,
        indices: &'g mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()>
    where
        Dim<PAGE>: IndexCachePage,
    {
        graph.record(|cuda: &B| self.run_paged(cuda, queries, cache, indices))
    }
}
