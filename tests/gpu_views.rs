//! Borrowed views on the H200 (feature `gpu-tests`; fails without a GPU): one layer of a
//! `CudaSlice` pool carved with `chunks_exact_mut`, rows of a larger GEMM output, outputs in
//! the first rows of larger buffers; bytes equal to the owned run, nothing outside the views
//! changed. Run under compute-sanitizer by `scripts/gpu-run.sh sanitize`.
#![cfg(feature = "gpu-tests")]

mod common;

use shapeproof::backend::Cuda;

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

#[test]
fn prologue_writes_one_layer_of_a_pool_through_views() {
    let mut rng = common::rng("gpu prologue_writes_one_layer_of_a_pool_through_views");
    common::views::prologue_through_views(&gpu(), &mut rng);
}

#[test]
fn sparse_mla_reads_and_writes_through_views() {
    let mut rng = common::rng("gpu sparse_mla_reads_and_writes_through_views");
    common::views::sparse_mla_through_views(&gpu(), &mut rng);
}

#[test]
fn wrong_views_are_errors() {
    common::views::wrong_views_are_errors(&gpu());
}

#[test]
fn misaligned_views_are_errors() {
    let mut rng = common::rng("gpu misaligned_views_are_errors");
    common::views::misaligned_views_are_errors(&gpu(), &mut rng);
}
