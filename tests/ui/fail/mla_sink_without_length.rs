// "attn_sink requires topk_length".
use shapeproof::backend::Cpu;
use shapeproof::ops::sparse_mla::*;
use shapeproof::tensor::{Cols, Tensor};

fn add_sink(inputs: SparseMlaInputs<Cpu, 512, 64, 512, Plain>, sink: Tensor<Cpu, f32, Cols<64>>) {
    let _ = inputs.with_sink(sink);
}

fn main() {}
