//! Borrowed views on the CPU backend: kernels read and write ranges of the caller's
//! allocations exactly as they do owned tensors, and touch nothing outside the views.

mod common;

use shapeproof::backend::Cpu;

#[test]
fn prologue_writes_one_layer_of_a_pool_through_views() {
    let mut rng = common::rng("prologue_writes_one_layer_of_a_pool_through_views");
    common::views::prologue_through_views(&Cpu, &mut rng);
}

#[test]
fn sparse_mla_reads_and_writes_through_views() {
    let mut rng = common::rng("sparse_mla_reads_and_writes_through_views");
    common::views::sparse_mla_through_views(&Cpu, &mut rng);
}

#[test]
fn wrong_views_are_errors() {
    common::views::wrong_views_are_errors(&Cpu);
}
