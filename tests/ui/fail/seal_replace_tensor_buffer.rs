// A tensor lends its elements, never its allocation: there is no `&mut` to the buffer, so it
// cannot be replaced by a shorter one while the row count stays.
use shapeproof::backend::Cpu;
use shapeproof::tensor::{Cols, Tensor};

fn main() -> shapeproof::Result<()> {
    let mut out = Tensor::<Cpu, f32, Cols<64>>::zeros(&Cpu, 4)?;
    *out.buffer_mut() = vec![0.0; 1];
    *out.buffer() = vec![0.0; 1];
    Ok(())
}
