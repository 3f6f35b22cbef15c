// "out, max_logits and lse must not alias": passing one buffer twice is a borrow error.
use shapeproof::backend::Cpu;
use shapeproof::dtype::bf16;
use shapeproof::layout::MlaLatentKv;
use shapeproof::ops::sparse_mla::*;
use shapeproof::tensor::{Cols, Tensor};

fn run(
    inputs: &SparseMlaInputs<Cpu, 576, 64, 2048, Plain>,
    kv: &MlaLatentKv<Cpu, 576>,
    out: &mut Tensor<Cpu, bf16, OutRow<64>>,
    stats: &mut Tensor<Cpu, f32, Cols<64>>,
) {
    let k = SparseMlaPrefill::<576, 64, 2048>::new();
    let _ = k.run(&Cpu, inputs, kv, out, stats, stats);
}

fn main() {}
