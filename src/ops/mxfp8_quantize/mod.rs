//! MXFP8 quantization of bf16 rows (sglang's `to_mxfp8`): e4m3 data and one E8M0 scale per
//! 32 elements. The staged alternative to the fused prologue store, and the library's smallest
//! real kernel.

//!
//! Files: this module the kernel type, its rule and `run`; `launch.rs` the call and the sealed
//! entry; `cpu.rs` the reference; `cuda.rs` the launch (and the CUDA-only `record`). The op
//! takes plain tensors, so it has no `args.rs`.

mod cpu;
mod cuda;
mod launch;

use std::marker::PhantomData;

use crate::backend::Backend;
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
pub trait RunMxfp8Quantize: Backend + Sized + launch::Mxfp8QuantizeEntry {}

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
}
