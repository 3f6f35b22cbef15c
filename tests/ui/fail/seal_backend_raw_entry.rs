// The per-backend launch entry is internal: a kernel cannot be reached past the typed `run`
// (here with d_qk 640, 16 unpadded heads and top-k 100, which no rule admits).
use shapeproof::backend::Cpu;
use shapeproof::ops::sparse_mla::Plain;

fn main() {
    let _ = Cpu.sparse_mla::<640, 16, 100, Plain, 16>(todo!());
}
