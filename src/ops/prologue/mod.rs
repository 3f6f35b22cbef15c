//! The Inkling fused attention prologue (spec §1): per-head RMSNorm of q (optionally scaled by
//! the log-scaling tau), the causal short conv of k and v with conv-state history, RMSNorm of k,
//! and the scatter of K/V into the paged cache as bf16 or MXFP8, in one launch.
//!
//! The kernel type [`Prologue`] carries every static fact as a type parameter: the variant
//! (verify, extend, decode), the store (none, bf16, MXFP8 with its page size), the head dim, the
//! q and kv widths, the packed-row layout and the conv. Its constructor is where the rules are
//! checked; its `run` methods take the batch, already checked at its own constructor, and
//! launch with no further validation.

mod args;
mod call;
mod cpu;
mod cuda;

pub use args::{
    ConvHistory, ConvState, ConvTaps, DecodeBatch, DecodeTrack, ErrorCounter, ExtendBatch,
    ExtendTrack, PrologueWeights, TrackRows, VerifyBatch, VerifyWindows,
};
pub use call::{
    DecodeTrackRef, ExtendTrackRef, KvCacheTarget, KvTarget, PrologueCall, QTarget, VariantArgs,
};
pub use cuda::{
    ConvStateUpdateKernel, ConvStateUpdateParams, PrologueKernel, PrologueLaunch, PrologueParams,
    prologue_launch,
};

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::Result;
use crate::layout::{Mxfp8KvCache, PagedBf16Kv};
use crate::rules::{
    ConvWidth, Mxfp8PageSize, Mxfp8Width, PageSize, PrologueHeadDim, RowOffset, WholeHeads,
};
use crate::tensor::{BlockScales, Cols, RowShape, Tensor};

pub mod select;
pub use select::{PreferMxfp8, PreferredStore};

/// Which of the three prologue entry points a kernel type is.
pub trait Variant: 'static {
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
impl Variant for Verify {
    const ID: u32 = 0;
}
impl Variant for Extend {
    const ID: u32 = 1;
}
impl Variant for Decode {
    const ID: u32 = 2;
}

/// Where the prologue puts K and V, and what q looks like on the way out.
pub trait Store: 'static {
    /// The kernel's `STORE` template argument (0 none, 1 bf16, 2 MXFP8).
    const ID: u32;
    /// The page size the kernel is instantiated with (0 where the store ignores pages).
    const KERNEL_PAGE: usize;
    /// The outputs of a call: q (and its scales), k and v, one row per token.
    type Outputs<B: Backend, const DQ: usize, const DKV: usize>: Outputs<B>;
    /// The KV cache the store writes into.
    type Cache<B: Backend, const DKV: usize>;
}

/// No KV store: k and v are returned; attention stores them itself.
pub struct NoStore;
/// bf16 KV store into a [`PagedBf16Kv`] with pages of `PAGE` tokens.
pub struct Bf16Store<const PAGE: usize>;
/// MXFP8 store: q as e4m3 + block scales, K/V into an [`Mxfp8KvCache`] with pages of `PAGE`.
pub struct Mxfp8Store<const PAGE: usize>;

impl Store for NoStore {
    const ID: u32 = 0;
    const KERNEL_PAGE: usize = 0;
    type Outputs<B: Backend, const DQ: usize, const DKV: usize> = Bf16Outputs<B, DQ, DKV>;
    type Cache<B: Backend, const DKV: usize> = ();
}
impl<const PAGE: usize> Store for Bf16Store<PAGE> {
    const ID: u32 = 1;
    const KERNEL_PAGE: usize = 0;
    type Outputs<B: Backend, const DQ: usize, const DKV: usize> = Bf16Outputs<B, DQ, DKV>;
    type Cache<B: Backend, const DKV: usize> = PagedBf16Kv<B, PAGE, DKV>;
}
impl<const PAGE: usize> Store for Mxfp8Store<PAGE> {
    const ID: u32 = 2;
    const KERNEL_PAGE: usize = PAGE;
    type Outputs<B: Backend, const DQ: usize, const DKV: usize> = Mxfp8Outputs<B, DQ, DKV>;
    type Cache<B: Backend, const DKV: usize> = Mxfp8KvCache<B, PAGE, DKV>;
}

/// The per-token outputs of a call, as the backends see them.
pub trait Outputs<B: Backend> {
    /// Rows of every output tensor, named (`"q_out"`, …), for the boundary check.
    fn rows(&self) -> impl Iterator<Item = (&'static str, usize)>;
    /// The q target and the k/v outputs.
    fn targets(&mut self) -> (QTarget<'_, B>, &mut B::Buffer<bf16>, &mut B::Buffer<bf16>);
}

/// Outputs with a bf16 q: `q [T, DQ]`, `k [T, DKV]`, `v [T, DKV]`.
pub struct Bf16Outputs<B: Backend, const DQ: usize, const DKV: usize> {
    /// Normalized (and tau-scaled) q, `[T, DQ]`.
    pub q: Tensor<B, bf16, Cols<DQ>>,
    /// Conv + RMSNorm k, `[T, DKV]`.
    pub k: Tensor<B, bf16, Cols<DKV>>,
    /// Conv v, `[T, DKV]`.
    pub v: Tensor<B, bf16, Cols<DKV>>,
}

/// Outputs with an MXFP8 q: `q [T, DQ]` e4m3, `q_scales [T, HQ, 4]`, `k`, `v` bf16.
pub struct Mxfp8Outputs<B: Backend, const DQ: usize, const DKV: usize> {
    /// q as e4m3, `[T, DQ]`.
    pub q: Tensor<B, F8E4M3, Cols<DQ>>,
    /// q's E8M0 block scales, `[T, HQ, 4]` (one per 32 channels).
    pub q_scales: Tensor<B, E8M0, BlockScales<DQ>>,
    /// Conv + RMSNorm k, `[T, DKV]` bf16.
    pub k: Tensor<B, bf16, Cols<DKV>>,
    /// Conv v, `[T, DKV]` bf16.
    pub v: Tensor<B, bf16, Cols<DKV>>,
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

impl<B: Backend, const DQ: usize, const DKV: usize> Outputs<B> for Bf16Outputs<B, DQ, DKV> {
    fn rows(&self) -> impl Iterator<Item = (&'static str, usize)> {
        [
            ("q_out", self.q.rows()),
            ("k_out", self.k.rows()),
            ("v_out", self.v.rows()),
        ]
        .into_iter()
    }
    fn targets(&mut self) -> (QTarget<'_, B>, &mut B::Buffer<bf16>, &mut B::Buffer<bf16>) {
        (
            QTarget::Bf16(self.q.buffer_mut()),
            self.k.buffer_mut(),
            self.v.buffer_mut(),
        )
    }
}

impl<B: Backend, const DQ: usize, const DKV: usize> Outputs<B> for Mxfp8Outputs<B, DQ, DKV> {
    fn rows(&self) -> impl Iterator<Item = (&'static str, usize)> {
        [
            ("q_out", self.q.rows()),
            ("q_scale", self.q_scales.rows()),
            ("k_out", self.k.rows()),
            ("v_out", self.v.rows()),
        ]
        .into_iter()
    }
    fn targets(&mut self) -> (QTarget<'_, B>, &mut B::Buffer<bf16>, &mut B::Buffer<bf16>) {
        (
            QTarget::Mxfp8 {
                data: self.q.buffer_mut(),
                scales: self.q_scales.buffer_mut(),
            },
            self.k.buffer_mut(),
            self.v.buffer_mut(),
        )
    }
}

/// The depthwise causal conv applied to k and v: width `W`, optional SiLU, optional residual.
pub struct Conv<const W: usize, const SILU: bool, const RESIDUAL: bool>;

/// Inkling's k/v conv: width 4, no activation, residual add.
pub type InklingConv = Conv<4, false, true>;

/// A conv the prologue can run (`W` satisfies [`ConvWidth`]).
pub trait ConvSpec: 'static {
    /// Taps, including the current token.
    const W: usize;
    /// History rows kept in the conv-state cache, `W - 1`.
    const HISTORY: usize;
    /// SiLU after the conv.
    const SILU: bool;
    /// Residual add of the pre-conv input after the conv.
    const RESIDUAL: bool;
}
impl<const W: usize, const SILU: bool, const RESIDUAL: bool> ConvSpec for Conv<W, SILU, RESIDUAL>
where
    Dim<W>: ConvWidth,
{
    const W: usize = W;
    const HISTORY: usize = <Dim<W> as ConvWidth>::HISTORY;
    const SILU: bool = SILU;
    const RESIDUAL: bool = RESIDUAL;
}

/// The layout of the packed projection row `qkvr`: its width and where q, k and v start.
pub trait QkvrLayout: 'static {
    /// Elements per row (the row stride).
    const ROW: usize;
    /// Offset of q.
    const Q_OFF: usize;
    /// Offset of k.
    const K_OFF: usize;
    /// Offset of v.
    const V_OFF: usize;
}

/// A packed row of `ROW` bf16 elements with q, k, v starting at the given offsets; every
/// offset and the row stride must be multiples of 8 (16-byte vectors).
pub struct PackedRow<const ROW: usize, const Q_OFF: usize, const K_OFF: usize, const V_OFF: usize>;
impl<const ROW: usize, const Q_OFF: usize, const K_OFF: usize, const V_OFF: usize> QkvrLayout
    for PackedRow<ROW, Q_OFF, K_OFF, V_OFF>
where
    Dim<ROW>: RowOffset,
    Dim<Q_OFF>: RowOffset,
    Dim<K_OFF>: RowOffset,
    Dim<V_OFF>: RowOffset,
{
    const ROW: usize = ROW;
    const Q_OFF: usize = Q_OFF;
    const K_OFF: usize = K_OFF;
    const V_OFF: usize = V_OFF;
}

/// A row of the packed projection, `[L::ROW]`.
pub struct QkvrRow<L>(PhantomData<L>);
impl<L: QkvrLayout> RowShape for QkvrRow<L> {
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
    /// The MXFP8-store prologue. Checked: `DQ` and `DKV` are whole 128-channel heads, `PAGE` a
    /// multiple of 128, the row offsets multiples of 8, `2 <= W <= 8`.
    pub fn new() -> Self
    where
        Dim<DQ>: Mxfp8Width,
        Dim<DKV>: Mxfp8Width,
        Dim<PAGE>: Mxfp8PageSize,
        L: QkvrLayout,
        C: ConvSpec,
    {
        const { check_row_fits::<L>(DQ, DKV) };
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
    /// The bf16-store prologue. Checked: `HD` is 64, 128 or 256, `DQ` and `DKV` whole heads,
    /// `PAGE` a positive multiple of 32, the row offsets multiples of 8, `2 <= W <= 8`.
    pub fn new() -> Self
    where
        Dim<HD>: PrologueHeadDim,
        Dim<DQ>: WholeHeads<HD>,
        Dim<DKV>: WholeHeads<HD>,
        Dim<PAGE>: PageSize,
        L: QkvrLayout,
        C: ConvSpec,
    {
        const { check_row_fits::<L>(DQ, DKV) };
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
        L: QkvrLayout,
        C: ConvSpec,
    {
        const { check_row_fits::<L>(DQ, DKV) };
        Self {
            _types: PhantomData,
        }
    }
}

/// q, k and v lie inside the packed row. A post-monomorphization check (the model macro checks
/// the same at the span of the offending field, where `cargo check` sees it).
const fn check_row_fits<L: QkvrLayout>(dq: usize, dkv: usize) {
    assert!(
        L::Q_OFF + dq <= L::ROW,
        "q slice runs past the end of the packed qkvr row"
    );
    assert!(
        L::K_OFF + dkv <= L::ROW,
        "k slice runs past the end of the packed qkvr row"
    );
    assert!(
        L::V_OFF + dkv <= L::ROW,
        "v slice runs past the end of the packed qkvr row"
    );
}

impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<V, S, HD, DQ, DKV, L, C>
where
    V: Variant,
    S: Store,
    L: QkvrLayout,
    C: ConvSpec,
{
    /// The static facts of this instantiation.
    pub const STATICS: PrologueStatics = PrologueStatics {
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

/// A backend that can run the prologue: it receives the checked call as plain buffers.
pub trait RunPrologue: Backend + Sized {
    /// Runs the main prologue kernel (and, for extend, the trailing conv-state update).
    fn prologue<K: PrologueKernel>(&self, call: PrologueCall<'_, Self>) -> Result<()>;
}

/// The log-scaling temperature of a position (spec §1.12):
/// `tau(pos) = 1 + alpha · ln(max((pos + 1) / n_floor, 1))`.
pub fn log_scaling_tau(position: u64, n_floor: f32, alpha: f32) -> f32 {
    1.0 + alpha * ((position as f32 + 1.0) / n_floor).max(1.0).ln()
}
