// A user-declared kernel carries its own rule: per-head RMSNorm runs one warp per head, so the
// head dim must be a multiple of 32.
#[path = "../../../examples/kernels/head_rmsnorm.rs"]
#[allow(dead_code)]
mod head_rmsnorm;

fn main() {
    let _norm = head_rmsnorm::HeadRmsNorm::<8, 100>::new(1e-6);
}
