// 48 query heads cannot be split evenly over 32 ranks.
shapeproof::model! {
    pub mod wide_tp {
        num_attention_heads: 48,
        num_key_value_heads: 8,
        head_dim: 128,
        tensor_parallel: 32,
        kv_store: bf16,
    }
}

fn main() {}
