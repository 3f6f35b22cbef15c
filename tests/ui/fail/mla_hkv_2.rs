// The latent KV has one shared head: there is no way to ask for two.
use shapeproof::backend::Cpu;
use shapeproof::layout::MlaLatentKv;

fn main() {
    let _kv: Option<MlaLatentKv<Cpu, 576, 2>> = None;
}
