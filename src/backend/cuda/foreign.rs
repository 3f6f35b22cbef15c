//! Device memory with no Rust owner (a pointer from an engine's own allocator, another
//! framework, a C library), lent to the typed views through an `unsafe` door.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};

use crate::backend::Element;
use crate::error::{Error, Result};

/// `len` elements of `T` at a raw device address, borrowed for the life of this value: it
/// lends views like a `CudaSlice` but never frees the memory.
pub struct ForeignDeviceBuffer<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
}

impl<T: Element> ForeignDeviceBuffer<T> {
    /// Wraps `len` elements at `ptr`, ordered on `stream`.
    ///
    /// # Safety
    /// For as long as the returned value (and every view it lends) lives:
    /// - `ptr` addresses an allocation of `stream`'s context with room for `len` elements of
    ///   `T`, suitably aligned, holding valid `T` values;
    /// - the memory is neither freed nor resized, and nothing else writes it while a kernel
    ///   launched through these views can be reading or writing it, unless that work is
    ///   ordered on `stream` (or by the caller's own events).
    pub unsafe fn new(stream: &Arc<CudaStream>, ptr: u64, len: usize) -> Result<Self> {
        if len.checked_mul(std::mem::size_of::<T>()).is_none() {
            return Err(Error::Alloc {
                elements: len,
                element_bytes: std::mem::size_of::<T>(),
            });
        }
        // SAFETY: the caller's contract is cudarc's; the slice is never dropped (so never
        // freed) but leaked in `Drop`.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(Self {
            slice: ManuallyDrop::new(slice),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// The elements, borrowed (for `TensorView::from_slice`).
    pub fn view(&self) -> CudaView<'_, T> {
        self.slice.as_view()
    }

    /// The elements, borrowed mutably (for `TensorViewMut::from_slice_mut`).
    pub fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }
}

impl<T> Drop for ForeignDeviceBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; `leak` waits for the recorded uses and frees nothing.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        let _ = slice.leak();
    }
}
