//! The kernels' typed specs, one module per family, each with its CPU and CUDA backends.
//!
//! `mod.rs` of a family holds the kernel type (whose constructor carries the rules), its
//! argument structs and their boundary constructors; `cpu.rs` the reference; `cuda.rs` the
//! launch.

pub(crate) mod checked;
pub mod mxfp8_quantize;
pub mod prologue;
pub mod sparse_mla;
