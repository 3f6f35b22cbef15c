// The MXFP8 interleaved scale planes need whole 128-row tiles per page.
use shapeproof::backend::Cpu;
use shapeproof::layout::Mxfp8KvCache;

fn main() {
    let _ = Mxfp8KvCache::<Cpu, 64, 128>::zeros(&Cpu, 4);
}
