//! MXFP8 quantization of bf16 rows (sglang's `to_mxfp8`): e4m3 data and one E8M0 scale per
//! 32 elements. The staged alternative to the fused prologue store, and the library's smallest
//! real kernel.

mod cpu;
mod cuda;

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::backend::cuda::{GraphRecorder, IsCuda};
use crate::dim::Dim;
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::rules::Mxfp8Width;
use crate::tensor::{BlockScales, Cols, Storage, StorageMut, Tensor};

pub use cuda::Mxfp8QuantizeKernel;

/// Quantizes rows of `WIDTH` bf16 values to MXFP8 (docs/kernels/prologue.md §1.7).
#[derive(Clone, Copy, Debug)]
pub struct Mxfp8Quantize<const WIDTH: usize> {
    _width: PhantomData<Dim<WIDTH>>,
}

/// A backend that can run [`Mxfp8Quantize`]: the CPU reference and CUDA. Sealed: the entry
/// takes a call only [`Mxfp8Quantize::run`] can assemble.
pub trait RunMxfp8Quantize: Backend + Sized + launch::Mxfp8QuantizeLaunch {}
impl RunMxfp8Quantize for crate::backend::Cpu {}
impl RunMxfp8Quantize for crate::backend::Cuda {}

/// The launch layer: the checked call and the per-backend entry.
pub(crate) mod launch {
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

    /// The per-backend entry.
    pub trait Mxfp8QuantizeLaunch: Backend + Sized {
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
}

impl<const WIDTH: usize> Mxfp8Quantize<WIDTH> {
    /// The op; `WIDTH` must be a multiple of 128.
    pub fn new() -> Self
    where
        Dim<WIDTH>: Mxfp8Width,
    {
        Self {
            _width: PhantomData,
        }
    }

    /// Quantizes every row of `input`; `data` and `scales` must have as many rows.
    /// `input` can be owned or a view, `data` and `scales` owned or mutable views.
    pub fn run<B: RunMxfp8Quantize, SI: Storage<B>, SO: StorageMut<B>>(
        &self,
        backend: &B,
        input: &Tensor<B, bf16, Cols<WIDTH>, SI>,
        data: &mut Tensor<B, F8E4M3, Cols<WIDTH>, SO>,
        scales: &mut Tensor<B, E8M0, BlockScales<WIDTH>, SO>,
    ) -> Result<()> {
        Error::check_extent("data", "rows", input.rows(), data.rows())?;
        Error::check_extent("scales", "rows", input.rows(), scales.rows())?;
        // SAFETY: the width rule holds (`new`'s bound) and the row counts are tied above.
        unsafe {
            backend.mxfp8_quantize::<WIDTH>(launch::Mxfp8QuantizeCall {
                rows: input.rows(),
                input: input.as_slice(),
                data: data.as_slice_mut(),
                scales: scales.as_slice_mut(),
            })
        }
    }

    /// Records the same call into a CUDA graph (after the same checks): the graph borrows the
    /// three tensors until it is dropped, so none can be freed or swapped while it can replay.
    pub fn record<'g, B: RunMxfp8Quantize + IsCuda, SI: Storage<B>, SO: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        input: &'g Tensor<B, bf16, Cols<WIDTH>, SI>,
        data: &'g mut Tensor<B, F8E4M3, Cols<WIDTH>, SO>,
        scales: &'g mut Tensor<B, E8M0, BlockScales<WIDTH>, SO>,
    ) -> Result<()> {
        graph.record(|cuda: &B| self.run(cuda, input, data, scales))
    }
}
