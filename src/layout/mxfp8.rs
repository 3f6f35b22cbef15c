//! The MXFP8 KV cache of one layer: e4m3 K/V data and both interleaved E8M0 scale planes.

use crate::backend::Backend;
use crate::dim::{Dim, PagedSlots};
use crate::dtype::{E8M0, F8E4M3};
use crate::error::Result;
use crate::rules::{Mxfp8PageSize, Mxfp8Width};
use crate::tensor::{Cols, RowShape, Tensor};

/// One page of an interleaved scale plane, `[HKV, 32, PAGE/32, 4]` with `HKV = WIDTH / 128`.
pub struct ScalePlanePage<const PAGE: usize, const WIDTH: usize>;
impl<const PAGE: usize, const WIDTH: usize> RowShape for ScalePlanePage<PAGE, WIDTH> {
    const COLS: usize = (WIDTH / 128) * 32 * (PAGE / 32) * 4;
}

/// K and V of `WIDTH = HKV × 128` channels as MXFP8: e4m3 data `[pages × PAGE, WIDTH]` and the
/// scale planes `[pages, HKV, 32, PAGE/32, 4]` (spec §1.8), all four made together, so that a
/// cache without planes, or with planes of another page size or head count, cannot exist.
pub struct Mxfp8KvCache<B: Backend, const PAGE: usize, const WIDTH: usize> {
    /// K data, `[pages × PAGE, WIDTH]` e4m3.
    pub k: Tensor<B, F8E4M3, Cols<WIDTH>>,
    /// V data, `[pages × PAGE, WIDTH]` e4m3.
    pub v: Tensor<B, F8E4M3, Cols<WIDTH>>,
    /// K scales, `[pages, HKV, 32, PAGE/32, 4]`.
    pub k_scales: Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>>,
    /// V scales, `[pages, HKV, 32, PAGE/32, 4]`.
    pub v_scales: Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>>,
    slots: PagedSlots<PAGE>,
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize> Mxfp8KvCache<B, PAGE, WIDTH> {
    /// A cache of `pages` pages: data zeroed, scale bytes zero (2^-127, never NaN).
    pub fn zeros(backend: &B, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: Mxfp8PageSize,
        Dim<WIDTH>: Mxfp8Width,
    {
        let slots = PagedSlots::new(pages);
        Ok(Self {
            k: Tensor::zeros(backend, slots.slots())?,
            v: Tensor::zeros(backend, slots.slots())?,
            k_scales: Tensor::zeros(backend, pages)?,
            v_scales: Tensor::zeros(backend, pages)?,
            slots,
        })
    }

    /// The cache over the caller's four buffers (e.g. an existing pool), checked once:
    /// data `[pages × PAGE, WIDTH]`, planes `[pages, HKV, 32, PAGE/32, 4]`, contiguous.
    pub fn from_buffers(
        k: B::Buffer<F8E4M3>,
        v: B::Buffer<F8E4M3>,
        k_scales: B::Buffer<E8M0>,
        v_scales: B::Buffer<E8M0>,
        pages: usize,
    ) -> Result<Self>
    where
        Dim<PAGE>: Mxfp8PageSize,
        Dim<WIDTH>: Mxfp8Width,
    {
        let slots = PagedSlots::new(pages);
        Ok(Self {
            k: Tensor::from_buffer("k_buf", k, slots.slots())?,
            v: Tensor::from_buffer("v_buf", v, slots.slots())?,
            k_scales: Tensor::from_buffer("sfk", k_scales, pages)?,
            v_scales: Tensor::from_buffer("sfv", v_scales, pages)?,
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
