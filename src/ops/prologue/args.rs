//! The prologue's arguments: model weights, conv state, outputs, and one batch type per variant.
//!
//! Each constructor is the runtime boundary: it sees every tensor whose extent the batch
//! decides, checks that they agree (returning an error that names the parameter, the expected
//! and the actual extent), and from then on the agreement is a fact the launch relies on. The
//! fields are private so it stays one: tensors are read through accessors, written in place
//! through [`FixedExtent`] borrows (contents change, extents cannot), and given back by
//! `into_parts`.

use std::marker::PhantomData;

use super::{ConvSpec, QkvrRow, RowLayout};
use crate::backend::Backend;
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::tensor::{
    BlockScales, Cols, FixedExtent, Owned, RowShape, Scalar, Storage, StorageMut, Tensor,
};

/// Read accessors (`name()` → `&Tensor`) and in-place write access (`name_mut()` →
/// [`FixedExtent`]) for private tensor fields.
macro_rules! tensor_accessors {
    ($($(#[$doc:meta])* $name:ident / $name_mut:ident: $t:ty, $r:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name(&self) -> &Tensor<B, $t, $r, S> {
            &self.$name
        }
        #[doc = concat!("`", stringify!($name), "`, writable in place (contents only; the extent stays).")]
        pub fn $name_mut(&mut self) -> FixedExtent<'_, B, $t, $r, S> {
            FixedExtent::new(&mut self.$name)
        }
    )*};
}

/// The conv-state history of one slot: `[W-1, DKV]`, oldest row first.
pub struct ConvHistory<const DKV: usize, C>(PhantomData<C>);
impl<const DKV: usize, C: ConvSpec> RowShape for ConvHistory<DKV, C> {
    const COLS: usize = C::HISTORY * DKV;
}

/// A conv-state (or conv-window) tensor, `[rows, W-1, DKV]` bf16.
pub type ConvHistoryTensor<B, const DKV: usize, C, S> = Tensor<B, bf16, ConvHistory<DKV, C>, S>;

/// The depthwise conv taps of one channel, `[W]` (column `W-1` multiplies the current token).
pub struct ConvTaps<C>(PhantomData<C>);
impl<C: ConvSpec> RowShape for ConvTaps<C> {
    const COLS: usize = C::W;
}

/// The qkvr rows of one tracked window, `[W-1]`.
pub struct TrackRows<C>(PhantomData<C>);
impl<C: ConvSpec> RowShape for TrackRows<C> {
    const COLS: usize = C::HISTORY;
}

/// A layer's static parameters: the RMSNorm weights, the conv taps and epsilon.
pub struct PrologueWeights<B: Backend, const HD: usize, const DKV: usize, C, S: Storage<B> = Owned>
{
    q_gamma: Tensor<B, bf16, Cols<HD>, S>,     // [1, HD]
    k_gamma: Tensor<B, bf16, Cols<HD>, S>,     // [1, HD]
    k_weight: Tensor<B, bf16, ConvTaps<C>, S>, // [DKV, W]
    v_weight: Tensor<B, bf16, ConvTaps<C>, S>, // [DKV, W]
    eps: f32,
}

impl<B: Backend, const HD: usize, const DKV: usize, C: ConvSpec> PrologueWeights<B, HD, DKV, C> {
    /// Uploads the weights: gammas of `HD` values, conv taps `[DKV, W]` row-major.
    pub fn from_host(
        backend: &B,
        q_gamma: &[bf16],
        k_gamma: &[bf16],
        k_weight: &[bf16],
        v_weight: &[bf16],
        eps: f32,
    ) -> Result<Self> {
        Ok(Self {
            q_gamma: Tensor::from_host(backend, "q_gamma", q_gamma, 1)?,
            k_gamma: Tensor::from_host(backend, "k_gamma", k_gamma, 1)?,
            k_weight: Tensor::from_host(backend, "k_weight", k_weight, DKV)?,
            v_weight: Tensor::from_host(backend, "v_weight", v_weight, DKV)?,
            eps,
        })
    }
}

impl<B: Backend, const HD: usize, const DKV: usize, C: ConvSpec, S: Storage<B>>
    PrologueWeights<B, HD, DKV, C, S>
{
    /// The weights over tensors already on the backend: gammas of one row, taps of `DKV` rows.
    pub fn from_tensors(
        q_gamma: Tensor<B, bf16, Cols<HD>, S>,
        k_gamma: Tensor<B, bf16, Cols<HD>, S>,
        k_weight: Tensor<B, bf16, ConvTaps<C>, S>,
        v_weight: Tensor<B, bf16, ConvTaps<C>, S>,
        eps: f32,
    ) -> Result<Self> {
        q_gamma.expect_rows("q_gamma", "rows", 1)?;
        k_gamma.expect_rows("k_gamma", "rows", 1)?;
        k_weight.expect_rows("k_weight", "channels (DKV)", DKV)?;
        v_weight.expect_rows("v_weight", "channels (DKV)", DKV)?;
        Ok(Self {
            q_gamma,
            k_gamma,
            k_weight,
            v_weight,
            eps,
        })
    }

    tensor_accessors! {
        /// RMSNorm weight of q, `[HD]`, shared by all heads.
        q_gamma / q_gamma_mut: bf16, Cols<HD>;
        /// RMSNorm weight of k, `[HD]`.
        k_gamma / k_gamma_mut: bf16, Cols<HD>;
        /// Conv taps of k, `[DKV, W]`.
        k_weight / k_weight_mut: bf16, ConvTaps<C>;
        /// Conv taps of v, `[DKV, W]`.
        v_weight / v_weight_mut: bf16, ConvTaps<C>;
    }

    /// RMSNorm epsilon (Inkling: 1e-6).
    pub fn eps(&self) -> f32 {
        self.eps
    }
}

/// The conv-state caches of k and v, `[slots, W-1, DKV]` each.
pub struct ConvState<B: Backend, const DKV: usize, C, S: Storage<B> = Owned> {
    k: Tensor<B, bf16, ConvHistory<DKV, C>, S>, // [slots, W-1, DKV]
    v: Tensor<B, bf16, ConvHistory<DKV, C>, S>, // [slots, W-1, DKV]
}

impl<B: Backend, const DKV: usize, C: ConvSpec> ConvState<B, DKV, C> {
    /// Zeroed caches of `slots` slots.
    pub fn zeros(backend: &B, slots: usize) -> Result<Self> {
        Ok(Self {
            k: Tensor::zeros(backend, slots)?,
            v: Tensor::zeros(backend, slots)?,
        })
    }
}

impl<B: Backend, const DKV: usize, C: ConvSpec, S: Storage<B>> ConvState<B, DKV, C, S> {
    /// The two caches; they must have the same number of slots.
    pub fn new(
        k: Tensor<B, bf16, ConvHistory<DKV, C>, S>,
        v: Tensor<B, bf16, ConvHistory<DKV, C>, S>,
    ) -> Result<Self> {
        v.expect_rows("v_cache", "conv slots", k.rows())?;
        Ok(Self { k, v })
    }

    /// Number of conv-state slots.
    pub fn slots(&self) -> usize {
        self.k.rows()
    }

    tensor_accessors! {
        /// History of k's pre-conv inputs, `[slots, W-1, DKV]`.
        k / k_mut: bf16, ConvHistory<DKV, C>;
        /// History of v's pre-conv inputs, `[slots, W-1, DKV]`.
        v / v_mut: bf16, ConvHistory<DKV, C>;
    }

    /// The two caches back, `(k, v)`.
    pub fn into_parts(
        self,
    ) -> (
        ConvHistoryTensor<B, DKV, C, S>,
        ConvHistoryTensor<B, DKV, C, S>,
    ) {
        (self.k, self.v)
    }
}

impl<B: Backend, const DKV: usize, C: ConvSpec, S: StorageMut<B>> ConvState<B, DKV, C, S> {
    pub(crate) fn slices_mut(&mut self) -> (B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>) {
        (self.k.as_slice_mut(), self.v.as_slice_mut())
    }
}

/// A counter of indices the device skipped because they pointed outside their buffer
/// (`loc` beyond the pool, conv-cache indices beyond the cache, …). Read it after a call.
pub struct ErrorCounter<B: Backend> {
    count: Tensor<B, u32, Scalar>, // [1]
}

impl<B: Backend> ErrorCounter<B> {
    /// A counter at zero.
    pub fn new(backend: &B) -> Result<Self> {
        Ok(Self {
            count: Tensor::zeros(backend, 1)?,
        })
    }

    /// The count so far (waits for queued work).
    pub fn read(&self, backend: &B) -> Result<u32> {
        Ok(self.count.to_host(backend)?[0])
    }

    /// Sets the count back to zero.
    pub fn reset(&mut self, backend: &B) -> Result<()> {
        self.set(backend, 0)
    }

    /// Sets the count to `value` (e.g. to carry a running total over). The count wraps at
    /// 2^32 on every backend, as the device's `atomicAdd` does.
    pub fn set(&mut self, backend: &B, value: u32) -> Result<()> {
        self.count.write(backend, &[value])
    }

    /// The counter's one-element tensor (e.g. to copy it into an engine's own stats buffer).
    pub fn count(&self) -> &Tensor<B, u32, Scalar> {
        &self.count
    }

    pub(crate) fn count_tensor_mut(&mut self) -> &mut Tensor<B, u32, Scalar> {
        &mut self.count
    }
}

/// Outputs with a bf16 q: `q [T, DQ]`, `k [T, DKV]`, `v [T, DKV]`, tied to one token count.
pub struct Bf16Outputs<B: Backend, const DQ: usize, const DKV: usize, S: Storage<B> = Owned> {
    q: Tensor<B, bf16, Cols<DQ>, S>,  // [T, DQ]
    k: Tensor<B, bf16, Cols<DKV>, S>, // [T, DKV]
    v: Tensor<B, bf16, Cols<DKV>, S>, // [T, DKV]
}

/// The tensors of a [`Bf16Outputs`], given back by [`Bf16Outputs::into_parts`].
pub struct Bf16OutputParts<B: Backend, const DQ: usize, const DKV: usize, S: Storage<B> = Owned> {
    /// Normalized (and tau-scaled) q, `[T, DQ]`.
    pub q: Tensor<B, bf16, Cols<DQ>, S>,
    /// Conv + RMSNorm k, `[T, DKV]`.
    pub k: Tensor<B, bf16, Cols<DKV>, S>,
    /// Conv v, `[T, DKV]`.
    pub v: Tensor<B, bf16, Cols<DKV>, S>,
}

impl<B: Backend, const DQ: usize, const DKV: usize> Bf16Outputs<B, DQ, DKV> {
    /// Zeroed outputs for `tokens` tokens.
    pub fn zeros(backend: &B, tokens: usize) -> Result<Self> {
        Ok(Self {
            q: Tensor::zeros(backend, tokens)?,
            k: Tensor::zeros(backend, tokens)?,
            v: Tensor::zeros(backend, tokens)?,
        })
    }
}

impl<B: Backend, const DQ: usize, const DKV: usize, S: Storage<B>> Bf16Outputs<B, DQ, DKV, S> {
    /// Outputs over the caller's tensors; all three must have the same number of tokens.
    pub fn new(
        q: Tensor<B, bf16, Cols<DQ>, S>,
        k: Tensor<B, bf16, Cols<DKV>, S>,
        v: Tensor<B, bf16, Cols<DKV>, S>,
    ) -> Result<Self> {
        k.expect_rows("k_out", "tokens (as q_out)", q.rows())?;
        v.expect_rows("v_out", "tokens (as q_out)", q.rows())?;
        Ok(Self { q, k, v })
    }

    /// Tokens the outputs hold.
    pub fn tokens(&self) -> usize {
        self.q.rows()
    }

    tensor_accessors! {
        /// Normalized (and tau-scaled) q, `[T, DQ]`.
        q / q_mut: bf16, Cols<DQ>;
        /// Conv + RMSNorm k, `[T, DKV]`.
        k / k_mut: bf16, Cols<DKV>;
        /// Conv v, `[T, DKV]`.
        v / v_mut: bf16, Cols<DKV>;
    }

    /// The tensors back.
    pub fn into_parts(self) -> Bf16OutputParts<B, DQ, DKV, S> {
        Bf16OutputParts {
            q: self.q,
            k: self.k,
            v: self.v,
        }
    }
}

impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> Bf16Outputs<B, DQ, DKV, S> {
    #[allow(clippy::type_complexity)]
    pub(crate) fn slices_mut(
        &mut self,
    ) -> (
        B::SliceMut<'_, bf16>,
        B::SliceMut<'_, bf16>,
        B::SliceMut<'_, bf16>,
    ) {
        (
            self.q.as_slice_mut(),
            self.k.as_slice_mut(),
            self.v.as_slice_mut(),
        )
    }
}

/// Outputs with an MXFP8 q: `q [T, DQ]` e4m3, `q_scales [T, HQ, 4]`, `k`, `v` bf16, tied to one
/// token count.
pub struct Mxfp8Outputs<B: Backend, const DQ: usize, const DKV: usize, S: Storage<B> = Owned> {
    q: Tensor<B, F8E4M3, Cols<DQ>, S>,             // [T, DQ]
    q_scales: Tensor<B, E8M0, BlockScales<DQ>, S>, // [T, DQ / 32]
    k: Tensor<B, bf16, Cols<DKV>, S>,              // [T, DKV]
    v: Tensor<B, bf16, Cols<DKV>, S>,              // [T, DKV]
}

/// The tensors of an [`Mxfp8Outputs`], given back by [`Mxfp8Outputs::into_parts`].
pub struct Mxfp8OutputParts<B: Backend, const DQ: usize, const DKV: usize, S: Storage<B> = Owned> {
    /// q as e4m3, `[T, DQ]`.
    pub q: Tensor<B, F8E4M3, Cols<DQ>, S>,
    /// q's E8M0 block scales, `[T, HQ, 4]` (one per 32 channels).
    pub q_scales: Tensor<B, E8M0, BlockScales<DQ>, S>,
    /// Conv + RMSNorm k, `[T, DKV]` bf16.
    pub k: Tensor<B, bf16, Cols<DKV>, S>,
    /// Conv v, `[T, DKV]` bf16.
    pub v: Tensor<B, bf16, Cols<DKV>, S>,
}

impl<B: Backend, const DQ: usize, const DKV: usize> Mxfp8Outputs<B, DQ, DKV> {
    /// Zeroed outputs for `tokens` tokens.
    pub fn zeros(backend: &B, tokens: usize) -> Result<Self> {
        Ok(Self {
            q: Tensor::zeros(backend, tokens)?,
            q_scales: Tensor::zeros(backend, tokens)?,
            k: Tensor::zeros(backend, tokens)?,
            v: Tensor::zeros(backend, tokens)?,
        })
    }
}

impl<B: Backend, const DQ: usize, const DKV: usize, S: Storage<B>> Mxfp8Outputs<B, DQ, DKV, S> {
    /// Outputs over the caller's tensors; all four must have the same number of tokens.
    pub fn new(
        q: Tensor<B, F8E4M3, Cols<DQ>, S>,
        q_scales: Tensor<B, E8M0, BlockScales<DQ>, S>,
        k: Tensor<B, bf16, Cols<DKV>, S>,
        v: Tensor<B, bf16, Cols<DKV>, S>,
    ) -> Result<Self> {
        q_scales.expect_rows("q_scale", "tokens (as q_out)", q.rows())?;
        k.expect_rows("k_out", "tokens (as q_out)", q.rows())?;
        v.expect_rows("v_out", "tokens (as q_out)", q.rows())?;
        Ok(Self { q, q_scales, k, v })
    }

    /// Tokens the outputs hold.
    pub fn tokens(&self) -> usize {
        self.q.rows()
    }

    tensor_accessors! {
        /// q as e4m3, `[T, DQ]`.
        q / q_mut: F8E4M3, Cols<DQ>;
        /// q's E8M0 block scales, `[T, HQ, 4]` (one per 32 channels).
        q_scales / q_scales_mut: E8M0, BlockScales<DQ>;
        /// Conv + RMSNorm k, `[T, DKV]` bf16.
        k / k_mut: bf16, Cols<DKV>;
        /// Conv v, `[T, DKV]` bf16.
        v / v_mut: bf16, Cols<DKV>;
    }

    /// The tensors back.
    pub fn into_parts(self) -> Mxfp8OutputParts<B, DQ, DKV, S> {
        Mxfp8OutputParts {
            q: self.q,
            q_scales: self.q_scales,
            k: self.k,
            v: self.v,
        }
    }
}

impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> Mxfp8Outputs<B, DQ, DKV, S> {
    #[allow(clippy::type_complexity)]
    pub(crate) fn slices_mut(
        &mut self,
    ) -> (
        B::SliceMut<'_, F8E4M3>,
        B::SliceMut<'_, E8M0>,
        B::SliceMut<'_, bf16>,
        B::SliceMut<'_, bf16>,
    ) {
        (
            self.q.as_slice_mut(),
            self.q_scales.as_slice_mut(),
            self.k.as_slice_mut(),
            self.v.as_slice_mut(),
        )
    }
}

fn check_tau<B: Backend, S: Storage<B>>(
    tau: &Option<Tensor<B, f32, Scalar, S>>,
    tokens: usize,
) -> Result<()> {
    match tau {
        Some(t) => t.expect_at_least("log_scaling_tau", "values (one per token)", tokens),
        None => Ok(()),
    }
}

fn to_i32(param: &'static str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::Value {
        param,
        value: value as i64,
        range: format!("0 ..= {}", i32::MAX),
    })
}

/// A target-verify batch: `B` sequences of exactly `q` draft tokens, `T = B·q`.
pub struct VerifyBatch<B: Backend, L, S: Storage<B> = Owned> {
    qkvr: Tensor<B, bf16, QkvrRow<L>, S>,     // [T, ROW]
    cache_indices: Tensor<B, i32, Scalar, S>, // [B]
    cache_mask: Tensor<B, u8, Scalar, S>,     // [B]
    loc: Tensor<B, i64, Scalar, S>,           // [T]
    tau: Option<Tensor<B, f32, Scalar, S>>,   // [>= T]
    draft_tokens: usize,
}

/// The tensors of a [`VerifyBatch`], given back by [`VerifyBatch::into_parts`].
pub struct VerifyBatchParts<B: Backend, L, S: Storage<B> = Owned> {
    /// Packed projection rows, `[T, ROW]`.
    pub qkvr: Tensor<B, bf16, QkvrRow<L>, S>,
    /// Conv-state slot of each sequence, `[B]`.
    pub cache_indices: Tensor<B, i32, Scalar, S>,
    /// Whether each sequence has cached history, `[B]`.
    pub cache_mask: Tensor<B, u8, Scalar, S>,
    /// KV slot of each token, `[T]`.
    pub loc: Tensor<B, i64, Scalar, S>,
    /// Per-token q temperature, `[>= T]`, or none.
    pub tau: Option<Tensor<B, f32, Scalar, S>>,
}

impl<B: Backend, L: RowLayout, S: Storage<B>> VerifyBatch<B, L, S> {
    /// Ties the batch: `q > 0`, `T == B·q`, `loc` has `T` entries, `cache_mask` `B`,
    /// `tau` at least `T`.
    pub fn new(
        qkvr: Tensor<B, bf16, QkvrRow<L>, S>,
        cache_indices: Tensor<B, i32, Scalar, S>,
        cache_mask: Tensor<B, u8, Scalar, S>,
        loc: Tensor<B, i64, Scalar, S>,
        tau: Option<Tensor<B, f32, Scalar, S>>,
        draft_tokens: usize,
    ) -> Result<Self> {
        if draft_tokens == 0 {
            return Err(Error::Value {
                param: "draft_tokens",
                value: 0,
                range: "1 ..".to_string(),
            });
        }
        let seqs = cache_indices.rows();
        let tokens = Error::elements("cache_indices", seqs, draft_tokens)?;
        qkvr.expect_rows("qkvr", "tokens (T = B·q)", tokens)?;
        to_i32("qkvr rows", qkvr.rows())?;
        cache_mask.expect_rows("cache_mask", "sequences", seqs)?;
        loc.expect_rows("loc", "tokens", qkvr.rows())?;
        check_tau(&tau, qkvr.rows())?;
        Ok(Self {
            qkvr,
            cache_indices,
            cache_mask,
            loc,
            tau,
            draft_tokens,
        })
    }

    /// Tokens, `T`.
    pub fn tokens(&self) -> usize {
        self.qkvr.rows()
    }
    /// Sequences, `B`.
    pub fn seqs(&self) -> usize {
        self.cache_indices.rows()
    }
    /// Draft tokens per sequence, `q`.
    pub fn draft_tokens(&self) -> usize {
        self.draft_tokens
    }

    tensor_accessors! {
        /// Packed projection rows, `[T, ROW]`.
        qkvr / qkvr_mut: bf16, QkvrRow<L>;
        /// Conv-state slot of each sequence, `[B]`; -1 = padding sequence.
        cache_indices / cache_indices_mut: i32, Scalar;
        /// Whether each sequence has cached history, `[B]` (0/1).
        cache_mask / cache_mask_mut: u8, Scalar;
        /// KV slot of each token, `[T]`; negative = do not store.
        loc / loc_mut: i64, Scalar;
    }

    /// Per-token q temperature, `[>= T]`, or none.
    pub fn tau(&self) -> Option<&Tensor<B, f32, Scalar, S>> {
        self.tau.as_ref()
    }

    /// The tensors back.
    pub fn into_parts(self) -> VerifyBatchParts<B, L, S> {
        VerifyBatchParts {
            qkvr: self.qkvr,
            cache_indices: self.cache_indices,
            cache_mask: self.cache_mask,
            loc: self.loc,
            tau: self.tau,
        }
    }
}

/// The verify step's saved conv windows, `[capacity, q, W-1, DKV]` for k and for v: row
/// `[s][p]` is sequence `s`'s conv state after draft token `p`.
pub struct VerifyWindows<B: Backend, const DKV: usize, C, S: Storage<B> = Owned> {
    k: Tensor<B, bf16, ConvHistory<DKV, C>, S>, // [capacity · q, W-1, DKV]
    v: Tensor<B, bf16, ConvHistory<DKV, C>, S>, // [capacity · q, W-1, DKV]
    draft_tokens: usize,
}

impl<B: Backend, const DKV: usize, C: ConvSpec> VerifyWindows<B, DKV, C> {
    /// Zeroed windows for `capacity` sequences of `draft_tokens` tokens.
    pub fn zeros(backend: &B, capacity: usize, draft_tokens: usize) -> Result<Self> {
        if draft_tokens == 0 {
            return Err(Error::Value {
                param: "draft_tokens",
                value: 0,
                range: "1 ..".to_string(),
            });
        }
        let rows = Error::elements("capacity", capacity, draft_tokens)?;
        Ok(Self {
            k: Tensor::zeros(backend, rows)?,
            v: Tensor::zeros(backend, rows)?,
            draft_tokens,
        })
    }
}

impl<B: Backend, const DKV: usize, C: ConvSpec, S: Storage<B>> VerifyWindows<B, DKV, C, S> {
    /// Windows over the caller's buffers; their rows must be a whole number of sequences.
    pub fn new(
        k: Tensor<B, bf16, ConvHistory<DKV, C>, S>,
        v: Tensor<B, bf16, ConvHistory<DKV, C>, S>,
        draft_tokens: usize,
    ) -> Result<Self> {
        v.expect_rows("v_inter", "rows", k.rows())?;
        if draft_tokens == 0 || !k.rows().is_multiple_of(draft_tokens) {
            return Err(Error::Extent {
                param: "k_inter",
                what: "rows (a multiple of the draft tokens)",
                expected: k.rows().next_multiple_of(draft_tokens.max(1)),
                actual: k.rows(),
            });
        }
        Ok(Self { k, v, draft_tokens })
    }

    /// Sequences the windows hold.
    pub fn capacity(&self) -> usize {
        self.k.rows() / self.draft_tokens
    }

    /// Draft tokens per sequence.
    pub fn draft_tokens(&self) -> usize {
        self.draft_tokens
    }

    tensor_accessors! {
        /// k windows, `[capacity · q, W-1, DKV]`.
        k / k_mut: bf16, ConvHistory<DKV, C>;
        /// v windows, `[capacity · q, W-1, DKV]`.
        v / v_mut: bf16, ConvHistory<DKV, C>;
    }

    /// The two window tensors back, `(k, v)`.
    pub fn into_parts(
        self,
    ) -> (
        ConvHistoryTensor<B, DKV, C, S>,
        ConvHistoryTensor<B, DKV, C, S>,
    ) {
        (self.k, self.v)
    }
}

impl<B: Backend, const DKV: usize, C: ConvSpec, S: StorageMut<B>> VerifyWindows<B, DKV, C, S> {
    pub(crate) fn slices_mut(&mut self) -> (B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>) {
        (self.k.as_slice_mut(), self.v.as_slice_mut())
    }
}

/// Prefix-cache tracking of the extend variant: for each flagged sequence, the conv window made
/// of the listed qkvr rows is copied to a conv slot.
pub struct ExtendTrack<B: Backend, C, S: Storage<B> = Owned> {
    rows: Tensor<B, i64, TrackRows<C>, S>, // [B, W-1]
    mask: Tensor<B, u8, Scalar, S>,        // [B]
    dst: Tensor<B, i64, Scalar, S>,        // [B]
}

impl<B: Backend, C: ConvSpec, S: Storage<B>> ExtendTrack<B, C, S> {
    /// Ties the three per-sequence arrays to one sequence count `B` (the batch checks `B`).
    pub fn new(
        rows: Tensor<B, i64, TrackRows<C>, S>,
        mask: Tensor<B, u8, Scalar, S>,
        dst: Tensor<B, i64, Scalar, S>,
    ) -> Result<Self> {
        mask.expect_rows("track_mask", "sequences (as track_rows)", rows.rows())?;
        dst.expect_rows("track_dst", "sequences (as track_rows)", rows.rows())?;
        Ok(Self { rows, mask, dst })
    }

    tensor_accessors! {
        /// qkvr rows of each sequence's window, `[B, W-1]`; rows outside `[0, T)` are skipped.
        rows / rows_mut: i64, TrackRows<C>;
        /// Whether to track each sequence, `[B]` (0/1).
        mask / mask_mut: u8, Scalar;
        /// Destination conv slot of each sequence, `[B]`.
        dst / dst_mut: i64, Scalar;
    }
}

/// A prefill / extend batch of variable-length sequences.
pub struct ExtendBatch<B: Backend, L, C, S: Storage<B> = Owned> {
    qkvr: Tensor<B, bf16, QkvrRow<L>, S>,        // [T, ROW]
    cu_seqlens: Tensor<B, i64, Scalar, S>,       // [B + 1]
    seq_of_token: Tensor<B, i32, Scalar, S>,     // [T]
    cache_indices: Tensor<B, i32, Scalar, S>,    // [B]
    cache_mask: Tensor<B, u8, Scalar, S>,        // [B]
    has_initial_state: Tensor<B, u8, Scalar, S>, // [B]
    loc: Tensor<B, i64, Scalar, S>,              // [T]
    tau: Option<Tensor<B, f32, Scalar, S>>,      // [>= T]
    track: Option<ExtendTrack<B, C, S>>,
    update_conv_state: bool,
}

/// The tensors of an [`ExtendBatch`], given back by [`ExtendBatch::into_parts`].
pub struct ExtendBatchParts<B: Backend, L, C, S: Storage<B> = Owned> {
    /// Packed projection rows, `[T, ROW]`.
    pub qkvr: Tensor<B, bf16, QkvrRow<L>, S>,
    /// Token start of each sequence, `[B+1]`.
    pub cu_seqlens: Tensor<B, i64, Scalar, S>,
    /// Sequence of each token, `[T]`.
    pub seq_of_token: Tensor<B, i32, Scalar, S>,
    /// Conv-state slot of each sequence, `[B]`.
    pub cache_indices: Tensor<B, i32, Scalar, S>,
    /// Whether each sequence reads cached history, `[B]`.
    pub cache_mask: Tensor<B, u8, Scalar, S>,
    /// Whether each sequence has an initial state, `[B]`.
    pub has_initial_state: Tensor<B, u8, Scalar, S>,
    /// KV slot of each token, `[T]`.
    pub loc: Tensor<B, i64, Scalar, S>,
    /// Per-token q temperature, or none.
    pub tau: Option<Tensor<B, f32, Scalar, S>>,
    /// Prefix-cache tracking, or none.
    pub track: Option<ExtendTrack<B, C, S>>,
}

impl<B: Backend, L: RowLayout, C: ConvSpec, S: Storage<B>> ExtendBatch<B, L, C, S> {
    /// Ties the batch: `cu_seqlens` has `B+1` entries, the per-sequence arrays `B`, the
    /// per-token arrays `T`, `tau` at least `T`. Index values are guarded on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        qkvr: Tensor<B, bf16, QkvrRow<L>, S>,
        cu_seqlens: Tensor<B, i64, Scalar, S>,
        seq_of_token: Tensor<B, i32, Scalar, S>,
        cache_indices: Tensor<B, i32, Scalar, S>,
        cache_mask: Tensor<B, u8, Scalar, S>,
        has_initial_state: Tensor<B, u8, Scalar, S>,
        loc: Tensor<B, i64, Scalar, S>,
        tau: Option<Tensor<B, f32, Scalar, S>>,
        track: Option<ExtendTrack<B, C, S>>,
        update_conv_state: bool,
    ) -> Result<Self> {
        let (tokens, seqs) = (qkvr.rows(), cache_indices.rows());
        to_i32("qkvr rows", tokens)?;
        to_i32("cache_indices rows", seqs)?;
        cu_seqlens.expect_rows("cu_seqlens", "entries (B + 1)", seqs + 1)?;
        seq_of_token.expect_rows("seq_of_token", "tokens", tokens)?;
        cache_mask.expect_rows("cache_mask", "sequences", seqs)?;
        has_initial_state.expect_rows("has_initial_state", "sequences", seqs)?;
        loc.expect_rows("loc", "tokens", tokens)?;
        check_tau(&tau, tokens)?;
        if let Some(t) = &track {
            t.rows.expect_rows("track_rows", "sequences", seqs)?;
            t.mask.expect_rows("track_mask", "sequences", seqs)?;
            t.dst.expect_rows("track_dst", "sequences", seqs)?;
        }
        Ok(Self {
            qkvr,
            cu_seqlens,
            seq_of_token,
            cache_indices,
            cache_mask,
            has_initial_state,
            loc,
            tau,
            track,
            update_conv_state,
        })
    }

    /// Tokens, `T`.
    pub fn tokens(&self) -> usize {
        self.qkvr.rows()
    }
    /// Sequences, `B`.
    pub fn seqs(&self) -> usize {
        self.cache_indices.rows()
    }

    tensor_accessors! {
        /// Packed projection rows, `[T, ROW]`.
        qkvr / qkvr_mut: bf16, QkvrRow<L>;
        /// Token start of each sequence, `[B+1]`.
        cu_seqlens / cu_seqlens_mut: i64, Scalar;
        /// Sequence of each token, `[T]`.
        seq_of_token / seq_of_token_mut: i32, Scalar;
        /// Conv-state slot of each sequence, `[B]`; -1 = padding.
        cache_indices / cache_indices_mut: i32, Scalar;
        /// Whether each sequence reads cached history, `[B]` ("has initial state and valid").
        cache_mask / cache_mask_mut: u8, Scalar;
        /// Whether each sequence has an initial state, `[B]` (used by the trailing update).
        has_initial_state / has_initial_state_mut: u8, Scalar;
        /// KV slot of each token, `[T]`; negative = do not store.
        loc / loc_mut: i64, Scalar;
    }

    /// Per-token q temperature, `[>= T]`, or none.
    pub fn tau(&self) -> Option<&Tensor<B, f32, Scalar, S>> {
        self.tau.as_ref()
    }
    /// Prefix-cache tracking, or none.
    pub fn track(&self) -> Option<&ExtendTrack<B, C, S>> {
        self.track.as_ref()
    }
    /// Whether each sequence's conv state is rewritten from its tail after the main kernel.
    pub fn update_conv_state(&self) -> bool {
        self.update_conv_state
    }

    /// The tensors back.
    pub fn into_parts(self) -> ExtendBatchParts<B, L, C, S> {
        ExtendBatchParts {
            qkvr: self.qkvr,
            cu_seqlens: self.cu_seqlens,
            seq_of_token: self.seq_of_token,
            cache_indices: self.cache_indices,
            cache_mask: self.cache_mask,
            has_initial_state: self.has_initial_state,
            loc: self.loc,
            tau: self.tau,
            track: self.track,
        }
    }
}

/// Prefix-cache tracking of the decode variant: flagged tokens also copy their new window to a
/// second conv slot.
pub struct DecodeTrack<B: Backend, S: Storage<B> = Owned> {
    mask: Tensor<B, u8, Scalar, S>,     // [T]
    indices: Tensor<B, i64, Scalar, S>, // [T]
}

impl<B: Backend, S: Storage<B>> DecodeTrack<B, S> {
    /// Ties the two per-token arrays to one token count (the batch checks `T`).
    pub fn new(mask: Tensor<B, u8, Scalar, S>, indices: Tensor<B, i64, Scalar, S>) -> Result<Self> {
        indices.expect_rows("track_indices", "tokens (as track_mask)", mask.rows())?;
        Ok(Self { mask, indices })
    }

    tensor_accessors! {
        /// Whether to track each token, `[T]` (0/1).
        mask / mask_mut: u8, Scalar;
        /// Destination conv slot of each token, `[T]`.
        indices / indices_mut: i64, Scalar;
    }
}

/// A decode batch: `T` independent tokens, one per sequence.
pub struct DecodeBatch<B: Backend, L, S: Storage<B> = Owned> {
    qkvr: Tensor<B, bf16, QkvrRow<L>, S>,     // [T, ROW]
    cache_indices: Tensor<B, i32, Scalar, S>, // [T]
    cache_mask: Tensor<B, u8, Scalar, S>,     // [T]
    loc: Tensor<B, i64, Scalar, S>,           // [T]
    tau: Option<Tensor<B, f32, Scalar, S>>,   // [>= T]
    track: Option<DecodeTrack<B, S>>,
}

/// The tensors of a [`DecodeBatch`], given back by [`DecodeBatch::into_parts`].
pub struct DecodeBatchParts<B: Backend, L, S: Storage<B> = Owned> {
    /// Packed projection rows, `[T, ROW]`.
    pub qkvr: Tensor<B, bf16, QkvrRow<L>, S>,
    /// Conv-state slot of each token, `[T]`.
    pub cache_indices: Tensor<B, i32, Scalar, S>,
    /// Whether each token reads cached history, `[T]`.
    pub cache_mask: Tensor<B, u8, Scalar, S>,
    /// KV slot of each token, `[T]`.
    pub loc: Tensor<B, i64, Scalar, S>,
    /// Per-token q temperature, or none.
    pub tau: Option<Tensor<B, f32, Scalar, S>>,
    /// Tracking, or none.
    pub track: Option<DecodeTrack<B, S>>,
}

impl<B: Backend, L: RowLayout, S: Storage<B>> DecodeBatch<B, L, S> {
    /// Ties the batch: every per-token array has `T` entries, `tau` at least `T`.
    pub fn new(
        qkvr: Tensor<B, bf16, QkvrRow<L>, S>,
        cache_indices: Tensor<B, i32, Scalar, S>,
        cache_mask: Tensor<B, u8, Scalar, S>,
        loc: Tensor<B, i64, Scalar, S>,
        tau: Option<Tensor<B, f32, Scalar, S>>,
        track: Option<DecodeTrack<B, S>>,
    ) -> Result<Self> {
        let tokens = qkvr.rows();
        to_i32("qkvr rows", tokens)?;
        cache_indices.expect_rows("cache_indices", "tokens", tokens)?;
        cache_mask.expect_rows("cache_mask", "tokens", tokens)?;
        loc.expect_rows("loc", "tokens", tokens)?;
        check_tau(&tau, tokens)?;
        if let Some(t) = &track {
            t.mask.expect_rows("track_mask", "tokens", tokens)?;
            t.indices.expect_rows("track_indices", "tokens", tokens)?;
        }
        Ok(Self {
            qkvr,
            cache_indices,
            cache_mask,
            loc,
            tau,
            track,
        })
    }

    /// Tokens, `T`.
    pub fn tokens(&self) -> usize {
        self.qkvr.rows()
    }

    tensor_accessors! {
        /// Packed projection rows, `[T, ROW]`.
        qkvr / qkvr_mut: bf16, QkvrRow<L>;
        /// Conv-state slot of each token, `[T]`; -1 = padding.
        cache_indices / cache_indices_mut: i32, Scalar;
        /// Whether each token reads cached history, `[T]` (0/1).
        cache_mask / cache_mask_mut: u8, Scalar;
        /// KV slot of each token, `[T]`; negative = do not store.
        loc / loc_mut: i64, Scalar;
    }

    /// Per-token q temperature, `[>= T]`, or none.
    pub fn tau(&self) -> Option<&Tensor<B, f32, Scalar, S>> {
        self.tau.as_ref()
    }
    /// Tracking, or none.
    pub fn track(&self) -> Option<&DecodeTrack<B, S>> {
        self.track.as_ref()
    }

    /// The tensors back.
    pub fn into_parts(self) -> DecodeBatchParts<B, L, S> {
        DecodeBatchParts {
            qkvr: self.qkvr,
            cache_indices: self.cache_indices,
            cache_mask: self.cache_mask,
            loc: self.loc,
            tau: self.tau,
            track: self.track,
        }
    }
}
