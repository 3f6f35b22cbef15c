//! CPU reference of [`super::SparseMlaDecode`]: each valid slot's row decoded exactly
//! (`mla_fp8_decode_row`), scores and weighted sums in f64, rounded once.

use rayon::prelude::*;

use super::launch::{DecodeCall, DecodeEntry, DecodePagedPrefillCall, DecodePrepareCall};
use crate::backend::Cpu;
use crate::dtype::{F8E4M3, bf16, e4m3_from_f32};
use crate::error::Result;
use crate::layout::{MLA_CACHE_DIM, MLA_FP8_ROW_BYTES, MLA_LATENT_DIM, mla_fp8_decode_row};
use crate::ops::sparse_mla::cpu::reference as prefill_reference;
use crate::ops::sparse_mla::launch::{
    LatentKvSlices, SparseMlaCall, SparseMlaOutputSlices, SparseMlaQuerySlices,
};
use crate::ops::sparse_mla::{D_V, HeadTiling};

/// The values of cache row `slot` (the caller checked `slot` against the cache's rows).
fn cache_row(cache: &[u8], slot: usize) -> [f32; MLA_CACHE_DIM] {
    let row = &cache[slot * MLA_FP8_ROW_BYTES..(slot + 1) * MLA_FP8_ROW_BYTES];
    mla_fp8_decode_row(row.try_into().expect("a cache row is 656 bytes"))
}

/// The CPU reference runs the op.
impl super::RunDecode for Cpu {}

impl DecodeEntry for Cpu {
    /// The reference takes each row whole: no split, no scratch.
    fn decode_splits(&self, _rows: usize, _heads: usize, topk: usize) -> (usize, usize) {
        (1, topk)
    }

    unsafe fn sparse_mla_decode<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodeCall<'_, Cpu>,
    ) -> Result<()> {
        let DecodeCall {
            rows,
            slots,
            queries,
            cache,
            out,
            lse,
            ..
        } = call;
        debug_assert_eq!(lse.len(), rows * H_Q, "the call ties lse to the rows");
        let sm_scale = queries.sm_scale as f64;
        out.par_chunks_mut(H_Q * MLA_LATENT_DIM)
            .zip(lse.par_chunks_mut(H_Q))
            .enumerate()
            .for_each(|(r, (out, lse))| {
                let length = queries
                    .lengths
                    .map_or(TOPK, |l| l[r].clamp(0, TOPK as i32) as usize);
                let keys: Vec<[f32; MLA_CACHE_DIM]> = queries.indices[r * TOPK..r * TOPK + length]
                    .iter()
                    .filter(|&&s| s >= 0 && (s as usize) < slots)
                    .map(|&s| cache_row(cache, s as usize))
                    .collect();
                for h in 0..H_Q {
                    let q = &queries.q[(r * H_Q + h) * MLA_CACHE_DIM..][..MLA_CACHE_DIM];
                    let out_h = &mut out[h * MLA_LATENT_DIM..(h + 1) * MLA_LATENT_DIM];
                    if keys.is_empty() {
                        out_h.fill(bf16::ZERO);
                        lse[h] = f32::INFINITY;
                        continue;
                    }
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|k| {
                            let dot: f64 =
                                q.iter().zip(k).map(|(a, &b)| a.to_f64() * b as f64).sum();
                            sm_scale * dot
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = weights.iter().sum();
                    let mut acc = [0.0f64; MLA_LATENT_DIM];
                    for (k, &w) in keys.iter().zip(&weights) {
                        for (a, &v) in acc.iter_mut().zip(&k[..MLA_LATENT_DIM]) {
                            *a += w * v as f64;
                        }
                    }
                    for (o, a) in out_h.iter_mut().zip(&acc) {
                        *o = bf16::from_f64(a / z);
                    }
                    lse[h] = (m + z.ln()) as f32;
                }
            });
        Ok(())
    }

    unsafe fn sparse_mla_decode_prepare<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodePrepareCall<'_, Cpu>,
    ) -> Result<()> {
        let DecodePrepareCall {
            rows,
            slots,
            queries,
            q8,
            slots_out,
        } = call;
        for (e, v) in q8.iter_mut().zip(queries.q.iter()) {
            *e = e4m3_from_f32(v.to_f32());
        }
        for r in 0..rows {
            let length = queries
                .lengths
                .map_or(TOPK, |l| l[r].clamp(0, TOPK as i32) as usize);
            for j in 0..TOPK {
                let at = r * TOPK + j;
                let slot = queries.indices[at];
                let valid = j < length && slot >= 0 && (slot as usize) < slots;
                slots_out[at] = if valid { slot } else { -1 };
            }
        }
        Ok(())
    }

    /// Each query row through the prefill's reference over the row's own workspace: its
    /// `TOPK` slots' latent and RoPE values re-cast to e4m3 at identity scale (as the cache
    /// gather writes them), one row at a time (a row's workspace is
    /// `TOPK × 576` bytes; the whole step's would be the caller's memory many times over).
    unsafe fn sparse_mla_decode_paged_prefill<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodePagedPrefillCall<'_, Cpu>,
    ) -> Result<()> {
        let DecodePagedPrefillCall {
            rows,
            slots,
            q8,
            unit_scale,
            slots_in,
            cache,
            sm_scale,
            out,
            max_logits,
            lse,
        } = call;
        let zero = F8E4M3::from_bits(0);
        for r in 0..rows {
            // [TOPK, 576] the row's workspace, [TOPK] its indices into it.
            let mut kv = vec![zero; TOPK * MLA_CACHE_DIM];
            let mut positions = vec![-1i32; TOPK];
            for j in 0..TOPK {
                let at = r * TOPK + j;
                let slot = slots_in[at];
                if slot < 0 || slot as usize >= slots {
                    continue;
                }
                let row = cache_row(cache, slot as usize);
                let dst = &mut kv[j * MLA_CACHE_DIM..(j + 1) * MLA_CACHE_DIM];
                for (e, &v) in dst.iter_mut().zip(row.iter()) {
                    *e = e4m3_from_f32(v);
                }
                positions[j] = j as i32;
            }
            let call = SparseMlaCall::<Cpu> {
                s_q: 1,
                s_kv: TOPK,
                tiling: HeadTiling::Tiles64,
                queries: SparseMlaQuerySlices {
                    q: &q8[r * H_Q * MLA_CACHE_DIM..(r + 1) * H_Q * MLA_CACHE_DIM],
                    q_scale: unit_scale,
                    indices: &positions,
                    topk_length: None,
                    sink: None,
                    sm_scale,
                },
                kv: LatentKvSlices {
                    data: &kv,
                    scale: unit_scale,
                },
                outputs: SparseMlaOutputSlices {
                    out: &mut out[r * H_Q * D_V..(r + 1) * H_Q * D_V],
                    max_logits: &mut max_logits[r * H_Q..(r + 1) * H_Q],
                    lse: &mut lse[r * H_Q..(r + 1) * H_Q],
                },
            };
            prefill_reference(MLA_CACHE_DIM, H_Q, TOPK, call);
        }
        Ok(())
    }
}
