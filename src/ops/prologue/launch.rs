//! The launch layer: the checked call a backend receives, and the sealed entry that takes it.
//!
//! [`Prologue::run`](super::Prologue::run) ties the batch to the outputs, the caches and the
//! windows (row counts only: integer compares, no device access) and borrows everything as a
//! [`PrologueCall`] of slices and extents, grouped as the kernel reads them: the batch, the
//! variant's own arguments, the weights, the conv state and the targets. Backends trust a
//! `PrologueCall`: the types and those checks made it consistent. The module is private, so
//! the call, its parts and the entry cannot be named, built or called from outside the crate.

use super::args::{
    Bf16OutputSlices, Bf16Outputs, ConvStateSlices, DecodeBatch, DecodeBatchSlices,
    DecodeTrackSlices, ExtendBatch, ExtendBatchSlices, ExtendTrackSlices, Mxfp8OutputSlices,
    Mxfp8Outputs, VerifyBatch, VerifyBatchSlices, VerifyWindowSlices, VerifyWindows, WeightSlices,
};
use super::{ConvSpec, QkvrLayout, RowLayout, Store, Variant};
use crate::backend::Backend;
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::layout::{Mxfp8KvCache, PagedBf16Kv};
use crate::tensor::{Storage, StorageMut};

/// One checked prologue call as borrowed slices; extents in the field comments.
pub struct PrologueCall<'a, B: Backend> {
    /// What every variant's batch gives: tokens, sequences, qkvr, conv slots, `loc`, tau.
    pub(crate) batch: BatchSlices<'a, B>,
    /// What only this variant has (verify windows, extend sequences, decode tracking).
    pub(crate) variant: VariantSlices<'a, B>,
    /// The RMSNorm weights and conv taps.
    pub(crate) weights: WeightSlices<'a, B>,
    /// The conv-state caches.
    pub(crate) conv: ConvSlices<'a, B>,
    /// Where q, k and v go, and the skipped-index counter.
    pub(crate) targets: TargetSlices<'a, B>,
}

/// The part of a call every variant's batch gives.
pub struct BatchSlices<'a, B: Backend> {
    /// Tokens, `T`.
    pub(crate) tokens: usize,
    /// Sequences, `B` (`T` for decode).
    pub(crate) seqs: usize,
    /// Packed projection rows, `[T, ROW]`.
    pub(crate) qkvr: B::Slice<'a, bf16>,
    /// Conv slot of each sequence, `[B]` (decode `[T]`).
    pub(crate) cache_indices: B::Slice<'a, i32>,
    /// Whether each sequence reads cached history, `[B]` (decode `[T]`).
    pub(crate) cache_mask: B::Slice<'a, u8>,
    /// Per-token q temperature, `[>= T]`, or none.
    pub(crate) tau: Option<B::Slice<'a, f32>>,
    /// KV slot of each token, `[T]`.
    pub(crate) loc: B::Slice<'a, i64>,
}

/// The variant-specific part of a call.
pub enum VariantSlices<'a, B: Backend> {
    /// Verify: `T = B·q`, windows `[capacity, q, W-1, DKV]`.
    Verify {
        /// Draft tokens per sequence, `q`.
        draft_tokens: usize,
        /// The k and v windows, `[capacity · q, W-1, DKV]` each.
        windows: VerifyWindowSlices<'a, B>,
        /// Sequences the windows hold (>= B).
        capacity: usize,
    },
    /// Extend: variable-length sequences.
    Extend {
        /// Token start of each sequence, `[B+1]`.
        cu_seqlens: B::Slice<'a, i64>,
        /// Sequence of each token, `[T]`.
        seq_of_token: B::Slice<'a, i32>,
        /// Initial-state flag of each sequence, `[B]`.
        has_initial_state: B::Slice<'a, u8>,
        /// Prefix-cache tracking, `[B, W-1]` rows and `[B]` mask and destination, or none.
        track: Option<ExtendTrackSlices<'a, B>>,
        /// Run the trailing conv-state update.
        update_conv_state: bool,
    },
    /// Decode: one token per sequence.
    Decode {
        /// Tracking, `[T]` mask and destination, or none.
        track: Option<DecodeTrackSlices<'a, B>>,
    },
}

/// The conv-state caches of a call.
pub struct ConvSlices<'a, B: Backend> {
    /// k and v histories, `[slots, W-1, DKV]` each; written only by decode and the extend
    /// update.
    pub(crate) cache: ConvStateSlices<'a, B>,
    /// Conv-state slots.
    pub(crate) slots: usize,
}

/// Where a call writes: q, k, v per token, the KV store, the skipped-index counter.
pub struct TargetSlices<'a, B: Backend> {
    /// q output.
    pub(crate) q: QTarget<'a, B>,
    /// k output, `[T, DKV]`.
    pub(crate) k: B::SliceMut<'a, bf16>,
    /// v output, `[T, DKV]`.
    pub(crate) v: B::SliceMut<'a, bf16>,
    /// KV store.
    pub(crate) kv: KvTarget<'a, B>,
    /// Skipped-index counter, `[1]`, or none.
    pub(crate) bad_index_count: Option<B::SliceMut<'a, u32>>,
}

/// Where q goes.
pub enum QTarget<'a, B: Backend> {
    /// bf16 q, `[T, DQ]`.
    Bf16(B::SliceMut<'a, bf16>),
    /// e4m3 q `[T, DQ]` and its block scales `[T, DQ/32]`.
    Mxfp8 {
        /// e4m3 data, `[T, DQ]`.
        data: B::SliceMut<'a, F8E4M3>,
        /// E8M0 scales, `[T, DQ/32]`.
        scales: B::SliceMut<'a, E8M0>,
    },
}

/// Where K and V go.
pub enum KvTarget<'a, B: Backend> {
    /// Not stored.
    None,
    /// bf16 rows `[slots, DKV]`.
    Bf16 {
        /// K rows, `[slots, DKV]`.
        k: B::SliceMut<'a, bf16>,
        /// V rows, `[slots, DKV]`.
        v: B::SliceMut<'a, bf16>,
        /// Number of slots.
        slots: usize,
    },
    /// e4m3 rows `[slots, DKV]` and interleaved scale planes `[slots/PAGE, HKV, 32, PAGE/32, 4]`.
    Mxfp8 {
        /// K data, `[slots, DKV]`.
        k: B::SliceMut<'a, F8E4M3>,
        /// V data, `[slots, DKV]`.
        v: B::SliceMut<'a, F8E4M3>,
        /// K scales, `[slots/PAGE, HKV, 32, PAGE/32, 4]`.
        k_scales: B::SliceMut<'a, E8M0>,
        /// V scales, `[slots/PAGE, HKV, 32, PAGE/32, 4]`.
        v_scales: B::SliceMut<'a, E8M0>,
        /// Number of slots.
        slots: usize,
    },
}

/// The per-backend entry of the prologue: the private supertrait of
/// [`RunPrologue`](super::RunPrologue).
pub trait PrologueEntry: Backend + Sized {
    /// Runs the main prologue kernel of `Prologue<V, S, HD, DQ, DKV, L, C>` (and, for extend,
    /// the trailing conv-state update).
    ///
    /// # Safety
    /// `call` was assembled by `Prologue::run` (through its batch's `PrologueBatch`), whose
    /// rules and extent checks the kernel relies on.
    unsafe fn prologue<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C>(
        &self,
        call: PrologueCall<'_, Self>,
    ) -> Result<()>
    where
        V: Variant,
        S: Store,
        L: QkvrLayout<DQ, DKV>,
        C: ConvSpec;
}

/// An output set as the call sees it: its row counts and its slices.
pub trait OutputTargets<B: Backend> {
    /// Rows of every output tensor, named (`"q_out"`, …), for the boundary check.
    fn rows(&self) -> impl Iterator<Item = (&'static str, usize)>;
    /// The q target and the k/v outputs.
    fn targets(&mut self) -> (QTarget<'_, B>, B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>);
}

impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> OutputTargets<B>
    for Bf16Outputs<B, DQ, DKV, S>
{
    fn rows(&self) -> impl Iterator<Item = (&'static str, usize)> {
        [
            ("q_out", self.q().rows()),
            ("k_out", self.k().rows()),
            ("v_out", self.v().rows()),
        ]
        .into_iter()
    }
    fn targets(&mut self) -> (QTarget<'_, B>, B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>) {
        let Bf16OutputSlices { q, k, v } = self.slices_mut();
        (QTarget::Bf16(q), k, v)
    }
}

impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> OutputTargets<B>
    for Mxfp8Outputs<B, DQ, DKV, S>
{
    fn rows(&self) -> impl Iterator<Item = (&'static str, usize)> {
        [
            ("q_out", self.q().rows()),
            ("q_scale", self.q_scales().rows()),
            ("k_out", self.k().rows()),
            ("v_out", self.v().rows()),
        ]
        .into_iter()
    }
    fn targets(&mut self) -> (QTarget<'_, B>, B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>) {
        let Mxfp8OutputSlices { q, q_scales, k, v } = self.slices_mut();
        let q = QTarget::Mxfp8 {
            data: q,
            scales: q_scales,
        };
        (q, k, v)
    }
}

/// A cache's slices as a store target.
pub trait CacheSlices<B: Backend> {
    /// The cache's slices and slot count.
    fn target(&mut self) -> KvTarget<'_, B>;
}
impl<B: Backend> CacheSlices<B> for () {
    fn target(&mut self) -> KvTarget<'_, B> {
        KvTarget::None
    }
}
impl<B: Backend, const PAGE: usize, const DKV: usize, S: StorageMut<B>> CacheSlices<B>
    for PagedBf16Kv<B, PAGE, DKV, S>
{
    fn target(&mut self) -> KvTarget<'_, B> {
        let slots = self.slots();
        let (k, v) = self.slices_mut();
        KvTarget::Bf16 { k, v, slots }
    }
}
impl<B: Backend, const PAGE: usize, const DKV: usize, S: StorageMut<B>> CacheSlices<B>
    for Mxfp8KvCache<B, PAGE, DKV, S>
{
    fn target(&mut self) -> KvTarget<'_, B> {
        let slots = self.slots();
        let (k, v, k_scales, v_scales) = self.slices_mut();
        KvTarget::Mxfp8 {
            k,
            v,
            k_scales,
            v_scales,
            slots,
        }
    }
}

/// What differs between the variants' batches: each splits into the part every variant has
/// and its own, after its own checks. The private supertrait of
/// [`PrologueBatch`](super::PrologueBatch).
pub trait SplitBatch<'a, B: Backend> {
    /// The batch's slices, checked against what the variant pairs with it.
    fn split(self) -> Result<(BatchSlices<'a, B>, VariantSlices<'a, B>)>;
}

impl<'a, B: Backend, L: RowLayout, const DKV: usize, C: ConvSpec, SB, SN> SplitBatch<'a, B>
    for (
        &'a VerifyBatch<B, L, SB>,
        &'a mut VerifyWindows<B, DKV, C, SN>,
    )
where
    SB: Storage<B>,
    SN: StorageMut<B>,
{
    /// Verify: the windows hold the batch's draft tokens and at least its sequences.
    fn split(self) -> Result<(BatchSlices<'a, B>, VariantSlices<'a, B>)> {
        let (batch, windows) = self;
        let (tokens, seqs, capacity) = (batch.tokens(), batch.seqs(), windows.capacity());
        let VerifyBatchSlices {
            qkvr,
            cache_indices,
            cache_mask,
            loc,
            tau,
            draft_tokens,
        } = batch.slices();
        let windows = windows.slices_mut();
        Error::check_extent(
            "k_inter",
            "draft tokens per sequence",
            draft_tokens,
            windows.draft_tokens,
        )?;
        if capacity < seqs {
            return Err(Error::Extent {
                param: "k_inter",
                what: "sequences (at least B)",
                expected: seqs,
                actual: capacity,
            });
        }
        let common = BatchSlices {
            tokens,
            seqs,
            qkvr,
            cache_indices,
            cache_mask,
            tau,
            loc,
        };
        let variant = VariantSlices::Verify {
            draft_tokens,
            windows,
            capacity,
        };
        Ok((common, variant))
    }
}

impl<'a, B: Backend, L: RowLayout, C: ConvSpec, SB: Storage<B>> SplitBatch<'a, B>
    for &'a ExtendBatch<B, L, C, SB>
{
    /// Extend: sequences of their own lengths, tied at the batch's constructor.
    fn split(self) -> Result<(BatchSlices<'a, B>, VariantSlices<'a, B>)> {
        let (tokens, seqs) = (self.tokens(), self.seqs());
        let ExtendBatchSlices {
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
        } = self.slices();
        let common = BatchSlices {
            tokens,
            seqs,
            qkvr,
            cache_indices,
            cache_mask,
            tau,
            loc,
        };
        let variant = VariantSlices::Extend {
            cu_seqlens,
            seq_of_token,
            has_initial_state,
            track,
            update_conv_state,
        };
        Ok((common, variant))
    }
}

impl<'a, B: Backend, L: RowLayout, SB: Storage<B>> SplitBatch<'a, B> for &'a DecodeBatch<B, L, SB> {
    /// Decode: one token per sequence, so `B = T`.
    fn split(self) -> Result<(BatchSlices<'a, B>, VariantSlices<'a, B>)> {
        let tokens = self.tokens();
        let DecodeBatchSlices {
            qkvr,
            cache_indices,
            cache_mask,
            loc,
            tau,
            track,
        } = self.slices();
        let common = BatchSlices {
            tokens,
            seqs: tokens,
            qkvr,
            cache_indices,
            cache_mask,
            tau,
            loc,
        };
        Ok((common, VariantSlices::Decode { track }))
    }
}
