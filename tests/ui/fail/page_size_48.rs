// Pages are tiled in 32-token chunks.
use shapeproof::backend::Cpu;
use shapeproof::layout::PagedBf16Kv;

fn main() {
    let _ = PagedBf16Kv::<Cpu, 48, 128>::zeros(&Cpu, 4);
}
