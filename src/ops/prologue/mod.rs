//! The Inkling fused attention prologue (docs/kernels/prologue.md §1): per-head RMSNorm of q (optionally scaled by
//! the log-scaling tau), the causal short conv of k and v with conv-state history, RMSNorm of k,
//! and the scatter of K/V into the paged cache as bf16 or MXFP8, in one launch.
//!
//! The kernel type [`Prologue`] carries every static fact as a type parameter: the variant
//! (verify, extend, decode), the store (none, bf16, MXFP8 with its page size), the head dim, the
//! q and kv widths, the packed-row layout and the conv. Its constructor is where the rules are
//! checked; its [`run`](Prologue::run) takes the batch, already checked at its own constructor,
//! and launches with no further validation.
//!
//! Files: this module the kernel type, its rules and `run`; `args.rs` the checked argument
//! structs; `launch.rs` the call and the sealed entry; `cpu.rs` the reference; `cuda.rs` the
//! launch (and the CUDA-only `record` and `launch_plan`).

mod args;
mod cpu;
mod cuda;
mod launch;

pub use crate::ops::counter::ErrorCounter;
pub use args::{
    Bf16OutputParts, ConvStateParts, DecodeBatchParts, DecodeTrackParts, ExtendBatchParts,
    ExtendTrackParts, Mxfp8OutputParts, PrologueWeightsParts, VerifyBatchParts, VerifyWindowsParts,
};
pub use args::{
    ConvHistory, ConvState, ConvTaps, DecodeBatch, DecodeTrack, ExtendBatch, ExtendTrack,
    PrologueWeights, TrackRows, VerifyBatch, VerifyWindows,
};
pub use cuda::{
    ConvStateUpdateKernel, ConvStateUpdateParams, PrologueKernel, PrologueLaunchPlan,
    PrologueParams,
};

use std::marker::PhantomData;

use launch::{BatchSlices, ConvSlices, PrologueCall, TargetSlices, VariantSlices};

use crate::backend::Backend;
use crate::backend::sealed::Sealed;
use crate::dim::Dim;
use crate::error::{Error, Result};
use crate::layout::{Mxfp8KvCache, PagedBf16Kv};
use crate::rules::{
    ConvWidth, Mxfp8PageSize, Mxfp8Width, PageSize, PrologueHeadDim, RowOffset, WholeHeads,
};
use crate::tensor::{RowShape, Storage, StorageMut};

pub mod select;
pub use select::{PreferMxfp8, PreferredStore};

/// Which of the three prologue entry points a kernel type is (sealed).
pub trait Variant: Sealed + 'static {
    /// The kernel's `VARIANT` template argument.
    const ID: u32;
}
/// Target-verify step of speculative decoding: `B` sequences of exactly `q` draft tokens,
/// conv cache read-only, per-draft-position conv windows saved.
pub struct Verify;
/// Prefill / extend: variable-length sequences, optional trailing conv-state update.
pub struct Extend;
/// Decode: one token per sequence, conv state updated in place.
pub struct Decode;
impl Sealed for Verify {}
impl Sealed for Extend {}
impl Sealed for Decode {}
impl Variant for Verify {
    const ID: u32 = 0;
}
impl Variant for Extend {
    const ID: u32 = 1;
}
impl Variant for Decode {
    const ID: u32 = 2;
}

/// Where the prologue puts K and V, and what q looks like on the way out. Sealed: the kernel's
/// store argument must match the outputs and cache types it names.
pub trait Store: Sealed + 'static {
    /// The kernel's `STORE` template argument (0 none, 1 bf16, 2 MXFP8).
    const ID: u32;
    /// The page size the kernel is instantiated with (0 where the store ignores pages).
    const KERNEL_PAGE: usize;
    /// The outputs of a call: q (and its scales), k and v, one row per token, in storage `S`
    /// (owned, or views of the caller's buffers).
    type Outputs<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>>: Outputs<B>;
    /// The KV cache the store writes into, in storage `S`.
    type Cache<B: Backend, const DKV: usize, S: StorageMut<B>>: KvCacheTarget<B>;
}

/// No KV store: k and v are returned; attention stores them itself.
pub struct NoStore;
/// bf16 KV store into a [`PagedBf16Kv`] with pages of `PAGE` tokens.
pub struct Bf16Store<const PAGE: usize>;
/// MXFP8 store: q as e4m3 + block scales, K/V into an [`Mxfp8KvCache`] with pages of `PAGE`.
pub struct Mxfp8Store<const PAGE: usize>;

impl Sealed for NoStore {}
impl<const PAGE: usize> Sealed for Bf16Store<PAGE> {}
impl<const PAGE: usize> Sealed for Mxfp8Store<PAGE> {}
impl Store for NoStore {
    const ID: u32 = 0;
    const KERNEL_PAGE: usize = 0;
    type Outputs<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> =
        Bf16Outputs<B, DQ, DKV, S>;
    type Cache<B: Backend, const DKV: usize, S: StorageMut<B>> = ();
}
impl<const PAGE: usize> Store for Bf16Store<PAGE> {
    const ID: u32 = 1;
    const KERNEL_PAGE: usize = 0;
    type Outputs<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> =
        Bf16Outputs<B, DQ, DKV, S>;
    type Cache<B: Backend, const DKV: usize, S: StorageMut<B>> = PagedBf16Kv<B, PAGE, DKV, S>;
}
impl<const PAGE: usize> Store for Mxfp8Store<PAGE> {
    const ID: u32 = 2;
    const KERNEL_PAGE: usize = PAGE;
    type Outputs<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> =
        Mxfp8Outputs<B, DQ, DKV, S>;
    type Cache<B: Backend, const DKV: usize, S: StorageMut<B>> = Mxfp8KvCache<B, PAGE, DKV, S>;
}

/// The per-token outputs of a call (q, its scales where MXFP8, k and v), tied to one token
/// count. Sealed: the launch trusts the row counts it reports.
pub trait Outputs<B: Backend>: launch::OutputTargets<B> {}
impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> Outputs<B>
    for Bf16Outputs<B, DQ, DKV, S>
{
}
impl<B: Backend, const DQ: usize, const DKV: usize, S: StorageMut<B>> Outputs<B>
    for Mxfp8Outputs<B, DQ, DKV, S>
{
}

pub use args::{Bf16Outputs, Mxfp8Outputs};

/// A KV cache the prologue can store into (none, [`PagedBf16Kv`], [`Mxfp8KvCache`]). Sealed:
/// the launch trusts the slot count it reports.
pub trait KvCacheTarget<B: Backend>: launch::CacheSlices<B> {}
impl<B: Backend> KvCacheTarget<B> for () {}
impl<B: Backend, const PAGE: usize, const DKV: usize, S: StorageMut<B>> KvCacheTarget<B>
    for PagedBf16Kv<B, PAGE, DKV, S>
{
}
impl<B: Backend, const PAGE: usize, const DKV: usize, S: StorageMut<B>> KvCacheTarget<B>
    for Mxfp8KvCache<B, PAGE, DKV, S>
{
}

/// The depthwise causal conv applied to k and v: width `W`, optional SiLU, optional residual.
pub struct Conv<const W: usize, const SILU: bool, const RESIDUAL: bool>;

/// Inkling's k/v conv: width 4, no activation, residual add.
pub type InklingConv = Conv<4, false, true>;

/// A conv the prologue can run (`W` satisfies [`ConvWidth`]). Sealed: the conv-state row
/// shape and the kernel's instantiation are derived from it.
pub trait ConvSpec: Sealed + 'static {
    /// Taps, including the current token.
    const W: usize;
    /// History rows kept in the conv-state cache, `W - 1`.
    const HISTORY: usize;
    /// SiLU after the conv.
    const SILU: bool;
    /// Residual add of the pre-conv input after the conv.
    const RESIDUAL: bool;
}
impl<const W: usize, const SILU: bool, const RESIDUAL: bool> Sealed for Conv<W, SILU, RESIDUAL> {}
impl<const W: usize, const SILU: bool, const RESIDUAL: bool> ConvSpec for Conv<W, SILU, RESIDUAL>
where
    Dim<W>: ConvWidth,
{
    const W: usize = W;
    const HISTORY: usize = <Dim<W> as ConvWidth>::HISTORY;
    const SILU: bool = SILU;
    const RESIDUAL: bool = RESIDUAL;
}

/// A packed projection row `qkvr` of `ROW` bf16 elements (sealed: the only rows are
/// [`PackedRow`]s, whose slices lie inside the row by construction).
pub trait RowLayout: Sealed + 'static {
    /// Elements per row (the row stride).
    const ROW: usize;
}

/// Where q, k and v lie in a packed row, for a kernel with q width `DQ` and k/v width `DKV`.
///
/// A [`PackedRow`] implements it for exactly its own widths, so a row that does not hold the
/// kernel's slices is a type error that `cargo check` reports, and no offset can run past the
/// row: the offsets are derived from the widths, never written.
#[diagnostic::on_unimplemented(
    message = "packed row `{Self}` does not hold the kernel's slices: q of {DQ} and k, v of {DKV} channels",
    label = "the row's q and k/v widths must be the kernel's DQ and DKV",
    note = "`PackedRow<DQ, DKV, TAIL>` is [q: DQ | k: DKV | v: DKV | TAIL more elements]; write the kernel's widths in it (Inkling TP8 global layer: `PackedRow<1024, 128, 128>`)"
)]
pub trait QkvrLayout<const DQ: usize, const DKV: usize>: RowLayout {
    /// Offset of q.
    const Q_OFF: usize;
    /// Offset of k.
    const K_OFF: usize;
    /// Offset of v.
    const V_OFF: usize;
}

/// A packed projection row `[q: DQ | k: DKV | v: DKV | TAIL more]` of bf16 elements (Inkling's
/// `qkvr`: the tail is `r`, which the prologue does not read). The offsets are derived from the
/// widths, so the three slices never overlap and never leave the row; `TAIL` must be a
/// multiple of 8 so every row starts on a 16-byte vector.
pub struct PackedRow<const DQ: usize, const DKV: usize, const TAIL: usize>;
impl<const DQ: usize, const DKV: usize, const TAIL: usize> Sealed for PackedRow<DQ, DKV, TAIL> {}
impl<const DQ: usize, const DKV: usize, const TAIL: usize> RowLayout for PackedRow<DQ, DKV, TAIL>
where
    Dim<TAIL>: RowOffset,
{
    const ROW: usize = DQ + 2 * DKV + TAIL;
}
impl<const DQ: usize, const DKV: usize, const TAIL: usize> QkvrLayout<DQ, DKV>
    for PackedRow<DQ, DKV, TAIL>
where
    Dim<TAIL>: RowOffset,
{
    const Q_OFF: usize = 0;
    const K_OFF: usize = DQ;
    const V_OFF: usize = DQ + DKV;
}

/// A row of the packed projection, `[L::ROW]`.
pub struct QkvrRow<L>(PhantomData<L>);
impl<L: RowLayout> RowShape for QkvrRow<L> {
    const COLS: usize = L::ROW;
}

/// The static facts of one prologue instantiation as plain values, for the CPU reference and
/// the launch shape (the types have already proven them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrologueStatics {
    /// 0 verify, 1 extend, 2 decode.
    pub variant: u32,
    /// 0 none, 1 bf16, 2 MXFP8.
    pub store: u32,
    /// Head dim.
    pub hd: usize,
    /// q heads.
    pub hq: usize,
    /// KV heads.
    pub hkv: usize,
    /// Conv width.
    pub w: usize,
    /// SiLU after the conv.
    pub silu: bool,
    /// Residual add after the conv.
    pub residual: bool,
    /// Page size of the MXFP8 scale planes (0 otherwise).
    pub page: usize,
    /// qkvr row stride.
    pub row: usize,
    /// q offset in the row.
    pub q_off: usize,
    /// k offset in the row.
    pub k_off: usize,
    /// v offset in the row.
    pub v_off: usize,
}

impl PrologueStatics {
    /// q width, `hq × hd`.
    pub const fn dq(&self) -> usize {
        self.hq * self.hd
    }
    /// kv width, `hkv × hd`.
    pub const fn dkv(&self) -> usize {
        self.hkv * self.hd
    }
}

/// The fused prologue kernel of one layer kind: variant `V`, store `S`, head dim `HD`, widths
/// `DQ = HQ·HD` and `DKV = HKV·HD`, packed-row layout `L`, conv `C`.
///
/// Build it with [`Mxfp8Prologue`], [`Bf16Prologue`] or [`UnstoredPrologue`]; the
/// constructor is where the rules of the store are checked.
pub struct Prologue<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C> {
    _types: PhantomData<StaticTypes<V, S, L, C>>,
}

/// The type parameters a [`Prologue`] carries (zero-sized, `Send`, `Sync`).
type StaticTypes<V, S, L, C> = fn() -> (V, S, L, C);

/// The prologue with the MXFP8 store: head dim 128, `DQ`, `DKV` multiples of 128, pages of
/// `PAGE` tokens (a multiple of 128).
pub type Mxfp8Prologue<V, const DQ: usize, const DKV: usize, L, C, const PAGE: usize> =
    Prologue<V, Mxfp8Store<PAGE>, 128, DQ, DKV, L, C>;

/// The prologue with the bf16 store: head dim 64, 128 or 256.
pub type Bf16Prologue<
    V,
    const HD: usize,
    const DQ: usize,
    const DKV: usize,
    L,
    C,
    const PAGE: usize,
> = Prologue<V, Bf16Store<PAGE>, HD, DQ, DKV, L, C>;

/// The prologue without a store (k and v returned for the attention backend to store).
pub type UnstoredPrologue<V, const HD: usize, const DQ: usize, const DKV: usize, L, C> =
    Prologue<V, NoStore, HD, DQ, DKV, L, C>;

impl<V: Variant, const DQ: usize, const DKV: usize, L: 'static, C: 'static, const PAGE: usize>
    Prologue<V, Mxfp8Store<PAGE>, 128, DQ, DKV, L, C>
{
    /// The MXFP8-store prologue. Checked (the rules of `crate::rules`): `DQ` and `DKV` are
    /// MXFP8 widths (`Mxfp8Width`), `PAGE` an `Mxfp8PageSize`, the packed row holds q, k and v
    /// of these widths (`QkvrLayout`), the conv width a `ConvWidth` (through `ConvSpec`).
    pub fn new() -> Self
    where
        Dim<DQ>: Mxfp8Width,
        Dim<DKV>: Mxfp8Width,
        Dim<PAGE>: Mxfp8PageSize,
        L: QkvrLayout<DQ, DKV>,
        C: ConvSpec,
    {
        Self {
            _types: PhantomData,
        }
    }
}

impl<
    V: Variant,
    const HD: usize,
    const DQ: usize,
    const DKV: usize,
    L: 'static,
    C: 'static,
    const PAGE: usize,
> Prologue<V, Bf16Store<PAGE>, HD, DQ, DKV, L, C>
{
    /// The bf16-store prologue. Checked (the rules of `crate::rules`): `HD` a
    /// `PrologueHeadDim`, `DQ` and `DKV` whole heads (`WholeHeads<HD>`), `PAGE` a `PageSize`,
    /// the packed row holds q, k and v of these widths (`QkvrLayout`), the conv width a
    /// `ConvWidth` (through `ConvSpec`).
    pub fn new() -> Self
    where
        Dim<HD>: PrologueHeadDim,
        Dim<DQ>: WholeHeads<HD>,
        Dim<DKV>: WholeHeads<HD>,
        Dim<PAGE>: PageSize,
        L: QkvrLayout<DQ, DKV>,
        C: ConvSpec,
    {
        Self {
            _types: PhantomData,
        }
    }
}

impl<V: Variant, const HD: usize, const DQ: usize, const DKV: usize, L: 'static, C: 'static>
    Prologue<V, NoStore, HD, DQ, DKV, L, C>
{
    /// The prologue without a KV store; rules as for the bf16 store.
    pub fn new() -> Self
    where
        Dim<HD>: PrologueHeadDim,
        Dim<DQ>: WholeHeads<HD>,
        Dim<DKV>: WholeHeads<HD>,
        L: QkvrLayout<DQ, DKV>,
        C: ConvSpec,
    {
        Self {
            _types: PhantomData,
        }
    }
}

/// What a prologue kernel type fixes, as values: the backend-neutral spec the CPU reference
/// computes with and the CUDA launch sizes its grid from.
pub trait PrologueSpec {
    /// The static facts of this instantiation.
    const STATICS: PrologueStatics;
}

impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C> PrologueSpec
    for Prologue<V, S, HD, DQ, DKV, L, C>
where
    V: Variant,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
{
    const STATICS: PrologueStatics = PrologueStatics {
        variant: V::ID,
        store: S::ID,
        hd: HD,
        hq: DQ / HD,
        hkv: DKV / HD,
        w: C::W,
        silu: C::SILU,
        residual: C::RESIDUAL,
        page: S::KERNEL_PAGE,
        row: L::ROW,
        q_off: L::Q_OFF,
        k_off: L::K_OFF,
        v_off: L::V_OFF,
    };
}

impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C> Clone
    for Prologue<V, S, HD, DQ, DKV, L, C>
{
    fn clone(&self) -> Self {
        *self
    }
}
impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C> Copy
    for Prologue<V, S, HD, DQ, DKV, L, C>
{
}

/// A backend that can run the prologue: the CPU reference and CUDA. Sealed: its entry takes a
/// call only the typed `run` methods can assemble.
pub trait RunPrologue: Backend + Sized + launch::PrologueEntry {}

/// The log-scaling temperature of a position (docs/kernels/prologue.md §1.12):
/// `tau(pos) = 1 + alpha · ln(max((pos + 1) / n_floor, 1))`.
pub fn log_scaling_tau(position: u64, n_floor: f32, alpha: f32) -> f32 {
    1.0 + alpha * ((position as f32 + 1.0) / n_floor).max(1.0).ln()
}

/// Where one call of the prologue writes, besides the conv state: the per-token outputs, the
/// KV cache the store fills, and the counter of indices the device skipped.
pub struct PrologueTargets<'a, B: Backend, O, K> {
    /// The per-token outputs ([`Bf16Outputs`] or [`Mxfp8Outputs`], as the store says).
    pub out: &'a mut O,
    /// The KV cache ([`PagedBf16Kv`], [`Mxfp8KvCache`], or `()` without a store).
    pub kv: &'a mut K,
    /// The skipped-index counter, or none.
    pub errors: Option<&'a mut ErrorCounter<B>>,
}

/// The batch argument of the variant `V`'s [`Prologue::run`]: `&ExtendBatch` for extend,
/// `&DecodeBatch` for decode, and for verify the batch with the windows it saves,
/// `(&VerifyBatch, &mut VerifyWindows)`.
///
/// Sealed: it supplies what differs between the variants (the sequence count, the variant's
/// own slices and checks), which the launch trusts.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a batch of the `{V}` prologue",
    label = "the batch argument of this variant's `run`",
    note = "verify takes `(&VerifyBatch, &mut VerifyWindows)`, extend `&ExtendBatch`, decode `&DecodeBatch`"
)]
pub trait PrologueBatch<'a, B: Backend, V, L, const DKV: usize, C>:
    launch::SplitBatch<'a, B>
{
}

impl<'a, B: Backend, L: RowLayout, const DKV: usize, C: ConvSpec, SB: Storage<B>, SN>
    PrologueBatch<'a, B, Verify, L, DKV, C>
    for (
        &'a VerifyBatch<B, L, SB>,
        &'a mut VerifyWindows<B, DKV, C, SN>,
    )
where
    SN: StorageMut<B>,
{
}
impl<'a, B: Backend, L: RowLayout, const DKV: usize, C: ConvSpec, SB: Storage<B>>
    PrologueBatch<'a, B, Extend, L, DKV, C> for &'a ExtendBatch<B, L, C, SB>
{
}
impl<'a, B: Backend, L: RowLayout, const DKV: usize, C, SB: Storage<B>>
    PrologueBatch<'a, B, Decode, L, DKV, C> for &'a DecodeBatch<B, L, SB>
{
}

impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<V, S, HD, DQ, DKV, L, C>
where
    V: Variant,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
{
    /// Runs the prologue of this variant on `backend`: q/k/v out and K/V stored at `loc`;
    /// verify also saves the conv windows, decode updates the conv state in place, extend
    /// (if asked) runs the trailing conv-state update.
    ///
    /// `batch` is the variant's [`PrologueBatch`]. Every argument struct can hold owned
    /// tensors or views of the caller's buffers (its storage parameter), independently of the
    /// others.
    pub fn run<'a, B, A, SW, SC, SO, SK>(
        &self,
        backend: &B,
        weights: &'a PrologueWeights<B, HD, DKV, C, SW>,
        conv: &'a mut ConvState<B, DKV, C, SC>,
        batch: A,
        targets: PrologueTargets<'a, B, S::Outputs<B, DQ, DKV, SO>, S::Cache<B, DKV, SK>>,
    ) -> Result<()>
    where
        B: RunPrologue,
        A: PrologueBatch<'a, B, V, L, DKV, C>,
        SW: Storage<B>,
        SC: StorageMut<B>,
        SO: StorageMut<B>,
        SK: StorageMut<B>,
    {
        Self::call(weights, conv, batch, targets, |call| {
            // SAFETY: assembled by `call`, the boundary.
            unsafe { backend.prologue::<V, S, HD, DQ, DKV, L, C>(call) }
        })
    }

    /// The boundary of every entry (`run`, `record`, `launch_plan`): ties the outputs to the
    /// batch (and the variant's own checks, through `PrologueBatch`), borrows everything as one
    /// call and hands it to `then`. The call is built as `then`'s argument rather than
    /// returned: a returned call (about 800 bytes of slices) was copied into and out of its
    /// `Result` on every launch.
    #[inline(always)]
    fn call<'a, B, A, SW, SC, SO, SK, R>(
        weights: &'a PrologueWeights<B, HD, DKV, C, SW>,
        conv: &'a mut ConvState<B, DKV, C, SC>,
        batch: A,
        targets: PrologueTargets<'a, B, S::Outputs<B, DQ, DKV, SO>, S::Cache<B, DKV, SK>>,
        then: impl FnOnce(PrologueCall<'a, B>) -> Result<R>,
    ) -> Result<R>
    where
        B: Backend,
        A: PrologueBatch<'a, B, V, L, DKV, C>,
        SW: Storage<B>,
        SC: StorageMut<B>,
        SO: StorageMut<B>,
        SK: StorageMut<B>,
    {
        let (batch, variant): (BatchSlices<'a, B>, VariantSlices<'a, B>) = batch.split()?;
        let PrologueTargets { out, kv, errors } = targets;
        for (param, rows) in launch::OutputTargets::rows(&*out) {
            Error::check_extent(param, "tokens", batch.tokens, rows)?;
        }
        let (q, k, v) = launch::OutputTargets::targets(out);
        then(PrologueCall {
            batch,
            variant,
            weights: weights.slices(),
            conv: ConvSlices {
                slots: conv.slots(),
                cache: conv.slices_mut(),
            },
            targets: TargetSlices {
                q,
                k,
                v,
                kv: launch::CacheSlices::target(kv),
                bad_index_count: errors.map(|e| e.slice_mut()),
            },
        })
    }
}
