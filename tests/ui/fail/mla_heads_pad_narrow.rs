// 20 real heads do not fit a 16-head tile: they pad to 32.
use shapeproof::ops::sparse_mla::{Plain, SparseMlaPrefill};

fn main() {
    let _ = SparseMlaPrefill::<576, 16, 2048, Plain, 20>::new();
}
