// Planes for 2 KV heads (DKV 256) given to a layer with 1 KV head (DKV 128).
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
    kv: &mut Mxfp8KvCache<Cpu, 128, 256>,
) {
    let p = Mxfp8Prologue::<Verify, 1024, 128, Row, InklingConv, 128>::new();
    let _ = p.run(&Cpu, weights, conv, (batch, windows), PrologueTargets { out, kv, errors: None });
}

fn main() {}
