// 12 KV heads over 8 ranks: neither split nor replicated evenly.
use shapeproof::model::TensorParallel;

fn main() {
    let _ = TensorParallel::<8>::kv_heads_per_rank::<12>();
}
