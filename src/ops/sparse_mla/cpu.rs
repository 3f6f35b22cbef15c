//! CPU reference of the sparse MLA prefill (docs/kernels/sparse_mla.md §3.3), exact softmax in f32/f64 on the
//! dequantized inputs (the kernel's e4m3 re-quantization of P is not modelled; the tests'
//! tolerances cover it).

use rayon::prelude::*;

use super::launch::{SparseMlaCall, SparseMlaEntry};
use super::{D_V, Options};
use crate::backend::Cpu;
use crate::dtype::{F8E4M3, bf16, e4m3_to_f32};
use crate::error::Result;

/// The CPU reference runs the op.
impl super::RunSparseMla for Cpu {}

impl SparseMlaEntry for Cpu {
    unsafe fn sparse_mla<
        const D_QK: usize,
        const H_Q: usize,
        const TOPK: usize,
        O: Options,
        const HEADS: usize,
    >(
        &self,
        call: SparseMlaCall<'_, Cpu>,
    ) -> Result<()> {
        reference(D_QK, HEADS, TOPK, call);
        Ok(())
    }
}

/// Every e4m3 byte decoded, so the inner loops are table lookups.
fn e4m3_table() -> [f32; 256] {
    std::array::from_fn(|b| e4m3_to_f32(float8::F8E4M3::from_bits(b as u8)))
}

/// The reference over one checked call (also the paged decode-through-prefill's, a row at a
/// time).
pub(crate) fn reference(d_qk: usize, heads: usize, topk: usize, call: SparseMlaCall<'_, Cpu>) {
    let lut = e4m3_table();
    let SparseMlaCall {
        s_kv,
        queries,
        kv,
        outputs,
        ..
    } = call;
    let kv_scale = kv.scale[0];
    let score_scale = queries.sm_scale * queries.q_scale[0] * kv_scale;
    // Values are decoded per query row, for the rows it selects: a whole-workspace f32 copy
    // would be four times the workspace (which the caller could allocate), an abort where the
    // reference must return.
    let (kv, q) = (kv.data, queries.q); // [s_kv, d_qk], [s_q, heads, d_qk] e4m3
    let (indices, topk_length, sink) = (queries.indices, queries.topk_length, queries.sink);

    outputs
        .out
        .par_chunks_mut(heads * D_V)
        .zip(outputs.max_logits.par_chunks_mut(heads))
        .zip(outputs.lse.par_chunks_mut(heads))
        .enumerate()
        .for_each(|(i, ((out, max_logits), lse))| {
            let length = topk_length.map_or(topk, |l| l[i].clamp(0, topk as i32) as usize);
            let rows: Vec<usize> = indices[i * topk..i * topk + length]
                .iter()
                .filter(|&&idx| idx >= 0 && (idx as usize) < s_kv)
                .map(|&idx| idx as usize)
                .collect();
            let decode = |values: &[F8E4M3]| -> Vec<f32> {
                values.iter().map(|v| lut[v.to_bits() as usize]).collect()
            };
            // [rows.len(), d_qk] the selected rows, [heads, d_qk] the query's heads.
            let keys: Vec<f32> = rows
                .iter()
                .flat_map(|&r| decode(&kv[r * d_qk..(r + 1) * d_qk]))
                .collect();
            let q_row = decode(&q[i * heads * d_qk..(i + 1) * heads * d_qk]);
            for h in 0..heads {
                let qh = &q_row[h * d_qk..(h + 1) * d_qk];
                let out_h = &mut out[h * D_V..(h + 1) * D_V];
                if rows.is_empty() {
                    out_h.fill(bf16::ZERO);
                    max_logits[h] = f32::NEG_INFINITY;
                    lse[h] = f32::INFINITY;
                    continue;
                }
                let scores: Vec<f64> = keys
                    .chunks_exact(d_qk)
                    .map(|k| {
                        let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
                        (dot * score_scale) as f64
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = weights.iter().sum();
                let denom = z + sink.map_or(0.0, |s| (s[h] as f64 - m).exp());
                let mut acc = vec![0.0f64; D_V];
                for (k, &p) in keys.chunks_exact(d_qk).zip(&weights) {
                    for (a, &v) in acc.iter_mut().zip(&k[..D_V]) {
                        *a += p * v as f64;
                    }
                }
                for (o, a) in out_h.iter_mut().zip(&acc) {
                    *o = bf16::from_f64(a * kv_scale as f64 / denom);
                }
                max_logits[h] = m as f32;
                lse[h] = (m + z.ln()) as f32;
            }
        });
}
