//! The typed `run` methods, and the checked call they hand to a backend.
//!
//! `run` ties the batch to the outputs, the caches and the windows (row counts only: integer
//! compares, no device access) and flattens everything into a [`PrologueCall`] of borrowed
//! slices and extents. Backends trust a `PrologueCall`: the types and these checks made it
//! consistent. Everything in this module is internal: the module is private, so the call, its
//! parts and the backend entry cannot be named, built or called from outside the crate.

use super::args::{Bf16Outputs, Mxfp8Outputs, VerifyBatch, VerifyWindows};
use super::args::{ConvState, DecodeBatch, ErrorCounter, ExtendBatch, PrologueWeights};
use super::{
    ConvSpec, Decode, Extend, Outputs, Prologue, PrologueKernel, QkvrLayout, RunPrologue, Store,
    Verify,
};
use crate::backend::cuda::{GraphRecorder, IsCuda};
use crate::backend::{Backend, Cuda};
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::layout::{Mxfp8KvCache, PagedBf16Kv};
use crate::tensor::{Storage, StorageMut};

/// Where q goes.
pub enum QTarget<'a, B: Backend> {
    /// bf16 q, `[T, DQ]`.
    Bf16(B::SliceMut<'a, bf16>),
    /// e4m3 q `[T, DQ]` and its block scales `[T, DQ/32]`.
    Mxfp8 {
        /// e4m3 data.
        data: B::SliceMut<'a, F8E4M3>,
        /// E8M0 scales.
        scales: B::SliceMut<'a, E8M0>,
    },
}

/// Where K and V go.
pub enum KvTarget<'a, B: Backend> {
    /// Not stored.
    None,
    /// bf16 rows `[slots, DKV]`.
    Bf16 {
        /// K rows.
        k: B::SliceMut<'a, bf16>,
        /// V rows.
        v: B::SliceMut<'a, bf16>,
        /// Number of slots.
        slots: usize,
    },
    /// e4m3 rows `[slots, DKV]` and interleaved scale planes `[slots/PAGE, HKV, 32, PAGE/32, 4]`.
    Mxfp8 {
        /// K data.
        k: B::SliceMut<'a, F8E4M3>,
        /// V data.
        v: B::SliceMut<'a, F8E4M3>,
        /// K scales.
        k_scales: B::SliceMut<'a, E8M0>,
        /// V scales.
        v_scales: B::SliceMut<'a, E8M0>,
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
        k_inter: B::SliceMut<'a, bf16>,
        /// v windows.
        v_inter: B::SliceMut<'a, bf16>,
        /// Sequences the windows hold (>= B).
        capacity: usize,
    },
    /// Extend.
    Extend {
        /// `[B+1]` token starts.
        cu_seqlens: B::Slice<'a, i64>,
        /// `[T]` sequence of each token.
        seq_of_token: B::Slice<'a, i32>,
        /// `[B]` initial-state flags.
        has_initial_state: B::Slice<'a, u8>,
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

/// Extend tracking as slices.
pub struct ExtendTrackRef<'a, B: Backend> {
    /// `[B, W-1]` qkvr rows of each tracked window.
    pub rows: B::Slice<'a, i64>,
    /// `[B]` whether to track.
    pub mask: B::Slice<'a, u8>,
    /// `[B]` destination conv slot.
    pub dst: B::Slice<'a, i64>,
}

/// Decode tracking as slices.
pub struct DecodeTrackRef<'a, B: Backend> {
    /// `[T]` whether to track.
    pub mask: B::Slice<'a, u8>,
    /// `[T]` destination conv slot.
    pub indices: B::Slice<'a, i64>,
}

/// One checked prologue call as slices; extents in the comments.
pub struct PrologueCall<'a, B: Backend> {
    /// Tokens, `T`.
    pub tokens: usize,
    /// Sequences, `B` (`T` for decode).
    pub seqs: usize,
    /// `[T, ROW]`.
    pub qkvr: B::Slice<'a, bf16>,
    /// `[HD]`.
    pub q_gamma: B::Slice<'a, bf16>,
    /// `[HD]`.
    pub k_gamma: B::Slice<'a, bf16>,
    /// `[DKV, W]`.
    pub k_weight: B::Slice<'a, bf16>,
    /// `[DKV, W]`.
    pub v_weight: B::Slice<'a, bf16>,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// `[slots, W-1, DKV]`; written only by decode and the extend update.
    pub k_cache: B::SliceMut<'a, bf16>,
    /// `[slots, W-1, DKV]`.
    pub v_cache: B::SliceMut<'a, bf16>,
    /// Conv-state slots.
    pub conv_slots: usize,
    /// `[B]` (decode `[T]`).
    pub cache_indices: B::Slice<'a, i32>,
    /// `[B]` (decode `[T]`).
    pub cache_mask: B::Slice<'a, u8>,
    /// `[>= T]` or none.
    pub tau: Option<B::Slice<'a, f32>>,
    /// `[T]`.
    pub loc: B::Slice<'a, i64>,
    /// q output.
    pub q: QTarget<'a, B>,
    /// `[T, DKV]`.
    pub k_out: B::SliceMut<'a, bf16>,
    /// `[T, DKV]`.
    pub v_out: B::SliceMut<'a, bf16>,
    /// KV store.
    pub kv: KvTarget<'a, B>,
    /// Variant-specific arguments.
    pub variant: VariantArgs<'a, B>,
    /// `[1]` skipped-index counter, or none.
    pub bad_index_count: Option<B::SliceMut<'a, u32>>,
}

/// The per-backend entry of the prologue.
pub trait PrologueLaunchEntry: Backend + Sized {
    /// Runs the main prologue kernel (and, for extend, the trailing conv-state update).
    ///
    /// # Safety
    /// `call` was assembled by a typed `run` (one of the variants' `call`), whose rules and
    /// extent checks the kernel relies on.
    unsafe fn prologue<K: PrologueKernel>(&self, call: PrologueCall<'_, Self>) -> Result<()>;
}

/// A backend whose launches can be handed out as parameter blocks (CUDA).
pub trait PlansLaunches: Backend + Sized {
    /// The parameter blocks and shapes of one checked call.
    fn plan<K: PrologueKernel>(
        &self,
        call: PrologueCall<'_, Self>,
    ) -> Result<super::PrologueLaunch>;
}
impl PlansLaunches for Cuda {
    fn plan<K: PrologueKernel>(
        &self,
        call: PrologueCall<'_, Cuda>,
    ) -> Result<super::PrologueLaunch> {
        super::cuda::prologue_launch::<K>(self, call)
    }
}

/// An output set as the launch sees it: its row counts and its slices.
pub trait OutputTargets<B: Backend> {
    /// Rows of every output tensor, named (`"q_out"`, …), for the boundary check.
    fn rows(&self) -> impl Iterator<Item = (&'static str, usize)>;
    /// The q target and the k/v outputs.
    fn targets(&mut self) -> (QTarget<'_, B>, B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>);
}

impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> Outputs<B>
    for Bf16Outputs<B, DQ, DKV, S>
{
}
impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> Outputs<B>
    for Mxfp8Outputs<B, DQ, DKV, S>
{
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
        let (q, k, v) = self.slices_mut();
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
        let (data, scales, k, v) = self.slices_mut();
        (QTarget::Mxfp8 { data, scales }, k, v)
    }
}

/// A KV cache the prologue can store into (none, [`PagedBf16Kv`], [`Mxfp8KvCache`]). Sealed:
/// the launch trusts the slot count it reports.
pub trait KvCacheTarget<B: Backend>: CacheSlices<B> {}
impl<B: Backend> KvCacheTarget<B> for () {}
impl<B: Backend, const PAGE: usize, const DKV: usize, S: StorageMut<B>> KvCacheTarget<B>
    for PagedBf16Kv<B, PAGE, DKV, S>
{
}
impl<B: Backend, const PAGE: usize, const DKV: usize, S: StorageMut<B>> KvCacheTarget<B>
    for Mxfp8KvCache<B, PAGE, DKV, S>
{
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

/// What every variant's batch contributes to a call.
struct BatchRefs<'a, B: Backend> {
    tokens: usize,
    seqs: usize,
    qkvr: B::Slice<'a, bf16>,
    cache_indices: B::Slice<'a, i32>,
    cache_mask: B::Slice<'a, u8>,
    tau: Option<B::Slice<'a, f32>>,
    loc: B::Slice<'a, i64>,
}

/// Ties the outputs to the batch and flattens everything into one call.
#[allow(clippy::too_many_arguments)]
fn assemble<
    'a,
    B: Backend,
    const HD: usize,
    const DKV: usize,
    C: ConvSpec,
    SW: Storage<B>,
    SC: StorageMut<B>,
>(
    batch: BatchRefs<'a, B>,
    weights: &'a PrologueWeights<B, HD, DKV, C, SW>,
    conv: &'a mut ConvState<B, DKV, C, SC>,
    out: &'a mut impl OutputTargets<B>,
    kv: KvTarget<'a, B>,
    variant: VariantArgs<'a, B>,
    errors: Option<&'a mut ErrorCounter<B>>,
) -> Result<PrologueCall<'a, B>> {
    check_outputs(out, batch.tokens)?;
    let (q, k_out, v_out) = out.targets();
    let conv_slots = conv.slots();
    let (k_cache, v_cache) = conv.slices_mut();
    Ok(PrologueCall {
        tokens: batch.tokens,
        seqs: batch.seqs,
        qkvr: batch.qkvr,
        q_gamma: weights.q_gamma().as_slice(),
        k_gamma: weights.k_gamma().as_slice(),
        k_weight: weights.k_weight().as_slice(),
        v_weight: weights.v_weight().as_slice(),
        eps: weights.eps(),
        k_cache,
        v_cache,
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
        bad_index_count: errors.map(|e| e.count_tensor_mut().as_slice_mut()),
    })
}

fn check_outputs<B: Backend>(out: &impl OutputTargets<B>, tokens: usize) -> Result<()> {
    for (param, rows) in out.rows() {
        Error::check_extent(param, "tokens", tokens, rows)?;
    }
    Ok(())
}

/// The `run` (any backend) and `launch_plan` (CUDA) entries of one variant: both go through
/// the variant's `call`, the one place its boundary checks live.
macro_rules! variant_entries {
    ($(#[$doc:meta])* [$($st:ident: $bound:ident),*] ($($arg:ident: $ty:ty),*)) => {
        $(#[$doc])*
        ///
        /// Every argument struct can hold owned tensors or views of the caller's buffers (its
        /// storage parameter), independently of the others.
        #[allow(clippy::too_many_arguments)]
        pub fn run<'r, B: RunPrologue, $($st: $bound<B>),*>(
            &self,
            backend: &B,
            $($arg: $ty,)*
        ) -> Result<()>
        {
            let call = Self::call($($arg),*)?;
            // SAFETY: assembled by this variant's `call`, the boundary.
            unsafe { backend.prologue::<Self>(call) }
        }

        /// Records the same call into a CUDA graph (after the same checks as `run`): the graph
        /// borrows every argument until it is dropped, so no tensor can be freed or swapped
        /// while it can replay.
        #[allow(clippy::too_many_arguments)]
        pub fn record<'r, B: RunPrologue + IsCuda, $($st: $bound<B>),*>(
            &self,
            graph: &mut GraphRecorder<'r>,
            $($arg: $ty,)*
        ) -> Result<()>
        {
            graph.record(|cuda: &B| self.run(cuda, $($arg),*))
        }

        /// The launches `run` would queue on `cuda`, as parameter blocks and shapes, after the
        /// same checks; nothing is queued. For replaying the call with raw driver launches
        /// (a benchmark's baseline, an engine's own graph), which is `unsafe` on the caller's
        /// side: the blocks hold raw device addresses of the buffers borrowed here.
        #[allow(clippy::too_many_arguments)]
        pub fn launch_plan<'r, B: PlansLaunches, $($st: $bound<B>),*>(
            &self,
            cuda: &B,
            $($arg: $ty,)*
        ) -> Result<super::PrologueLaunch>
        {
            cuda.plan::<Self>(Self::call($($arg),*)?)
        }
    };
}

impl<S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<Verify, S, HD, DQ, DKV, L, C>
where
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
    Self: PrologueKernel,
{
    variant_entries! {
        /// Runs the verify prologue: q/k/v out, windows saved, K/V stored at `loc`.
        [SW: Storage, SC: StorageMut, SB: Storage, SN: StorageMut, SO: StorageMut, SK: StorageMut]
        (
            weights: &'r PrologueWeights<B, HD, DKV, C, SW>,
            conv: &'r mut ConvState<B, DKV, C, SC>,
            batch: &'r VerifyBatch<B, L, SB>,
            windows: &'r mut VerifyWindows<B, DKV, C, SN>,
            out: &'r mut S::Outputs<B, DQ, DKV, SO>,
            kv: &'r mut S::Cache<B, DKV, SK>,
            errors: Option<&'r mut ErrorCounter<B>>
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn call<
        'a,
        B: Backend,
        SW: Storage<B>,
        SC: StorageMut<B>,
        SB: Storage<B>,
        SN: StorageMut<B>,
        SO: StorageMut<B>,
        SK: StorageMut<B>,
    >(
        weights: &'a PrologueWeights<B, HD, DKV, C, SW>,
        conv: &'a mut ConvState<B, DKV, C, SC>,
        batch: &'a VerifyBatch<B, L, SB>,
        windows: &'a mut VerifyWindows<B, DKV, C, SN>,
        out: &'a mut S::Outputs<B, DQ, DKV, SO>,
        kv: &'a mut S::Cache<B, DKV, SK>,
        errors: Option<&'a mut ErrorCounter<B>>,
    ) -> Result<PrologueCall<'a, B>> {
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
            qkvr: batch.qkvr().as_slice(),
            cache_indices: batch.cache_indices().as_slice(),
            cache_mask: batch.cache_mask().as_slice(),
            tau: batch.tau().map(|t| t.as_slice()),
            loc: batch.loc().as_slice(),
        };
        let capacity = windows.capacity();
        let (k_inter, v_inter) = windows.slices_mut();
        let variant = VariantArgs::Verify {
            draft_tokens: batch.draft_tokens(),
            k_inter,
            v_inter,
            capacity,
        };
        assemble(refs, weights, conv, out, kv.target(), variant, errors)
    }
}

impl<S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<Extend, S, HD, DQ, DKV, L, C>
where
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
    Self: PrologueKernel,
{
    variant_entries! {
        /// Runs the extend prologue, then (if asked) the trailing conv-state update.
        [SW: Storage, SC: StorageMut, SB: Storage, SO: StorageMut, SK: StorageMut]
        (
            weights: &'r PrologueWeights<B, HD, DKV, C, SW>,
            conv: &'r mut ConvState<B, DKV, C, SC>,
            batch: &'r ExtendBatch<B, L, C, SB>,
            out: &'r mut S::Outputs<B, DQ, DKV, SO>,
            kv: &'r mut S::Cache<B, DKV, SK>,
            errors: Option<&'r mut ErrorCounter<B>>
        )
    }

    fn call<
        'a,
        B: Backend,
        SW: Storage<B>,
        SC: StorageMut<B>,
        SB: Storage<B>,
        SO: StorageMut<B>,
        SK: StorageMut<B>,
    >(
        weights: &'a PrologueWeights<B, HD, DKV, C, SW>,
        conv: &'a mut ConvState<B, DKV, C, SC>,
        batch: &'a ExtendBatch<B, L, C, SB>,
        out: &'a mut S::Outputs<B, DQ, DKV, SO>,
        kv: &'a mut S::Cache<B, DKV, SK>,
        errors: Option<&'a mut ErrorCounter<B>>,
    ) -> Result<PrologueCall<'a, B>> {
        let refs = BatchRefs {
            tokens: batch.tokens(),
            seqs: batch.seqs(),
            qkvr: batch.qkvr().as_slice(),
            cache_indices: batch.cache_indices().as_slice(),
            cache_mask: batch.cache_mask().as_slice(),
            tau: batch.tau().map(|t| t.as_slice()),
            loc: batch.loc().as_slice(),
        };
        let variant = VariantArgs::Extend {
            cu_seqlens: batch.cu_seqlens().as_slice(),
            seq_of_token: batch.seq_of_token().as_slice(),
            has_initial_state: batch.has_initial_state().as_slice(),
            track: batch.track().map(|t| ExtendTrackRef {
                rows: t.rows().as_slice(),
                mask: t.mask().as_slice(),
                dst: t.dst().as_slice(),
            }),
            update_conv_state: batch.update_conv_state(),
        };
        assemble(refs, weights, conv, out, kv.target(), variant, errors)
    }
}

impl<S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<Decode, S, HD, DQ, DKV, L, C>
where
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
    Self: PrologueKernel,
{
    variant_entries! {
        /// Runs the decode prologue: the conv state of each valid token is updated in place.
        [SW: Storage, SC: StorageMut, SB: Storage, SO: StorageMut, SK: StorageMut]
        (
            weights: &'r PrologueWeights<B, HD, DKV, C, SW>,
            conv: &'r mut ConvState<B, DKV, C, SC>,
            batch: &'r DecodeBatch<B, L, SB>,
            out: &'r mut S::Outputs<B, DQ, DKV, SO>,
            kv: &'r mut S::Cache<B, DKV, SK>,
            errors: Option<&'r mut ErrorCounter<B>>
        )
    }

    fn call<
        'a,
        B: Backend,
        SW: Storage<B>,
        SC: StorageMut<B>,
        SB: Storage<B>,
        SO: StorageMut<B>,
        SK: StorageMut<B>,
    >(
        weights: &'a PrologueWeights<B, HD, DKV, C, SW>,
        conv: &'a mut ConvState<B, DKV, C, SC>,
        batch: &'a DecodeBatch<B, L, SB>,
        out: &'a mut S::Outputs<B, DQ, DKV, SO>,
        kv: &'a mut S::Cache<B, DKV, SK>,
        errors: Option<&'a mut ErrorCounter<B>>,
    ) -> Result<PrologueCall<'a, B>> {
        let refs = BatchRefs {
            tokens: batch.tokens(),
            seqs: batch.tokens(),
            qkvr: batch.qkvr().as_slice(),
            cache_indices: batch.cache_indices().as_slice(),
            cache_mask: batch.cache_mask().as_slice(),
            tau: batch.tau().map(|t| t.as_slice()),
            loc: batch.loc().as_slice(),
        };
        let variant = VariantArgs::Decode {
            track: batch.track().map(|t| DecodeTrackRef {
                mask: t.mask().as_slice(),
                indices: t.indices().as_slice(),
            }),
        };
        assemble(refs, weights, conv, out, kv.target(), variant, errors)
    }
}
