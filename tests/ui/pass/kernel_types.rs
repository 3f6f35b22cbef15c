// Valid configurations build: Inkling TP8 (global and SWA layers, MXFP8 store), a head-dim-64
// model with the bf16 store, DeepSeek V3.2 at TP8 (16 real heads padded to 64).
use shapeproof::backend::Cpu;
use shapeproof::layout::{MlaLatentKv, Mxfp8KvCache, PagedBf16Kv};
use shapeproof::model::TensorParallel;
use shapeproof::ops::prologue::{
    Bf16Prologue, Decode, Extend, InklingConv, Mxfp8Prologue, PackedRow, Verify,
};
use shapeproof::ops::sparse_mla::{SparseMlaPrefill, WithLengthAndSink};

type GlobalRow = PackedRow<1024, 128, 128>;
type SwaRow = PackedRow<1024, 256, 128>;

fn main() {
    let _ = Mxfp8Prologue::<Verify, 1024, 128, GlobalRow, InklingConv, 128>::new();
    let _ = Mxfp8Prologue::<Extend, 1024, 256, SwaRow, InklingConv, 128>::new();
    let _ = Mxfp8Prologue::<Decode, 1024, 256, SwaRow, InklingConv, 128>::new();
    let _ = Bf16Prologue::<Verify, 64, 512, 64, PackedRow<512, 64, 0>, InklingConv, 32>::new();
    let _ = SparseMlaPrefill::<576, 64, 2048, shapeproof::ops::sparse_mla::Plain, 16>::new();
    let _ = SparseMlaPrefill::<512, 64, 512, WithLengthAndSink>::new();
    let _ = Mxfp8KvCache::<Cpu, 128, 256>::zeros(&Cpu, 2).unwrap();
    let _ = PagedBf16Kv::<Cpu, 32, 64>::zeros(&Cpu, 2).unwrap();
    let _ = MlaLatentKv::<Cpu, 576>::new(&Cpu, vec![Default::default(); 576], 1, 1.0).unwrap();
    assert_eq!(TensorParallel::<8>::heads_per_rank::<64>(), 8);
}
