// A JSON config whose RoPE width gives a q·k head dim the sparse MLA prefill does not support.
shapeproof::model! {
    pub mod mla_rope_128 {
        config: "../models/mla_rope_128.json",
        tensor_parallel: 8,
    }
}

fn main() {}
