// A conv of width 1 has no history.
use shapeproof::ops::prologue::{Conv, Mxfp8Prologue, PackedRow, Verify};

fn main() {
    let _ = Mxfp8Prologue::<Verify, 1024, 128, PackedRow<1024, 128, 128>, Conv<1, false, true>, 128>::new();
}
