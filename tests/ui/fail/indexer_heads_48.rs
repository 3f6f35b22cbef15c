// The lightning indexer runs 32 or 64 index heads.
use shapeproof::ops::indexer::LightningIndexer;

fn main() {
    let _ = LightningIndexer::<48, 2048>::new();
}
