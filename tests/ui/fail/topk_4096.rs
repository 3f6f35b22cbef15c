// The top-k alone selects as the indexer does: a multiple of 128 up to 2048.
use shapeproof::ops::topk::TopK;

fn main() {
    let _ = TopK::<4096>::new();
}
