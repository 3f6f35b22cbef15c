// The MXFP8 scale planes need pages of whole 128-token tiles.
shapeproof::model! {
    pub mod inkling_small_pages {
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 128,
        tensor_parallel: 8,
        page_size: 64,
        kv_store: mxfp8,
    }
}

fn main() {}
