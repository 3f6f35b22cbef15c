//! CUDA launch of [`super::Mxfp8Quantize`] (`kernels/mxfp8_quantize.cu`).

use std::marker::PhantomData;

use super::launch::{Mxfp8QuantizeCall, Mxfp8QuantizeLaunch};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, LaunchShape};
use crate::dtype::MXFP8_BLOCK;
use crate::error::Result;

/// Threads per block of the quantize kernel.
const THREADS: u32 = 256;

crate::param_block! {
    /// The kernel's parameter block (`struct Mxfp8QuantizeParams`).
    pub struct Mxfp8QuantizeParams {
        input: u64,
        data: u64,
        scales: u64,
        rows: i64,
    }
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

impl Mxfp8QuantizeLaunch for Cuda {
    unsafe fn mxfp8_quantize<const WIDTH: usize>(
        &self,
        call: Mxfp8QuantizeCall<'_, Cuda>,
    ) -> Result<()> {
        let Mxfp8QuantizeCall {
            rows,
            input,
            mut data,
            mut scales,
        } = call;
        let blocks = rows * (WIDTH / MXFP8_BLOCK); // 32-element blocks, one per thread
        if blocks == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = Mxfp8QuantizeParams {
            input: args.read_vectors("input", &input)?,
            data: args.write_vectors("data", &mut data)?,
            scales: args.write("scales", &mut scales)?,
            rows: rows as i64,
        };
        let shape = LaunchShape {
            grid: (blocks.div_ceil(THREADS as usize) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: the three buffers hold rows × WIDTH, rows × WIDTH and rows × WIDTH/32
        // elements (tied by `Mxfp8Quantize::run`), exactly what the kernel touches.
        unsafe { args.launch::<Mxfp8QuantizeKernel<WIDTH>>(shape, &params) }
    }
}
