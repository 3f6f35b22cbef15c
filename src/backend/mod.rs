//! Where kernels run: the CPU reference backend and the CUDA backend.
//!
//! Both expose the same buffers-and-transfers surface ([`Backend`]); every op is implemented for
//! both, so tests run the same typed call on each and compare.
//!
//! A kernel never sees an owned buffer: the typed boundary hands it borrowed slices
//! ([`Backend::Slice`], [`Backend::SliceMut`]) whose extents it has checked. On the CPU these
//! are `&[T]` and `&mut [T]`; on a GPU, cudarc's `CudaView` and `CudaViewMut`. A borrowed slice
//! cannot be resized or swapped for another allocation, so what the boundary checked stays true
//! until the launch.

pub mod cpu;
pub mod cuda;

pub use cpu::Cpu;
pub use cuda::Cuda;

use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::Result;

/// A type a kernel buffer can hold: plain old data that is valid as zero bytes.
pub trait Element:
    Copy
    + Default
    + Send
    + Sync
    + Unpin
    + std::fmt::Debug
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + 'static
{
}
impl Element for bf16 {}
impl Element for F8E4M3 {}
impl Element for E8M0 {}
impl Element for u8 {}
impl Element for u32 {}
impl Element for i32 {}
impl Element for i64 {}
impl Element for f32 {}

/// Something with a length in elements: a backend's buffer or a borrowed slice of one.
pub trait Buffer<T> {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether the buffer holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A place where buffers live and kernels run.
pub trait Backend {
    /// The backend's buffer of `T` (a `Vec<T>` on the CPU, a `CudaSlice<T>` on a GPU).
    type Buffer<T: Element>: Buffer<T>;
    /// A shared borrow of consecutive elements (`&[T]`, `CudaView<T>`).
    type Slice<'a, T: Element>: Buffer<T>;
    /// A mutable borrow of consecutive elements (`&mut [T]`, `CudaViewMut<T>`).
    type SliceMut<'a, T: Element>: Buffer<T>;
    /// A zero-filled buffer of `len` elements.
    fn zeros<T: Element>(&self, len: usize) -> Result<Self::Buffer<T>>;
    /// A buffer holding a copy of `host`.
    fn upload<T: Element>(&self, host: &[T]) -> Result<Self::Buffer<T>>;
    /// Overwrites `buf` with `host` (same length).
    fn write<T: Element>(&self, buf: &mut Self::Buffer<T>, host: &[T]) -> Result<()> {
        self.write_slice(&mut Self::slice_mut(buf), host)
    }
    /// A host copy of `buf` (waits for the work queued before it).
    fn download<T: Element>(&self, buf: &Self::Buffer<T>) -> Result<Vec<T>> {
        self.download_slice(&Self::slice(buf))
    }
    /// A host copy of a borrowed slice (waits for the work queued before it).
    fn download_slice<T: Element>(&self, slice: &Self::Slice<'_, T>) -> Result<Vec<T>>;
    /// Overwrites a mutably borrowed slice with `host` (same length).
    fn write_slice<T: Element>(&self, slice: &mut Self::SliceMut<'_, T>, host: &[T]) -> Result<()>;
    /// Waits until all queued work is done.
    fn synchronize(&self) -> Result<()>;
    /// A short description for logs (`"cpu"`, `"NVIDIA H200 (sm_90a)"`).
    fn describe(&self) -> String;
    /// The whole of `buf`, borrowed.
    fn slice<T: Element>(buf: &Self::Buffer<T>) -> Self::Slice<'_, T>;
    /// The whole of `buf`, borrowed mutably.
    fn slice_mut<T: Element>(buf: &mut Self::Buffer<T>) -> Self::SliceMut<'_, T>;
    /// Elements `range` of `buf`, borrowed (e.g. the rows of a GEMM output that a kernel reads);
    /// `None` when the range is not inside the buffer.
    fn slice_range<T: Element>(
        buf: &Self::Buffer<T>,
        range: std::ops::Range<usize>,
    ) -> Option<Self::Slice<'_, T>>;
    /// Elements `range` of `buf`, borrowed mutably (e.g. the first `T` rows of an output buffer
    /// sized for the largest batch); `None` when the range is not inside the buffer.
    fn slice_range_mut<T: Element>(
        buf: &mut Self::Buffer<T>,
        range: std::ops::Range<usize>,
    ) -> Option<Self::SliceMut<'_, T>>;
    /// `buf` split into consecutive disjoint mutable chunks of `chunk` elements, each borrowed
    /// for as long as `buf` (e.g. one KV pool carved into per-layer views); `None` when `chunk`
    /// is zero or does not divide the length.
    fn chunks_exact_mut<T: Element>(
        buf: &mut Self::Buffer<T>,
        chunk: usize,
    ) -> Option<Vec<Self::SliceMut<'_, T>>>;
    /// A shorter-lived shared borrow of a slice.
    fn reborrow<'b, T: Element>(slice: &'b Self::Slice<'_, T>) -> Self::Slice<'b, T>;
    /// A shorter-lived mutable borrow of a mutable slice.
    fn reborrow_mut<'b, T: Element>(slice: &'b mut Self::SliceMut<'_, T>) -> Self::SliceMut<'b, T>;
    /// A shared borrow of a mutable slice.
    fn downgrade<'b, T: Element>(slice: &'b Self::SliceMut<'_, T>) -> Self::Slice<'b, T>;
}

/// Seals traits whose implementations the kernels trust: outside the crate they can be named
/// and used as bounds, but not implemented (the trait is public, the module is not).
pub(crate) mod sealed {
    /// The seal.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot implement this trait of shapeproof: it is sealed",
        label = "only the library's own types implement it",
        note = "the kernels trust what its implementations report (offsets, widths, row counts), so only the types the library checks implement it"
    )]
    pub trait Sealed {}
}
