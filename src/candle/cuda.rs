//! candle's CUDA storage lent to the CUDA backend (feature `candle-cuda`).

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaViewMut, DevicePtrMut};

use crate::backend::cuda::ForeignDeviceBuffer;
use crate::dtype::E8M0;

/// Runs `f` on bytes `range` of `bytes` viewed as E8M0 scales; `None` when the range is not
/// inside the buffer.
///
/// cudarc types a mutable view by its buffer's element type and cannot re-type a sub-range of
/// one. A range that starts at a multiple of its length (a layer of a pool of equal layers, or
/// the whole buffer) is one of the equal chunks of the whole buffer re-typed, and keeps the
/// buffer's own events. Any other range is lent through a [`ForeignDeviceBuffer`] over the same
/// memory, on the buffer's stream, that lives only while `f` runs; ordering is then that of a
/// view of `bytes` itself: the buffer's pending work is waited for first, the foreign buffer's
/// write event is recorded on `bytes`' stream before `f` (a launch on another stream waits for
/// the work queued there), and dropping it makes that stream wait for what `f` queued (`leak`
/// waits on its events) before `bytes` is used again.
pub(crate) fn with_bytes_as_e8m0<Out>(
    bytes: &mut CudaSlice<u8>,
    range: Range<usize>,
    f: impl FnOnce(CudaViewMut<'_, E8M0>) -> Out,
) -> Option<Out> {
    if range.start > range.end || range.end > bytes.len() {
        return None;
    }
    let len = range.len();
    // SAFETY (both re-typings): bytes viewed as as many `E8M0` (`repr(transparent)` over `u8`,
    // every bit pattern valid).
    if len == 0 {
        return Some(f(unsafe { bytes.transmute_mut::<E8M0>(0) }?));
    }
    if range.start.is_multiple_of(len) {
        let total = bytes.len();
        let all = unsafe { bytes.transmute_mut::<E8M0>(total) }?;
        return Some(f(all.chunks_exact_mut(len).nth(range.start / len)?));
    }
    let stream = bytes.stream().clone();
    // The storage's own ordering first: its pending reads and writes are waited for here.
    let (base, guard) = bytes.device_ptr_mut(&stream);
    // SAFETY: `range` is inside `bytes`, whose memory outlives the foreign buffer (it is
    // dropped at the end of this function, while `bytes` is mutably borrowed), and `E8M0` is a
    // byte: every bit pattern is valid. Nothing else uses the range while `f` runs.
    let mut foreign = unsafe {
        ForeignDeviceBuffer::<E8M0>::new(&stream, base + range.start as u64, range.len()).ok()?
    };
    {
        // Records the foreign buffer's write event on `stream` (no-op without event tracking).
        let mut view = foreign.view_mut();
        let _order = view.device_ptr_mut(&stream);
    }
    let out = f(foreign.view_mut());
    drop(foreign);
    drop(guard);
    Some(out)
}
