// The index-key cache has pages of 64 tokens.
use shapeproof::backend::Cpu;
use shapeproof::layout::IndexKeyCache;

fn main() {
    let _ = IndexKeyCache::<Cpu, 32>::zeros(&Cpu, 4);
}
