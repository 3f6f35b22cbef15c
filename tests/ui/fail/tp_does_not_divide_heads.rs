// 48 heads cannot be split evenly over 32 ranks.
use shapeproof::model::TensorParallel;

fn main() {
    let _ = TensorParallel::<32>::heads_per_rank::<48>();
}
