// The indexer's top-k is a multiple of 128 up to 2048 (its candidates live in shared memory).
use shapeproof::ops::indexer::LightningIndexer;

fn main() {
    let _ = LightningIndexer::<64, 4096>::new();
}
