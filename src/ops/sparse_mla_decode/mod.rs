//! Sparse MLA decode over the FP8 cache (DeepSeek V3.2's decode step, docs/kernels/mla_cache.md
//! §8.5): every query row attends to its top-k cache slots, read straight from the 656-byte
//! rows of an [`MlaFp8KvCache`] — dequantized per 128-channel group — with bf16 queries, at the
//! head count a rank holds (8, 16, 32, 64 or 128, never padded).
//!
//! Math, per query row `r` and head `h`, over the valid slots `j` of the row (the first
//! `lengths[r]` of `indices[r]`, inside the cache): `s_j = sm_scale · q[r, h] · k_j` with `k_j`
//! the dequantized 576-channel row, `out[r, h] = Σ softmax(s)_j · k_j[..512]`,
//! `lse[r, h] = ln Σ exp(s_j)`; a row without a valid slot gives `out = 0`, `lse = +inf` (the
//! prefill's conventions). A slot listed twice counts twice.
//!
//! Backends: the CPU reference (f64), and CUDA (`kernels/sparse_mla_decode.cu`: f16 tensor
//! cores on the cache's e4m3 bytes with the group scales folded into the partial scores and
//! into the softmax weights, the top-k split over CTAs and combined when the
//! batch is too small to fill the GPU; the splits' partials live in the caller's
//! [`DecodeWorkspace`], made once per row count, so a step allocates nothing and `record` puts
//! it into a CUDA graph).
//!
//! [`DecodeThroughPrefill`] runs the same step as the FP8 prefill over the step's gathered
//! rows: faster where heads are many, with e4m3 q and RoPE in the scores.
//!
//! Files: this module the kernel type, its rules and `run`; `args.rs` the checked queries;
//! `through_prefill.rs` the step through the prefill;
//! `launch.rs` the calls and the sealed entry; `cpu.rs` the reference; `cuda.rs` the launches (and
//! the decode's CUDA-only `record`).

mod args;
mod cpu;
mod cuda;
mod launch;
mod through_prefill;

pub use args::{DecodeQueries, DecodeQueryParts, DecodeWorkspace};
pub use cuda::{
    DECODE_SMEM_BYTES, SparseMlaDecodeCombineKernel, SparseMlaDecodeKernel,
    SparseMlaDecodePrepareKernel, decode_splits,
};
pub use through_prefill::{DecodeThroughPrefill, PrefillDecodeWorkspace};

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::error::Result;
use crate::layout::{MLA_CACHE_DIM, MlaFp8KvCache};
use crate::ops::sparse_mla::OutRow;
use crate::rules::{DecodeHeads, MlaCachePage, MlaScaleGroup, TopkWidth};
use crate::tensor::{Cols, Heads, Storage, StorageMut, Tensor};

/// One query row of the decode, `[H_Q, 576]` bf16.
pub type DecodeQRow<const H_Q: usize> = Heads<H_Q, MLA_CACHE_DIM>;

/// The sparse MLA decode with `H_Q` query heads and `TOPK` slots a row.
#[derive(Clone, Copy, Debug)]
pub struct SparseMlaDecode<const H_Q: usize, const TOPK: usize> {
    _dims: PhantomData<(Dim<H_Q>, Dim<TOPK>)>,
}

/// A backend that can run the decode: the CPU reference and CUDA. Sealed: its entry takes a call only
/// [`SparseMlaDecode::run`] can assemble.
pub trait RunDecode: Backend + Sized + launch::DecodeEntry {}

impl<const H_Q: usize, const TOPK: usize> SparseMlaDecode<H_Q, TOPK> {
    /// The decode. Checked: `H_Q` a [`DecodeHeads`], `TOPK` a [`TopkWidth`].
    pub fn new() -> Self
    where
        Dim<H_Q>: DecodeHeads,
        Dim<TOPK>: TopkWidth,
    {
        Self { _dims: PhantomData }
    }

    /// FLOPs of one step of `rows` query rows, counted as `2·rows·H_Q·TOPK·(576 + 512)`.
    pub fn flops(rows: usize) -> f64 {
        2.0 * rows as f64 * H_Q as f64 * TOPK as f64 * (MLA_CACHE_DIM + 512) as f64
    }

    /// One decode step: `out [rows, H_Q, 512]` and `lse [rows, H_Q]` of every query row of
    /// `queries` over its slots of `cache`. Both outputs must have a row for every query row;
    /// `workspace` is the scratch made for this row count ([`DecodeWorkspace::new`]).
    pub fn run<B, SQ, const PAGE: usize, const GROUP: usize, SC, SO>(
        &self,
        backend: &B,
        queries: &DecodeQueries<B, H_Q, TOPK, SQ>,
        cache: &MlaFp8KvCache<B, PAGE, GROUP, SC>,
        workspace: &mut DecodeWorkspace<B, H_Q, TOPK>,
        out: &mut Tensor<B, crate::dtype::bf16, OutRow<H_Q>, SO>,
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
        let rows = check_step(queries, out, lse, workspace.rows)?;
        // SAFETY: the rules hold (`new`'s bounds, and the cache's: 656-byte rows); the queries
        // tie q, indices and lengths to `rows` with rows × H_Q ≤ i32::MAX; the outputs have
        // `rows` rows; the cache holds `slots` ≤ i32::MAX rows.
        unsafe {
            backend.sparse_mla_decode::<H_Q, TOPK>(launch::DecodeCall {
                rows,
                slots: cache.slots(),
                queries: queries.slices(),
                cache: cache.slice(),
                out: out.as_slice_mut(),
                lse: lse.as_slice_mut(),
                splits: workspace.splits,
                blocks_per_split: workspace.blocks_per_split,
                part_o: workspace.part_o.as_slice_mut(),
                part_lse: workspace.part_lse.as_slice_mut(),
            })
        }
    }
}

/// The extents a decode step ties to its queries' row count (either route): `out`, `lse` and
/// the workspace (made for `workspace_rows` rows) must hold that many rows. Returns the count.
pub(crate) fn check_step<B, SQ, SO, const H_Q: usize, const TOPK: usize>(
    queries: &DecodeQueries<B, H_Q, TOPK, SQ>,
    out: &Tensor<B, crate::dtype::bf16, OutRow<H_Q>, SO>,
    lse: &Tensor<B, f32, Cols<H_Q>, SO>,
    workspace_rows: usize,
) -> Result<usize>
where
    B: Backend,
    SQ: Storage<B>,
    SO: Storage<B>,
{
    let rows = queries.rows();
    out.expect_rows("out", "query rows (as q)", rows)?;
    lse.expect_rows("lse", "query rows (as q)", rows)?;
    crate::error::Error::check_extent("workspace", "query rows (as q)", rows, workspace_rows)?;
    Ok(rows)
}
