// Top-k widths are consumed two 64-token blocks at a time.
use shapeproof::ops::sparse_mla::SparseMlaPrefill;

fn main() {
    let _ = SparseMlaPrefill::<576, 64, 100>::new();
}
