// `kv_store: auto` picks a store by type; a head dim no store takes reports the head-dim rule.
use shapeproof::ops::prologue::PreferredStore;

fn main() {
    let _store: Option<PreferredStore<96, 128>> = None;
}
