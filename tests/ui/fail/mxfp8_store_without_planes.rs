// The seed error "requires K/V scale buffers": an MXFP8 prologue given a cache without scale
// planes (a bf16 paged cache) does not type-check.
use shapeproof::backend::Cpu;
use shapeproof::layout::PagedBf16Kv;
use shapeproof::ops::prologue::*;

type Row = PackedRow<1024, 128, 128>;

fn store(
    weights: &PrologueWeights<Cpu, 128, 128, InklingConv>,
    conv: &mut ConvState<Cpu, 128, InklingConv>,
    batch: &VerifyBatch<Cpu, Row>,
    windows: &mut VerifyWindows<Cpu, 128, InklingConv>,
    out: &mut Mxfp8Outputs<Cpu, 1024, 128>,
    kv: &mut PagedBf16Kv<Cpu, 128, 128>,
) {
    let p = Mxfp8Prologue::<Verify, 1024, 128, Row, InklingConv, 128>::new();
    let _ = p.run(&Cpu, weights, conv, (batch, windows), PrologueTargets { out, kv, errors: None });
}

fn main() {}
