//! The typed `run` methods, and the checked call they hand to a backend.
//!
//! `run` ties the batch to the outputs, the caches and the windows (row counts only: integer
//! compares, no device access) and flattens everything into a [`PrologueCall`] of plain buffers
//! and extents. Backends trust a `PrologueCall`: the types and these checks made it consistent.

use super::args::{ConvState, DecodeBatch, ErrorCounter, ExtendBatch, PrologueWeights};
use super::args::{VerifyBatch, VerifyWindows};
use super::{
    ConvSpec, Decode, Extend, Outputs, Prologue, PrologueKernel, QkvrLayout, RunPrologue, Store,
    Verify,
};
use crate::backend::Backend;
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::layout::{Mxfp8KvCache, PagedBf16Kv};

/// Where q goes.
pub enum QTarget<'a, B: Backend> {
    /// bf16 q, `[T, DQ]`.
    Bf16(&'a mut B::Buffer<bf16>),
    /// e4m3 q `[T, DQ]` and its block scales `[T, DQ/32]`.
    Mxfp8 {
        /// e4m3 data.
        data: &'a mut B::Buffer<F8E4M3>,
        /// E8M0 scales.
        scales: &'a mut B::Buffer<E8M0>,
    },
}

/// Where K and V go.
pub enum KvTarget<'a, B: Backend> {
    /// Not stored.
    None,
    /// bf16 rows `[slots, DKV]`.
    Bf16 {
        /// K rows.
        k: &'a mut B::Buffer<bf16>,
        /// V rows.
        v: &'a mut B::Buffer<bf16>,
        /// Number of slots.
        slots: usize,
    },
    /// e4m3 rows `[slots, DKV]` and interleaved scale planes `[slots/PAGE, HKV, 32, PAGE/32, 4]`.
    Mxfp8 {
        /// K data.
        k: &'a mut B::Buffer<F8E4M3>,
        /// V data.
        v: &'a mut B::Buffer<F8E4M3>,
        /// K scales.
        k_scales: &'a mut B::Buffer<E8M0>,
        /// V scales.
        v_scales: &'a mut B::Buffer<E8M0>,
        /// Number of slots.
        slots: usize,
    },
}

/// The variant-specific part of a call.
pub enum VariantArgs<'a, B: Backend> {
    /// Verify: `T = B·q`, windows `[capacity, q, W-1, DKV]`.
    Verify {
        /// Draft tokens per sequence.
        draft_tokens: usize,
        /// k windows.
        k_inter: &'a mut B::Buffer<bf16>,
        /// v windows.
        v_inter: &'a mut B::Buffer<bf16>,
        /// Sequences the windows hold (>= B).
        capacity: usize,
    },
    /// Extend.
    Extend {
        /// `[B+1]` token starts.
        cu_seqlens: &'a B::Buffer<i64>,
        /// `[T]` sequence of each token.
        seq_of_token: &'a B::Buffer<i32>,
        /// `[B]` initial-state flags.
        has_initial_state: &'a B::Buffer<u8>,
        /// Prefix-cache tracking.
        track: Option<ExtendTrackRef<'a, B>>,
        /// Run the trailing conv-state update.
        update_conv_state: bool,
    },
    /// Decode.
    Decode {
        /// Tracking.
        track: Option<DecodeTrackRef<'a, B>>,
    },
}

/// Extend tracking as plain buffers.
pub struct ExtendTrackRef<'a, B: Backend> {
    /// `[B, W-1]` qkvr rows of each tracked window.
    pub rows: &'a B::Buffer<i64>,
    /// `[B]` whether to track.
    pub mask: &'a B::Buffer<u8>,
    /// `[B]` destination conv slot.
    pub dst: &'a B::Buffer<i64>,
}

/// Decode tracking as plain buffers.
pub struct DecodeTrackRef<'a, B: Backend> {
    /// `[T]` whether to track.
    pub mask: &'a B::Buffer<u8>,
    /// `[T]` destination conv slot.
    pub indices: &'a B::Buffer<i64>,
}

/// One checked prologue call as plain buffers; extents in the comments.
pub struct PrologueCall<'a, B: Backend> {
    /// Tokens, `T`.
    pub tokens: usize,
    /// Sequences, `B` (`T` for decode).
    pub seqs: usize,
    /// `[T, ROW]`.
    pub qkvr: &'a B::Buffer<bf16>,
    /// `[HD]`.
    pub q_gamma: &'a B::Buffer<bf16>,
    /// `[HD]`.
    pub k_gamma: &'a B::Buffer<bf16>,
    /// `[DKV, W]`.
    pub k_weight: &'a B::Buffer<bf16>,
    /// `[DKV, W]`.
    pub v_weight: &'a B::Buffer<bf16>,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// `[slots, W-1, DKV]`; written only by decode and the extend update.
    pub k_cache: &'a mut B::Buffer<bf16>,
    /// `[slots, W-1, DKV]`.
    pub v_cache: &'a mut B::Buffer<bf16>,
    /// Conv-state slots.
    pub conv_slots: usize,
    /// `[B]` (decode `[T]`).
    pub cache_indices: &'a B::Buffer<i32>,
    /// `[B]` (decode `[T]`).
    pub cache_mask: &'a B::Buffer<u8>,
    /// `[>= T]` or none.
    pub tau: Option<&'a B::Buffer<f32>>,
    /// `[T]`.
    pub loc: &'a B::Buffer<i64>,
    /// q output.
    pub q: QTarget<'a, B>,
    /// `[T, DKV]`.
    pub k_out: &'a mut B::Buffer<bf16>,
    /// `[T, DKV]`.
    pub v_out: &'a mut B::Buffer<bf16>,
    /// KV store.
    pub kv: KvTarget<'a, B>,
    /// Variant-specific arguments.
    pub variant: VariantArgs<'a, B>,
    /// `[1]` skipped-index counter, or none.
    pub bad_index_count: Option<&'a mut B::Buffer<u32>>,
}

/// A KV cache the prologue can store into.
pub trait KvCacheTarget<B: Backend> {
    /// The cache's buffers as a store target.
    fn target(&mut self) -> KvTarget<'_, B>;
}
impl<B: Backend> KvCacheTarget<B> for () {
    fn target(&mut self) -> KvTarget<'_, B> {
        KvTarget::None
    }
}
impl<B: Backend, const PAGE: usize, const DKV: usize> KvCacheTarget<B>
    for PagedBf16Kv<B, PAGE, DKV>
{
    fn target(&mut self) -> KvTarget<'_, B> {
        let slots = self.slots();
        KvTarget::Bf16 {
            k: self.k.buffer_mut(),
            v: self.v.buffer_mut(),
            slots,
        }
    }
}
impl<B: Backend, const PAGE: usize, const DKV: usize> KvCacheTarget<B>
    for Mxfp8KvCache<B, PAGE, DKV>
{
    fn target(&mut self) -> KvTarget<'_, B> {
        let slots = self.slots();
        KvTarget::Mxfp8 {
            k: self.k.buffer_mut(),
            v: self.v.buffer_mut(),
            k_scales: self.k_scales.buffer_mut(),
            v_scales: self.v_scales.buffer_mut(),
            slots,
        }
    }
}

/// What every variant's batch contributes to a call.
struct BatchRefs<'a, B: Backend> {
    tokens: usize,
    seqs: usize,
    qkvr: &'a B::Buffer<bf16>,
    cache_indices: &'a B::Buffer<i32>,
    cache_mask: &'a B::Buffer<u8>,
    tau: Option<&'a B::Buffer<f32>>,
    loc: &'a B::Buffer<i64>,
}

/// Ties the outputs to the batch and flattens everything into one call.
fn assemble<'a, B: Backend, const HD: usize, const DKV: usize, C: ConvSpec>(
    batch: BatchRefs<'a, B>,
    weights: &'a PrologueWeights<B, HD, DKV, C>,
    conv: &'a mut ConvState<B, DKV, C>,
    out: &'a mut impl Outputs<B>,
    kv: KvTarget<'a, B>,
    variant: VariantArgs<'a, B>,
    errors: Option<&'a mut ErrorCounter<B>>,
) -> Result<PrologueCall<'a, B>> {
    check_outputs(out, batch.tokens)?;
    let (q, k_out, v_out) = out.targets();
    let conv_slots = conv.slots();
    Ok(PrologueCall {
        tokens: batch.tokens,
        seqs: batch.seqs,
        qkvr: batch.qkvr,
        q_gamma: weights.q_gamma.buffer(),
        k_gamma: weights.k_gamma.buffer(),
        k_weight: weights.k_weight.buffer(),
        v_weight: weights.v_weight.buffer(),
        eps: weights.eps,
        k_cache: conv.k.buffer_mut(),
        v_cache: conv.v.buffer_mut(),
        conv_slots,
        cache_indices: batch.cache_indices,
        cache_mask: batch.cache_mask,
        tau: batch.tau,
        loc: batch.loc,
        q,
        k_out,
        v_out,
        kv,
        variant,
        bad_index_count: errors.map(|e| e.count.buffer_mut()),
    })
}

fn check_outputs<B: Backend>(out: &impl Outputs<B>, tokens: usize) -> Result<()> {
    for (param, rows) in out.rows() {
        Error::check_extent(param, "tokens", tokens, rows)?;
    }
    Ok(())
}

impl<S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<Verify, S, HD, DQ, DKV, L, C>
where
    S: Store,
    L: QkvrLayout,
    C: ConvSpec,
    Self: PrologueKernel,
{
    /// Runs the verify prologue: q/k/v out, windows saved, K/V stored at `loc`.
    #[allow(clippy::too_many_arguments)]
    pub fn run<B: RunPrologue>(
        &self,
        backend: &B,
        weights: &PrologueWeights<B, HD, DKV, C>,
        conv: &mut ConvState<B, DKV, C>,
        batch: &VerifyBatch<B, L>,
        windows: &mut VerifyWindows<B, DKV, C>,
        out: &mut S::Outputs<B, DQ, DKV>,
        kv: &mut S::Cache<B, DKV>,
        errors: Option<&mut ErrorCounter<B>>,
    ) -> Result<()>
    where
        S::Cache<B, DKV>: KvCacheTarget<B>,
    {
        Error::check_extent(
            "k_inter",
            "draft tokens per sequence",
            batch.draft_tokens(),
            windows.draft_tokens(),
        )?;
        if windows.capacity() < batch.seqs() {
            return Err(Error::Extent {
                param: "k_inter",
                what: "sequences (at least B)",
                expected: batch.seqs(),
                actual: windows.capacity(),
            });
        }
        let refs = BatchRefs {
            tokens: batch.tokens(),
            seqs: batch.seqs(),
            qkvr: batch.qkvr.buffer(),
            cache_indices: batch.cache_indices.buffer(),
            cache_mask: batch.cache_mask.buffer(),
            tau: batch.tau.as_ref().map(|t| t.buffer()),
            loc: batch.loc.buffer(),
        };
        let capacity = windows.capacity();
        let variant = VariantArgs::Verify {
            draft_tokens: batch.draft_tokens(),
            k_inter: windows.k.buffer_mut(),
            v_inter: windows.v.buffer_mut(),
            capacity,
        };
        backend.prologue::<Self>(assemble(
            refs,
            weights,
            conv,
            out,
            kv.target(),
            variant,
            errors,
        )?)
    }
}

impl<S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<Extend, S, HD, DQ, DKV, L, C>
where
    S: Store,
    L: QkvrLayout,
    C: ConvSpec,
    Self: PrologueKernel,
{
    /// Runs the extend prologue, then (if asked) the trailing conv-state update.
    #[allow(clippy::too_many_arguments)]
    pub fn run<B: RunPrologue>(
        &self,
        backend: &B,
        weights: &PrologueWeights<B, HD, DKV, C>,
        conv: &mut ConvState<B, DKV, C>,
        batch: &ExtendBatch<B, L, C>,
        out: &mut S::Outputs<B, DQ, DKV>,
        kv: &mut S::Cache<B, DKV>,
        errors: Option<&mut ErrorCounter<B>>,
    ) -> Result<()>
    where
        S::Cache<B, DKV>: KvCacheTarget<B>,
    {
        let refs = BatchRefs {
            tokens: batch.tokens(),
            seqs: batch.seqs(),
            qkvr: batch.qkvr.buffer(),
            cache_indices: batch.cache_indices.buffer(),
            cache_mask: batch.cache_mask.buffer(),
            tau: batch.tau.as_ref().map(|t| t.buffer()),
            loc: batch.loc.buffer(),
        };
        let variant = VariantArgs::Extend {
            cu_seqlens: batch.cu_seqlens.buffer(),
            seq_of_token: batch.seq_of_token.buffer(),
            has_initial_state: batch.has_initial_state.buffer(),
            track: batch.track.as_ref().map(|t| ExtendTrackRef {
                rows: t.rows.buffer(),
                mask: t.mask.buffer(),
                dst: t.dst.buffer(),
            }),
            update_conv_state: batch.update_conv_state,
        };
        backend.prologue::<Self>(assemble(
            refs,
            weights,
            conv,
            out,
            kv.target(),
            variant,
            errors,
        )?)
    }
}

impl<S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<Decode, S, HD, DQ, DKV, L, C>
where
    S: Store,
    L: QkvrLayout,
    C: ConvSpec,
    Self: PrologueKernel,
{
    /// Runs the decode prologue: the conv state of each valid token is updated in place.
    #[allow(clippy::too_many_arguments)]
    pub fn run<B: RunPrologue>(
        &self,
        backend: &B,
        weights: &PrologueWeights<B, HD, DKV, C>,
        conv: &mut ConvState<B, DKV, C>,
        batch: &DecodeBatch<B, L>,
        out: &mut S::Outputs<B, DQ, DKV>,
        kv: &mut S::Cache<B, DKV>,
        errors: Option<&mut ErrorCounter<B>>,
    ) -> Result<()>
    where
        S::Cache<B, DKV>: KvCacheTarget<B>,
    {
        let refs = BatchRefs {
            tokens: batch.tokens(),
            seqs: batch.tokens(),
            qkvr: batch.qkvr.buffer(),
            cache_indices: batch.cache_indices.buffer(),
            cache_mask: batch.cache_mask.buffer(),
            tau: batch.tau.as_ref().map(|t| t.buffer()),
            loc: batch.loc.buffer(),
        };
        let variant = VariantArgs::Decode {
            track: batch.track.as_ref().map(|t| DecodeTrackRef {
                mask: t.mask.buffer(),
                indices: t.indices.buffer(),
            }),
        };
        backend.prologue::<Self>(assemble(
            refs,
            weights,
            conv,
            out,
            kv.target(),
            variant,
            errors,
        )?)
    }
}
