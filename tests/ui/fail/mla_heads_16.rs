// DeepSeek V3.2 at TP8 has 16 heads per rank: the raw kernel runs 64-head tiles.
use shapeproof::ops::sparse_mla::SparseMlaPrefill;

fn main() {
    let _ = SparseMlaPrefill::<576, 16, 2048>::new();
}
