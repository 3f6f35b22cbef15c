// 64 query heads cannot be grouped over 12 KV heads.
shapeproof::model! {
    pub mod uneven_groups {
        num_attention_heads: 64,
        num_key_value_heads: 12,
        head_dim: 128,
        tensor_parallel: 4,
        kv_store: bf16,
    }
}

fn main() {}
