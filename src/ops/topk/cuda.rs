//! CUDA launch of [`TopK`] (`kernels/topk.cu`), and its CUDA-only entry [`TopK::record`].

use std::marker::PhantomData;

use super::launch::{TopkCall, TopkEntry};
use super::{RunTopk, TopK, TopkScores};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::dim::Dim;
use crate::error::Result;
use crate::tensor::{Cols, Storage, StorageMut, Tensor};

/// Threads per block of the top-k kernel (`topk::kThreads`): one block a row.
const THREADS: u32 = 1024;

crate::param_block! {
    /// The kernel's parameter block (`struct TopkParams`).
    pub struct TopkParams {
        scores: u64,
        starts: u64,
        ends: u64,
        indices: u64,
        width: i64,
        rows: i32,
    }
}

/// `topk_kernel<TOPK>`.
pub struct TopkKernel<const TOPK: usize>(PhantomData<Dim<TOPK>>);

impl<const TOPK: usize> CudaKernel for TopkKernel<TOPK> {
    const SOURCE: &'static str = include_str!("../../../kernels/topk.cu");
    type Params = TopkParams;
    fn instantiation() -> String {
        format!("topk_kernel<{TOPK}>")
    }
}

/// The CUDA launch runs the op.
impl RunTopk for Cuda {}

impl TopkEntry for Cuda {
    unsafe fn topk<const TOPK: usize>(&self, call: TopkCall<'_, Cuda>) -> Result<()> {
        let TopkCall {
            rows,
            scores,
            mut indices,
        } = call;
        if rows == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = TopkParams {
            scores: args.read("scores", &scores.scores)?,
            starts: args.read("starts", &scores.starts)?,
            ends: args.read("ends", &scores.ends)?,
            indices: args.write("indices", &mut indices)?,
            width: scores.width as i64,
            rows: rows as i32,
        };
        let shape = LaunchShape {
            grid: (rows as u32, 1, 1), // rows <= i32::MAX (`TopkScores::new`)
            block: (THREADS, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: `scores` holds rows × width values, `starts` and `ends` rows values and
        // `indices` rows × TOPK (tied by `TopK::run`); the kernel clamps every range to
        // [0, width] before it reads.
        unsafe { args.launch::<TopkKernel<TOPK>>(shape, &params) }
    }
}

impl<const TOPK: usize> TopK<TOPK> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the scores and `indices` until it is dropped, so neither can be freed
    /// or swapped while it can replay.
    pub fn record<'g, B: RunTopk + IsCuda, SS: Storage<B>, SO: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        scores: &'g TopkScores<B, SS>,
        indices: &'g mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()> {
        graph.record(|cuda: &B| self.run(cuda, scores, indices))
    }
}
