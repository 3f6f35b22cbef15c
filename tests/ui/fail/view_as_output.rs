// A read-only view cannot be an output: the lse of this call would be written through `&[f32]`.
use shapeproof::backend::Cpu;
use shapeproof::layout::MlaLatentKv;
use shapeproof::ops::sparse_mla::{Plain, SparseMlaInputs, SparseMlaPrefill};
use shapeproof::tensor::{Cols, Tensor, TensorView};

fn main() -> shapeproof::Result<()> {
    let inputs = SparseMlaInputs::<Cpu, 576, 16, 128, Plain>::new(
        Tensor::zeros(&Cpu, 1)?,
        Tensor::from_host(&Cpu, "q_scale", &[1.0], 1)?,
        Tensor::zeros(&Cpu, 1)?,
        0.1,
    )?;
    let kv = MlaLatentKv::<Cpu, 576>::new(&Cpu, vec![Default::default(); 576], 1, 1.0)?;
    let (out, ml, lse) = (vec![Default::default(); 16 * 512], vec![0.0f32; 16], vec![0.0f32; 16]);
    let mut out = TensorView::<Cpu, _, _>::from_slice("out", &out[..], 1)?;
    let mut ml = TensorView::<Cpu, f32, Cols<16>>::from_slice("max_logits", &ml[..], 1)?;
    let mut lse = TensorView::<Cpu, f32, Cols<16>>::from_slice("lse", &lse[..], 1)?;
    SparseMlaPrefill::<576, 64, 128, Plain, 16>::new().run(&Cpu, &inputs, &kv, &mut out, &mut ml, &mut lse)
}
