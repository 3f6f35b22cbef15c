//! A kernel declared outside the library (`shapeproof::kernel`): per-head RMSNorm of bf16 rows,
//! `out = x / sqrt(mean(x²) + eps) · gamma` (one `[HD]` gamma), on the CPU with the arithmetic
//! of `head_rmsnorm.cu` in its order (the two agree bit for bit) and on CUDA.

use shapeproof::{dim::Dim, kernel::prelude::*};

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

/// One call on backend `B`, assembled only by [`HeadRmsNorm::run`]: `x` and `out` hold the same
/// whole number of `[HEADS, HD]` rows, `gamma` `HD` values (the CUDA kernel checks no bound).
pub struct NormCall<'a, B: Backend> {
    eps: f32,
    x: B::Slice<'a, bf16>,      // [rows, HEADS, HD]
    gamma: B::Slice<'a, bf16>,  // [HD]
    out: B::SliceMut<'a, bf16>, // [rows, HEADS, HD]
}

impl<const HEADS: usize, const HD: usize> Kernel for HeadRmsNorm<HEADS, HD> {
    type Call<'a, B: Backend> = NormCall<'a, B>;
}

impl<const HEADS: usize, const HD: usize> HeadRmsNorm<HEADS, HD> {
    /// The kernel. Checked: `HD` is a [`WarpHeadDim`].
    pub fn new(eps: f32) -> Self
    where
        Dim<HD>: WarpHeadDim,
    {
        Self(eps)
    }

    /// The safe door: normalizes every row of `x` into `out` once the extents are tied.
    pub fn run<B: Run<Self>>(
        &self,
        b: &B,
        x: &Tensor<B, bf16, Heads<HEADS, HD>>,
        gamma: &Tensor<B, bf16, Cols<HD>>,
        out: &mut Tensor<B, bf16, Heads<HEADS, HD>>,
    ) -> Result<()> {
        out.expect_rows("out", "rows (as x)", x.rows())?;
        gamma.expect_rows("gamma", "rows", 1)?;
        let (eps, x, gamma, out) = (self.0, x.as_slice(), gamma.as_slice(), out.as_slice_mut());
        // SAFETY: x and out hold the same rows of HEADS × HD values, gamma HD values.
        unsafe { b.enter(NormCall { eps, x, gamma, out }) }
    }
}

impl<const HEADS: usize, const HD: usize> Run<HeadRmsNorm<HEADS, HD>> for Cpu {
    unsafe fn enter(&self, call: NormCall<'_, Cpu>) -> Result<()> {
        for (x, out) in call.x.chunks_exact(HD).zip(call.out.chunks_exact_mut(HD)) {
            // Lane l sums the squares of channels l, l + 32, … with fused multiply-adds; the xor
            // butterfly's total is lane 0's: pairs 16, 8, 4, 2, 1 lanes apart added in turn.
            let mut lanes: [f32; 32] = std::array::from_fn(|l| {
                (x[l..].iter().step_by(32)).fold(0.0, |s, v| v.to_f32().mul_add(v.to_f32(), s))
            });
            for half in [16, 8, 4, 2, 1] {
                (0..half).for_each(|l| lanes[l] += lanes[l + half]);
            }
            let inv = 1.0 / (lanes[0] / HD as f32 + call.eps).sqrt();
            for ((o, v), g) in out.iter_mut().zip(x).zip(call.gamma) {
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

impl<const HEADS: usize, const HD: usize> Run<HeadRmsNorm<HEADS, HD>> for Cuda {
    unsafe fn enter(&self, mut call: NormCall<'_, Cuda>) -> Result<()> {
        let rows = call.x.len() / (HEADS * HD);
        let mut args = DeviceArgs::new(self)?; // each buffer admitted: this context, this stream
        let params = HeadRmsNormParams {
            x: args.read("x", &call.x)?,
            gamma: args.read("gamma", &call.gamma)?,
            out: args.write("out", &mut call.out)?,
            rows: rows as i64,
            eps: call.eps,
        };
        let shape = LaunchShape::linear("x", rows * HEADS * 32, 128)?; // a warp a (row, head)
        // SAFETY: all the kernel touches under this shape is in the call's buffers, via `args`.
        unsafe { args.launch::<HeadRmsNorm<HEADS, HD>>(shape, &params) }
    }
}
