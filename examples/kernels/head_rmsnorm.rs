//! A kernel declared outside the library: per-head RMSNorm of bf16 rows.
//!
//! The four parts every kernel has (see `shapeproof::kernel`):
//! 1. the kernel type, whose constructor carries its rule ([`WarpHeadDim`]);
//! 2. the CUDA source (`head_rmsnorm.cu`) with one by-value parameter struct, mirrored here by
//!    [`HeadRmsNormParams`];
//! 3. `impl CudaKernel` naming the source and the template instantiation the type selects;
//! 4. a CPU implementation with the exact semantics of the CUDA one.

use std::marker::PhantomData;

use shapeproof::backend::cuda::{CudaKernel, LaunchShape};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dim::Dim;
use shapeproof::prelude::bf16;
use shapeproof::tensor::{Cols, RowShape, Tensor};
use shapeproof::{Error, Result};

/// A head dim one warp can normalize: 32 lanes × `HD / 32` channels held in registers.
#[diagnostic::on_unimplemented(
    message = "head dim `{Self}` is not a multiple of 32 between 32 and 1024",
    label = "per-head RMSNorm needs HD = 32, 64, …, 1024",
    note = "one warp normalizes one head, each of its 32 lanes holding HD / 32 channels; pad the head to a multiple of 32"
)]
pub trait WarpHeadDim {}

/// Implements [`WarpHeadDim`] for `32 · k`, for each listed `k`.
macro_rules! warp_head_dims {
    ($($k:literal)*) => {$(
        #[diagnostic::do_not_recommend]
        impl WarpHeadDim for Dim<{ $k * 32 }> {}
    )*};
}
warp_head_dims!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);

/// One row of the input or output: `[HEADS, HD]` bf16.
pub struct HeadRow<const HEADS: usize, const HD: usize>;
impl<const HEADS: usize, const HD: usize> RowShape for HeadRow<HEADS, HD> {
    const COLS: usize = HEADS * HD;
}

/// Per-head RMSNorm of rows of `HEADS` heads of `HD` channels, with one `[HD]` weight shared by
/// the heads: `out = x / sqrt(mean(x²) + eps) · gamma`.
#[derive(Clone, Copy, Debug)]
pub struct HeadRmsNorm<const HEADS: usize, const HD: usize> {
    eps: f32,
}

impl<const HEADS: usize, const HD: usize> HeadRmsNorm<HEADS, HD> {
    /// The kernel with epsilon `eps`. Checked: `HD` is a multiple of 32 up to 1024.
    pub fn new(eps: f32) -> Self
    where
        Dim<HD>: WarpHeadDim,
    {
        Self { eps }
    }

    /// Normalizes every row of `x` into `out`: the safe door. It checks what the kernel
    /// relies on (the row counts agree, one gamma row) and returns an error naming the argument
    /// otherwise.
    pub fn run<B: RunHeadRmsNorm>(
        &self,
        backend: &B,
        x: &Tensor<B, bf16, HeadRow<HEADS, HD>>,
        gamma: &Tensor<B, bf16, Cols<HD>>,
        out: &mut Tensor<B, bf16, HeadRow<HEADS, HD>>,
    ) -> Result<()> {
        out.expect_rows("out", "rows", x.rows())?;
        gamma.expect_rows("gamma", "rows", 1)?;
        // SAFETY: the two checks above are the whole contract of `head_rmsnorm`.
        unsafe { backend.head_rmsnorm(self, x, gamma, out) }
    }
}

/// A backend that runs [`HeadRmsNorm`]: the raw door, with no checks.
pub trait RunHeadRmsNorm: Backend + Sized {
    /// Runs the kernel on tensors whose extents the caller vouches for.
    ///
    /// # Safety
    /// `out` has exactly as many rows as `x`, and `gamma` exactly one row: the CUDA kernel
    /// reads `x.rows() × HEADS × HD` elements of `x` and `HD` of `gamma`, and writes
    /// `x.rows() × HEADS × HD` elements of `out`, with no bounds checks.
    unsafe fn head_rmsnorm<const HEADS: usize, const HD: usize>(
        &self,
        kernel: &HeadRmsNorm<HEADS, HD>,
        x: &Tensor<Self, bf16, HeadRow<HEADS, HD>>,
        gamma: &Tensor<Self, bf16, Cols<HD>>,
        out: &mut Tensor<Self, bf16, HeadRow<HEADS, HD>>,
    ) -> Result<()>;
}

/// The CPU path: the CUDA kernel's arithmetic, in its order, so the results agree bit for bit.
impl RunHeadRmsNorm for Cpu {
    unsafe fn head_rmsnorm<const HEADS: usize, const HD: usize>(
        &self,
        kernel: &HeadRmsNorm<HEADS, HD>,
        x: &Tensor<Cpu, bf16, HeadRow<HEADS, HD>>,
        gamma: &Tensor<Cpu, bf16, Cols<HD>>,
        out: &mut Tensor<Cpu, bf16, HeadRow<HEADS, HD>>,
    ) -> Result<()> {
        let gamma = gamma.buffer();
        let x = x.buffer();
        for (head_in, head_out) in x
            .chunks_exact(HD)
            .zip(out.as_slice_mut().chunks_exact_mut(HD))
        {
            // Lane l sums the squares of channels l, l + 32, … with fused multiply-adds.
            let mut lanes = [0.0f32; 32];
            for (lane, sum) in lanes.iter_mut().enumerate() {
                for c in (lane..HD).step_by(32) {
                    let v = head_in[c].to_f32();
                    *sum = v.mul_add(v, *sum);
                }
            }
            // The xor butterfly: every lane ends with the same total.
            for mask in [16, 8, 4, 2, 1] {
                let before = lanes;
                for (lane, sum) in lanes.iter_mut().enumerate() {
                    *sum += before[lane ^ mask];
                }
            }
            let inv = 1.0 / (lanes[0] / HD as f32 + kernel.eps).sqrt();
            for ((o, v), g) in head_out.iter_mut().zip(head_in).zip(gamma) {
                *o = bf16::from_f32(v.to_f32() * inv * g.to_f32());
            }
        }
        Ok(())
    }
}

shapeproof::param_block! {
    /// The kernel's parameter block, field for field `struct HeadRmsNormParams` of the source.
    pub struct HeadRmsNormParams {
        x: u64,
        gamma: u64,
        out: u64,
        rows: i64,
        eps: f32,
    }
}

/// `head_rmsnorm_kernel<HEADS, HD>`: the type is the JIT cache key.
pub struct HeadRmsNormKernel<const HEADS: usize, const HD: usize>(PhantomData<Dim<HD>>);

impl<const HEADS: usize, const HD: usize> CudaKernel for HeadRmsNormKernel<HEADS, HD> {
    const SOURCE: &'static str = include_str!("head_rmsnorm.cu");
    type Params = HeadRmsNormParams;
    fn instantiation() -> String {
        format!("head_rmsnorm_kernel<{HEADS}, {HD}>")
    }
}

/// Threads per block: four warps, one (row, head) each.
const THREADS: u32 = 128;

/// The CUDA path: one launch, no checks beyond the row counts `run` has tied.
impl RunHeadRmsNorm for Cuda {
    unsafe fn head_rmsnorm<const HEADS: usize, const HD: usize>(
        &self,
        kernel: &HeadRmsNorm<HEADS, HD>,
        x: &Tensor<Cuda, bf16, HeadRow<HEADS, HD>>,
        gamma: &Tensor<Cuda, bf16, Cols<HD>>,
        out: &mut Tensor<Cuda, bf16, HeadRow<HEADS, HD>>,
    ) -> Result<()> {
        let warps = x.rows() * HEADS;
        if warps == 0 {
            return Ok(());
        }
        let params = HeadRmsNormParams {
            x: self.ptr(x.buffer()),
            gamma: self.ptr(gamma.buffer()),
            out: self.ptr(out.buffer()),
            rows: i64::try_from(x.rows()).map_err(|_| Error::Value {
                param: "x",
                value: i64::MAX,
                range: "rows up to i64::MAX".to_string(),
            })?,
            eps: kernel.eps,
        };
        let shape = LaunchShape {
            grid: ((warps * 32).div_ceil(THREADS as usize) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: x and out hold rows × HEADS × HD elements (their types and the caller's
        // contract), gamma holds HD: exactly what the kernel reads and writes under this shape.
        unsafe { self.launch::<HeadRmsNormKernel<HEADS, HD>>(shape, &params) }
    }
}
