// A view is tied to the allocation it borrows: it cannot outlive it.
use shapeproof::backend::Cpu;
use shapeproof::tensor::{Cols, TensorView};

fn main() -> shapeproof::Result<()> {
    let view = {
        let pool = vec![0.0f32; 64];
        TensorView::<Cpu, f32, Cols<16>>::from_slice("kv", &pool[..], 4)?
    };
    println!("{}", view.rows());
    Ok(())
}
