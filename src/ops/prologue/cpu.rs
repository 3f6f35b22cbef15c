//! CPU reference of the prologue (docs/kernels/prologue.md §1.5–§1.8), on plain slices.
//!
//! Arithmetic follows the kernel's order where rounding depends on it (sums of squares per
//! 8-channel lane, then a butterfly over the lanes of a head; conv taps oldest first; IEEE
//! square root and division), so that bf16 outputs and MXFP8 bytes agree with the device
//! bit for bit wherever the kernel is IEEE (everywhere except SiLU's exponential).

use rayon::prelude::*;

use super::call::{KvTarget, PrologueCall, PrologueLaunchEntry, QTarget, VariantArgs};
use super::{PrologueKernel, PrologueStatics};
use crate::backend::Cpu;
use crate::dtype::{MXFP8_BLOCK, bf16, mxfp8_encode_block, mxfp8_encode_row, rn_bf16};
use crate::error::Result;
use crate::layout::{kv_data_offset, scale_plane_offset};

impl PrologueLaunchEntry for Cpu {
    unsafe fn prologue<K: PrologueKernel>(&self, call: PrologueCall<'_, Cpu>) -> Result<()> {
        run(&K::STATICS, call);
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

struct Inputs<'a> {
    st: &'a PrologueStatics,
    qkvr: &'a [bf16],
    k_cache: &'a [bf16],
    v_cache: &'a [bf16],
}

impl Inputs<'_> {
    fn x(&self, token: usize, offset: usize, channel: usize) -> f32 {
        self.qkvr[token * self.st.row + offset + channel].to_f32()
    }
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

fn run(st: &PrologueStatics, call: PrologueCall<'_, Cpu>) {
    let PrologueCall {
        tokens,
        seqs,
        qkvr,
        q_gamma,
        k_gamma,
        k_weight,
        v_weight,
        eps,
        k_cache,
        v_cache,
        conv_slots,
        cache_indices,
        cache_mask,
        tau,
        loc,
        q,
        k_out,
        v_out,
        kv,
        mut variant,
        mut bad_index_count,
    } = call;
    // No token, no work: the CUDA backend launches nothing then, so nothing is counted either.
    if tokens == 0 {
        return;
    }
    // Skipped indices, modulo 2^32 like the device's `atomicAdd` on its u32 counter.
    let mut bad = 0u32;
    let (dq, dkv, history) = (st.dq(), st.dkv(), st.w - 1);

    let slot_of = |index: i32, bad: &mut u32| -> Option<usize> {
        match index {
            -1 => None,
            i if i >= 0 && (i as usize) < conv_slots => Some(i as usize),
            _ => {
                *bad = bad.wrapping_add(1);
                None
            }
        }
    };

    // Per-token context. A token whose sequence metadata is out of range is computed without
    // history and not stored (the kernel's device guard).
    let contexts: Vec<Option<TokenContext>> = (0..tokens)
        .map(|t| match &variant {
            VariantArgs::Verify { draft_tokens, .. } => {
                let seq = t / draft_tokens;
                let slot = slot_of(cache_indices[seq], &mut bad);
                Some(TokenContext {
                    seq,
                    bos: seq * draft_tokens,
                    slot,
                    gate: slot.is_some() && cache_mask[seq] != 0,
                    store: true,
                })
            }
            VariantArgs::Extend {
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
                if seq < 0 || seq as usize >= seqs {
                    bad = bad.wrapping_add(1);
                    return Some(unresolved);
                }
                let seq = seq as usize;
                let bos = cu_seqlens[seq];
                if bos < 0 || bos > t as i64 {
                    bad = bad.wrapping_add(1);
                    return Some(unresolved);
                }
                let slot = slot_of(cache_indices[seq], &mut bad);
                Some(TokenContext {
                    seq,
                    bos: bos as usize,
                    slot,
                    gate: slot.is_some() && cache_mask[seq] != 0,
                    store: true,
                })
            }
            VariantArgs::Decode { .. } => {
                let slot = slot_of(cache_indices[t], &mut bad);
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
        .collect();

    let inputs = Inputs {
        st,
        qkvr,
        k_cache,
        v_cache,
    };
    let q_gamma: Vec<f32> = q_gamma.iter().map(|g| g.to_f32()).collect();
    let k_gamma: Vec<f32> = k_gamma.iter().map(|g| g.to_f32()).collect();
    let k_weight: Vec<f32> = k_weight.iter().map(|g| g.to_f32()).collect();
    let v_weight: Vec<f32> = v_weight.iter().map(|g| g.to_f32()).collect();

    let results: Vec<Option<TokenOut>> = (0..tokens)
        .into_par_iter()
        .map(|t| {
            let ctx = contexts[t]?;
            let tau_t = tau.map(|tau| tau[t]);
            Some(TokenOut {
                q: q_row(&inputs, t, &q_gamma, eps, tau_t),
                k: kv_row(
                    &inputs,
                    t,
                    ctx,
                    st.k_off,
                    inputs.k_cache,
                    &k_weight,
                    Some((&k_gamma, eps)),
                ),
                v: kv_row(&inputs, t, ctx, st.v_off, inputs.v_cache, &v_weight, None),
            })
        })
        .collect();

    // Outputs, one row per computed token.
    let mut q = q;
    for (t, out) in results.iter().enumerate() {
        let Some(out) = out else { continue };
        match &mut q {
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
        for (d, &x) in k_out[t * dkv..(t + 1) * dkv].iter_mut().zip(&out.k) {
            *d = bf16::from_f32(x);
        }
        for (d, &x) in v_out[t * dkv..(t + 1) * dkv].iter_mut().zip(&out.v) {
            *d = bf16::from_f32(x);
        }
    }

    // KV store at `loc`: verify and extend store every token, decode only tokens with a slot.
    // A `loc` beyond the pool is counted for every token, stored or not (as the kernel does).
    let mut kv = kv;
    let slots = match &kv {
        KvTarget::None => None,
        KvTarget::Bf16 { slots, .. } | KvTarget::Mxfp8 { slots, .. } => Some(*slots),
    };
    for (t, out) in results.iter().enumerate() {
        let (Some(out), Some(ctx), Some(slots)) = (out, contexts[t], slots) else {
            continue;
        };
        if loc[t] >= slots as i64 {
            bad = bad.wrapping_add(1);
            continue;
        }
        if loc[t] < 0 || !ctx.store {
            continue;
        }
        let slot = loc[t] as usize;
        match &mut kv {
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

    // Conv-state side effects.
    match &mut variant {
        VariantArgs::Verify {
            draft_tokens,
            k_inter,
            v_inter,
            capacity,
        } => {
            for (t, ctx) in contexts.iter().enumerate() {
                let Some(ctx) = ctx else { continue };
                let Some(slot) = ctx.slot else { continue };
                if ctx.seq >= *capacity {
                    continue;
                }
                let pos = t - ctx.bos;
                for (inter, cache, off) in [
                    (&mut **k_inter, &*k_cache, st.k_off),
                    (&mut **v_inter, &*v_cache, st.v_off),
                ] {
                    for w in 0..history {
                        let p = pos + 1 + w;
                        let row = ((ctx.seq * *draft_tokens + pos) * history + w) * dkv;
                        for c in 0..dkv {
                            let x = if p < history {
                                history_row(cache, st, slot, p, c)
                            } else {
                                qkvr[(ctx.bos + p - history) * st.row + off + c]
                            };
                            inter[row + c] = x;
                        }
                    }
                }
            }
        }
        VariantArgs::Decode { track } => {
            for (t, ctx) in contexts.iter().enumerate() {
                let Some(ctx) = ctx else { continue };
                let Some(slot) = ctx.slot else { continue };
                let track_to = match track {
                    Some(tr) if tr.mask[t] != 0 => {
                        let i = tr.indices[t];
                        if i >= 0 && (i as usize) < conv_slots {
                            Some(i as usize)
                        } else {
                            bad = bad.wrapping_add(1);
                            None
                        }
                    }
                    _ => None,
                };
                for (cache, off) in [(&mut *k_cache, st.k_off), (&mut *v_cache, st.v_off)] {
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
                                qkvr[t * st.row + off + c]
                            }
                        })
                        .collect();
                    for dst in std::iter::once(slot).chain(track_to) {
                        cache[dst * history * dkv..(dst + 1) * history * dkv]
                            .copy_from_slice(&window);
                    }
                }
            }
        }
        VariantArgs::Extend {
            cu_seqlens,
            has_initial_state,
            track,
            update_conv_state,
            ..
        } => {
            let row_of = |r: i64| (r >= 0 && (r as usize) < tokens).then_some(r as usize);
            if *update_conv_state {
                for b in 0..seqs {
                    if cache_indices[b] == -1 {
                        continue;
                    }
                    let Some(slot) = slot_of(cache_indices[b], &mut bad) else {
                        continue;
                    };
                    let (bos, eos) = (cu_seqlens[b], cu_seqlens[b + 1]);
                    if !(0 <= bos && bos <= eos && eos <= tokens as i64) {
                        bad = bad.wrapping_add(1);
                        continue;
                    }
                    let qlen = (eos - bos) as usize;
                    if qlen == 0 {
                        continue;
                    }
                    for (cache, off) in [(&mut *k_cache, st.k_off), (&mut *v_cache, st.v_off)] {
                        let old = cache[slot * history * dkv..(slot + 1) * history * dkv].to_vec();
                        for w in 0..history {
                            for c in 0..dkv {
                                cache[(slot * history + w) * dkv + c] = if qlen >= history - w {
                                    qkvr[(eos as usize - history + w) * st.row + off + c]
                                } else if has_initial_state[b] != 0 {
                                    old[(w + qlen) * dkv + c]
                                } else {
                                    bf16::ZERO
                                };
                            }
                        }
                    }
                }
            }
            if let Some(tr) = track {
                let (rows, mask, dst) = (tr.rows, tr.mask, tr.dst);
                for b in 0..seqs {
                    if mask[b] == 0 {
                        continue;
                    }
                    let d = dst[b];
                    // Each bad row counts, and a bad destination counts once more.
                    let window_rows: Vec<Option<usize>> = (0..history)
                        .map(|w| row_of(rows[b * history + w]))
                        .collect();
                    bad =
                        bad.wrapping_add(window_rows.iter().filter(|r| r.is_none()).count() as u32);
                    if d < 0 || d as usize >= conv_slots {
                        bad = bad.wrapping_add(1);
                        continue;
                    }
                    let Some(window_rows) = window_rows.into_iter().collect::<Option<Vec<usize>>>()
                    else {
                        continue;
                    };
                    let d = d as usize;
                    for (cache, off) in [(&mut *k_cache, st.k_off), (&mut *v_cache, st.v_off)] {
                        for (w, &r) in window_rows.iter().enumerate() {
                            for c in 0..dkv {
                                cache[(d * history + w) * dkv + c] = qkvr[r * st.row + off + c];
                            }
                        }
                    }
                }
            }
        }
    }

    if let Some(counter) = bad_index_count.as_mut() {
        counter[0] = counter[0].wrapping_add(bad);
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
    offset: usize,
    cache: &[bf16],
    weight: &[f32],
    norm: Option<(&[f32], f32)>,
) -> Vec<f32> {
    let st = inputs.st;
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
