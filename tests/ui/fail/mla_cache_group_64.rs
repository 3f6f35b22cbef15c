// The FP8 sparse MLA cache scales groups of 128 latent channels (64-channel groups are another
// format).
use shapeproof::ops::mla_cache::MlaCacheStore;

fn main() {
    let _ = MlaCacheStore::<64, 64>::new();
}
