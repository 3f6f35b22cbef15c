//! FP8 sparse MLA prefill (docs/kernels/sparse_mla.md §3): every query row attends to its own top-k rows of a shared
//! latent KV, with e4m3 × e4m3 tensor-core math; output bf16 plus natural-log `max_logits` and
//! `lse`.
//!
//! [`SparseMlaPrefill`] carries the static facts: `D_QK` (512 or 576), the padded query heads
//! `H_Q` (a head tile: 8, 16 or 32 heads for the narrow kernel, or a multiple of 64), the top-k
//! width, the options (plain, with per-row top-k lengths, with lengths and an attention sink)
//! and the real head count `HEADS` the library pads to `H_Q`. [`HeadTiling`] says which CUDA
//! kernel runs the heads: by default the narrow kernel up to 32 real heads (the narrowest of
//! its tiles that holds them) and the 64-head kernel above, or the 64-head kernel for any `H_Q`.

//!
//! Files: this module the kernel type, its rules and `run`; `args.rs` the checked inputs;
//! `launch.rs` the call and the sealed entry; `cpu.rs` the reference; `cuda.rs` the launch
//! (and the CUDA-only `record`).

mod args;
pub(crate) mod cpu;
pub(crate) mod cuda;
pub(crate) mod launch;

pub use args::{SparseMlaInputParts, SparseMlaInputs, padded_indices};
pub use cuda::{
    SPARSE_MLA_PAGED_SMEM_BYTES, SparseMlaNarrowKernel, SparseMlaPagedKernel, SparseMlaWideKernel,
    sparse_mla_narrow_smem_bytes, sparse_mla_wide_smem_bytes,
};

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::backend::sealed::Sealed;
use crate::dim::Dim;
use crate::dtype::bf16;
use crate::error::Result;
use crate::layout::MlaLatentKv;
use crate::rules::{HeadTile, MlaHeadDim, PadsTo, TopkWidth};
use crate::tensor::{Cols, RowShape, Scalar, Storage, StorageMut, Tensor};
use launch::{LatentKvSlices, SparseMlaCall, SparseMlaOutputSlices, SparseMlaQuerySlices};

/// Width of the value: the first `d_v` channels of a latent row (the catalogue's `MLA_D_V`).
pub const D_V: usize = shapeproof_rules::MLA_D_V;

/// Which optional inputs a call has; the type states of [`SparseMlaInputs`]. Sealed: the
/// kernel's instantiation trusts these flags to match the buffers.
pub trait Options: Sealed + 'static {
    /// Per-row top-k lengths are given.
    const HAVE_LENGTH: bool;
    /// A per-head attention sink is given.
    const HAVE_SINK: bool;
    /// The top-k lengths, `[s_q]` i32, or `()`.
    type Length<B: Backend, S: Storage<B>>;
    /// The sink logits, `[HEADS]` f32, or `()`.
    type Sink<B: Backend, const HEADS: usize, S: Storage<B>>;
    /// The lengths, if any.
    fn length<B: Backend, S: Storage<B>>(
        length: &Self::Length<B, S>,
    ) -> Option<&Tensor<B, i32, Scalar, S>>;
    /// The sink logits, if any.
    fn sink<B: Backend, const HEADS: usize, S: Storage<B>>(
        sink: &Self::Sink<B, HEADS, S>,
    ) -> Option<&Tensor<B, f32, Cols<HEADS>, S>>;
}
/// No optional input: every index of the row is considered (invalid ones masked).
pub struct Plain;
/// Per-row top-k lengths: only the first `topk_length[i]` indices of row `i` count.
pub struct WithLength;
/// Top-k lengths and a per-head attention sink (denominator only).
pub struct WithLengthAndSink;
impl Sealed for Plain {}
impl Sealed for WithLength {}
impl Sealed for WithLengthAndSink {}
impl Options for Plain {
    const HAVE_LENGTH: bool = false;
    const HAVE_SINK: bool = false;
    type Length<B: Backend, S: Storage<B>> = ();
    type Sink<B: Backend, const HEADS: usize, S: Storage<B>> = ();
    fn length<B: Backend, S: Storage<B>>(_: &()) -> Option<&Tensor<B, i32, Scalar, S>> {
        None
    }
    fn sink<B: Backend, const HEADS: usize, S: Storage<B>>(
        _: &(),
    ) -> Option<&Tensor<B, f32, Cols<HEADS>, S>> {
        None
    }
}
impl Options for WithLength {
    const HAVE_LENGTH: bool = true;
    const HAVE_SINK: bool = false;
    type Length<B: Backend, S: Storage<B>> = Tensor<B, i32, Scalar, S>;
    type Sink<B: Backend, const HEADS: usize, S: Storage<B>> = ();
    fn length<B: Backend, S: Storage<B>>(
        length: &Tensor<B, i32, Scalar, S>,
    ) -> Option<&Tensor<B, i32, Scalar, S>> {
        Some(length)
    }
    fn sink<B: Backend, const HEADS: usize, S: Storage<B>>(
        _: &(),
    ) -> Option<&Tensor<B, f32, Cols<HEADS>, S>> {
        None
    }
}
impl Options for WithLengthAndSink {
    const HAVE_LENGTH: bool = true;
    const HAVE_SINK: bool = true;
    type Length<B: Backend, S: Storage<B>> = Tensor<B, i32, Scalar, S>;
    type Sink<B: Backend, const HEADS: usize, S: Storage<B>> = Tensor<B, f32, Cols<HEADS>, S>;
    fn length<B: Backend, S: Storage<B>>(
        length: &Tensor<B, i32, Scalar, S>,
    ) -> Option<&Tensor<B, i32, Scalar, S>> {
        Some(length)
    }
    fn sink<B: Backend, const HEADS: usize, S: Storage<B>>(
        sink: &Tensor<B, f32, Cols<HEADS>, S>,
    ) -> Option<&Tensor<B, f32, Cols<HEADS>, S>> {
        Some(sink)
    }
}

/// Options to which an attention sink can be added: those with top-k lengths.
#[diagnostic::on_unimplemented(
    message = "an attention sink requires per-row top-k lengths",
    label = "call `.with_topk_length(..)` before `.with_sink(..)`",
    note = "the sink kernel masks by top-k length (DeepSeek V4 passes both); `{Self}` has no lengths"
)]
pub trait AcceptsSink: Sealed {}
impl AcceptsSink for WithLength {}

/// One query row of q, `[HEADS, D_QK]`.
pub struct QRow<const HEADS: usize, const D_QK: usize>;
impl<const HEADS: usize, const D_QK: usize> RowShape for QRow<HEADS, D_QK> {
    const COLS: usize = HEADS * D_QK;
}

/// One query row of the output, `[HEADS, 512]`.
pub struct OutRow<const HEADS: usize>;
impl<const HEADS: usize> RowShape for OutRow<HEADS> {
    const COLS: usize = HEADS * D_V;
}

/// Which CUDA kernel runs the heads of a call. Both compute the same function within the
/// tests' tolerances; they differ in speed and in the rounding details of their softmax (the
/// narrow kernel weighs blocks against a reference max, `docs/ARCHITECTURE.md`), so an engine
/// that wants one kernel's numbers everywhere can name it. The CPU reference ignores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeadTiling {
    /// The fastest kernel measured on the H200 for the real heads: up to 32 heads run one narrow
    /// tile (`kernels/sparse_mla_narrow.cu`), the narrowest of 8, 16 and 32 that holds them
    /// (also when `H_Q` pads them further: 16 real heads of `H_Q = 64` run as a 16-head tile).
    /// More run in `HEADS.div_ceil(64)` tiles of the 64-head kernel
    /// (`kernels/sparse_mla_prefill.cu`), at every `TOPK`: 1.20-1.29× faster than the narrow
    /// kernel's 64-head tiles from `TOPK` 128 to 2048 (`bench/RESULTS.md`).
    #[default]
    Fastest,
    /// Tiles of 64 heads in the 64-head kernel (`kernels/sparse_mla_prefill.cu`),
    /// `HEADS.div_ceil(64)` of them, whatever `H_Q` and `TOPK` are: one kernel's numbers
    /// everywhere, and the structure of the published Hopper kernels.
    Tiles64,
}

/// The sparse MLA prefill kernel: head dim `D_QK`, `H_Q` padded query heads, top-k width
/// `TOPK`, options `O`, and `HEADS` real query heads (default `H_Q`).
pub struct SparseMlaPrefill<
    const D_QK: usize,
    const H_Q: usize,
    const TOPK: usize,
    O = Plain,
    const HEADS: usize = H_Q,
> {
    tiling: HeadTiling,
    _types: PhantomData<fn() -> O>,
}

impl<const D_QK: usize, const H_Q: usize, const TOPK: usize, O: Options, const HEADS: usize>
    SparseMlaPrefill<D_QK, H_Q, TOPK, O, HEADS>
{
    /// The kernel. Checked: `D_QK` is 512 or 576, `H_Q` a head tile (8, 16, 32 or a positive
    /// multiple of 64) that the real `HEADS` pad to, `TOPK` a positive multiple of 128.
    pub fn new() -> Self
    where
        Dim<D_QK>: MlaHeadDim,
        Dim<H_Q>: HeadTile,
        Dim<TOPK>: TopkWidth,
        Dim<HEADS>: PadsTo<H_Q>,
    {
        Self {
            tiling: HeadTiling::Fastest,
            _types: PhantomData,
        }
    }

    /// The same kernel type run with `tiling` instead of [`HeadTiling::Fastest`].
    pub fn with_tiling(self, tiling: HeadTiling) -> Self {
        Self { tiling, ..self }
    }

    /// The head tiling the CUDA backend runs.
    pub fn tiling(&self) -> HeadTiling {
        self.tiling
    }

    /// FLOPs of one call with `s_q` query rows, counted as `2·s_q·h_q·topk·(d_qk + 512)`
    /// over the `H_Q` padded heads, as published benchmarks count them. The CUDA kernels launch
    /// only the tiles that hold a real head, so where `HEADS < H_Q` they may do less
    /// (the narrowest tile that holds the real heads, [`HeadTiling`]).
    pub fn flops(s_q: usize) -> f64 {
        2.0 * s_q as f64 * H_Q as f64 * TOPK as f64 * (D_QK + D_V) as f64
    }

    /// Runs the prefill into three distinct outputs (distinct `&mut` borrows: they cannot
    /// alias). `out [s_q, HEADS, 512]`, `max_logits [s_q, HEADS]`, `lse [s_q, HEADS]`.
    ///
    /// The inputs, the latent KV and the outputs can each be owned or views of the caller's
    /// buffers (their storage parameters).
    pub fn run<B: RunSparseMla, SI: Storage<B>, SK: Storage<B>, SO: StorageMut<B>>(
        &self,
        backend: &B,
        inputs: &SparseMlaInputs<B, D_QK, HEADS, TOPK, O, SI>,
        kv: &MlaLatentKv<B, D_QK, SK>,
        out: &mut Tensor<B, bf16, OutRow<HEADS>, SO>,
        max_logits: &mut Tensor<B, f32, Cols<HEADS>, SO>,
        lse: &mut Tensor<B, f32, Cols<HEADS>, SO>,
    ) -> Result<()> {
        let s_q = inputs.s_q();
        out.expect_rows("out", "query rows", s_q)?;
        max_logits.expect_rows("max_logits", "query rows", s_q)?;
        lse.expect_rows("lse", "query rows", s_q)?;
        // SAFETY: the rules hold (the constructor's bounds) and every extent was checked by
        // the inputs' constructors and the three row checks above.
        unsafe {
            backend.sparse_mla::<D_QK, H_Q, TOPK, O, HEADS>(SparseMlaCall {
                tiling: self.tiling,
                s_q,
                s_kv: kv.len(),
                queries: SparseMlaQuerySlices {
                    q: inputs.q().as_slice(),
                    q_scale: inputs.q_scale().as_slice(),
                    indices: inputs.indices().as_slice(),
                    topk_length: inputs.topk_length().map(|t| t.as_slice()),
                    sink: inputs.sink().map(|t| t.as_slice()),
                    sm_scale: inputs.sm_scale(),
                },
                kv: LatentKvSlices {
                    data: kv.data().as_slice(),
                    scale: kv.scale().as_slice(),
                },
                outputs: SparseMlaOutputSlices {
                    out: out.as_slice_mut(),
                    max_logits: max_logits.as_slice_mut(),
                    lse: lse.as_slice_mut(),
                },
            })
        }
    }
}

/// The most query rows one call takes at `heads` real heads: the CUDA kernels count their work
/// items, a query row for each head tile of at most 64 heads, in `i32`, and their persistent
/// CTAs step `item += gridDim.x`, so the items stay at most 2³⁰ (far beyond any buffer a GPU
/// holds: 2³⁰ rows of one 8-head tile are 5 TB of q at d_qk 576).
pub const fn max_query_rows(heads: usize) -> usize {
    let wide = shapeproof_rules::WIDE_HEAD_TILE;
    let tiles = if heads > wide {
        heads.div_ceil(wide)
    } else {
        1
    };
    (1 << 30) / tiles
}

/// A backend that can run the sparse MLA prefill: the CPU reference and CUDA.
///
/// Sealed: its launch entry takes a call that only [`SparseMlaPrefill::run`] can assemble, so
/// no code outside the crate reaches a kernel past the boundary's checks.
pub trait RunSparseMla: Backend + Sized + launch::SparseMlaEntry {}
