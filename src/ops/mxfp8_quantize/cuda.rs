//! CUDA launch of [`super::Mxfp8Quantize`] (`kernels/mxfp8_quantize.cu`).

use std::marker::PhantomData;

use super::RunMxfp8Quantize;
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, LaunchShape};
use crate::dtype::{E8M0, F8E4M3, MXFP8_BLOCK, bf16};
use crate::error::Result;
use crate::tensor::{BlockScales, Cols, Tensor};

/// Threads per block of the quantize kernel.
const THREADS: u32 = 256;

/// The kernel's parameter block (`struct Mxfp8QuantizeParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Mxfp8QuantizeParams {
    input: u64,
    data: u64,
    scales: u64,
    rows: i64,
}

/// `mxfp8_quantize_kernel<WIDTH>`.
pub struct Mxfp8QuantizeKernel<const WIDTH: usize>(PhantomData<Dim<WIDTH>>);
use crate::dim::Dim;

impl<const WIDTH: usize> CudaKernel for Mxfp8QuantizeKernel<WIDTH> {
    const SOURCE: &'static str = include_str!("../../../kernels/mxfp8_quantize.cu");
    type Params = Mxfp8QuantizeParams;
    fn instantiation() -> String {
        format!("mxfp8_quantize_kernel<{WIDTH}>")
    }
}

impl RunMxfp8Quantize for Cuda {
    fn mxfp8_quantize<const WIDTH: usize>(
        &self,
        input: &Tensor<Cuda, bf16, Cols<WIDTH>>,
        data: &mut Tensor<Cuda, F8E4M3, Cols<WIDTH>>,
        scales: &mut Tensor<Cuda, E8M0, BlockScales<WIDTH>>,
    ) -> Result<()> {
        let blocks = input.rows() * (WIDTH / MXFP8_BLOCK); // 32-element blocks, one per thread
        if blocks == 0 {
            return Ok(());
        }
        let params = Mxfp8QuantizeParams {
            input: self.ptr(input.buffer()),
            data: self.ptr(data.buffer()),
            scales: self.ptr(scales.buffer()),
            rows: input.rows() as i64,
        };
        let shape = LaunchShape {
            grid: (blocks.div_ceil(THREADS as usize) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: the three buffers hold rows × WIDTH, rows × WIDTH and rows × WIDTH/32
        // elements (tied by `Mxfp8Quantize::run`), exactly what the kernel touches.
        unsafe { self.launch::<Mxfp8QuantizeKernel<WIDTH>>(shape, &params) }
    }
}
