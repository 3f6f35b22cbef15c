//! CUDA launch of [`Mxfp8Quantize`] (`kernels/mxfp8_quantize.cu`), and its CUDA-only entry
//! [`Mxfp8Quantize::record`].

use std::marker::PhantomData;

use super::launch::{Mxfp8QuantizeCall, Mxfp8QuantizeEntry};
use super::{Mxfp8Quantize, RunMxfp8Quantize};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::dim::Dim;
use crate::dtype::{E8M0, F8E4M3, MXFP8_BLOCK, bf16};
use crate::error::Result;
use crate::tensor::{BlockScales, Cols, Storage, StorageMut, Tensor};

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

impl<const WIDTH: usize> CudaKernel for Mxfp8QuantizeKernel<WIDTH> {
    const SOURCE: &'static str = include_str!("../../../kernels/mxfp8_quantize.cu");
    type Params = Mxfp8QuantizeParams;
    fn instantiation() -> String {
        format!("mxfp8_quantize_kernel<{WIDTH}>")
    }
}

/// The CUDA launch runs the op.
impl super::RunMxfp8Quantize for Cuda {}

impl Mxfp8QuantizeEntry for Cuda {
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

impl<const WIDTH: usize> Mxfp8Quantize<WIDTH> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks): the graph borrows the
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
