// The k slice starts at element 1028: not a 16-byte vector boundary.
use shapeproof::ops::prologue::{InklingConv, Mxfp8Prologue, PackedRow, Verify};

fn main() {
    let _ = Mxfp8Prologue::<Verify, 1024, 128, PackedRow<1024, 128, 132>, InklingConv, 128>::new();
}
