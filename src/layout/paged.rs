//! The paged bf16 KV cache of one layer.

use crate::backend::Backend;
use crate::dim::{Dim, PagedSlots};
use crate::dtype::bf16;
use crate::error::{Error, Result};
use crate::rules::PageSize;
use crate::tensor::{Cols, FixedExtent, Tensor};

/// K and V rows of `WIDTH = HKV × head_dim` bf16 channels, `pages × PAGE` slots each.
///
/// Both hold exactly `pages × PAGE` rows (checked when made); the fields are private so that
/// stays true.
pub struct PagedBf16Kv<B: Backend, const PAGE: usize, const WIDTH: usize> {
    k: Tensor<B, bf16, Cols<WIDTH>>, // [pages × PAGE, WIDTH]
    v: Tensor<B, bf16, Cols<WIDTH>>, // [pages × PAGE, WIDTH]
    slots: PagedSlots<PAGE>,
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize> PagedBf16Kv<B, PAGE, WIDTH> {
    /// A zeroed cache of `pages` pages.
    pub fn zeros(backend: &B, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: PageSize,
    {
        let slots = PagedSlots::new(pages);
        let rows = Error::elements("pages", pages, PAGE)?;
        Ok(Self {
            k: Tensor::zeros(backend, rows)?,
            v: Tensor::zeros(backend, rows)?,
            slots,
        })
    }

    /// The cache over the caller's K and V buffers, each `[pages × PAGE, WIDTH]`.
    pub fn from_buffers(k: B::Buffer<bf16>, v: B::Buffer<bf16>, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: PageSize,
    {
        let slots = PagedSlots::new(pages);
        let rows = Error::elements("pages", pages, PAGE)?;
        Ok(Self {
            k: Tensor::from_buffer("k_buf", k, rows)?,
            v: Tensor::from_buffer("v_buf", v, rows)?,
            slots,
        })
    }

    /// Number of KV slots, `pages × PAGE`.
    pub fn slots(&self) -> usize {
        self.slots.slots()
    }

    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.slots.pages()
    }

    /// K rows, `[pages × PAGE, WIDTH]`.
    pub fn k(&self) -> &Tensor<B, bf16, Cols<WIDTH>> {
        &self.k
    }
    /// V rows, `[pages × PAGE, WIDTH]`.
    pub fn v(&self) -> &Tensor<B, bf16, Cols<WIDTH>> {
        &self.v
    }
    /// K rows, writable in place.
    pub fn k_mut(&mut self) -> FixedExtent<'_, B, bf16, Cols<WIDTH>> {
        FixedExtent::new(&mut self.k)
    }
    /// V rows, writable in place.
    pub fn v_mut(&mut self) -> FixedExtent<'_, B, bf16, Cols<WIDTH>> {
        FixedExtent::new(&mut self.v)
    }
    pub(crate) fn slices_mut(&mut self) -> (B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>) {
        (self.k.as_slice_mut(), self.v.as_slice_mut())
    }

    /// The K and V tensors back.
    pub fn into_parts(self) -> (Tensor<B, bf16, Cols<WIDTH>>, Tensor<B, bf16, Cols<WIDTH>>) {
        (self.k, self.v)
    }
}
