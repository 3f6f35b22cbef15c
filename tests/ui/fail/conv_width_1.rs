// A conv of width 1 has no history.
use shapeproof::ops::prologue::{Conv, Mxfp8Prologue, PackedRow, Verify};

fn main() {
    let _ = Mxfp8Prologue::<Verify, 1024, 128, PackedRow<1408, 0, 1024, 1152>, Conv<1, false, true>, 128>::new();
}
