// Seed: "interleaved K/V scale buffers with shape ...": planes built for 256-token pages given
// to a prologue that stores 128-token pages.
use shapeproof::backend::Cpu;
use shapeproof::layout::Mxfp8KvCache;
use shapeproof::ops::prologue::*;

type Row = PackedRow<1024, 128, 128>;

fn store(
    weights: &PrologueWeights<Cpu, 128, 128, InklingConv>,
    conv: &mut ConvState<Cpu, 128, InklingConv>,
    batch: &VerifyBatch<Cpu, Row>,
    windows: &mut VerifyWindows<Cpu, 128, InklingConv>,
    out: &mut Mxfp8Outputs<Cpu, 1024, 128>,
    kv: &mut Mxfp8KvCache<Cpu, 256, 128>,
) {
    let p = Mxfp8Prologue::<Verify, 1024, 128, Row, InklingConv, 128>::new();
    let _ = p.run(&Cpu, weights, conv, (batch, windows), PrologueTargets { out, kv, errors: None });
}

fn main() {}
