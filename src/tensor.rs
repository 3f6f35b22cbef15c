//! Typed tensors: a backend buffer, a dynamic row count, and a static row shape.
//!
//! The kernels' tensors are all "rows of a static shape" (`[T, DQ]`, `[T, HQ, 4]`,
//! `[slots, W-1, DKV]`): the row shape is a type ([`RowShape`]) whose `COLS` is derived from
//! the kernel's const generics, the row count is the one dynamic extent. A tensor is built from
//! the caller's buffer once, checking that the buffer holds exactly `rows × COLS` elements;
//! the batch constructors then tie the row counts of the tensors that must agree.

use std::marker::PhantomData;

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

/// The E8M0 scales of an MXFP8 row of `WIDTH` elements: one per 32-element block.
#[derive(Clone, Copy, Debug)]
pub struct BlockScales<const WIDTH: usize>;
impl<const WIDTH: usize> RowShape for BlockScales<WIDTH> {
    const COLS: usize = WIDTH / crate::dtype::MXFP8_BLOCK;
}

/// Rows of `R::COLS` elements of `T` in a buffer of backend `B`, row-major and contiguous.
///
/// The buffer holds exactly `rows × R::COLS` elements, checked when the tensor is made, and it
/// cannot be replaced afterwards: the tensor lends its elements ([`as_slice`](Self::as_slice),
/// [`as_slice_mut`](Self::as_slice_mut), [`write`](Self::write)) but never its allocation, so
/// a kernel that trusts the row count can trust the buffer.
pub struct Tensor<B: Backend, T: Element, R = Scalar> {
    buf: B::Buffer<T>,
    rows: usize,
    _row: PhantomData<R>,
}

impl<B: Backend, T: Element, R: RowShape> Tensor<B, T, R> {
    /// Wraps the caller's buffer as `rows` rows; `param` names it in the error when the buffer
    /// does not hold exactly `rows × R::COLS` elements.
    pub fn from_buffer(param: &'static str, buf: B::Buffer<T>, rows: usize) -> Result<Self> {
        Error::check_extent(
            param,
            "elements",
            Error::elements(param, rows, R::COLS)?,
            buf.len(),
        )?;
        Ok(Self {
            buf,
            rows,
            _row: PhantomData,
        })
    }

    /// Uploads `host` as `rows` rows.
    pub fn from_host(backend: &B, param: &'static str, host: &[T], rows: usize) -> Result<Self> {
        Error::check_extent(
            param,
            "elements",
            Error::elements(param, rows, R::COLS)?,
            host.len(),
        )?;
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
        Ok(Self {
            buf: backend.upload(&vec![value; Error::elements("rows", rows, R::COLS)?])?,
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

    /// The backend buffer, read-only (e.g. to pass it to a kernel of the caller's own).
    pub fn buffer(&self) -> &B::Buffer<T> {
        &self.buf
    }

    /// The elements, borrowed (`&[T]` on the CPU, a `CudaView` on a GPU).
    pub fn as_slice(&self) -> B::Slice<'_, T> {
        B::slice(&self.buf)
    }

    /// The elements, borrowed mutably (`&mut [T]`, a `CudaViewMut`): the contents can change,
    /// the allocation and its length cannot.
    pub fn as_slice_mut(&mut self) -> B::SliceMut<'_, T> {
        B::slice_mut(&mut self.buf)
    }

    /// Gives the buffer back.
    pub fn into_buffer(self) -> B::Buffer<T> {
        self.buf
    }

    /// A host copy of the elements, row-major.
    pub fn to_host(&self, backend: &B) -> Result<Vec<T>> {
        backend.download(&self.buf)
    }

    /// Overwrites the elements from `host` (same length).
    pub fn write(&mut self, backend: &B, host: &[T]) -> Result<()> {
        backend.write(&mut self.buf, host)
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

/// A mutable borrow of a tensor held by a checked struct (a cache, an output set, a batch):
/// its contents can be written, its allocation and row count cannot be swapped, so the struct's
/// invariant survives the borrow.
pub struct FixedExtent<'a, B: Backend, T: Element, R>(&'a mut Tensor<B, T, R>);

impl<'a, B: Backend, T: Element, R: RowShape> FixedExtent<'a, B, T, R> {
    pub(crate) fn new(tensor: &'a mut Tensor<B, T, R>) -> Self {
        Self(tensor)
    }

    /// Overwrites the elements from `host` (same length).
    pub fn write(&mut self, backend: &B, host: &[T]) -> Result<()> {
        self.0.write(backend, host)
    }

    /// The elements, borrowed mutably.
    pub fn as_slice_mut(&mut self) -> B::SliceMut<'_, T> {
        self.0.as_slice_mut()
    }
}

impl<B: Backend, T: Element, R> std::ops::Deref for FixedExtent<'_, B, T, R> {
    type Target = Tensor<B, T, R>;
    fn deref(&self) -> &Tensor<B, T, R> {
        self.0
    }
}

impl<B: Backend, T: Element, R: RowShape> std::fmt::Debug for Tensor<B, T, R> {
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
        assert_eq!(err.to_string(), "`k_out`: expected 12 elements, got 10");
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
