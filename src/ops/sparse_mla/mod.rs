//! FP8 sparse MLA prefill (spec §3): every query row attends to its own top-k rows of a shared
//! latent KV, with e4m3 × e4m3 tensor-core math; output bf16 plus natural-log `max_logits` and
//! `lse`.
//!
//! [`SparseMlaPrefill`] carries the static facts: `D_QK` (512 or 576), the padded query heads
//! `H_Q` (a head tile: 8, 16 or 32 heads for the narrow kernel, or a multiple of 64), the top-k width, the options (plain, with per-row top-k lengths, with
//! lengths and an attention sink) and the real head count `HEADS` the library pads to `H_Q`.

mod cpu;
mod cuda;

pub use cuda::SparseMlaKernel;

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::dtype::{F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::layout::MlaLatentKv;
use crate::rules::{HeadTile, MlaHeadDim, PadsTo, TopkWidth};
use crate::tensor::{Cols, RowShape, Scalar, Tensor};

/// Width of the value: the first 512 channels of a latent row.
pub const D_V: usize = 512;

/// Which optional inputs a call has; the type states of [`SparseMlaInputs`].
pub trait Options: 'static {
    /// Per-row top-k lengths are given.
    const HAVE_LENGTH: bool;
    /// A per-head attention sink is given.
    const HAVE_SINK: bool;
    /// The top-k lengths, `[s_q]` i32, or `()`.
    type Length<B: Backend>;
    /// The sink logits, `[HEADS]` f32, or `()`.
    type Sink<B: Backend, const HEADS: usize>;
    /// The lengths' buffer, if any.
    fn length<B: Backend>(length: &Self::Length<B>) -> Option<&B::Buffer<i32>>;
    /// The sink's buffer, if any.
    fn sink<B: Backend, const HEADS: usize>(sink: &Self::Sink<B, HEADS>)
    -> Option<&B::Buffer<f32>>;
}
/// No optional input: every index of the row is considered (invalid ones masked).
pub struct Plain;
/// Per-row top-k lengths: only the first `topk_length[i]` indices of row `i` count.
pub struct WithLength;
/// Top-k lengths and a per-head attention sink (denominator only).
pub struct WithLengthAndSink;
impl Options for Plain {
    const HAVE_LENGTH: bool = false;
    const HAVE_SINK: bool = false;
    type Length<B: Backend> = ();
    type Sink<B: Backend, const HEADS: usize> = ();
    fn length<B: Backend>(_: &()) -> Option<&B::Buffer<i32>> {
        None
    }
    fn sink<B: Backend, const HEADS: usize>(_: &()) -> Option<&B::Buffer<f32>> {
        None
    }
}
impl Options for WithLength {
    const HAVE_LENGTH: bool = true;
    const HAVE_SINK: bool = false;
    type Length<B: Backend> = Tensor<B, i32, Scalar>;
    type Sink<B: Backend, const HEADS: usize> = ();
    fn length<B: Backend>(length: &Tensor<B, i32, Scalar>) -> Option<&B::Buffer<i32>> {
        Some(length.buffer())
    }
    fn sink<B: Backend, const HEADS: usize>(_: &()) -> Option<&B::Buffer<f32>> {
        None
    }
}
impl Options for WithLengthAndSink {
    const HAVE_LENGTH: bool = true;
    const HAVE_SINK: bool = true;
    type Length<B: Backend> = Tensor<B, i32, Scalar>;
    type Sink<B: Backend, const HEADS: usize> = Tensor<B, f32, Cols<HEADS>>;
    fn length<B: Backend>(length: &Tensor<B, i32, Scalar>) -> Option<&B::Buffer<i32>> {
        Some(length.buffer())
    }
    fn sink<B: Backend, const HEADS: usize>(
        sink: &Tensor<B, f32, Cols<HEADS>>,
    ) -> Option<&B::Buffer<f32>> {
        Some(sink.buffer())
    }
}

/// Options to which an attention sink can be added: those with top-k lengths.
#[diagnostic::on_unimplemented(
    message = "an attention sink requires per-row top-k lengths",
    label = "call `.with_topk_length(..)` before `.with_sink(..)`",
    note = "the sink kernel masks by top-k length (DeepSeek V4 passes both); `{Self}` has no lengths"
)]
pub trait AcceptsSink {}
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

/// The sparse MLA prefill kernel: head dim `D_QK`, `H_Q` padded query heads, top-k width
/// `TOPK`, options `O`, and `HEADS` real query heads (default `H_Q`).
pub struct SparseMlaPrefill<
    const D_QK: usize,
    const H_Q: usize,
    const TOPK: usize,
    O = Plain,
    const HEADS: usize = H_Q,
> {
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
            _types: PhantomData,
        }
    }

    /// FLOPs of one call with `s_q` query rows, counted as `2·s_q·h_q·topk·(d_qk + 512)`
    /// over the padded heads (the work the tensor cores do).
    pub fn flops(s_q: usize) -> f64 {
        2.0 * s_q as f64 * H_Q as f64 * TOPK as f64 * (D_QK + D_V) as f64
    }

    /// Runs the prefill into three distinct outputs (distinct `&mut` borrows: they cannot
    /// alias). `out [s_q, HEADS, 512]`, `max_logits [s_q, HEADS]`, `lse [s_q, HEADS]`.
    pub fn run<B: RunSparseMla>(
        &self,
        backend: &B,
        inputs: &SparseMlaInputs<B, D_QK, HEADS, TOPK, O>,
        kv: &MlaLatentKv<B, D_QK>,
        out: &mut Tensor<B, bf16, OutRow<HEADS>>,
        max_logits: &mut Tensor<B, f32, Cols<HEADS>>,
        lse: &mut Tensor<B, f32, Cols<HEADS>>,
    ) -> Result<()> {
        let s_q = inputs.q.rows();
        out.expect_rows("out", "query rows", s_q)?;
        max_logits.expect_rows("max_logits", "query rows", s_q)?;
        lse.expect_rows("lse", "query rows", s_q)?;
        backend.sparse_mla::<D_QK, H_Q, TOPK, O, HEADS>(SparseMlaCall {
            s_q,
            s_kv: kv.len(),
            q: inputs.q.buffer(),
            q_scale: inputs.q_scale.buffer(),
            indices: inputs.indices.buffer(),
            topk_length: O::length(&inputs.topk_length),
            sink: O::sink::<B, HEADS>(&inputs.sink),
            sm_scale: inputs.sm_scale,
            kv: kv.rows.buffer(),
            kv_scale: kv.scale.buffer(),
            out: out.buffer_mut(),
            max_logits: max_logits.buffer_mut(),
            lse: lse.buffer_mut(),
        })
    }
}

/// The per-call inputs of the prefill, tied to one query-row count `s_q`.
pub struct SparseMlaInputs<
    B: Backend,
    const D_QK: usize,
    const HEADS: usize,
    const TOPK: usize,
    O: Options,
> {
    /// Queries, `[s_q, HEADS, D_QK]` e4m3 (real heads only; the kernel pads).
    pub q: Tensor<B, F8E4M3, QRow<HEADS, D_QK>>,
    /// Dequantization scale of q, `[1]`.
    pub q_scale: Tensor<B, f32, Scalar>,
    /// Top-k row indices into the latent KV, `[s_q, TOPK]` i32; -1 (or anything outside
    /// `[0, s_kv)`) is invalid and never read.
    pub indices: Tensor<B, i32, Cols<TOPK>>,
    /// Per-row valid prefix lengths, `[s_q]` (values clamped to `[0, TOPK]` on the device).
    pub topk_length: O::Length<B>,
    /// Per-head sink logits, `[HEADS]`.
    pub sink: O::Sink<B, HEADS>,
    /// Softmax scale (natural-log units).
    pub sm_scale: f32,
}

impl<B: Backend, const D_QK: usize, const HEADS: usize, const TOPK: usize>
    SparseMlaInputs<B, D_QK, HEADS, TOPK, Plain>
{
    /// Ties q and the indices to one query-row count.
    pub fn new(
        q: Tensor<B, F8E4M3, QRow<HEADS, D_QK>>,
        q_scale: Tensor<B, f32, Scalar>,
        indices: Tensor<B, i32, Cols<TOPK>>,
        sm_scale: f32,
    ) -> Result<Self> {
        indices.expect_rows("indices", "query rows (as q)", q.rows())?;
        if q.rows() > i32::MAX as usize {
            return Err(Error::Value {
                param: "s_q",
                value: q.rows() as i64,
                range: format!("0 ..= {}", i32::MAX),
            });
        }
        Ok(Self {
            q,
            q_scale,
            indices,
            topk_length: (),
            sink: (),
            sm_scale,
        })
    }

    /// Adds per-row top-k lengths, `[s_q]`.
    pub fn with_topk_length(
        self,
        topk_length: Tensor<B, i32, Scalar>,
    ) -> Result<SparseMlaInputs<B, D_QK, HEADS, TOPK, WithLength>> {
        topk_length.expect_rows("topk_length", "query rows (as q)", self.q.rows())?;
        Ok(SparseMlaInputs {
            q: self.q,
            q_scale: self.q_scale,
            indices: self.indices,
            topk_length,
            sink: (),
            sm_scale: self.sm_scale,
        })
    }
}

impl<B: Backend, const D_QK: usize, const HEADS: usize, const TOPK: usize, O: Options>
    SparseMlaInputs<B, D_QK, HEADS, TOPK, O>
{
    /// Adds per-head sink logits, `[HEADS]`; only after top-k lengths.
    pub fn with_sink(
        self,
        sink: Tensor<B, f32, Cols<HEADS>>,
    ) -> Result<SparseMlaInputs<B, D_QK, HEADS, TOPK, WithLengthAndSink>>
    where
        O: AcceptsSink + Options<Length<B> = Tensor<B, i32, Scalar>>,
    {
        sink.expect_rows("attn_sink", "rows", 1)?;
        Ok(SparseMlaInputs {
            q: self.q,
            q_scale: self.q_scale,
            indices: self.indices,
            topk_length: self.topk_length,
            sink,
            sm_scale: self.sm_scale,
        })
    }
}

/// One checked call as plain buffers; extents in the comments.
pub struct SparseMlaCall<'a, B: Backend> {
    /// Query rows.
    pub s_q: usize,
    /// Latent KV rows.
    pub s_kv: usize,
    /// `[s_q, HEADS, D_QK]`.
    pub q: &'a B::Buffer<F8E4M3>,
    /// `[1]`.
    pub q_scale: &'a B::Buffer<f32>,
    /// `[s_q, TOPK]`.
    pub indices: &'a B::Buffer<i32>,
    /// `[s_q]` or none.
    pub topk_length: Option<&'a B::Buffer<i32>>,
    /// `[HEADS]` or none.
    pub sink: Option<&'a B::Buffer<f32>>,
    /// Softmax scale.
    pub sm_scale: f32,
    /// `[s_kv, D_QK]`.
    pub kv: &'a B::Buffer<F8E4M3>,
    /// `[1]`.
    pub kv_scale: &'a B::Buffer<f32>,
    /// `[s_q, HEADS, 512]`.
    pub out: &'a mut B::Buffer<bf16>,
    /// `[s_q, HEADS]`.
    pub max_logits: &'a mut B::Buffer<f32>,
    /// `[s_q, HEADS]`.
    pub lse: &'a mut B::Buffer<f32>,
}

/// A backend that can run the sparse MLA prefill.
pub trait RunSparseMla: Backend + Sized {
    /// Runs one checked call.
    fn sparse_mla<
        const D_QK: usize,
        const H_Q: usize,
        const TOPK: usize,
        O: Options,
        const HEADS: usize,
    >(
        &self,
        call: SparseMlaCall<'_, Self>,
    ) -> Result<()>;
}
