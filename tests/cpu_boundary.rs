//! The runtime boundary on the CPU backend: every extent a safe caller can get wrong is an
//! `Err` naming the argument (never a panic), and garbage index values never make the
//! reference panic (it skips what the device guards skip).

mod common;

use shapeproof::backend::Cpu;

#[test]
fn sparse_mla_extents_are_errors() {
    common::boundary::sparse_mla_extents(&Cpu);
}

#[test]
fn prologue_extents_are_errors() {
    common::boundary::prologue_extents(&Cpu);
}

#[test]
fn tensor_and_quantize_extents_are_errors() {
    common::boundary::tensor_and_quantize_extents(&Cpu);
}

#[test]
fn garbage_index_values_never_panic() {
    let mut rng = common::rng("garbage_index_values_never_panic");
    common::boundary::hostile_index_values(&Cpu, &mut rng);
}

#[test]
fn counter_wraps_and_empty_batches_count_nothing() {
    common::boundary::counter_wraps_and_empty_batches_count_nothing(&Cpu);
}
