// 48 query heads per rank (e.g. 384 heads at TP8) are no head tile: the raw kernel type needs the
// tile that holds them (64) and the real count (48) as `HEADS`.
use shapeproof::ops::sparse_mla::SparseMlaPrefill;

fn main() {
    let _kernel = SparseMlaPrefill::<576, 48, 2048>::new();
}
