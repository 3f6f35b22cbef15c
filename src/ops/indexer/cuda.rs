//! CUDA launch of [`LightningIndexer`] (`kernels/lightning_indexer.cu`), and its CUDA-only entry
//! [`LightningIndexer::record`].

use std::marker::PhantomData;

use super::launch::{IndexerCall, IndexerEntry};
use super::{IndexKeys, IndexerQueries, LightningIndexer, RunIndexer};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::dim::Dim;
use crate::error::Result;
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
}
