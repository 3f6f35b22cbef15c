//! The paged bf16 KV cache of one layer.

use crate::backend::Backend;
use crate::dim::{Dim, PagedSlots};
use crate::dtype::bf16;
use crate::error::Result;
use crate::rules::PageSize;
use crate::tensor::{Cols, Tensor};

/// K and V rows of `WIDTH = HKV × head_dim` bf16 channels, `pages × PAGE` slots each.
pub struct PagedBf16Kv<B: Backend, const PAGE: usize, const WIDTH: usize> {
    /// K rows, `[pages × PAGE, WIDTH]`.
    pub k: Tensor<B, bf16, Cols<WIDTH>>,
    /// V rows, `[pages × PAGE, WIDTH]`.
    pub v: Tensor<B, bf16, Cols<WIDTH>>,
    slots: PagedSlots<PAGE>,
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize> PagedBf16Kv<B, PAGE, WIDTH> {
    /// A zeroed cache of `pages` pages.
    pub fn zeros(backend: &B, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: PageSize,
    {
        let slots = PagedSlots::new(pages);
        Ok(Self {
            k: Tensor::zeros(backend, slots.slots())?,
            v: Tensor::zeros(backend, slots.slots())?,
            slots,
        })
    }

    /// The cache over the caller's K and V buffers, each `[pages × PAGE, WIDTH]`.
    pub fn from_buffers(k: B::Buffer<bf16>, v: B::Buffer<bf16>, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: PageSize,
    {
        let slots = PagedSlots::new(pages);
        Ok(Self {
            k: Tensor::from_buffer("k_buf", k, slots.slots())?,
            v: Tensor::from_buffer("v_buf", v, slots.slots())?,
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
}
