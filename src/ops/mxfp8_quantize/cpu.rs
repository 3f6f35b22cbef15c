//! CPU reference of [`super::Mxfp8Quantize`].

use super::launch::{Mxfp8QuantizeCall, Mxfp8QuantizeEntry};
use crate::backend::Cpu;
use crate::dtype::{MXFP8_BLOCK, mxfp8_encode_block};
use crate::error::Result;

/// The CPU reference runs the op.
impl super::RunMxfp8Quantize for Cpu {}

impl Mxfp8QuantizeEntry for Cpu {
    unsafe fn mxfp8_quantize<const WIDTH: usize>(
        &self,
        call: Mxfp8QuantizeCall<'_, Cpu>,
    ) -> Result<()> {
        let src = call.input.chunks_exact(MXFP8_BLOCK); // [rows · WIDTH/32, 32]
        let dst = call.data.chunks_exact_mut(MXFP8_BLOCK);
        for ((block, out), scale) in src.zip(dst).zip(call.scales.iter_mut()) {
            let x: [f32; MXFP8_BLOCK] = std::array::from_fn(|i| block[i].to_f32());
            let (s, q) = mxfp8_encode_block(&x);
            *scale = s;
            out.copy_from_slice(&q);
        }
        Ok(())
    }
}
