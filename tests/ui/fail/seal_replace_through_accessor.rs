// The in-place accessors of a checked struct write contents, not allocations: the K rows of a
// cache cannot be swapped through `k_mut()`.
use shapeproof::backend::Cpu;
use shapeproof::layout::PagedBf16Kv;
use shapeproof::tensor::Tensor;

fn main() -> shapeproof::Result<()> {
    let mut kv = PagedBf16Kv::<Cpu, 128, 128>::zeros(&Cpu, 2)?;
    *kv.k_mut() = Tensor::zeros(&Cpu, 1)?;
    Ok(())
}
