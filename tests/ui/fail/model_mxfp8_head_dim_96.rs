// An Inkling-like model with 96-channel heads cannot use the MXFP8 KV store.
shapeproof::model! {
    pub mod inkling_hd96 {
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 96,
        layers: { global: {}, sliding: { num_key_value_heads: 16 } },
        tensor_parallel: 8,
        kv_store: mxfp8,
    }
}

fn main() {}
