//! The MXFP8 KV cache of one layer: e4m3 K/V data and both interleaved E8M0 scale planes.

use crate::backend::Backend;
use crate::dim::{Dim, PagedSlots};
use crate::dtype::{E8M0, F8E4M3};
use crate::error::{Error, Result};
use crate::rules::{Mxfp8PageSize, Mxfp8Width};
use crate::tensor::{Cols, FixedExtent, Owned, RowShape, Storage, StorageMut, Tensor};

/// One page of an interleaved scale plane, `[HKV, 32, PAGE/32, 4]` with `HKV = WIDTH / 128`.
pub struct ScalePlanePage<const PAGE: usize, const WIDTH: usize>;
impl<const PAGE: usize, const WIDTH: usize> RowShape for ScalePlanePage<PAGE, WIDTH> {
    const COLS: usize = (WIDTH / 128) * 32 * (PAGE / 32) * 4;
}

/// K and V of `WIDTH = HKV × 128` channels as MXFP8: e4m3 data `[pages × PAGE, WIDTH]` and the
/// scale planes `[pages, HKV, 32, PAGE/32, 4]` (docs/kernels/prologue.md §1.8), all four made together, so that a
/// cache without planes, or with planes of another page size or head count, cannot exist.
/// Owned (`S = Owned`) or views of part of an engine's pool (`S = ViewMut<'a>`).
///
/// The fields are private: the four extents agree from construction to drop.
pub struct Mxfp8KvCache<B: Backend, const PAGE: usize, const WIDTH: usize, S: Storage<B> = Owned> {
    k: Tensor<B, F8E4M3, Cols<WIDTH>, S>, // [pages × PAGE, WIDTH]
    v: Tensor<B, F8E4M3, Cols<WIDTH>, S>, // [pages × PAGE, WIDTH]
    k_scales: Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>, S>, // [pages, HKV, 32, PAGE/32, 4]
    v_scales: Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>, S>, // [pages, HKV, 32, PAGE/32, 4]
    slots: PagedSlots<PAGE>,
}

/// The four tensors of an [`Mxfp8KvCache`], given back by [`Mxfp8KvCache::into_parts`] (and
/// taken by [`Mxfp8KvCache::from_parts`]).
pub struct Mxfp8KvParts<B: Backend, const PAGE: usize, const WIDTH: usize, S: Storage<B> = Owned> {
    /// K data, `[pages × PAGE, WIDTH]` e4m3.
    pub k: Tensor<B, F8E4M3, Cols<WIDTH>, S>,
    /// V data, `[pages × PAGE, WIDTH]` e4m3.
    pub v: Tensor<B, F8E4M3, Cols<WIDTH>, S>,
    /// K scales, `[pages, HKV, 32, PAGE/32, 4]`.
    pub k_scales: Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>, S>,
    /// V scales, `[pages, HKV, 32, PAGE/32, 4]`.
    pub v_scales: Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>, S>,
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize> Mxfp8KvCache<B, PAGE, WIDTH> {
    /// A cache of `pages` pages: data zeroed, scale bytes zero (2^-127, never NaN).
    pub fn zeros(backend: &B, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: Mxfp8PageSize,
        Dim<WIDTH>: Mxfp8Width,
    {
        let rows = Error::elements("pages", pages, PAGE)?;
        Self::from_parts(
            Mxfp8KvParts {
                k: Tensor::zeros(backend, rows)?,
                v: Tensor::zeros(backend, rows)?,
                k_scales: Tensor::zeros(backend, pages)?,
                v_scales: Tensor::zeros(backend, pages)?,
            },
            pages,
        )
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
        let rows = Error::elements("pages", pages, PAGE)?;
        Self::from_parts(
            Mxfp8KvParts {
                k: Tensor::from_buffer("k_buf", k, rows)?,
                v: Tensor::from_buffer("v_buf", v, rows)?,
                k_scales: Tensor::from_buffer("sfk", k_scales, pages)?,
                v_scales: Tensor::from_buffer("sfv", v_scales, pages)?,
            },
            pages,
        )
    }
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize, S: Storage<B>>
    Mxfp8KvCache<B, PAGE, WIDTH, S>
{
    /// The cache over four tensors (owned, or views of one layer's part of an engine's pool):
    /// data of `pages × PAGE` rows, planes of `pages` rows.
    pub fn from_parts(parts: Mxfp8KvParts<B, PAGE, WIDTH, S>, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: Mxfp8PageSize,
        Dim<WIDTH>: Mxfp8Width,
    {
        let rows = Error::elements("pages", pages, PAGE)?;
        parts.k.expect_rows("k_buf", "slots (pages × PAGE)", rows)?;
        parts.v.expect_rows("v_buf", "slots (pages × PAGE)", rows)?;
        parts.k_scales.expect_rows("sfk", "pages", pages)?;
        parts.v_scales.expect_rows("sfv", "pages", pages)?;
        Ok(Self {
            k: parts.k,
            v: parts.v,
            k_scales: parts.k_scales,
            v_scales: parts.v_scales,
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

    /// K data, `[pages × PAGE, WIDTH]` e4m3.
    pub fn k(&self) -> &Tensor<B, F8E4M3, Cols<WIDTH>, S> {
        &self.k
    }
    /// V data, `[pages × PAGE, WIDTH]` e4m3.
    pub fn v(&self) -> &Tensor<B, F8E4M3, Cols<WIDTH>, S> {
        &self.v
    }
    /// K scales, `[pages, HKV, 32, PAGE/32, 4]`.
    pub fn k_scales(&self) -> &Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>, S> {
        &self.k_scales
    }
    /// V scales, `[pages, HKV, 32, PAGE/32, 4]`.
    pub fn v_scales(&self) -> &Tensor<B, E8M0, ScalePlanePage<PAGE, WIDTH>, S> {
        &self.v_scales
    }
    /// K data, writable in place.
    pub fn k_mut(&mut self) -> FixedExtent<'_, B, F8E4M3, Cols<WIDTH>, S> {
        FixedExtent::new(&mut self.k)
    }
    /// V data, writable in place.
    pub fn v_mut(&mut self) -> FixedExtent<'_, B, F8E4M3, Cols<WIDTH>, S> {
        FixedExtent::new(&mut self.v)
    }
    /// K scales, writable in place.
    pub fn k_scales_mut(&mut self) -> FixedExtent<'_, B, E8M0, ScalePlanePage<PAGE, WIDTH>, S> {
        FixedExtent::new(&mut self.k_scales)
    }
    /// V scales, writable in place.
    pub fn v_scales_mut(&mut self) -> FixedExtent<'_, B, E8M0, ScalePlanePage<PAGE, WIDTH>, S> {
        FixedExtent::new(&mut self.v_scales)
    }
    /// The four tensors back.
    pub fn into_parts(self) -> Mxfp8KvParts<B, PAGE, WIDTH, S> {
        Mxfp8KvParts {
            k: self.k,
            v: self.v,
            k_scales: self.k_scales,
            v_scales: self.v_scales,
        }
    }
}

impl<B: Backend, const PAGE: usize, const WIDTH: usize, S: StorageMut<B>>
    Mxfp8KvCache<B, PAGE, WIDTH, S>
{
    #[allow(clippy::type_complexity)]
    pub(crate) fn slices_mut(
        &mut self,
    ) -> (
        B::SliceMut<'_, F8E4M3>,
        B::SliceMut<'_, F8E4M3>,
        B::SliceMut<'_, E8M0>,
        B::SliceMut<'_, E8M0>,
    ) {
        (
            self.k.as_slice_mut(),
            self.v.as_slice_mut(),
            self.k_scales.as_slice_mut(),
            self.v_scales.as_slice_mut(),
        )
    }
}
