// A top-k width of 0 would launch no work.
use shapeproof::ops::sparse_mla::SparseMlaPrefill;

fn main() {
    let _ = SparseMlaPrefill::<512, 64, 0>::new();
}
