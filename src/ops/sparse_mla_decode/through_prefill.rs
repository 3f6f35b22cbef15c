//! The decode step through the FP8 sparse MLA prefill (docs/kernels/mla_cache.md §8.6): the
//! step's q cast to e4m3 and its slots masked (a prepare kernel), then the Q8KV8 prefill's
//! paged variant, which reads the step's top-k rows from the cache itself, scales their latent
//! bytes by their group's scale and casts their RoPE values to e4m3 in shared memory — the
//! values a gather into an e4m3 workspace would have written, without the workspace. Where
//! heads are many (64 and 128 a rank) the prefill's tensor-core rate outweighs everything else;
//! the price is the prefill's precision class (e4m3 q and RoPE), which is why it is an op of its
//! own and not a silent route of [`SparseMlaDecode`](super::SparseMlaDecode).

use super::launch;
use super::{DecodeQueries, RunDecode};
use crate::backend::Backend;
use crate::backend::cuda::{GraphRead, GraphRecorder, IsCuda, read_ref};
use crate::dim::Dim;
use crate::dtype::{F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::layout::{MLA_CACHE_DIM, MlaFp8KvCache};
use crate::ops::sparse_mla::{OutRow, QRow};
use crate::rules::{DecodeHeads, HeadTile, MlaCachePage, MlaScaleGroup, PadsTo, TopkWidth};
use crate::tensor::{Cols, Scalar, Storage, StorageMut, Tensor};

/// The sparse MLA decode with `H_Q` query heads and `TOPK` slots a row, run as the FP8 prefill
/// over the step's cache rows. Same inputs and outputs as
/// [`SparseMlaDecode`](super::SparseMlaDecode); the scores use e4m3 q and e4m3 RoPE values
/// (the prefill's numerics, docs/kernels/mla_cache.md §8.6) instead of bf16 ones. On the GPU it
/// runs the 64-head kernel whatever `H_Q` (8 to 32 heads pad a 64-head tile: at those head
/// counts [`SparseMlaDecode`](super::SparseMlaDecode) is the faster op).
pub struct DecodeThroughPrefill<const H_Q: usize, const TOPK: usize> {
    _heads: std::marker::PhantomData<(Dim<H_Q>, Dim<TOPK>)>,
}

/// The scratch of [`DecodeThroughPrefill`] for one row count: e4m3 q, the step's masked slots
/// and the prefill's max-logits output. Made once for a row count and reused by every step of
/// that count.
///
/// The fields are private: their extents stay what `new` made them.
pub struct PrefillDecodeWorkspace<B: Backend, const H_Q: usize, const TOPK: usize> {
    rows: usize,
    /// `[rows, H_Q, 576]` e4m3.
    q8: Tensor<B, F8E4M3, QRow<H_Q, MLA_CACHE_DIM>>,
    /// `[1]`, 1.0 (identity scale of q and of the rows).
    unit_scale: Tensor<B, f32, Scalar>,
    /// `[rows, TOPK]` each position's cache slot, or -1 (past its row's length or outside the
    /// cache).
    slots: Tensor<B, i32, Cols<TOPK>>,
    /// `[rows, H_Q]` the prefill's max logits (not part of the decode's outputs).
    max_logits: Tensor<B, f32, Cols<H_Q>>,
}

impl<B: Backend, const H_Q: usize, const TOPK: usize> PrefillDecodeWorkspace<B, H_Q, TOPK> {
    /// The scratch of steps of `rows` query rows (`rows · TOPK` at most `i32::MAX`).
    pub fn new(backend: &B, rows: usize) -> Result<Self> {
        Error::check_i32_product("rows", rows, TOPK)?;
        Ok(Self {
            rows,
            q8: Tensor::zeros(backend, rows)?,
            unit_scale: Tensor::from_host(backend, "unit_scale", &[1.0f32], 1)?,
            slots: Tensor::zeros(backend, rows)?,
            max_logits: Tensor::zeros(backend, rows)?,
        })
    }

    /// Query rows this scratch serves.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

impl<const H_Q: usize, const TOPK: usize> DecodeThroughPrefill<H_Q, TOPK> {
    /// The decode through the prefill. Checked: `H_Q` a [`DecodeHeads`] that is its own head
    /// tile (8, 16, 32, 64 or 128), `TOPK` a [`TopkWidth`].
    pub fn new() -> Self
    where
        Dim<H_Q>: DecodeHeads + HeadTile + PadsTo<H_Q>,
        Dim<TOPK>: TopkWidth,
    {
        Self {
            _heads: std::marker::PhantomData,
        }
    }

    /// One decode step: `out [rows, H_Q, 512]` and `lse [rows, H_Q]` of every query row of
    /// `queries` over its slots of `cache`, as [`SparseMlaDecode::run`](super::SparseMlaDecode::run)
    /// defines them but with the scores of e4m3 q and RoPE values. A slot outside the cache or
    /// past its row's length is no key, as there.
    pub fn run<B, SQ, const PAGE: usize, const GROUP: usize, SC, SO>(
        &self,
        backend: &B,
        queries: &DecodeQueries<B, H_Q, TOPK, SQ>,
        cache: &MlaFp8KvCache<B, PAGE, GROUP, SC>,
        workspace: &mut PrefillDecodeWorkspace<B, H_Q, TOPK>,
        out: &mut Tensor<B, bf16, OutRow<H_Q>, SO>,
        lse: &mut Tensor<B, f32, Cols<H_Q>, SO>,
    ) -> Result<()>
    where
        B: RunDecode,
        SQ: Storage<B>,
        SC: Storage<B>,
        SO: StorageMut<B>,
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        let rows = super::check_step(queries, out, lse, workspace.rows)?;
        let slots = cache.slots();
        // SAFETY: `new`'s bounds (H_Q a decode head count, TOPK a multiple of 128); the queries
        // tie q, indices and lengths to `rows`; the workspace was made for `rows` (checked
        // above): q8 holds rows × H_Q × 576, slots rows × TOPK ≤ i32::MAX; the cache holds
        // `slots` ≤ i32::MAX rows.
        unsafe {
            backend.sparse_mla_decode_prepare::<H_Q, TOPK>(launch::DecodePrepareCall {
                rows,
                slots,
                queries: queries.slices(),
                q8: workspace.q8.as_slice_mut(),
                slots_out: workspace.slots.as_slice_mut(),
            })?;
        }
        // SAFETY: as above; the outputs were tied to `rows` by `check_step`.
        unsafe {
            backend.sparse_mla_decode_paged_prefill::<H_Q, TOPK>(launch::DecodePagedPrefillCall {
                rows,
                slots,
                q8: workspace.q8.as_slice(),
                unit_scale: workspace.unit_scale.as_slice(),
                slots_in: workspace.slots.as_slice(),
                cache: cache.slice(),
                sm_scale: queries.sm_scale(),
                out: out.as_slice_mut(),
                max_logits: workspace.max_logits.as_slice_mut(),
                lse: lse.as_slice_mut(),
            })
        }
    }
}

impl<const H_Q: usize, const TOPK: usize> DecodeThroughPrefill<H_Q, TOPK> {
    /// Records the same step as [`run`](Self::run) into a CUDA graph (its two launches, after
    /// the same checks): the graph borrows the queries, the cache, the workspace and both
    /// outputs until it is dropped, so none can be freed or swapped while it can replay. The
    /// cache is a `&'g` borrow or the one the step's `MlaCacheStore::record` handed back.
    pub fn record<'g, B, SQ, const PAGE: usize, const GROUP: usize, SC, SO>(
        &self,
        graph: &mut GraphRecorder<'g>,
        queries: &'g DecodeQueries<B, H_Q, TOPK, SQ>,
        cache: impl Into<GraphRead<'g, MlaFp8KvCache<B, PAGE, GROUP, SC>>>,
        workspace: &'g mut PrefillDecodeWorkspace<B, H_Q, TOPK>,
        out: &'g mut Tensor<B, bf16, OutRow<H_Q>, SO>,
        lse: &'g mut Tensor<B, f32, Cols<H_Q>, SO>,
    ) -> Result<()>
    where
        B: RunDecode + IsCuda,
        SQ: Storage<B>,
        SC: Storage<B> + 'g,
        SO: StorageMut<B>,
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        let cache = read_ref(cache);
        graph.record(|cuda: &B| self.run(cuda, queries, cache, workspace, out, lse))
    }
}
