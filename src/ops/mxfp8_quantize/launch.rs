//! The launch layer: the checked call and the sealed entry that takes it. The module is
//! private, so neither can be named, built or called from outside the crate.

use crate::backend::Backend;
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::Result;

/// One checked call; made only by `Mxfp8Quantize::run`.
pub struct Mxfp8QuantizeCall<'a, B: Backend> {
    pub(crate) rows: usize,                   // rows of WIDTH values
    pub(crate) input: B::Slice<'a, bf16>,     // [rows, WIDTH]
    pub(crate) data: B::SliceMut<'a, F8E4M3>, // [rows, WIDTH]
    pub(crate) scales: B::SliceMut<'a, E8M0>, // [rows, WIDTH / 32]
}

/// The per-backend entry: the private supertrait of
/// [`RunMxfp8Quantize`](super::RunMxfp8Quantize).
pub trait Mxfp8QuantizeEntry: Backend + Sized {
    /// Quantizes one checked call.
    ///
    /// # Safety
    /// `call` was assembled by `Mxfp8Quantize::run`: `WIDTH` a multiple of 128, `input`
    /// and `data` of `rows × WIDTH` elements, `scales` of `rows × WIDTH / 32`.
    unsafe fn mxfp8_quantize<const WIDTH: usize>(
        &self,
        call: Mxfp8QuantizeCall<'_, Self>,
    ) -> Result<()>;
}
