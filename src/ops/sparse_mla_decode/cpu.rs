//! CPU reference of [`super::SparseMlaDecode`]: each valid slot's row decoded exactly
//! (`mla_fp8_decode_row`), scores and weighted sums in f64, rounded once.

use rayon::prelude::*;

use super::launch::{DecodeCall, DecodeEntry, DecodePrepareCall};
use crate::backend::Cpu;
use crate::dtype::{bf16, e4m3_from_f32};
use crate::error::Result;
use crate::layout::{MLA_CACHE_DIM, MLA_FP8_ROW_BYTES, MLA_LATENT_DIM, mla_fp8_decode_row};

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
                    .map(|&s| {
                        let at = s as usize * MLA_FP8_ROW_BYTES;
                        mla_fp8_decode_row(cache[at..at + MLA_FP8_ROW_BYTES].try_into().unwrap())
                    })
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
            slots_flat,
            positions,
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
                slots_flat[at] = if valid { slot } else { -1 };
                positions[at] = if valid { at as i32 } else { -1 };
            }
        }
        Ok(())
    }
}
