// The sparse MLA decode runs 8, 16, 32, 64 or 128 query heads, unpadded.
use shapeproof::ops::sparse_mla_decode::SparseMlaDecode;

fn main() {
    let _ = SparseMlaDecode::<24, 2048>::new();
}
