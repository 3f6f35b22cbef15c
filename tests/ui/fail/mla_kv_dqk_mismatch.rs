// kv's d_qk must be q's: a 512-wide latent KV for a 576-wide kernel.
use shapeproof::backend::Cpu;
use shapeproof::dtype::bf16;
use shapeproof::layout::MlaLatentKv;
use shapeproof::ops::sparse_mla::*;
use shapeproof::tensor::{Cols, Tensor};

fn run(
    inputs: &SparseMlaInputs<Cpu, 576, 64, 2048, Plain>,
    kv: &MlaLatentKv<Cpu, 512>,
    out: &mut Tensor<Cpu, bf16, OutRow<64>>,
    max_logits: &mut Tensor<Cpu, f32, Cols<64>>,
    lse: &mut Tensor<Cpu, f32, Cols<64>>,
) {
    let k = SparseMlaPrefill::<576, 64, 2048>::new();
    let _ = k.run(&Cpu, inputs, kv, out, max_logits, lse);
}

fn main() {}
