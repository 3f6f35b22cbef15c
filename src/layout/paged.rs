//! The paged bf16 KV cache of one layer.

use crate::backend::Backend;
use crate::dim::{Dim, PagedSlots};
use crate::dtype::bf16;
use crate::error::{Error, Result};
use crate::rules::PageSize;
use crate::tensor::{Cols, FixedExtent, Owned, Storage, StorageMut, Tensor};

/// K and V rows of `WIDTH = HKV × head_dim` bf16 channels, `pages × PAGE` slots each, owned
/// (`S = Owned`) or a view of part of an engine's pool (`S = ViewMut<'a>`).
///
/// Both hold exactly `pages × PAGE` rows (checked when made); the fields are private so that
/// stays true.
pub struct PagedBf16Kv<B: Backend, const PAGE: usize, const WIDTH: usize, S: Storage<B> = Owned> {
    k: Tensor<B, bf16, Cols<WIDTH>, S>, // [pages × PAGE, WIDTH]
    v: Tensor<B, bf16, Cols<WIDTH>, S>, // [pages × PAGE, WIDTH]
    slots: PagedSlots<PAGE>,
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize> PagedBf16Kv<B, PAGE, WIDTH> {
    /// A zeroed cache of `pages` pages.
    pub fn zeros(backend: &B, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: PageSize,
    {
        let rows = Error::elements("pages", pages, PAGE)?;
        Self::from_tensors(
            Tensor::zeros(backend, rows)?,
            Tensor::zeros(backend, rows)?,
            pages,
        )
    }

    /// The cache over the caller's K and V buffers, each `[pages × PAGE, WIDTH]`.
    pub fn from_buffers(k: B::Buffer<bf16>, v: B::Buffer<bf16>, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: PageSize,
    {
        let rows = Error::elements("pages", pages, PAGE)?;
        Self::from_tensors(
            Tensor::from_buffer("k_buf", k, rows)?,
            Tensor::from_buffer("v_buf", v, rows)?,
            pages,
        )
    }
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize, S: Storage<B>>
    PagedBf16Kv<B, PAGE, WIDTH, S>
{
    /// The cache over K and V tensors (owned, or views of an engine's pool), each of
    /// `pages × PAGE` rows.
    pub fn from_tensors(
        k: Tensor<B, bf16, Cols<WIDTH>, S>,
        v: Tensor<B, bf16, Cols<WIDTH>, S>,
        pages: usize,
    ) -> Result<Self>
    where
        Dim<PAGE>: PageSize,
    {
        let rows = Error::elements("pages", pages, PAGE)?;
        k.expect_rows("k_buf", "slots (pages × PAGE)", rows)?;
        v.expect_rows("v_buf", "slots (pages × PAGE)", rows)?;
        Ok(Self {
            k,
            v,
            slots: PagedSlots::new(pages),
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
    pub fn k(&self) -> &Tensor<B, bf16, Cols<WIDTH>, S> {
        &self.k
    }
    /// V rows, `[pages × PAGE, WIDTH]`.
    pub fn v(&self) -> &Tensor<B, bf16, Cols<WIDTH>, S> {
        &self.v
    }
    /// K rows, writable in place.
    pub fn k_mut(&mut self) -> FixedExtent<'_, B, bf16, Cols<WIDTH>, S> {
        FixedExtent::new(&mut self.k)
    }
    /// V rows, writable in place.
    pub fn v_mut(&mut self) -> FixedExtent<'_, B, bf16, Cols<WIDTH>, S> {
        FixedExtent::new(&mut self.v)
    }
    /// The K and V tensors back.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(
        self,
    ) -> (
        Tensor<B, bf16, Cols<WIDTH>, S>,
        Tensor<B, bf16, Cols<WIDTH>, S>,
    ) {
        (self.k, self.v)
    }
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize, S: StorageMut<B>>
    PagedBf16Kv<B, PAGE, WIDTH, S>
{
    pub(crate) fn slices_mut(&mut self) -> (B::SliceMut<'_, bf16>, B::SliceMut<'_, bf16>) {
        (self.k.as_slice_mut(), self.v.as_slice_mut())
    }
}
