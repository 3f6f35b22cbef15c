// A tied struct's fields are private: the indices cannot be swapped for a shorter tensor after
// `SparseMlaInputs::new` tied them to q.
use shapeproof::backend::Cpu;
use shapeproof::ops::sparse_mla::{Plain, SparseMlaInputs};
use shapeproof::tensor::Tensor;

fn main() -> shapeproof::Result<()> {
    let mut inputs = SparseMlaInputs::<Cpu, 576, 64, 128, Plain>::new(
        Tensor::zeros(&Cpu, 4)?,
        Tensor::from_host(&Cpu, "q_scale", &[1.0], 1)?,
        Tensor::zeros(&Cpu, 4)?,
        0.1,
    )?;
    inputs.indices = Tensor::zeros(&Cpu, 1)?;
    Ok(())
}
