//! The CPU reference backend: buffers are `Vec`s, ops run the exact semantics of docs/kernels/.
//!
//! It runs anywhere, serves as the oracle of the GPU tests, and is a usable (slow) default.

use super::{Backend, Buffer, Element};
use crate::error::{Error, Result};

/// The CPU reference backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl<T> Buffer<T> for Vec<T> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
}
impl<T> Buffer<T> for &[T] {
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
}
impl<T> Buffer<T> for &mut [T] {
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
}

/// An empty `Vec` with room for `len` elements, or [`Error::Alloc`] (never a capacity-overflow
/// panic) when no allocation can hold them.
fn reserve<T>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::Alloc {
        elements: len,
        element_bytes: std::mem::size_of::<T>(),
    })?;
    Ok(v)
}

/// `len` copies of `value`, or [`Error::Alloc`].
pub(crate) fn try_filled<T: Clone>(len: usize, value: T) -> Result<Vec<T>> {
    let mut v = reserve::<T>(len)?;
    v.resize(len, value);
    Ok(v)
}

impl Backend for Cpu {
    type Buffer<T: Element> = Vec<T>;
    type Slice<'a, T: Element> = &'a [T];
    type SliceMut<'a, T: Element> = &'a mut [T];

    fn zeros<T: Element>(&self, len: usize) -> Result<Vec<T>> {
        let mut v = reserve::<T>(len)?;
        v.resize(len, T::default());
        Ok(v)
    }

    fn upload<T: Element>(&self, host: &[T]) -> Result<Vec<T>> {
        let mut v = reserve::<T>(host.len())?;
        v.extend_from_slice(host);
        Ok(v)
    }

    fn download_slice<T: Element>(&self, slice: &&[T]) -> Result<Vec<T>> {
        let mut v = reserve::<T>(slice.len())?;
        v.extend_from_slice(slice);
        Ok(v)
    }

    fn write_slice<T: Element>(&self, slice: &mut &mut [T], host: &[T]) -> Result<()> {
        Error::check_extent("host data", "elements", slice.len(), host.len())?;
        slice.copy_from_slice(host);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        "cpu (reference)".to_string()
    }

    fn slice<T: Element>(buf: &Vec<T>) -> &[T] {
        buf
    }
    fn slice_mut<T: Element>(buf: &mut Vec<T>) -> &mut [T] {
        buf
    }
    fn slice_range<T: Element>(buf: &Vec<T>, range: std::ops::Range<usize>) -> Option<&[T]> {
        buf.get(range)
    }
    fn slice_range_mut<T: Element>(
        buf: &mut Vec<T>,
        range: std::ops::Range<usize>,
    ) -> Option<&mut [T]> {
        buf.get_mut(range)
    }
    fn chunks_exact_mut<T: Element>(buf: &mut Vec<T>, chunk: usize) -> Option<Vec<&mut [T]>> {
        (chunk > 0 && buf.len().is_multiple_of(chunk))
            .then(|| buf.chunks_exact_mut(chunk).collect())
    }
    fn reborrow<'b, T: Element>(slice: &'b &[T]) -> &'b [T] {
        slice
    }
    fn reborrow_mut<'b, T: Element>(slice: &'b mut &mut [T]) -> &'b mut [T] {
        slice
    }
    fn downgrade<'b, T: Element>(slice: &'b &mut [T]) -> &'b [T] {
        slice
    }
}
