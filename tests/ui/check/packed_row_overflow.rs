// A packed row that does not hold the kernel's slices is a type error that `cargo check`
// reports (this suite runs in check mode): the row is described by its widths, so an offset
// running past the row cannot be written at all, and a row of other widths is rejected here.
use shapeproof::ops::prologue::{InklingConv, Mxfp8Prologue, PackedRow, Verify};

fn main() {
    // q 1024 and k/v 128, but the row says k/v are 256 wide.
    let _ = Mxfp8Prologue::<Verify, 1024, 128, PackedRow<1024, 256, 128>, InklingConv, 128>::new();
}
