// Sparse MLA supports d_qk 512 and 576.
use shapeproof::ops::sparse_mla::SparseMlaPrefill;

fn main() {
    let _ = SparseMlaPrefill::<640, 64, 2048>::new();
}
