// A relative-position head dim whose packed row would overflow is reported at its key (the
// row width is computed with checked arithmetic, not wrapped).
shapeproof::model! {
    pub mod huge_rel {
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 128,
        conv_width: 4,
        rel_head_dim: 18446744073709551615,
        tensor_parallel: 8,
        kv_store: bf16,
    }
}

fn main() {}
