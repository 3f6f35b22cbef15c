// MXFP8 with a 64-channel KV width.
use shapeproof::ops::prologue::{Decode, InklingConv, Mxfp8Prologue, PackedRow};

fn main() {
    let _ = Mxfp8Prologue::<Decode, 1024, 64, PackedRow<1024, 64, 128>, InklingConv, 128>::new();
}
