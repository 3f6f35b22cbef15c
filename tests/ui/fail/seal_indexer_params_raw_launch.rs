// The prefill indexer's parameter block has public fields (a benchmark fills it for a raw
// launch), so safe code can write any address and extent into it; launching it is the
// `unsafe` door `DeviceArgs::launch`, whose `# Safety` contract those values must meet.
use shapeproof::backend::Cuda;
use shapeproof::backend::cuda::DeviceArgs;
use shapeproof::ops::indexer::{IndexerParams, LightningIndexerKernel, prefill_indexer_launch_shape};

fn main() {
    let cuda = Cuda::new(0).unwrap();
    let args = DeviceArgs::new(&cuda).unwrap();
    let params = IndexerParams {
        k: 0xdead_0000,
        tokens: 1 << 20,
        s_kv: i32::MAX,
        ..IndexerParams::default()
    };
    let shape = prefill_indexer_launch_shape(1 << 20, 64, 2048);
    args.launch::<LightningIndexerKernel<64, 2048>>(shape, &params).unwrap();
}
