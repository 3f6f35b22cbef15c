//! A kernel declared outside the library (`shapeproof::kernel`): per-head RMSNorm of bf16 rows,
//! `out = x / sqrt(mean(x²) + eps) · gamma`, one `[HD]` gamma shared by the heads. Its parts: the
//! type and its rule, the CUDA source (`head_rmsnorm.cu`) and its parameter mirror, the safe
//! `run` that ties the extents, and the raw door on each backend (the CPU one does the CUDA
//! one's arithmetic in its order, so the two agree bit for bit).

use shapeproof::Result;
use shapeproof::backend::cuda::{DeviceArgs, LaunchShape};
use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dim::Dim;
use shapeproof::prelude::bf16;
use shapeproof::tensor::{Cols, Heads, Tensor};

shapeproof::dim_rule! {
    /// A head dim one warp can normalize: 32 lanes × `HD / 32` channels in registers.
    pub trait WarpHeadDim for 32..=1024 step 32 {
        message: "head dim `{Self}` is not a multiple of 32 between 32 and 1024",
        label: "per-head RMSNorm needs HD = 32, 64, …, 1024",
        note: "one warp normalizes one head, each of its 32 lanes holding HD / 32 channels; pad the head to a multiple of 32",
    }
}

/// Per-head RMSNorm of rows of `HEADS` heads of `HD` channels, with epsilon `eps`.
pub struct HeadRmsNorm<const HEADS: usize, const HD: usize>(f32);

impl<const HEADS: usize, const HD: usize> HeadRmsNorm<HEADS, HD> {
    /// The kernel. Checked: `HD` is a [`WarpHeadDim`].
    pub fn new(eps: f32) -> Self
    where
        Dim<HD>: WarpHeadDim,
    {
        Self(eps)
    }

    /// The safe door: normalizes every row of `x` into `out` once the extents are tied.
    pub fn run<B: RunHeadRmsNorm>(
        &self,
        b: &B,
        x: &Tensor<B, bf16, Heads<HEADS, HD>>,
        gamma: &Tensor<B, bf16, Cols<HD>>,
        out: &mut Tensor<B, bf16, Heads<HEADS, HD>>,
    ) -> Result<()> {
        out.expect_rows("out", "rows (as x)", x.rows())?;
        gamma.expect_rows("gamma", "rows", 1)?;
        let (x, gamma, out) = (x.as_slice(), gamma.as_slice(), out.as_slice_mut());
        // SAFETY: x and out hold the same rows of HEADS × HD values, gamma HD values.
        unsafe { b.head_rmsnorm::<HEADS, HD>(self.0, x, gamma, out) }
    }
}

/// A backend that runs [`HeadRmsNorm`]: the raw door.
pub trait RunHeadRmsNorm: Backend + Sized {
    /// # Safety
    /// `out` is as long as `x`, a whole number of `[HEADS, HD]` rows, and `gamma` is `HD` long:
    /// the CUDA kernel checks no bound.
    unsafe fn head_rmsnorm<const HEADS: usize, const HD: usize>(
        &self,
        eps: f32,
        x: Self::Slice<'_, bf16>,
        gamma: Self::Slice<'_, bf16>,
        out: Self::SliceMut<'_, bf16>,
    ) -> Result<()>;
}

impl RunHeadRmsNorm for Cpu {
    unsafe fn head_rmsnorm<const HEADS: usize, const HD: usize>(
        &self,
        eps: f32,
        x: &[bf16],
        gamma: &[bf16],
        out: &mut [bf16],
    ) -> Result<()> {
        for (x, out) in x.chunks_exact(HD).zip(out.chunks_exact_mut(HD)) {
            // Lane l sums the squares of channels l, l + 32, … with fused multiply-adds; the xor
            // butterfly then leaves every lane with the same total.
            let mut lanes: [f32; 32] = std::array::from_fn(|l| {
                (l..HD)
                    .step_by(32)
                    .fold(0.0, |s, c| x[c].to_f32().mul_add(x[c].to_f32(), s))
            });
            for mask in [16, 8, 4, 2, 1] {
                let before = lanes;
                lanes = std::array::from_fn(|l| before[l] + before[l ^ mask]);
            }
            let inv = 1.0 / (lanes[0] / HD as f32 + eps).sqrt();
            for ((o, v), g) in out.iter_mut().zip(x).zip(gamma) {
                *o = bf16::from_f32(v.to_f32() * inv * g.to_f32());
            }
        }
        Ok(())
    }
}

shapeproof::cuda_kernel! {
    impl CudaKernel for HeadRmsNorm<const HEADS: usize, const HD: usize> {
        source: include_str!("head_rmsnorm.cu"),
        instantiation: "head_rmsnorm_kernel<{HEADS}, {HD}>",
        params: pub struct HeadRmsNormParams { x: u64, gamma: u64, out: u64, rows: i64, eps: f32 },
    }
}

impl RunHeadRmsNorm for Cuda {
    unsafe fn head_rmsnorm<const HEADS: usize, const HD: usize>(
        &self,
        eps: f32,
        x: Self::Slice<'_, bf16>,
        gamma: Self::Slice<'_, bf16>,
        mut out: Self::SliceMut<'_, bf16>,
    ) -> Result<()> {
        let rows = x.len() / (HEADS * HD);
        let mut args = DeviceArgs::new(self)?; // each buffer admitted: this context, this stream
        let params = HeadRmsNormParams {
            x: args.read("x", &x)?,
            gamma: args.read("gamma", &gamma)?,
            out: args.write("out", &mut out)?,
            rows: rows as i64,
            eps,
        };
        let shape = LaunchShape::linear("x", rows * HEADS * 32, 128)?; // a warp a (row, head)
        // SAFETY: x and out hold rows × HEADS × HD values and gamma HD (the caller's contract),
        // all the kernel touches under this shape; every address came from `args`.
        unsafe { args.launch::<HeadRmsNorm<HEADS, HD>>(shape, &params) }
    }
}
