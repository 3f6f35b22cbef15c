//! The CUDA backend end to end on the smallest real kernel: context, NVRTC JIT (memory and
//! disk cache), typed launch, and MXFP8 bytes equal to the CPU encoder's. Compiled only with
//! `--features gpu-tests`; run on the H200 (`scripts/gpu-bundle.sh`). Without a GPU it fails.
#![cfg(feature = "gpu-tests")]

mod common;

use shapeproof::backend::{Backend, Cpu, Cuda};
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::ops::mxfp8_quantize::Mxfp8Quantize;
use shapeproof::tensor::{BlockScales, Cols, Tensor};

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

fn quantize<B: shapeproof::ops::mxfp8_quantize::RunMxfp8Quantize, const D: usize>(
    b: &B,
    input: &[bf16],
    rows: usize,
) -> (Vec<u8>, Vec<u8>)
where
    shapeproof::dim::Dim<D>: shapeproof::rules::Mxfp8Width,
{
    let x = Tensor::<B, bf16, Cols<D>>::from_host(b, "input", input, rows).unwrap();
    let mut data = Tensor::<B, F8E4M3, Cols<D>>::filled(b, rows, F8E4M3::from_bits(0x7F)).unwrap();
    let mut scales = Tensor::<B, E8M0, BlockScales<D>>::filled(b, rows, E8M0(0xFF)).unwrap();
    Mxfp8Quantize::<D>::new()
        .run(b, &x, &mut data, &mut scales)
        .unwrap();
    (
        data.to_host(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        scales.to_host(b).unwrap().iter().map(|s| s.0).collect(),
    )
}

#[test]
fn device_is_hopper() {
    let g = gpu();
    eprintln!("device: {}", g.describe());
    assert_eq!(g.arch().as_str(), "sm_90a");
}

/// Random rows of many magnitudes, plus every edge the encoder has: zero blocks, infinities,
/// NaN, block maxima at 448·2^k and one bf16 ulp around it, subnormal magnitudes.
#[test]
fn mxfp8_quantize_matches_cpu_encoder_bytes() {
    let g = gpu();
    let mut rng = common::rng("mxfp8_quantize_matches_cpu_encoder_bytes");
    const D: usize = 1024;
    let rows = 4096;
    let mut x: Vec<bf16> = Vec::with_capacity(rows * D);
    for r in 0..rows {
        let scale = 2f32.powi((r % 60) as i32 - 30);
        x.extend(common::bf16_normal(&mut rng, D, 0.0, scale));
    }
    // Edge blocks in row 0.
    x[..32].fill(bf16::ZERO);
    x[32] = bf16::INFINITY;
    x[64] = bf16::NEG_INFINITY;
    x[96] = bf16::NAN;
    for (i, k) in (-20..20).enumerate() {
        let base = 448.0 * 2f32.powi(k);
        let b = bf16::from_f32(base);
        for (j, v) in [
            b,
            bf16::from_bits(b.to_bits() + 1),
            bf16::from_bits(b.to_bits() - 1),
        ]
        .into_iter()
        .enumerate()
        {
            let block = 128 + (3 * i + j) * 32;
            x[D + block] = v;
        }
    }
    x[2 * D..2 * D + 32].fill(bf16::from_bits(0x0001)); // smallest subnormal bf16
    let (gd, gs) = quantize::<Cuda, D>(&g, &x, rows);
    let (cd, cs) = quantize::<Cpu, D>(&Cpu, &x, rows);
    let bad_scales = gs.iter().zip(&cs).filter(|(a, b)| a != b).count();
    let bad_data = gd.iter().zip(&cd).filter(|(a, b)| a != b).count();
    assert_eq!(
        (bad_scales, bad_data),
        (0, 0),
        "scale and data bytes differing from the CPU encoder"
    );
}

/// A second backend instance finds the compiled kernel in the disk cache.
#[test]
fn disk_cache_round_trip() {
    let dir = std::env::temp_dir().join(format!("shapeproof-cache-test-{}", std::process::id()));
    // SAFETY: set before any other thread of this test reads the variable.
    unsafe { std::env::set_var("SHAPEPROOF_CACHE_DIR", &dir) };
    let g = gpu();
    g.precompile::<shapeproof::ops::mxfp8_quantize::Mxfp8QuantizeKernel<256>>()
        .unwrap();
    let entries = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "kernel"))
                .count()
        })
        .unwrap_or(0);
    assert!(entries >= 1, "expected a kernel entry in {}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
}
