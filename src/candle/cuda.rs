//! candle's CUDA storage lent to the CUDA backend (feature `candle-cuda`).

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaViewMut};

use crate::dtype::E8M0;

/// Runs `f` on bytes `range` of `bytes` viewed as E8M0 scales; `None` when the range is not
/// inside the buffer. The view keeps the buffer's own events (cudarc orders it like any view
/// of `bytes`).
pub(crate) fn with_bytes_as_e8m0<Out>(
    bytes: &mut CudaSlice<u8>,
    range: Range<usize>,
    f: impl FnOnce(CudaViewMut<'_, E8M0>) -> Out,
) -> Option<Out> {
    let len = range.len();
    let mut range_bytes = bytes.try_slice_mut(range)?;
    // SAFETY: `len` bytes viewed as as many `E8M0` (`repr(transparent)` over `u8`, every bit
    // pattern valid).
    let scales = unsafe { range_bytes.transmute_mut::<E8M0>(len) }?;
    Some(f(scales))
}
