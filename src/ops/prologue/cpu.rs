//! CPU reference of the prologue (docs/kernels/prologue.md §1.5–§1.8), on plain slices.
//!
//! Arithmetic follows the kernel's order where rounding depends on it (sums of squares per
//! 8-channel lane, then a butterfly over the lanes of a head; conv taps oldest first; IEEE
//! square root and division), so that bf16 outputs and MXFP8 bytes agree with the device
//! bit for bit wherever the kernel is IEEE (everywhere except SiLU's exponential).
//!
//! [`run`] goes through the kernel's phases in its order, one function each: the conv context
//! of every token, the per-token q/k/v rows (conv, RMSNorm, tau), the outputs, the KV store,
//! then the variant's conv-state side effect (verify windows, decode state, extend update and
//! tracking), and last the skipped-index count.

use rayon::prelude::*;

use super::args::{DecodeTrackSlices, ExtendTrackSlices, VerifyWindowSlices, WeightSlices};
use super::launch::{
    BatchSlices, ConvSlices, KvTarget, PrologueCall, PrologueEntry, QTarget, TargetSlices,
    VariantSlices,
};
use super::{ConvSpec, Prologue, PrologueSpec, PrologueStatics, QkvrLayout, Store, Variant};
use crate::backend::Cpu;
use crate::dtype::{MXFP8_BLOCK, bf16, mxfp8_encode_block, mxfp8_encode_row, rn_bf16};
use crate::error::Result;
use crate::layout::{kv_data_offset, scale_plane_offset};

/// The CPU reference runs the op.
impl super::RunPrologue for Cpu {}

impl PrologueEntry for Cpu {
    unsafe fn prologue<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C>(
        &self,
        call: PrologueCall<'_, Cpu>,
    ) -> Result<()>
    where
        V: Variant,
        S: Store,
        L: QkvrLayout<DQ, DKV>,
        C: ConvSpec,
    {
        run(&Prologue::<V, S, HD, DQ, DKV, L, C>::STATICS, call);
        Ok(())
    }
}

/// Channels per lane: one 16-byte vector of bf16.
const LANE: usize = 8;

/// `1 / sqrt(sum / n + eps)` of a head whose values are `x`, summed as the kernel does: per
/// 8-channel lane with fused multiply-adds, then an xor butterfly over the head's lanes (masks
/// 1, 2, 4, …), then IEEE scaling, square root and division.
pub fn head_rms_inverse(x: &[f32], eps: f32) -> f32 {
    let mut lanes: Vec<f32> = x
        .chunks_exact(LANE)
        .map(|v| v.iter().fold(0.0f32, |acc, &e| e.mul_add(e, acc)))
        .collect();
    let mut mask = 1;
    while mask < lanes.len() {
        let prev = lanes.clone();
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = prev[l] + prev[l ^ mask];
        }
        mask *= 2;
    }
    1.0 / (lanes[0] * (1.0 / x.len() as f32) + eps).sqrt()
}

/// Where one token's conv history comes from.
#[derive(Clone, Copy, Debug)]
struct TokenContext {
    /// Sequence index (token index for decode).
    seq: usize,
    /// First token of the sequence.
    bos: usize,
    /// The conv slot, if the sequence has a valid one.
    slot: Option<usize>,
    /// Whether cached history is read (otherwise it is zeros).
    gate: bool,
    /// Whether the token may be scattered into the KV pool.
    store: bool,
}

/// What the rows read: the packed projection and the conv caches.
struct Inputs<'a> {
    st: &'a PrologueStatics,
    qkvr: &'a [bf16],
    k_cache: &'a [bf16],
    v_cache: &'a [bf16],
}

impl Inputs<'_> {
    /// Channel `channel` of the slice at `offset` of token `token`'s qkvr row.
    fn x(&self, token: usize, offset: usize, channel: usize) -> f32 {
        self.qkvr[token * self.st.row + offset + channel].to_f32()
    }
    /// Row `row` of slot `slot`'s history in `cache`, channel `channel`.
    fn history(&self, cache: &[bf16], slot: usize, row: usize, channel: usize) -> f32 {
        history_row(cache, self.st, slot, row, channel).to_f32()
    }
}

/// One token's results, in f32 holding bf16-rounded values.
struct TokenOut {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The conv of k or of v: where its input lies in the row, its history and its taps.
#[derive(Clone, Copy)]
struct ConvInput<'a> {
    /// Offset of the slice in the qkvr row.
    offset: usize,
    /// Its history, `[slots, W-1, DKV]`.
    cache: &'a [bf16],
    /// Its taps, `[DKV, W]`.
    weight: &'a [f32],
}

/// Skipped indices, counted modulo 2^32 like the device's `atomicAdd` on its u32 counter.
type Skipped = u32;

/// One call of the kernel of `st`, phase by phase.
fn run(st: &PrologueStatics, call: PrologueCall<'_, Cpu>) {
    let PrologueCall {
        batch,
        mut variant,
        weights,
        mut conv,
        mut targets,
    } = call;
    // No token, no work: the CUDA backend launches nothing then, so nothing is counted either.
    if batch.tokens == 0 {
        return;
    }
    let mut bad: Skipped = 0;
    let contexts = token_contexts(&batch, &variant, conv.slots, &mut bad);
    let rows = token_rows(st, &batch, &weights, &conv, &contexts);
    store_outputs(st, &rows, &mut targets);
    store_kv(st, &rows, &contexts, batch.loc, &mut targets.kv, &mut bad);
    match &mut variant {
        VariantSlices::Verify {
            draft_tokens,
            windows,
            capacity,
        } => {
            let saved = SavedWindows {
                windows,
                draft_tokens: *draft_tokens,
                capacity: *capacity,
            };
            save_verify_windows(st, &batch, &conv, &contexts, saved);
        }
        VariantSlices::Decode { track } => {
            update_decode_state(st, &batch, &mut conv, &contexts, track.as_ref(), &mut bad);
        }
        VariantSlices::Extend {
            cu_seqlens,
            has_initial_state,
            track,
            update_conv_state,
            ..
        } => {
            if *update_conv_state {
                let seqs = ExtendSeqs {
                    cu_seqlens,
                    has_initial_state,
                };
                update_extend_state(st, &batch, &mut conv, seqs, &mut bad);
            }
            if let Some(track) = track {
                track_extend_windows(st, &batch, &mut conv, track, &mut bad);
            }
        }
    }
    if let Some(counter) = targets.bad_index_count.as_mut() {
        counter[0] = counter[0].wrapping_add(bad);
    }
}

/// The conv slot `index` names: none for -1 (padding) and, counted as skipped, for an index
/// outside the `slots` of the cache.
fn slot_of(index: i32, slots: usize, bad: &mut Skipped) -> Option<usize> {
    match index {
        -1 => None,
        i if i >= 0 && (i as usize) < slots => Some(i as usize),
        _ => {
            *bad = bad.wrapping_add(1);
            None
        }
    }
}

/// Phase 1, the conv window: where each token's history comes from (its sequence, the
/// sequence's first token, its conv slot). A token whose sequence metadata is out of range is
/// computed without history and not stored (the kernel's device guard).
fn token_contexts(
    batch: &BatchSlices<'_, Cpu>,
    variant: &VariantSlices<'_, Cpu>,
    conv_slots: usize,
    bad: &mut Skipped,
) -> Vec<Option<TokenContext>> {
    let (cache_indices, cache_mask) = (batch.cache_indices, batch.cache_mask);
    (0..batch.tokens)
        .map(|t| match variant {
            VariantSlices::Verify { draft_tokens, .. } => {
                let seq = t / draft_tokens;
                let slot = slot_of(cache_indices[seq], conv_slots, bad);
                Some(TokenContext {
                    seq,
                    bos: seq * draft_tokens,
                    slot,
                    gate: slot.is_some() && cache_mask[seq] != 0,
                    store: true,
                })
            }
            VariantSlices::Extend {
                cu_seqlens,
                seq_of_token,
                ..
            } => {
                let unresolved = TokenContext {
                    seq: usize::MAX,
                    bos: t,
                    slot: None,
                    gate: false,
                    store: false,
                };
                let seq = seq_of_token[t];
                if seq < 0 || seq as usize >= batch.seqs {
                    *bad = bad.wrapping_add(1);
                    return Some(unresolved);
                }
                let seq = seq as usize;
                let bos = cu_seqlens[seq];
                if bos < 0 || bos > t as i64 {
                    *bad = bad.wrapping_add(1);
                    return Some(unresolved);
                }
                let slot = slot_of(cache_indices[seq], conv_slots, bad);
                Some(TokenContext {
                    seq,
                    bos: bos as usize,
                    slot,
                    gate: slot.is_some() && cache_mask[seq] != 0,
                    store: true,
                })
            }
            VariantSlices::Decode { .. } => {
                let slot = slot_of(cache_indices[t], conv_slots, bad);
                Some(TokenContext {
                    seq: t,
                    bos: t,
                    slot,
                    gate: slot.is_some() && cache_mask[t] != 0,
                    // decode stores only tokens with a slot
                    store: slot.is_some(),
                })
            }
        })
        .collect()
}

/// The weights in f32, as the rows read them.
struct Weights {
    q_gamma: Vec<f32>,  // [HD]
    k_gamma: Vec<f32>,  // [HD]
    k_weight: Vec<f32>, // [DKV, W]
    v_weight: Vec<f32>, // [DKV, W]
    eps: f32,
}

/// Phase 2, the per-token rows: q normalized (and tau-scaled), k and v through the conv, k
/// normalized; every token in parallel.
fn token_rows(
    st: &PrologueStatics,
    batch: &BatchSlices<'_, Cpu>,
    weights: &WeightSlices<'_, Cpu>,
    conv: &ConvSlices<'_, Cpu>,
    contexts: &[Option<TokenContext>],
) -> Vec<Option<TokenOut>> {
    let inputs = Inputs {
        st,
        qkvr: batch.qkvr,
        k_cache: &*conv.cache.k,
        v_cache: &*conv.cache.v,
    };
    let f32s = |v: &[bf16]| v.iter().map(|g| g.to_f32()).collect::<Vec<f32>>();
    let w = Weights {
        q_gamma: f32s(weights.q_gamma),
        k_gamma: f32s(weights.k_gamma),
        k_weight: f32s(weights.k_weight),
        v_weight: f32s(weights.v_weight),
        eps: weights.eps,
    };
    let tau = batch.tau;
    (0..batch.tokens)
        .into_par_iter()
        .map(|t| {
            let ctx = contexts[t]?;
            let tau_t = tau.map(|tau| tau[t]);
            let k_conv = ConvInput {
                offset: st.k_off,
                cache: inputs.k_cache,
                weight: &w.k_weight,
            };
            let v_conv = ConvInput {
                offset: st.v_off,
                cache: inputs.v_cache,
                weight: &w.v_weight,
            };
            Some(TokenOut {
                q: q_row(&inputs, t, &w.q_gamma, w.eps, tau_t),
                k: kv_row(&inputs, t, ctx, k_conv, Some((&w.k_gamma, w.eps))),
                v: kv_row(&inputs, t, ctx, v_conv, None),
            })
        })
        .collect()
}

/// Phase 3, the outputs: one q (bf16, or e4m3 and scales), k and v row per computed token.
fn store_outputs(
    st: &PrologueStatics,
    rows: &[Option<TokenOut>],
    targets: &mut TargetSlices<'_, Cpu>,
) {
    let (dq, dkv) = (st.dq(), st.dkv());
    for (t, out) in rows.iter().enumerate() {
        let Some(out) = out else { continue };
        match &mut targets.q {
            QTarget::Bf16(q_out) => {
                for (d, &x) in q_out[t * dq..(t + 1) * dq].iter_mut().zip(&out.q) {
                    *d = bf16::from_f32(x);
                }
            }
            QTarget::Mxfp8 { data, scales } => mxfp8_encode_row(
                &out.q,
                &mut data[t * dq..(t + 1) * dq],
                &mut scales[t * dq / MXFP8_BLOCK..(t + 1) * dq / MXFP8_BLOCK],
            ),
        }
        for (d, &x) in targets.k[t * dkv..(t + 1) * dkv].iter_mut().zip(&out.k) {
            *d = bf16::from_f32(x);
        }
        for (d, &x) in targets.v[t * dkv..(t + 1) * dkv].iter_mut().zip(&out.v) {
            *d = bf16::from_f32(x);
        }
    }
}

/// Phase 4, the KV store at `loc` (`[T]`): verify and extend store every token, decode only
/// tokens with a slot. A `loc` beyond the pool is counted for every token, stored or not (as
/// the kernel does).
fn store_kv(
    st: &PrologueStatics,
    rows: &[Option<TokenOut>],
    contexts: &[Option<TokenContext>],
    loc: &[i64],
    kv: &mut KvTarget<'_, Cpu>,
    bad: &mut Skipped,
) {
    let dkv = st.dkv();
    let slots = match kv {
        KvTarget::None => return,
        KvTarget::Bf16 { slots, .. } | KvTarget::Mxfp8 { slots, .. } => *slots,
    };
    for (t, out) in rows.iter().enumerate() {
        let (Some(out), Some(ctx)) = (out, contexts[t]) else {
            continue;
        };
        if loc[t] >= slots as i64 {
            *bad = bad.wrapping_add(1);
            continue;
        }
        if loc[t] < 0 || !ctx.store {
            continue;
        }
        let slot = loc[t] as usize;
        match kv {
            KvTarget::None => {}
            KvTarget::Bf16 { k, v, .. } => {
                for c in 0..dkv {
                    k[kv_data_offset(slot, c, dkv)] = bf16::from_f32(out.k[c]);
                    v[kv_data_offset(slot, c, dkv)] = bf16::from_f32(out.v[c]);
                }
            }
            KvTarget::Mxfp8 {
                k,
                v,
                k_scales,
                v_scales,
                ..
            } => {
                for (row, data, planes) in [
                    (&out.k, &mut **k, &mut **k_scales),
                    (&out.v, &mut **v, &mut **v_scales),
                ] {
                    for c0 in (0..dkv).step_by(MXFP8_BLOCK) {
                        let block: [f32; MXFP8_BLOCK] =
                            row[c0..c0 + MXFP8_BLOCK].try_into().expect("block");
                        let (scale, q) = mxfp8_encode_block(&block);
                        let at = kv_data_offset(slot, c0, dkv);
                        data[at..at + MXFP8_BLOCK].copy_from_slice(&q);
                        planes[scale_plane_offset(slot, c0, st.page, st.hkv)] = scale;
                    }
                }
            }
        }
    }
}

/// The verify windows a call writes, with their shape.
struct SavedWindows<'w, 'a> {
    /// k and v windows, `[capacity · q, W-1, DKV]` each.
    windows: &'w mut VerifyWindowSlices<'a, Cpu>,
    /// Draft tokens per sequence, `q`.
    draft_tokens: usize,
    /// Sequences the windows hold.
    capacity: usize,
}

/// Phase 5 of verify: every token with a slot saves the conv window after it (history rows,
/// then the sequence's tokens up to it) into its sequence's row of the windows; the conv
/// cache itself is read-only.
fn save_verify_windows(
    st: &PrologueStatics,
    batch: &BatchSlices<'_, Cpu>,
    conv: &ConvSlices<'_, Cpu>,
    contexts: &[Option<TokenContext>],
    saved: SavedWindows<'_, '_>,
) {
    let (dkv, history) = (st.dkv(), st.w - 1);
    let SavedWindows {
        windows,
        draft_tokens,
        capacity,
    } = saved;
    for (t, ctx) in contexts.iter().enumerate() {
        let Some(ctx) = ctx else { continue };
        let Some(slot) = ctx.slot else { continue };
        if ctx.seq >= capacity {
            continue;
        }
        let pos = t - ctx.bos;
        for (inter, cache, off) in [
            (&mut *windows.k, &*conv.cache.k, st.k_off),
            (&mut *windows.v, &*conv.cache.v, st.v_off),
        ] {
            for w in 0..history {
                let p = pos + 1 + w;
                let row = ((ctx.seq * draft_tokens + pos) * history + w) * dkv;
                for c in 0..dkv {
                    let x = if p < history {
                        history_row(cache, st, slot, p, c)
                    } else {
                        batch.qkvr[(ctx.bos + p - history) * st.row + off + c]
                    };
                    inter[row + c] = x;
                }
            }
        }
    }
}

/// Phase 5 of decode: each token with a slot shifts its conv state by one (the oldest row out,
/// the token in) in place, and where tracked copies the new window to a second slot too.
fn update_decode_state(
    st: &PrologueStatics,
    batch: &BatchSlices<'_, Cpu>,
    conv: &mut ConvSlices<'_, Cpu>,
    contexts: &[Option<TokenContext>],
    track: Option<&DecodeTrackSlices<'_, Cpu>>,
    bad: &mut Skipped,
) {
    let (dkv, history) = (st.dkv(), st.w - 1);
    for (t, ctx) in contexts.iter().enumerate() {
        let Some(ctx) = ctx else { continue };
        let Some(slot) = ctx.slot else { continue };
        let track_to = match track {
            Some(tr) if tr.mask[t] != 0 => {
                let i = tr.indices[t];
                if i >= 0 && (i as usize) < conv.slots {
                    Some(i as usize)
                } else {
                    *bad = bad.wrapping_add(1);
                    None
                }
            }
            _ => None,
        };
        for (cache, off) in [
            (&mut *conv.cache.k, st.k_off),
            (&mut *conv.cache.v, st.v_off),
        ] {
            // new[w] = w < K-1 ? (gate ? hist[w+1] : 0) : x_t, read before any write.
            let window: Vec<bf16> = (0..history)
                .flat_map(|w| (0..dkv).map(move |c| (w, c)))
                .map(|(w, c)| {
                    if w + 1 < history {
                        if ctx.gate {
                            cache[(slot * history + w + 1) * dkv + c]
                        } else {
                            bf16::ZERO
                        }
                    } else {
                        batch.qkvr[t * st.row + off + c]
                    }
                })
                .collect();
            for dst in std::iter::once(slot).chain(track_to) {
                cache[dst * history * dkv..(dst + 1) * history * dkv].copy_from_slice(&window);
            }
        }
    }
}

/// The per-sequence arrays of an extend call that its trailing update reads.
struct ExtendSeqs<'s> {
    /// Token start of each sequence, `[B+1]`.
    cu_seqlens: &'s [i64],
    /// Initial-state flag of each sequence, `[B]`.
    has_initial_state: &'s [u8],
}

/// Phase 5 of extend, the trailing update: each sequence with a slot rewrites its conv state
/// from its last `W-1` tokens (older rows kept from the initial state where the sequence is
/// shorter).
fn update_extend_state(
    st: &PrologueStatics,
    batch: &BatchSlices<'_, Cpu>,
    conv: &mut ConvSlices<'_, Cpu>,
    seqs: ExtendSeqs<'_>,
    bad: &mut Skipped,
) {
    let (dkv, history, tokens) = (st.dkv(), st.w - 1, batch.tokens);
    for b in 0..batch.seqs {
        if batch.cache_indices[b] == -1 {
            continue;
        }
        let Some(slot) = slot_of(batch.cache_indices[b], conv.slots, bad) else {
            continue;
        };
        let (bos, eos) = (seqs.cu_seqlens[b], seqs.cu_seqlens[b + 1]);
        if !(0 <= bos && bos <= eos && eos <= tokens as i64) {
            *bad = bad.wrapping_add(1);
            continue;
        }
        let qlen = (eos - bos) as usize;
        if qlen == 0 {
            continue;
        }
        for (cache, off) in [
            (&mut *conv.cache.k, st.k_off),
            (&mut *conv.cache.v, st.v_off),
        ] {
            let old = cache[slot * history * dkv..(slot + 1) * history * dkv].to_vec();
            for w in 0..history {
                for c in 0..dkv {
                    cache[(slot * history + w) * dkv + c] = if qlen >= history - w {
                        batch.qkvr[(eos as usize - history + w) * st.row + off + c]
                    } else if seqs.has_initial_state[b] != 0 {
                        old[(w + qlen) * dkv + c]
                    } else {
                        bf16::ZERO
                    };
                }
            }
        }
    }
}

/// Phase 6 of extend, prefix-cache tracking: each flagged sequence copies the window of its
/// listed qkvr rows to its destination slot. Each bad row counts, and a bad destination
/// counts once more.
fn track_extend_windows(
    st: &PrologueStatics,
    batch: &BatchSlices<'_, Cpu>,
    conv: &mut ConvSlices<'_, Cpu>,
    track: &ExtendTrackSlices<'_, Cpu>,
    bad: &mut Skipped,
) {
    let (dkv, history, tokens) = (st.dkv(), st.w - 1, batch.tokens);
    let row_of = |r: i64| (r >= 0 && (r as usize) < tokens).then_some(r as usize);
    let (rows, mask, dst) = (track.rows, track.mask, track.dst);
    for b in 0..batch.seqs {
        if mask[b] == 0 {
            continue;
        }
        let d = dst[b];
        let window_rows: Vec<Option<usize>> = (0..history)
            .map(|w| row_of(rows[b * history + w]))
            .collect();
        *bad = bad.wrapping_add(window_rows.iter().filter(|r| r.is_none()).count() as u32);
        if d < 0 || d as usize >= conv.slots {
            *bad = bad.wrapping_add(1);
            continue;
        }
        let Some(window_rows) = window_rows.into_iter().collect::<Option<Vec<usize>>>() else {
            continue;
        };
        let d = d as usize;
        for (cache, off) in [
            (&mut *conv.cache.k, st.k_off),
            (&mut *conv.cache.v, st.v_off),
        ] {
            for (w, &r) in window_rows.iter().enumerate() {
                for c in 0..dkv {
                    cache[(d * history + w) * dkv + c] = batch.qkvr[r * st.row + off + c];
                }
            }
        }
    }
}

/// Row `row` of slot `slot`'s conv history, channel `c` (`cache [slots, W-1, DKV]`).
fn history_row(cache: &[bf16], st: &PrologueStatics, slot: usize, row: usize, c: usize) -> bf16 {
    cache[(slot * (st.w - 1) + row) * st.dkv() + c]
}

/// q of one token: per-head RMSNorm, rounded to bf16, then the tau fold rounded again.
fn q_row(inputs: &Inputs<'_>, t: usize, gamma: &[f32], eps: f32, tau: Option<f32>) -> Vec<f32> {
    let st = inputs.st;
    let mut out = Vec::with_capacity(st.dq());
    for h in 0..st.hq {
        let x: Vec<f32> = (0..st.hd)
            .map(|j| inputs.x(t, st.q_off, h * st.hd + j))
            .collect();
        let inv = head_rms_inverse(&x, eps);
        for (j, &xj) in x.iter().enumerate() {
            let qn = rn_bf16(xj * inv * gamma[j]);
            out.push(match tau {
                Some(tau) => rn_bf16(qn * tau),
                None => qn,
            });
        }
    }
    out
}

/// k or v of one token: the causal conv over history and the sequence's earlier tokens,
/// SiLU, residual, the bf16 rounding, and (for k) the per-head RMSNorm.
fn kv_row(
    inputs: &Inputs<'_>,
    t: usize,
    ctx: TokenContext,
    conv: ConvInput<'_>,
    norm: Option<(&[f32], f32)>,
) -> Vec<f32> {
    let st = inputs.st;
    let ConvInput {
        offset,
        cache,
        weight,
    } = conv;
    let (w_taps, history) = (st.w, st.w - 1);
    let y: Vec<f32> = (0..st.dkv())
        .map(|c| {
            let taps = &weight[c * w_taps..(c + 1) * w_taps];
            let mut acc = 0.0f32;
            for (i, &tap_weight) in taps[..history].iter().enumerate() {
                // Tap i pairs with the input at time t - history + i.
                let u = t as i64 - history as i64 + i as i64;
                let x = if u >= ctx.bos as i64 {
                    inputs.x(u as usize, offset, c)
                } else if let (true, Some(slot)) = (ctx.gate, ctx.slot) {
                    inputs.history(cache, slot, t - ctx.bos + i, c)
                } else {
                    0.0
                };
                acc = x.mul_add(tap_weight, acc);
            }
            let xt = inputs.x(t, offset, c);
            acc = xt.mul_add(taps[history], acc);
            if st.silu {
                acc /= 1.0 + (-acc).exp();
            }
            if st.residual {
                acc += xt;
            }
            rn_bf16(acc)
        })
        .collect();
    match norm {
        None => y,
        Some((gamma, eps)) => y
            .chunks_exact(st.hd)
            .flat_map(|head| {
                let inv = head_rms_inverse(head, eps);
                head.iter()
                    .zip(gamma)
                    .map(move |(&v, &g)| rn_bf16(v * inv * g))
            })
            .collect(),
    }
}
