// DQ must be whole heads even with the bf16 store: 1000 is not a multiple of 128.
use shapeproof::ops::prologue::{Bf16Prologue, InklingConv, PackedRow, Verify};

fn main() {
    let _ = Bf16Prologue::<Verify, 128, 1000, 128, PackedRow<1000, 128, 8>, InklingConv, 128>::new();
}
