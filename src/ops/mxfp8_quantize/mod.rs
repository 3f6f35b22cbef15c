//! MXFP8 quantization of bf16 rows (sglang's `to_mxfp8`): e4m3 data and one E8M0 scale per
//! 32 elements. The staged alternative to the fused prologue store, and the library's smallest
//! real kernel.

mod cpu;
mod cuda;

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dim::Dim;
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::rules::Mxfp8Width;
use crate::tensor::{BlockScales, Cols, Tensor};

pub use cuda::Mxfp8QuantizeKernel;

/// Quantizes rows of `WIDTH` bf16 values to MXFP8 (spec §1.7).
#[derive(Clone, Copy, Debug)]
pub struct Mxfp8Quantize<const WIDTH: usize> {
    _width: PhantomData<Dim<WIDTH>>,
}

/// A backend that can run [`Mxfp8Quantize`].
pub trait RunMxfp8Quantize: Backend + Sized {
    /// Quantizes `input` into `data` and `scales` (row counts already tied).
    fn mxfp8_quantize<const WIDTH: usize>(
        &self,
        input: &Tensor<Self, bf16, Cols<WIDTH>>,
        data: &mut Tensor<Self, F8E4M3, Cols<WIDTH>>,
        scales: &mut Tensor<Self, E8M0, BlockScales<WIDTH>>,
    ) -> Result<()>;
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
    pub fn run<B: RunMxfp8Quantize>(
        &self,
        backend: &B,
        input: &Tensor<B, bf16, Cols<WIDTH>>,
        data: &mut Tensor<B, F8E4M3, Cols<WIDTH>>,
        scales: &mut Tensor<B, E8M0, BlockScales<WIDTH>>,
    ) -> Result<()> {
        Error::check_extent("data", "rows", input.rows(), data.rows())?;
        Error::check_extent("scales", "rows", input.rows(), scales.rows())?;
        backend.mxfp8_quantize(input, data, scales)
    }
}
