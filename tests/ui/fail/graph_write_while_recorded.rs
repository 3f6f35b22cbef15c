// While a graph can replay, the tensors it writes stay borrowed: the caller cannot write,
// read or swap them in between (the replay would race, or hit the old allocation).
use shapeproof::backend::Cuda;
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::ops::mxfp8_quantize::Mxfp8Quantize;
use shapeproof::tensor::{BlockScales, Cols, Tensor};

fn step(gpu: &Cuda) -> shapeproof::Result<()> {
    let input = Tensor::<Cuda, bf16, Cols<128>>::zeros(gpu, 4)?;
    let mut data = Tensor::<Cuda, F8E4M3, Cols<128>>::zeros(gpu, 4)?;
    let mut scales = Tensor::<Cuda, E8M0, BlockScales<128>>::zeros(gpu, 4)?;
    let mut recorder = gpu.record_graph()?;
    Mxfp8Quantize::<128>::new().record(&mut recorder, &input, &mut data, &mut scales)?;
    let graph = recorder.finish()?;
    scales.write(gpu, &[E8M0(127); 16])?;
    graph.replay()
}

fn main() {
    let _ = step;
}
