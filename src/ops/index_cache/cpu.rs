//! CPU reference of [`super::IndexKeyStore`] and [`super::IndexKeyGather`]: the format's host
//! encoder (`crate::layout::index_cache`) and byte copies, token by token.

use super::launch::{IndexCacheEntry, IndexGatherCall, IndexStoreCall};
use crate::backend::Cpu;
use crate::dtype::{F8E4M3, bf16};
use crate::error::Result;
use crate::layout::{INDEX_KEY_DIM, index_key_encode, index_key_offsets};
use crate::ops::counter::slot_of;

/// The CPU reference runs the op.
impl super::RunIndexCache for Cpu {}

impl IndexCacheEntry for Cpu {
    unsafe fn index_key_store<const PAGE: usize>(
        &self,
        call: IndexStoreCall<'_, Cpu>,
    ) -> Result<()> {
        let IndexStoreCall {
            slots,
            rows,
            cache,
            mut skipped,
            ..
        } = call;
        let keys = rows.k.chunks_exact(INDEX_KEY_DIM); // [T, 128]
        for (key, &loc) in keys.zip(rows.loc) {
            let Some(slot) = slot_of(loc, slots, &mut skipped) else {
                continue;
            };
            let key: &[bf16; INDEX_KEY_DIM] = key.try_into().expect("128 values");
            let (bytes, scale) = index_key_encode(key);
            let (key_at, scale_at) = index_key_offsets::<PAGE>(slot);
            cache[key_at..key_at + INDEX_KEY_DIM].copy_from_slice(&bytes);
            cache[scale_at..scale_at + 4].copy_from_slice(&scale.to_le_bytes());
        }
        Ok(())
    }

    unsafe fn index_key_gather<const PAGE: usize>(
        &self,
        call: IndexGatherCall<'_, Cpu>,
    ) -> Result<()> {
        let IndexGatherCall {
            slots,
            cache,
            index,
            k,
            k_scale,
            mut skipped,
            ..
        } = call;
        let rows = k.chunks_exact_mut(INDEX_KEY_DIM).zip(k_scale.iter_mut()); // [n, 128], [n]
        for ((row, scale), &slot) in rows.zip(index) {
            let Some(slot) = slot_of(slot as i64, slots, &mut skipped) else {
                row.fill(F8E4M3::from_bits(0));
                *scale = 0.0;
                continue;
            };
            let (key_at, scale_at) = index_key_offsets::<PAGE>(slot);
            for (o, &b) in row.iter_mut().zip(&cache[key_at..key_at + INDEX_KEY_DIM]) {
                *o = F8E4M3::from_bits(b);
            }
            *scale = f32::from_le_bytes(cache[scale_at..scale_at + 4].try_into().expect("4 bytes"));
        }
        Ok(())
    }
}
