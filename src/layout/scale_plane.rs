//! The index math of the interleaved MXFP8 scale planes (docs/kernels/prologue.md §1.8), in one place.
//!
//! Mirrored by the CUDA kernels that write the planes (`kernels/inkling_prologue.cu`).

/// Byte offset of the scale of (KV slot `slot`, channel `channel`) in a plane of shape
/// `[pages, hkv, 32, page/32, 4]`: index order `[page][head][po % 32][po / 32][block]`, where
/// `po` is the slot's position in its page, `head = channel / 128`, `block = (channel % 128) / 32`.
pub const fn scale_plane_offset(slot: usize, channel: usize, page: usize, hkv: usize) -> usize {
    let chunks = page / 32; // 32-token chunks per page
    let (page_index, po) = (slot / page, slot % page);
    let (head, block) = (channel / 128, (channel % 128) / 32);
    (page_index * hkv + head) * (32 * chunks * 4) + (po % 32) * (chunks * 4) + (po / 32) * 4 + block
}

/// Element offset of (slot, channel) in a KV data buffer `[slots, width]`.
pub const fn kv_data_offset(slot: usize, channel: usize, width: usize) -> usize {
    slot * width + channel
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/kernels/prologue.md §1.8: P = 128, HKV = 2 (Inkling TP8 SWA), slot 300, channel 200.
    #[test]
    fn spec_example() {
        assert_eq!(scale_plane_offset(300, 200, 128, 2), 2758);
        assert_eq!(kv_data_offset(300, 200, 256), 77000);
    }

    /// Every (slot, block) of a plane maps to a distinct byte, covering the plane exactly.
    #[test]
    fn offsets_are_a_bijection() {
        for (page, hkv) in [(128, 1), (128, 2), (256, 3), (128, 8)] {
            let pages = 3;
            let mut seen = vec![false; pages * hkv * page * 4];
            for slot in 0..pages * page {
                for channel in (0..hkv * 128).step_by(32) {
                    let o = scale_plane_offset(slot, channel, page, hkv);
                    assert!(!seen[o], "page {page} hkv {hkv} slot {slot} ch {channel}");
                    seen[o] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }
}
