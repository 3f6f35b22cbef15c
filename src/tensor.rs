//! Typed tensors: a backend buffer, a dynamic row count, and a static row shape.
//!
//! The kernels' tensors are all "rows of a static shape" (`[T, DQ]`, `[T, HQ, 4]`,
//! `[slots, W-1, DKV]`): the row shape is a type ([`RowShape`]) whose `COLS` is derived from
//! the kernel's const generics, the row count is the one dynamic extent. A tensor is built from
//! the caller's buffer once, checking that the buffer holds exactly `rows × COLS` elements;
//! the batch constructors then tie the row counts of the tensors that must agree.

use std::marker::PhantomData;

use crate::backend::sealed::Sealed;
use crate::backend::{Backend, Buffer, Element};
use crate::error::{Error, Result};

/// The static shape of one row of a tensor, flattened to `COLS` elements.
pub trait RowShape: 'static {
    /// Elements per row.
    const COLS: usize;
}

/// A row of `N` elements.
#[derive(Clone, Copy, Debug)]
pub struct Cols<const N: usize>;
impl<const N: usize> RowShape for Cols<N> {
    const COLS: usize = N;
}

/// One element per row: a vector.
pub type Scalar = Cols<1>;

/// A row of `H` heads of `HD` channels each, `[H, HD]` (a token's q, or any per-head rows).
#[derive(Clone, Copy, Debug)]
pub struct Heads<const H: usize, const HD: usize>;
impl<const H: usize, const HD: usize> RowShape for Heads<H, HD> {
    const COLS: usize = H * HD;
}

/// The E8M0 scales of an MXFP8 row of `WIDTH` elements: one per 32-element block.
#[derive(Clone, Copy, Debug)]
pub struct BlockScales<const WIDTH: usize>;
impl<const WIDTH: usize> RowShape for BlockScales<WIDTH> {
    const COLS: usize = WIDTH / crate::dtype::MXFP8_BLOCK;
}

/// Where a tensor's elements live: in an allocation it owns ([`Owned`]), or in part of someone
/// else's, borrowed for `'a` ([`View`] to read, [`ViewMut`] to write). Sealed: the kernels trust
/// the lengths these report.
pub trait Storage<B: Backend>: Sealed {
    /// The storage of elements of `T`.
    type Of<T: Element>: Buffer<T>;
    /// The elements, borrowed.
    fn slice<T: Element>(s: &Self::Of<T>) -> B::Slice<'_, T>;
}

/// A storage whose elements can be written.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is a read-only view, but this argument is written",
    label = "outputs, caches and conv state need owned tensors or `ViewMut` views",
    note = "make the view with `Tensor::from_slice_mut` / `view_mut()` (a mutable borrow of the allocation) instead of `from_slice` / `view()`"
)]
pub trait StorageMut<B: Backend>: Storage<B> {
    /// The elements, borrowed mutably.
    fn slice_mut<T: Element>(s: &mut Self::Of<T>) -> B::SliceMut<'_, T>;
}

/// The tensor owns its allocation (a `Vec`, a `CudaSlice`).
#[derive(Debug)]
pub struct Owned;
/// The tensor reads part of an allocation it borrows for `'a` (`&[T]`, a `CudaView`).
#[derive(Debug)]
pub struct View<'a>(PhantomData<&'a ()>);
/// The tensor reads and writes part of an allocation it borrows mutably for `'a` (`&mut [T]`,
/// a `CudaViewMut`): e.g. one layer's K/V rows inside an engine's pool.
#[derive(Debug)]
pub struct ViewMut<'a>(PhantomData<&'a mut ()>);
impl Sealed for Owned {}
impl Sealed for View<'_> {}
impl Sealed for ViewMut<'_> {}

impl<B: Backend> Storage<B> for Owned {
    type Of<T: Element> = B::Buffer<T>;
    fn slice<T: Element>(s: &B::Buffer<T>) -> B::Slice<'_, T> {
        B::slice(s)
    }
}
impl<B: Backend> StorageMut<B> for Owned {
    fn slice_mut<T: Element>(s: &mut B::Buffer<T>) -> B::SliceMut<'_, T> {
        B::slice_mut(s)
    }
}
impl<'a, B: Backend> Storage<B> for View<'a> {
    type Of<T: Element> = B::Slice<'a, T>;
    fn slice<'s, T: Element>(s: &'s B::Slice<'a, T>) -> B::Slice<'s, T> {
        B::reborrow(s)
    }
}
impl<'a, B: Backend> Storage<B> for ViewMut<'a> {
    type Of<T: Element> = B::SliceMut<'a, T>;
    fn slice<'s, T: Element>(s: &'s B::SliceMut<'a, T>) -> B::Slice<'s, T> {
        B::downgrade(s)
    }
}
impl<'a, B: Backend> StorageMut<B> for ViewMut<'a> {
    fn slice_mut<'s, T: Element>(s: &'s mut B::SliceMut<'a, T>) -> B::SliceMut<'s, T> {
        B::reborrow_mut(s)
    }
}

/// Rows of `R::COLS` elements of `T` on backend `B`, row-major and contiguous, in storage `S`
/// (owned by default, or a borrowed view of part of an existing allocation).
///
/// The storage holds exactly `rows × R::COLS` elements, checked when the tensor is made, and it
/// cannot be replaced afterwards: the tensor lends its elements ([`as_slice`](Self::as_slice),
/// [`as_slice_mut`](Self::as_slice_mut), [`write`](Self::write)) but never its storage, so a
/// kernel that trusts the row count can trust the buffer. A view's lifetime ties it to the
/// allocation it borrows.
pub struct Tensor<B: Backend, T: Element, R = Scalar, S: Storage<B> = Owned> {
    buf: S::Of<T>,
    rows: usize,
    _row: PhantomData<(R, S)>,
}

/// A tensor viewing part of an allocation it borrows for `'a`.
pub type TensorView<'a, B, T, R = Scalar> = Tensor<B, T, R, View<'a>>;
/// A tensor writing part of an allocation it borrows mutably for `'a`.
pub type TensorViewMut<'a, B, T, R = Scalar> = Tensor<B, T, R, ViewMut<'a>>;

impl<B: Backend, T: Element, R: RowShape, S: Storage<B>> Tensor<B, T, R, S> {
    fn checked(param: &'static str, buf: S::Of<T>, rows: usize) -> Result<Self> {
        Error::check_rows(param, rows, R::COLS, buf.len())?;
        Ok(Self {
            buf,
            rows,
            _row: PhantomData,
        })
    }

    /// Number of rows (the dynamic extent).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    pub const fn cols(&self) -> usize {
        R::COLS
    }

    /// The elements, borrowed (`&[T]` on the CPU, a `CudaView` on a GPU).
    pub fn as_slice(&self) -> B::Slice<'_, T> {
        S::slice(&self.buf)
    }

    /// A read-only view of the whole tensor, for the structs that take views.
    pub fn view(&self) -> TensorView<'_, B, T, R> {
        Tensor {
            buf: self.as_slice(),
            rows: self.rows,
            _row: PhantomData,
        }
    }

    /// A host copy of the elements, row-major.
    pub fn to_host(&self, backend: &B) -> Result<Vec<T>> {
        backend.download_slice(&self.as_slice())
    }

    /// Checks that this tensor has `expected` rows; `param` names it in the error.
    pub fn expect_rows(
        &self,
        param: &'static str,
        what: &'static str,
        expected: usize,
    ) -> Result<()> {
        Error::check_extent(param, what, expected, self.rows)
    }

    /// Checks that this tensor has at least `min` rows.
    pub fn expect_at_least(
        &self,
        param: &'static str,
        what: &'static str,
        min: usize,
    ) -> Result<()> {
        if self.rows >= min {
            Ok(())
        } else {
            Err(Error::Extent {
                param,
                what,
                expected: min,
                actual: self.rows,
            })
        }
    }
}

impl<B: Backend, T: Element, R: RowShape, S: StorageMut<B>> Tensor<B, T, R, S> {
    /// The elements, borrowed mutably (`&mut [T]`, a `CudaViewMut`): the contents can change,
    /// the storage and its length cannot.
    pub fn as_slice_mut(&mut self) -> B::SliceMut<'_, T> {
        S::slice_mut(&mut self.buf)
    }

    /// A writable view of the whole tensor, for the structs that take views.
    pub fn view_mut(&mut self) -> TensorViewMut<'_, B, T, R> {
        Tensor {
            rows: self.rows,
            buf: S::slice_mut(&mut self.buf),
            _row: PhantomData,
        }
    }

    /// Overwrites the elements from `host` (same length).
    pub fn write(&mut self, backend: &B, host: &[T]) -> Result<()> {
        backend.write_slice(&mut self.as_slice_mut(), host)
    }
}

impl<B: Backend, T: Element, R: RowShape> Tensor<B, T, R, Owned> {
    /// Wraps the caller's buffer as `rows` rows; `param` names it in the error when the buffer
    /// does not hold exactly `rows × R::COLS` elements.
    pub fn from_buffer(param: &'static str, buf: B::Buffer<T>, rows: usize) -> Result<Self> {
        Self::checked(param, buf, rows)
    }

    /// Uploads `host` as `rows` rows.
    pub fn from_host(backend: &B, param: &'static str, host: &[T], rows: usize) -> Result<Self> {
        Error::check_rows(param, rows, R::COLS, host.len())?;
        Self::from_buffer(param, backend.upload(host)?, rows)
    }

    /// `rows` zero rows.
    pub fn zeros(backend: &B, rows: usize) -> Result<Self> {
        Ok(Self {
            buf: backend.zeros(Error::elements("rows", rows, R::COLS)?)?,
            rows,
            _row: PhantomData,
        })
    }

    /// `rows` rows all set to `value` (for poisoning outputs in tests, or sentinel fills).
    pub fn filled(backend: &B, rows: usize, value: T) -> Result<Self> {
        let len = Error::elements("rows", rows, R::COLS)?;
        let host = crate::backend::cpu::try_filled(len, value)?;
        Ok(Self {
            buf: backend.upload(&host)?,
            rows,
            _row: PhantomData,
        })
    }

    /// The backend buffer, read-only (e.g. to pass it to a kernel of the caller's own).
    pub fn buffer(&self) -> &B::Buffer<T> {
        &self.buf
    }

    /// Gives the buffer back.
    pub fn into_buffer(self) -> B::Buffer<T> {
        self.buf
    }
}

impl<'a, B: Backend, T: Element, R: RowShape> Tensor<B, T, R, View<'a>> {
    /// `rows` rows read from part of an existing allocation (`&data[..]` on the CPU,
    /// `slice.slice(a..b)` of a `CudaSlice` on a GPU); `param` names it in the error when the
    /// slice does not hold exactly `rows × R::COLS` elements.
    pub fn from_slice(param: &'static str, slice: B::Slice<'a, T>, rows: usize) -> Result<Self> {
        Self::checked(param, slice, rows)
    }
}

impl<'a, B: Backend, T: Element, R: RowShape> Tensor<B, T, R, ViewMut<'a>> {
    /// `rows` rows read and written in part of an existing allocation (`&mut data[..]`,
    /// `slice.slice_mut(a..b)`); checked like [`Tensor::from_buffer`].
    pub fn from_slice_mut(
        param: &'static str,
        slice: B::SliceMut<'a, T>,
        rows: usize,
    ) -> Result<Self> {
        Self::checked(param, slice, rows)
    }
}

/// A mutable borrow of a tensor held by a checked struct (a cache, an output set, a batch):
/// its contents can be written, its storage and row count cannot be swapped, so the struct's
/// invariant survives the borrow.
pub struct FixedExtent<'a, B: Backend, T: Element, R, S: Storage<B> = Owned>(
    &'a mut Tensor<B, T, R, S>,
);

impl<'a, B: Backend, T: Element, R: RowShape, S: Storage<B>> FixedExtent<'a, B, T, R, S> {
    pub(crate) fn new(tensor: &'a mut Tensor<B, T, R, S>) -> Self {
        Self(tensor)
    }
}

impl<B: Backend, T: Element, R: RowShape, S: StorageMut<B>> FixedExtent<'_, B, T, R, S> {
    /// Overwrites the elements from `host` (same length).
    pub fn write(&mut self, backend: &B, host: &[T]) -> Result<()> {
        self.0.write(backend, host)
    }

    /// The elements, borrowed mutably.
    pub fn as_slice_mut(&mut self) -> B::SliceMut<'_, T> {
        self.0.as_slice_mut()
    }
}

impl<B: Backend, T: Element, R, S: Storage<B>> std::ops::Deref for FixedExtent<'_, B, T, R, S> {
    type Target = Tensor<B, T, R, S>;
    fn deref(&self) -> &Tensor<B, T, R, S> {
        self.0
    }
}

impl<B: Backend, T: Element, R: RowShape, S: Storage<B>> std::fmt::Debug for Tensor<B, T, R, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor<{}>[{} × {}]",
            std::any::type_name::<T>(),
            self.rows,
            R::COLS
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;

    #[test]
    fn wrong_length_names_the_parameter_and_both_extents() {
        let err = Tensor::<Cpu, f32, Cols<4>>::from_buffer("k_out", vec![0.0; 10], 3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`k_out`: expected 3 rows of 4 = 12 elements, got 10"
        );
    }

    #[test]
    fn a_row_count_whose_element_count_overflows_is_an_error_not_a_wrap() {
        // rows × 4 wraps to 0 in release builds: without the check an empty buffer would pass
        // as 2^62 rows.
        let rows = 1usize << (usize::BITS - 2);
        let err = Tensor::<Cpu, f32, Cols<4>>::from_buffer("kv", vec![], rows).unwrap_err();
        assert!(err.to_string().starts_with("`kv`: "), "{err}");
        assert!(Tensor::<Cpu, f32, Cols<4>>::zeros(&Cpu, rows).is_err());
        assert!(Tensor::<Cpu, f32, Cols<4>>::filled(&Cpu, rows, 0.0).is_err());
    }
}
