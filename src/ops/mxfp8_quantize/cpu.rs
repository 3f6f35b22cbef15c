//! CPU reference of [`super::Mxfp8Quantize`].

use super::RunMxfp8Quantize;
use crate::backend::Cpu;
use crate::dtype::{E8M0, F8E4M3, MXFP8_BLOCK, bf16, mxfp8_encode_block};
use crate::error::Result;
use crate::tensor::{BlockScales, Cols, Tensor};

impl RunMxfp8Quantize for Cpu {
    fn mxfp8_quantize<const WIDTH: usize>(
        &self,
        input: &Tensor<Cpu, bf16, Cols<WIDTH>>,
        data: &mut Tensor<Cpu, F8E4M3, Cols<WIDTH>>,
        scales: &mut Tensor<Cpu, E8M0, BlockScales<WIDTH>>,
    ) -> Result<()> {
        let src = input.buffer().chunks_exact(MXFP8_BLOCK); // [rows · WIDTH/32, 32]
        let dst = data.buffer_mut().chunks_exact_mut(MXFP8_BLOCK);
        for ((block, out), scale) in src.zip(dst).zip(scales.buffer_mut().iter_mut()) {
            let x: [f32; MXFP8_BLOCK] = std::array::from_fn(|i| block[i].to_f32());
            let (s, q) = mxfp8_encode_block(&x);
            *scale = s;
            out.copy_from_slice(&q);
        }
        Ok(())
    }
}
