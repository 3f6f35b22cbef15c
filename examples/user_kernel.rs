//! A kernel declared by a user of the library: per-head RMSNorm (`kernels/head_rmsnorm.rs`,
//! `kernels/head_rmsnorm.cu`).
//!
//! Runs the CPU path; when a CUDA GPU is present, also JIT-compiles the CUDA source with NVRTC,
//! runs it on the same inputs and compares the two bit for bit.
//!
//! ```text
//! cargo run --example user_kernel
//! ```
//!
//! The head-dim rule is a type: `HeadRmsNorm::<8, 100>::new(1e-6)` does not compile
//! ("head dim `Dim<100>` is not a multiple of 32 between 32 and 1024").

#[path = "kernels/head_rmsnorm.rs"]
mod head_rmsnorm;

use head_rmsnorm::HeadRmsNorm;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cpu, Cuda, cuda};
use shapeproof::kernel::Run;
use shapeproof::prelude::bf16;
use shapeproof::tensor::{Cols, Heads, Tensor};

/// Heads per row (Inkling's q heads on one of 8 ranks).
const HEADS: usize = 8;
/// Channels per head.
const HD: usize = 128;
/// Rows (tokens).
const ROWS: usize = 1000;

fn main() -> shapeproof::Result<()> {
    let norm = HeadRmsNorm::<HEADS, HD>::new(1e-6);

    let mut rng = StdRng::seed_from_u64(7);
    let x: Vec<bf16> = (0..ROWS * HEADS * HD)
        .map(|_| bf16::from_f32(rng.random_range(-4.0..4.0)))
        .collect();
    let gamma: Vec<bf16> = (0..HD)
        .map(|_| bf16::from_f32(rng.random_range(0.5..1.5)))
        .collect();

    let expected = run(&Cpu, &norm, &x, &gamma)?;
    println!(
        "cpu: normalized {ROWS} rows of {HEADS} heads × {HD} channels (first value {})",
        expected[0]
    );

    if !cuda::driver_present() {
        println!("no CUDA driver on this machine: CPU path only");
        return Ok(());
    }
    // SAFETY: a single-stream program: every buffer lives and is used on the backend's stream.
    let gpu = match unsafe { Cuda::new_untracked(0) } {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("no usable GPU ({e}): CPU path only");
            return Ok(());
        }
    };
    let got = run(&gpu, &norm, &x, &gamma)?;
    let mismatches = got
        .iter()
        .zip(&expected)
        .filter(|(g, e)| g.to_bits() != e.to_bits())
        .count();
    println!(
        "{}: {mismatches} of {} values differ from the CPU path",
        gpu.describe(),
        got.len()
    );
    if mismatches != 0 {
        eprintln!("the GPU and CPU paths disagree");
        std::process::exit(1);
    }
    Ok(())
}

/// Uploads the inputs to `backend`, runs the kernel, returns the output on the host.
fn run<B: Run<HeadRmsNorm<HEADS, HD>>>(
    backend: &B,
    norm: &HeadRmsNorm<HEADS, HD>,
    x: &[bf16],
    gamma: &[bf16],
) -> shapeproof::Result<Vec<bf16>> {
    let x = Tensor::<B, bf16, Heads<HEADS, HD>>::from_host(backend, "x", x, ROWS)?;
    let gamma = Tensor::<B, bf16, Cols<HD>>::from_host(backend, "gamma", gamma, 1)?;
    // Poisoned output: a row the kernel skips shows up as NaN.
    let mut out = Tensor::filled(backend, ROWS, bf16::NAN)?;
    norm.run(backend, &x, &gamma, &mut out)?;
    out.to_host(backend)
}
