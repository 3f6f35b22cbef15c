//! CPU reference of [`super::MlaCacheStore`] and [`super::MlaCacheGather`]: the format's host
//! encoder and decoder (`crate::layout::mla_fp8`), row by row.

use super::launch::{MlaCacheEntry, MlaGatherCall, MlaStoreCall};
use crate::backend::Cpu;
use crate::dtype::{F8E4M3, bf16, e4m3_from_f32};
use crate::error::Result;
use crate::layout::{MLA_CACHE_DIM, MLA_FP8_ROW_BYTES, mla_fp8_decode_row, mla_fp8_encode_row};
use crate::ops::counter::slot_of;

/// The CPU reference runs the op.
impl super::RunMlaCache for Cpu {}

impl MlaCacheEntry for Cpu {
    unsafe fn mla_cache_store<const GROUP: usize>(
        &self,
        call: MlaStoreCall<'_, Cpu>,
    ) -> Result<()> {
        let MlaStoreCall {
            slots,
            rows,
            cache,
            mut skipped,
            ..
        } = call;
        let kv = rows.kv.chunks_exact(MLA_CACHE_DIM); // [T, 576]
        for (row, &loc) in kv.zip(rows.loc) {
            let Some(slot) = slot_of(loc, slots, &mut skipped) else {
                continue;
            };
            let row: &[bf16; MLA_CACHE_DIM] = row.try_into().expect("576 values");
            let out = &mut cache[slot * MLA_FP8_ROW_BYTES..(slot + 1) * MLA_FP8_ROW_BYTES];
            mla_fp8_encode_row(row, out.try_into().expect("656 bytes"));
        }
        Ok(())
    }

    unsafe fn mla_cache_gather<const GROUP: usize>(
        &self,
        call: MlaGatherCall<'_, Cpu>,
    ) -> Result<()> {
        let MlaGatherCall {
            slots,
            cache,
            index,
            data,
            scale,
            mut skipped,
            ..
        } = call;
        let out = data.chunks_exact_mut(MLA_CACHE_DIM); // [n, 576]
        for (row, &index) in out.zip(index) {
            let Some(slot) = slot_of(index as i64, slots, &mut skipped) else {
                row.fill(F8E4M3::from_bits(0));
                continue;
            };
            let bytes = &cache[slot * MLA_FP8_ROW_BYTES..(slot + 1) * MLA_FP8_ROW_BYTES];
            let values = mla_fp8_decode_row(bytes.try_into().expect("656 bytes"));
            // Latent: the dequantized product; RoPE: the bf16 value (both exact in f32).
            for (o, v) in row.iter_mut().zip(values) {
                *o = e4m3_from_f32(v);
            }
        }
        scale[0] = 1.0;
        Ok(())
    }
}
