// A cache a graph's store writes comes back as a `Recorded`, which converts into the
// `GraphRead` a later `record` takes, and into nothing else: its borrow is private, so it
// cannot be turned back into a `&` to read the cache outside the graph while replays may be
// queued.
use shapeproof::backend::Cuda;
use shapeproof::backend::cuda::GraphRead;
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::mla_cache::{MlaCacheStore, MlaKvRows};
use shapeproof::tensor::Tensor;

fn peek<'g, T>(read: GraphRead<'g, T>) -> &'g T {
    read.0
}

fn step(gpu: &Cuda) -> shapeproof::Result<()> {
    let mut cache = DeepSeekV32KvCache::<Cuda>::zeros(gpu, 1)?;
    let rows = MlaKvRows::new(
        Tensor::from_host(gpu, "kv", &[bf16::ZERO; MLA_CACHE_DIM], 1)?,
        Tensor::from_host(gpu, "loc", &[0i64], 1)?,
    )?;
    let mut recorder = gpu.record_graph()?;
    let stored = MlaCacheStore::<64, 128>::new().record(&mut recorder, &rows, &mut cache, None)?;
    let cache = peek(stored.into());
    let graph = recorder.finish()?;
    graph.replay()?;
    let _bytes = cache.bytes().to_host(gpu)?;
    Ok(())
}

fn main() {
    let _ = step;
}
