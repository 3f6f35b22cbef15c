// The plain-slice call a backend trusts can only be assembled inside the crate.
use shapeproof::backend::Cpu;
use shapeproof::ops::sparse_mla::SparseMlaCall;
use shapeproof::ops::prologue::PrologueCall;

fn main() {
    let _call: Option<SparseMlaCall<'static, Cpu>> = None;
    let _call: Option<PrologueCall<'static, Cpu>> = None;
}
