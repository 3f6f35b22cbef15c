//! The kernels' typed specs, one module per family, each with its CPU and CUDA backends.
//!
//! Every family has the same files (`docs/ARCHITECTURE.md`, "Op family template"): `mod.rs`
//! the kernel type, its rules and the safe `run`; `args.rs` the checked argument structs
//! (declared with `checked_struct!`, `src/ops/checked.rs`); `launch.rs` the sealed `<Family>Entry` and its
//! `<Family>Call`; `cpu.rs` the reference; `cuda.rs` the launch and the CUDA-only `record` and
//! `launch_plan`. Only `cuda.rs` names CUDA types.

pub(crate) mod checked;
pub mod counter;
pub mod index_cache;
pub mod indexer;
pub mod mla_cache;
pub mod mxfp8_quantize;
pub mod prologue;
pub mod sparse_mla;
pub mod sparse_mla_decode;
pub mod topk;
