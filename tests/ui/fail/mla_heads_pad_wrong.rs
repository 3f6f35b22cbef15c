// 16 real heads pad to one 64-head tile, not to 128.
use shapeproof::ops::sparse_mla::{Plain, SparseMlaPrefill};

fn main() {
    let _ = SparseMlaPrefill::<576, 128, 2048, Plain, 16>::new();
}
