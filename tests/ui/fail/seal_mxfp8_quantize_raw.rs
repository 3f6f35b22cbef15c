// The quantize kernel's backend entry is internal too: no way around `Mxfp8Quantize::new`'s
// width rule or `run`'s row checks.
use shapeproof::backend::Cpu;
use shapeproof::ops::mxfp8_quantize::RunMxfp8Quantize;

fn quantize<B: RunMxfp8Quantize>(b: &B) {
    b.mxfp8_quantize::<100>(todo!());
}

fn main() {
    quantize(&Cpu);
}
