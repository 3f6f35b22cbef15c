// `GraphRead` is sealed: its conversion to a plain borrow takes a key only the crate can make,
// so a generic function bound on the public trait cannot turn a `Recorded` cache back into a
// `&` borrow to read it outside the graph while replays may be queued.
use shapeproof::backend::Cuda;
use shapeproof::backend::cuda::GraphRead;
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM};
use shapeproof::ops::mla_cache::{MlaCacheStore, MlaKvRows};
use shapeproof::tensor::Tensor;

fn peek<'g, T, R: GraphRead<'g, T>>(read: R) -> &'g T {
    read.into_ref()
}

fn step(gpu: &Cuda) -> shapeproof::Result<()> {
    let mut cache = DeepSeekV32KvCache::<Cuda>::zeros(gpu, 1)?;
    let rows = MlaKvRows::new(
        Tensor::from_host(gpu, "kv", &[bf16::ZERO; MLA_CACHE_DIM], 1)?,
        Tensor::from_host(gpu, "loc", &[0i64], 1)?,
    )?;
    let mut recorder = gpu.record_graph()?;
    let stored = MlaCacheStore::<64, 128>::new().record(&mut recorder, &rows, &mut cache, None)?;
    let cache = peek(stored);
    let graph = recorder.finish()?;
    graph.replay()?;
    let _bytes = cache.bytes().to_host(gpu)?;
    Ok(())
}

fn main() {
    let _ = step;
}
