// A misspelled key is an error, not a silently ignored setting.
shapeproof::model! {
    pub mod typo {
        num_attention_heads: 64,
        num_kv_heads: 8,
        head_dim: 128,
    }
}

fn main() {}
