//! TMA tensor maps (`CUtensorMap`): the descriptor a kernel's `cp.async.bulk.tensor` copies a
//! box of a global tensor with, bounds-checked by the hardware (a box reaching past the tensor
//! is filled with zeros, never read there) and laid out in shared memory with the swizzle the
//! tensor cores read.

use cudarc::driver::sys;

use crate::error::{Error, Result};

/// A tensor map as a kernel parameter: the driver's 128-byte opaque descriptor, 64-byte aligned
/// (`struct alignas(64) TensorMap { unsigned long long opaque[16]; }` on the CUDA side). Made on
/// the host per call from a buffer's address and extents; passed by value in the parameter
/// block, so a recorded graph keeps it as it keeps the buffers' addresses.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorMap([u64; 16]);

impl TensorMap {
    /// The map of `rows` rows of 128 bytes at device address `base`, copied in boxes of
    /// `box_rows` rows into shared memory in the 128-byte swizzle (the layout of a K-major wgmma
    /// operand whose rows are 128 bytes). Rows at or past `rows` arrive as zeros. `rows` = 0
    /// gives an empty map: a kernel must not copy through it (nothing to copy). A swizzled copy
    /// needs `base` 128-byte aligned (a row view of such rows always is): `Err` naming `param`
    /// otherwise, and when `rows` or `box_rows` lie outside what a map holds (`rows` at most
    /// 2^32, `box_rows` in 1..=256). Encoding asks the CUDA driver, as making a [`Cuda`](super::Cuda)
    /// does: call it where one exists.
    pub fn rows_of_128_bytes(
        param: &'static str,
        base: u64,
        rows: usize,
        box_rows: u32,
    ) -> Result<Self> {
        check_box(param, "box_rows", box_rows)?;
        if rows == 0 {
            return Ok(Self::default());
        }
        check_extent(param, "rows", rows)?;
        check_base(param, base)?;
        Self::encode(base, &[128, rows as u64], &[128], &[128, box_rows])
    }

    /// The map of the key tiles of `pages` pages of `page_bytes` bytes at device address
    /// `base`, a page starting with its `page_rows` rows of 128 bytes: box (0, 0, p) is page
    /// p's tile, copied into shared memory in the 128-byte swizzle (the bytes after a page's
    /// tile are never read through the map). `pages` = 0 gives an empty map (nothing to copy).
    /// `Err` naming `param` when `base` is not a multiple of 128 bytes, `page_bytes` not of
    /// 16 (a TMA stride), `page_rows` outside 1..=256 or `pages` past 2^32. Encoding asks
    /// the CUDA driver, as making a [`Cuda`](super::Cuda) does: call it where one exists.
    pub fn key_tiles_of_pages(
        param: &'static str,
        base: u64,
        pages: usize,
        page_bytes: usize,
        page_rows: u32,
    ) -> Result<Self> {
        check_box(param, "page_rows", page_rows)?;
        if pages == 0 {
            return Ok(Self::default());
        }
        check_extent(param, "pages", pages)?;
        check_base(param, base)?;
        if !page_bytes.is_multiple_of(16) || page_bytes < 128 * page_rows as usize {
            return Err(Error::Mismatch {
                param,
                expected: format!(
                    "pages of a multiple of 16 bytes holding {page_rows} rows of 128 bytes"
                ),
                actual: format!("{page_bytes} bytes a page"),
            });
        }
        Self::encode(
            base,
            &[128, page_rows as u64, pages as u64],
            &[128, page_bytes as u64],
            &[128, page_rows, 1],
        )
    }

    /// Encodes a tiled map of bytes: `dims` (innermost first), the byte strides of every
    /// dimension but the innermost, the box; 128-byte swizzle, zeros past the extents.
    fn encode<const RANK: usize, const STRIDES: usize>(
        base: u64,
        dims: &[u64; RANK],
        strides: &[u64; STRIDES],
        boxes: &[u32; RANK],
    ) -> Result<Self> {
        const {
            assert!(
                STRIDES + 1 == RANK,
                "a stride for every dimension but the innermost"
            )
        };
        let dims: [sys::cuuint64_t; RANK] = *dims;
        let strides: [sys::cuuint64_t; STRIDES] = *strides;
        let boxes: [sys::cuuint32_t; RANK] = *boxes;
        let element_strides: [sys::cuuint32_t; RANK] = [1; RANK];
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        // SAFETY: the arrays hold RANK entries (strides RANK - 1); the driver only encodes the
        // descriptor into `map` (it reads no device memory); `base` is a device address the
        // caller names, checked by the driver for alignment.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                RANK as u32,
                base as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
            .result()?;
        }
        // SAFETY: encoded above (and zeroed before).
        let map = unsafe { map.assume_init() };
        Ok(Self(map.opaque))
    }
}

/// A box extent the driver takes: 1 ..= 256 (`Err` naming `param` otherwise).
fn check_box(param: &'static str, what: &str, rows: u32) -> Result<()> {
    if (1..=256).contains(&rows) {
        return Ok(());
    }
    Err(Error::Mismatch {
        param,
        expected: format!("{what} of a tensor map's box in 1 ..= 256"),
        actual: rows.to_string(),
    })
}

/// A global extent the driver takes: at most 2^32 (`Err` naming `param` otherwise).
fn check_extent(param: &'static str, what: &str, n: usize) -> Result<()> {
    if (n as u64) <= 1 << 32 {
        return Ok(());
    }
    Err(Error::Mismatch {
        param,
        expected: format!("{what} of a tensor map, at most 2^32"),
        actual: n.to_string(),
    })
}

/// A swizzled copy's base: a multiple of 128 bytes (`Err` naming `param` otherwise).
fn check_base(param: &'static str, base: u64) -> Result<()> {
    if base.is_multiple_of(128) {
        return Ok(());
    }
    Err(Error::Mismatch {
        param,
        expected: "a device address that is a multiple of 128 bytes (its rows are copied by TMA in the 128-byte swizzle)".into(),
        actual: format!("{base:#x} ({} bytes past one)", base % 128),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The alignment check comes before the driver is asked: it runs without a GPU.
    #[test]
    fn a_base_off_128_bytes_is_an_err_naming_the_param() {
        let err = TensorMap::rows_of_128_bytes("k", 0x7f00_0000_0010, 64, 64).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("k"), "{text}");
        assert!(text.contains("multiple of 128"), "{text}");
        assert!(
            text.contains("0x7f0000000010") && text.contains("16 bytes past one"),
            "{text}"
        );
    }

    #[test]
    fn no_rows_is_an_empty_map_without_the_driver() {
        let map = TensorMap::rows_of_128_bytes("k", 0x10, 0, 64).unwrap();
        assert_eq!(map.0, [0u64; 16]);
    }

    #[test]
    fn pages_whose_bytes_break_the_stride_rule_are_an_err_naming_the_param() {
        let err = TensorMap::key_tiles_of_pages("index_cache", 0x1000, 4, 8450, 64).unwrap_err();
        assert!(err.to_string().contains("index_cache"), "{err}");
        assert!(err.to_string().contains("8450 bytes a page"), "{err}");
        let err = TensorMap::key_tiles_of_pages("index_cache", 0x1000, 4, 4096, 64).unwrap_err();
        assert!(err.to_string().contains("4096 bytes a page"), "{err}");
        let err = TensorMap::key_tiles_of_pages("index_cache", 0x1040, 4, 8448, 64).unwrap_err();
        assert!(err.to_string().contains("64 bytes past one"), "{err}");
        assert_eq!(
            TensorMap::key_tiles_of_pages("index_cache", 0x1040, 0, 8448, 64)
                .unwrap()
                .0,
            [0u64; 16]
        );
    }

    #[test]
    fn boxes_and_extents_a_map_cannot_hold_are_an_err_naming_the_param() {
        for bad in [0u32, 257] {
            let err = TensorMap::rows_of_128_bytes("k", 0x1000, 64, bad).unwrap_err();
            assert!(
                err.to_string().contains("k") && err.to_string().contains("box_rows"),
                "{err}"
            );
            let err =
                TensorMap::key_tiles_of_pages("index_cache", 0x1000, 4, 8448, bad).unwrap_err();
            assert!(err.to_string().contains("page_rows"), "{err}");
        }
        let err = TensorMap::rows_of_128_bytes("k", 0x1000, (1 << 32) + 1, 64).unwrap_err();
        assert!(err.to_string().contains("4294967297"), "{err}");
        let err = TensorMap::key_tiles_of_pages("index_cache", 0x1000, (1 << 32) + 1, 8448, 64)
            .unwrap_err();
        assert!(err.to_string().contains("pages"), "{err}");
    }
}
