// A cache a graph's store writes comes back read-only for the graph's life, and only later
// `record`s can read it: a copy to the host (or any read outside the graph) in between would
// not be ordered after the graph's replays.
use shapeproof::backend::Cuda;
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::mla_cache::{MlaCacheStore, MlaKvRows};
use shapeproof::tensor::Tensor;

fn step(gpu: &Cuda) -> shapeproof::Result<()> {
    let mut cache = DeepSeekV32KvCache::<Cuda>::zeros(gpu, 1)?;
    let rows = MlaKvRows::new(
        Tensor::from_host(gpu, "kv", &[bf16::ZERO; MLA_CACHE_DIM], 1)?,
        Tensor::from_host(gpu, "loc", &[0i64], 1)?,
    )?;
    let mut recorder = gpu.record_graph()?;
    let stored = MlaCacheStore::<64, 128>::new().record(&mut recorder, &rows, &mut cache, None)?;
    let graph = recorder.finish()?;
    graph.replay()?;
    let _bytes = stored.bytes().to_host(gpu)?;
    Ok(())
}

fn main() {
    let _ = step;
}
