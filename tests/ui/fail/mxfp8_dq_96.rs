// The seed error "MXFP8 fused prologue requires head_dim-aligned Q/K/V": DQ = 96.
use shapeproof::ops::prologue::{InklingConv, Mxfp8Prologue, PackedRow, Verify};

fn main() {
    let _ = Mxfp8Prologue::<Verify, 96, 128, PackedRow<96, 128, 32>, InklingConv, 128>::new();
}
