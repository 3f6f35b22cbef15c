// DeepSeek V3.2 at TP8 has 16 query heads per rank; the sparse MLA prefill runs 64-head tiles,
// so the raw kernel type needs the padded count (64) and the real one (16) as `HEADS`.
use shapeproof::ops::sparse_mla::SparseMlaPrefill;

fn main() {
    let _kernel = SparseMlaPrefill::<576, 16, 2048>::new();
}
