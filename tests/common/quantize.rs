//! One MXFP8 quantize case shared by the GPU tests of the boundary and of the engine machinery:
//! random rows, their CPU encoding, and the encoding read back from any backend.

use shapeproof::backend::{Backend, Cpu};
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::ops::mxfp8_quantize::Mxfp8Quantize;
use shapeproof::tensor::{BlockScales, Cols, Tensor};

/// Row width of the case (two 128-channel scale atoms).
pub const W: usize = 256;
/// Rows of the case.
pub const ROWS: usize = 300;

/// Random bf16 rows `[ROWS, W]` and their CPU encoding (data bytes, then scale bytes).
pub fn case(seed: &str) -> (Vec<bf16>, Vec<u8>) {
    let mut rng = super::rng(seed);
    let x = super::bf16_normal(&mut rng, ROWS * W, 0.0, 3.0);
    let input = Tensor::<Cpu, bf16, Cols<W>>::from_host(&Cpu, "x", &x, ROWS).unwrap();
    let mut data = Tensor::<Cpu, F8E4M3, Cols<W>>::zeros(&Cpu, ROWS).unwrap();
    let mut scales = Tensor::<Cpu, E8M0, BlockScales<W>>::zeros(&Cpu, ROWS).unwrap();
    Mxfp8Quantize::<W>::new()
        .run(&Cpu, &input, &mut data, &mut scales)
        .unwrap();
    (x, encoded(&Cpu, &data, &scales))
}

/// The data bytes, then the scale bytes, of an encoding on `b`.
pub fn encoded<B: Backend>(
    b: &B,
    data: &Tensor<B, F8E4M3, Cols<W>>,
    scales: &Tensor<B, E8M0, BlockScales<W>>,
) -> Vec<u8> {
    let mut bytes: Vec<u8> = data
        .to_host(b)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    bytes.extend(scales.to_host(b).unwrap().iter().map(|s| s.0));
    bytes
}
