// 24 heads per rank is no sparse MLA head tile: the tiles are 8, 16, 32 and multiples of 64.
use shapeproof::ops::sparse_mla::SparseMlaPrefill;

fn main() {
    let _ = SparseMlaPrefill::<576, 24, 2048>::new();
}
