// The bf16-store prologue is instantiated for head dims 64, 128 and 256 only.
use shapeproof::ops::prologue::{Bf16Prologue, InklingConv, PackedRow, Verify};

fn main() {
    let _ = Bf16Prologue::<Verify, 96, 768, 96, PackedRow<768, 96, 0>, InklingConv, 128>::new();
}
