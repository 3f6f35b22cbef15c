//! Shared test inputs: fresh random data (seed printed, `SHAPEPROOF_SEED` replays it) and
//! the prologue scenarios run identically on any backend.
#![allow(dead_code)]

pub mod boundary;
#[cfg(feature = "candle")]
pub mod candle;
pub mod index_cache;
pub mod indexer;
pub mod mla_cache;
pub mod prologue;
pub mod quantize;
pub mod sparse_mla;
pub mod topk;
pub mod views;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32};

/// A seeded generator: the seed comes from `SHAPEPROOF_SEED` or the clock, and is printed so a
/// failure can be replayed.
pub fn rng(test: &str) -> StdRng {
    let seed = std::env::var("SHAPEPROOF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{test}: SHAPEPROOF_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// The sum of `f(i)` over `0..n`, computed on every core (rayon): the exact references of the
/// GPU tests (a full logit row a token) take most of a test's time on one core. A panic in `f`
/// (a failed check) fails the caller with its message.
pub fn par_sum(n: usize, f: impl Fn(usize) -> usize + Sync + Send) -> usize {
    use rayon::prelude::*;
    (0..n).into_par_iter().map(f).sum()
}

/// `n` bf16 values drawn from N(mean, std²).
pub fn bf16_normal(rng: &mut StdRng, n: usize, mean: f32, std: f32) -> Vec<bf16> {
    let d = Normal::new(mean, std).unwrap();
    (0..n).map(|_| bf16::from_f32(d.sample(rng))).collect()
}

/// `n` e4m3 values: N(0, std²) cast to e4m3 (saturating).
pub fn e4m3_normal(rng: &mut StdRng, n: usize, std: f32) -> Vec<F8E4M3> {
    let d = Normal::new(0.0, std).unwrap();
    (0..n).map(|_| e4m3_from_f32(d.sample(rng))).collect()
}

/// `n` distinct values from `0..bound`, in random order.
pub fn distinct(rng: &mut StdRng, n: usize, bound: usize) -> Vec<usize> {
    assert!(n <= bound);
    let mut all: Vec<usize> = (0..bound).collect();
    for i in 0..n {
        let j = rng.random_range(i..bound);
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

/// Random bytes (for poisoning caches whose untouched parts must stay byte-identical).
pub fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random()).collect()
}

/// Largest |a - b| / (atol + rtol·|b|) over two bf16 slices (NaN anywhere fails with infinity).
pub fn worst_bf16(a: &[bf16], b: &[bf16], atol: f32, rtol: f32) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    let mut worst = (0.0f32, 0usize);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x.to_f32(), y.to_f32());
        let r = if x.is_nan() || y.is_nan() {
            f32::INFINITY
        } else {
            (x - y).abs() / (atol + rtol * y.abs())
        };
        if r > worst.0 {
            worst = (r, i);
        }
    }
    worst
}
