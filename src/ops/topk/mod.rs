//! Exact top-k of rows of f32 scores, the selection step of DeepSeek Sparse Attention on its
//! own (docs/kernels/indexer.md §7.9): for logits an engine computes elsewhere (e.g. an FP8
//! MQA-logits kernel), the `TOPK` columns of each row's candidate range `[start, end)` with
//! the largest scores, as the `[rows, TOPK]` i32 rows the sparse MLA prefill takes.
//!
//! The selection is the lightning indexer's: exact and deterministic, ties to the lower column,
//! a row's columns in ascending order, then -1 where fewer columns are candidates; a score
//! orders as its f32 value with -0 below +0 and NaN as -inf.
//!
//! Files: this module the kernel type, its rule and `run`; `args.rs` the checked scores;
//! `launch.rs` the call and the sealed entry; `cpu.rs` the reference; `cuda.rs` the launch (and
//! the CUDA-only `record`).

mod args;
mod cpu;
mod cuda;
mod launch;

pub use args::{TopkScoreParts, TopkScores};
pub use cpu::select_row;
pub use cuda::{MAX_CLUSTERS, TopkKernel};

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::error::Result;
use crate::rules::IndexerTopk;
use crate::tensor::{Cols, Storage, StorageMut, Tensor};
use launch::TopkCall;

/// Selects the `TOPK` largest scores of each row (a multiple of 128 up to 2048: the widths the
/// lightning indexer selects, whose rows the sparse MLA prefill takes).
#[derive(Clone, Copy, Debug)]
pub struct TopK<const TOPK: usize> {
    _topk: PhantomData<Dim<TOPK>>,
}

/// A backend that can run [`TopK`]: the CPU reference and CUDA. Sealed: its entry takes a call
/// only [`TopK::run`] can assemble.
pub trait RunTopk: Backend + Sized + launch::TopkEntry {}

impl<const TOPK: usize> TopK<TOPK> {
    /// The op. Checked: `TOPK` is a multiple of 128 up to 2048.
    pub fn new() -> Self
    where
        Dim<TOPK>: IndexerTopk,
    {
        Self { _topk: PhantomData }
    }

    /// Writes every row's top-`TOPK` columns into `indices` (`[rows, TOPK]`, a row of
    /// `scores` each): the columns of the row's range `[start, end)` (each clamped to
    /// `[0, width]`; an empty range gives a row of -1) with the largest scores, ascending.
    ///
    /// `scores` and `indices` can each be owned or views of the caller's buffers.
    pub fn run<B: RunTopk, SS: Storage<B>, SO: StorageMut<B>>(
        &self,
        backend: &B,
        scores: &TopkScores<B, SS>,
        indices: &mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()> {
        let rows = scores.rows();
        indices.expect_rows("indices", "rows (as starts)", rows)?;
        // SAFETY: the rule holds (`new`'s bound); `scores` ties its values to rows × width
        // with width and rows within i32, and `indices` has a row for every row.
        unsafe {
            backend.topk::<TOPK>(TopkCall {
                rows,
                scores: scores.slices(),
                indices: indices.as_slice_mut(),
            })
        }
    }
}
