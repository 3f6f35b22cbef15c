// Indices are int32.
use shapeproof::backend::Cpu;
use shapeproof::dtype::F8E4M3;
use shapeproof::ops::sparse_mla::*;
use shapeproof::tensor::{Cols, Scalar, Tensor};

fn inputs(
    q: Tensor<Cpu, F8E4M3, QRow<64, 576>>,
    q_scale: Tensor<Cpu, f32, Scalar>,
    indices: Tensor<Cpu, i64, Cols<2048>>,
) {
    let _ = SparseMlaInputs::new(q, q_scale, indices, 0.1);
}

fn main() {}
