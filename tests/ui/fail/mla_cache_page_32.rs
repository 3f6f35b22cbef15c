// The FP8 sparse MLA cache has pages of 64 tokens.
use shapeproof::backend::Cpu;
use shapeproof::layout::MlaFp8KvCache;

fn main() {
    let _ = MlaFp8KvCache::<Cpu, 32, 128>::zeros(&Cpu, 4);
}
