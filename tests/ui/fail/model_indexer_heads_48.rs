// A DeepSeek-style model whose lightning indexer has 48 index heads: the indexer runs 32 or 64.
shapeproof::model! {
    pub mod dsa_48_index_heads {
        num_attention_heads: 128,
        kv_lora_rank: 512,
        qk_rope_head_dim: 64,
        index_topk: 2048,
        index_n_heads: 48,
        index_head_dim: 128,
        tensor_parallel: 8,
    }
}

fn main() {}
