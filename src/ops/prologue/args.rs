//! The prologue's arguments: model weights, conv state, and one batch type per variant.
//!
//! Each constructor is the runtime boundary: it sees every tensor whose extent the batch
//! decides, checks that they agree (returning an error that names the parameter, the expected
//! and the actual extent), and from then on the agreement is a fact the launch relies on.

use std::marker::PhantomData;

use super::{ConvSpec, QkvrLayout, QkvrRow};
use crate::backend::Backend;
use crate::dtype::bf16;
use crate::error::{Error, Result};
use crate::tensor::{Cols, RowShape, Scalar, Tensor};

/// The conv-state history of one slot: `[W-1, DKV]`, oldest row first.
pub struct ConvHistory<const DKV: usize, C>(PhantomData<C>);
impl<const DKV: usize, C: ConvSpec> RowShape for ConvHistory<DKV, C> {
    const COLS: usize = C::HISTORY * DKV;
}

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
pub struct PrologueWeights<B: Backend, const HD: usize, const DKV: usize, C> {
    /// RMSNorm weight of q, `[HD]`, shared by all heads.
    pub q_gamma: Tensor<B, bf16, Cols<HD>>,
    /// RMSNorm weight of k, `[HD]`.
    pub k_gamma: Tensor<B, bf16, Cols<HD>>,
    /// Conv taps of k, `[DKV, W]`.
    pub k_weight: Tensor<B, bf16, ConvTaps<C>>,
    /// Conv taps of v, `[DKV, W]`.
    pub v_weight: Tensor<B, bf16, ConvTaps<C>>,
    /// RMSNorm epsilon (Inkling: 1e-6).
    pub eps: f32,
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

/// The conv-state caches of k and v, `[slots, W-1, DKV]` each.
pub struct ConvState<B: Backend, const DKV: usize, C> {
    /// History of k's pre-conv inputs.
    pub k: Tensor<B, bf16, ConvHistory<DKV, C>>,
    /// History of v's pre-conv inputs.
    pub v: Tensor<B, bf16, ConvHistory<DKV, C>>,
}

impl<B: Backend, const DKV: usize, C: ConvSpec> ConvState<B, DKV, C> {
    /// The two caches; they must have the same number of slots.
    pub fn new(
        k: Tensor<B, bf16, ConvHistory<DKV, C>>,
        v: Tensor<B, bf16, ConvHistory<DKV, C>>,
    ) -> Result<Self> {
        v.expect_rows("v_cache", "conv slots", k.rows())?;
        Ok(Self { k, v })
    }

    /// Zeroed caches of `slots` slots.
    pub fn zeros(backend: &B, slots: usize) -> Result<Self> {
        Ok(Self {
            k: Tensor::zeros(backend, slots)?,
            v: Tensor::zeros(backend, slots)?,
        })
    }

    /// Number of conv-state slots.
    pub fn slots(&self) -> usize {
        self.k.rows()
    }
}

/// A counter of indices the device skipped because they pointed outside their buffer
/// (`loc` beyond the pool, conv-cache indices beyond the cache, …). Read it after a call.
pub struct ErrorCounter<B: Backend> {
    /// The count, `[1]`.
    pub count: Tensor<B, u32, Scalar>,
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
        self.count.write(backend, &[0])
    }
}

fn check_tau<B: Backend>(tau: &Option<Tensor<B, f32, Scalar>>, tokens: usize) -> Result<()> {
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
pub struct VerifyBatch<B: Backend, L> {
    /// Packed projection rows, `[T, ROW]`.
    pub qkvr: Tensor<B, bf16, QkvrRow<L>>,
    /// Conv-state slot of each sequence, `[B]`; -1 = padding sequence.
    pub cache_indices: Tensor<B, i32, Scalar>,
    /// Whether each sequence has cached history, `[B]` (0/1).
    pub cache_mask: Tensor<B, u8, Scalar>,
    /// KV slot of each token, `[T]`; negative = do not store.
    pub loc: Tensor<B, i64, Scalar>,
    /// Per-token q temperature, `[>= T]`, or none.
    pub tau: Option<Tensor<B, f32, Scalar>>,
    draft_tokens: usize,
}

impl<B: Backend, L: QkvrLayout> VerifyBatch<B, L> {
    /// Ties the batch: `q > 0`, `T == B·q`, `loc` has `T` entries, `cache_mask` `B`,
    /// `tau` at least `T`.
    pub fn new(
        qkvr: Tensor<B, bf16, QkvrRow<L>>,
        cache_indices: Tensor<B, i32, Scalar>,
        cache_mask: Tensor<B, u8, Scalar>,
        loc: Tensor<B, i64, Scalar>,
        tau: Option<Tensor<B, f32, Scalar>>,
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
        qkvr.expect_rows("qkvr", "tokens (T = B·q)", seqs * draft_tokens)?;
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
}

/// The verify step's saved conv windows, `[capacity, q, W-1, DKV]` for k and for v: row
/// `[s][p]` is sequence `s`'s conv state after draft token `p`.
pub struct VerifyWindows<B: Backend, const DKV: usize, C> {
    /// k windows, `[capacity · q, W-1, DKV]`.
    pub k: Tensor<B, bf16, ConvHistory<DKV, C>>,
    /// v windows, `[capacity · q, W-1, DKV]`.
    pub v: Tensor<B, bf16, ConvHistory<DKV, C>>,
    draft_tokens: usize,
}

impl<B: Backend, const DKV: usize, C: ConvSpec> VerifyWindows<B, DKV, C> {
    /// Zeroed windows for `capacity` sequences of `draft_tokens` tokens.
    pub fn zeros(backend: &B, capacity: usize, draft_tokens: usize) -> Result<Self> {
        Ok(Self {
            k: Tensor::zeros(backend, capacity * draft_tokens)?,
            v: Tensor::zeros(backend, capacity * draft_tokens)?,
            draft_tokens,
        })
    }

    /// Windows over the caller's buffers; their rows must be a whole number of sequences.
    pub fn new(
        k: Tensor<B, bf16, ConvHistory<DKV, C>>,
        v: Tensor<B, bf16, ConvHistory<DKV, C>>,
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
}

/// Prefix-cache tracking of the extend variant: for each flagged sequence, the conv window made
/// of the listed qkvr rows is copied to a conv slot.
pub struct ExtendTrack<B: Backend, C> {
    /// qkvr rows of each sequence's window, `[B, W-1]`.
    pub rows: Tensor<B, i64, TrackRows<C>>,
    /// Whether to track each sequence, `[B]` (0/1).
    pub mask: Tensor<B, u8, Scalar>,
    /// Destination conv slot of each sequence, `[B]`.
    pub dst: Tensor<B, i64, Scalar>,
}

/// A prefill / extend batch of variable-length sequences.
pub struct ExtendBatch<B: Backend, L, C> {
    /// Packed projection rows, `[T, ROW]`.
    pub qkvr: Tensor<B, bf16, QkvrRow<L>>,
    /// Token start of each sequence, `[B+1]`.
    pub cu_seqlens: Tensor<B, i64, Scalar>,
    /// Sequence of each token, `[T]`.
    pub seq_of_token: Tensor<B, i32, Scalar>,
    /// Conv-state slot of each sequence, `[B]`; -1 = padding.
    pub cache_indices: Tensor<B, i32, Scalar>,
    /// Whether each sequence reads cached history, `[B]` ("has initial state and valid").
    pub cache_mask: Tensor<B, u8, Scalar>,
    /// Whether each sequence has an initial state, `[B]` (used by the trailing update).
    pub has_initial_state: Tensor<B, u8, Scalar>,
    /// KV slot of each token, `[T]`; negative = do not store.
    pub loc: Tensor<B, i64, Scalar>,
    /// Per-token q temperature, `[>= T]`, or none.
    pub tau: Option<Tensor<B, f32, Scalar>>,
    /// Prefix-cache tracking, or none.
    pub track: Option<ExtendTrack<B, C>>,
    /// Rewrite each sequence's conv state from its tail after the main kernel.
    pub update_conv_state: bool,
}

impl<B: Backend, L: QkvrLayout, C: ConvSpec> ExtendBatch<B, L, C> {
    /// Ties the batch: `cu_seqlens` has `B+1` entries, the per-sequence arrays `B`, the
    /// per-token arrays `T`, `tau` at least `T`. Index values are guarded on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        qkvr: Tensor<B, bf16, QkvrRow<L>>,
        cu_seqlens: Tensor<B, i64, Scalar>,
        seq_of_token: Tensor<B, i32, Scalar>,
        cache_indices: Tensor<B, i32, Scalar>,
        cache_mask: Tensor<B, u8, Scalar>,
        has_initial_state: Tensor<B, u8, Scalar>,
        loc: Tensor<B, i64, Scalar>,
        tau: Option<Tensor<B, f32, Scalar>>,
        track: Option<ExtendTrack<B, C>>,
        update_conv_state: bool,
    ) -> Result<Self> {
        let (tokens, seqs) = (qkvr.rows(), cache_indices.rows());
        to_i32("qkvr rows", tokens)?;
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
}

/// Prefix-cache tracking of the decode variant: flagged tokens also copy their new window to a
/// second conv slot.
pub struct DecodeTrack<B: Backend> {
    /// Whether to track each token, `[T]` (0/1).
    pub mask: Tensor<B, u8, Scalar>,
    /// Destination conv slot of each token, `[T]`.
    pub indices: Tensor<B, i64, Scalar>,
}

/// A decode batch: `T` independent tokens, one per sequence.
pub struct DecodeBatch<B: Backend, L> {
    /// Packed projection rows, `[T, ROW]`.
    pub qkvr: Tensor<B, bf16, QkvrRow<L>>,
    /// Conv-state slot of each token, `[T]`; -1 = padding.
    pub cache_indices: Tensor<B, i32, Scalar>,
    /// Whether each token reads cached history, `[T]` (0/1).
    pub cache_mask: Tensor<B, u8, Scalar>,
    /// KV slot of each token, `[T]`; negative = do not store.
    pub loc: Tensor<B, i64, Scalar>,
    /// Per-token q temperature, `[>= T]`, or none.
    pub tau: Option<Tensor<B, f32, Scalar>>,
    /// Tracking, or none.
    pub track: Option<DecodeTrack<B>>,
}

impl<B: Backend, L: QkvrLayout> DecodeBatch<B, L> {
    /// Ties the batch: every per-token array has `T` entries, `tau` at least `T`.
    pub fn new(
        qkvr: Tensor<B, bf16, QkvrRow<L>>,
        cache_indices: Tensor<B, i32, Scalar>,
        cache_mask: Tensor<B, u8, Scalar>,
        loc: Tensor<B, i64, Scalar>,
        tau: Option<Tensor<B, f32, Scalar>>,
        track: Option<DecodeTrack<B>>,
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
}
