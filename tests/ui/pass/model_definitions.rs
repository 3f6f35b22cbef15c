//! The three models of the library's examples, defined with `shapeproof::model!`, and their
//! per-rank geometry checked against the numbers of the kernel spec.

use shapeproof::backend::Cpu;
use shapeproof::ops::indexer::LightningIndexer;
use shapeproof::ops::sparse_mla_decode::SparseMlaDecode;
use shapeproof::ops::prologue::{Bf16Store, Decode, Extend, Mxfp8Store, Verify};
use shapeproof::ops::sparse_mla::WithLength;
use static_assertions::assert_type_eq_all;

shapeproof::model! {
    /// Inkling, 8-way tensor parallel, MXFP8 KV cache.
    pub mod inkling_tp8 {
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 128,
        conv_width: 4,
        rel_head_dim: 16,
        layers: {
            global: {},
            sliding: { num_key_value_heads: 16 },
        },
        tensor_parallel: 8,
        page_size: 128,
        kv_store: mxfp8,
    }

    /// Inkling on 4 ranks.
    pub mod inkling_tp4 {
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 128,
        layers: { global: {}, sliding: { num_key_value_heads: 16 } },
        tensor_parallel: 4,
        kv_store: mxfp8,
    }

    /// Inkling on one GPU.
    pub mod inkling_tp1 {
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 128,
        kv_store: mxfp8,
    }

    /// Inkling on 4 ranks again, from a JSON config (one file serves every deployment). In a
    /// crate the path is relative to the crate root; this test's crate is generated elsewhere,
    /// so the path is found relative to this file.
    pub mod inkling_json_tp4 {
        config: "../models/inkling.json",
        tensor_parallel: 4,
        kv_store: mxfp8,
    }

    /// DeepSeek V3.2, 8-way tensor parallel, from its Hugging Face config.
    pub mod deepseek_v32_tp8 {
        config: "../models/deepseek_v32.json",
        tensor_parallel: 8,
    }

    /// A model with 64-channel heads: `auto` gives it the bf16 store.
    pub mod small_hd64 {
        num_attention_heads: 16,
        num_key_value_heads: 4,
        head_dim: 64,
        tensor_parallel: 2,
        kv_store: auto,
    }
}

// Inkling TP8: global 8 / 1 heads, SWA 8 / 2.
const _: () = {
    use inkling_tp8::{global, sliding};
    assert!(global::HQ == 8 && global::HKV == 1);
    assert!(global::DQ == 1024 && global::DKV == 128 && global::ROW == 1408);
    assert!(global::K_OFF == 1024 && global::V_OFF == 1152 && global::REL_OFF == 1280);
    assert!(sliding::HQ == 8 && sliding::HKV == 2);
    assert!(sliding::DKV == 256 && sliding::ROW == 1664);
    assert!(inkling_tp4::global::HQ == 16 && inkling_tp4::global::HKV == 2);
    assert!(inkling_tp4::sliding::HKV == 4 && inkling_tp4::sliding::ROW == 3328);
    assert!(inkling_tp1::HQ == 64 && inkling_tp1::HKV == 8 && inkling_tp1::ROW == 11264);
};
assert_type_eq_all!(inkling_tp8::global::KvStore, Mxfp8Store<128>);
assert_type_eq_all!(inkling_json_tp4::global::Prologue<Verify>, inkling_tp4::global::Prologue<Verify>);
assert_type_eq_all!(inkling_json_tp4::sliding::Prologue<Decode>, inkling_tp4::sliding::Prologue<Decode>);

// DeepSeek V3.2 TP8: 16 heads per rank, run as one 16-head tile (not padded); d_qk 576, top-k 2048.
const _: () = {
    use deepseek_v32_tp8 as ds;
    assert!(ds::HEADS == 128 && ds::HQ == 16 && ds::HQ_PADDED == 16);
    // The softmax scale of its config: 1/sqrt(192) · (0.1 · ln 40 + 1)² = 0.13523.
    assert!(ds::SM_SCALE > 0.13522 && ds::SM_SCALE < 0.13524);
    assert!(ds::D_QK == 576 && ds::TOPK == 2048);
    // Its lightning indexer: 64 index heads (`index_n_heads`), the same top-k width.
    assert!(ds::INDEX_HEADS == 64);
};
assert_type_eq_all!(deepseek_v32_tp8::Indexer, LightningIndexer<64, 2048>);
// The decode runs the rank's 16 heads unpadded.
assert_type_eq_all!(deepseek_v32_tp8::Decode, SparseMlaDecode<16, 2048>);

// Head dim 64 with `auto`: the selector picks the bf16 store.
assert_type_eq_all!(small_hd64::KvStore, Bf16Store<128>);
const _: () = assert!(small_hd64::HQ == 8 && small_hd64::HKV == 2 && small_hd64::DQ == 512);

fn main() {
    let _ = inkling_tp8::global::Prologue::<Verify>::new();
    let _ = inkling_tp8::sliding::Prologue::<Extend>::new();
    let _ = inkling_tp1::DecodePrologue::new();
    let _ = small_hd64::Prologue::<Decode>::new();
    let _ = deepseek_v32_tp8::SparseMlaWith::<WithLength>::new();
    // Every generated alias is usable as `Alias::new()`, with no annotation.
    let _ = deepseek_v32_tp8::SparseMla::new();
    let _ = deepseek_v32_tp8::Indexer::new();
    let _ = deepseek_v32_tp8::TopK::new();
    let _ = deepseek_v32_tp8::Decode::new();
    let _ = inkling_tp8::global::VerifyPrologue::new();
    let _cache = inkling_tp8::sliding::KvCache::<Cpu>::zeros(&Cpu, 1).unwrap();
    let _cache = small_hd64::KvCache::<Cpu>::zeros(&Cpu, 1).unwrap();
}
