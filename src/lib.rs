//! # shapeproof
//!
//! The shape rules of GPU attention kernels, as types.
//!
//! An inference server checks at run time, on every call, that MXFP8 head dims are multiples of
//! 128, that the K/V scale buffers exist and have the shape `[pages, dkv/128, 32, page/32, 4]`,
//! that a sparse MLA head dim is 512 or 576, that query heads are padded to a multiple of 64 (here:
//! a head tile of 8, 16, 32 or a multiple of 64),
//! that top-k is a multiple of 128 — and a wrong model config fails in production. Here those
//! facts are const generics: [`ops::prologue::Mxfp8Prologue`] can only be built when its widths
//! are multiples of 128, a misconfigured model does not compile (the error names the value, the
//! rule and the fix), and the launch the type generates carries no alignment checks.
//!
//! - [`dim`]: static extents (`Dim<N>`) and named dynamic ones.
//! - [`rules`]: one trait per rule, with its diagnostic.
//! - [`dtype`]: bf16, e4m3, E8M0 and the MXFP8 codec.
//! - [`layout`]: the KV caches as types (paged bf16, MXFP8 with scale planes, MLA latent).
//! - [`tensor`]: typed tensors and the checked boundary.
//! - [`backend`]: the CPU reference and the CUDA backend (NVRTC JIT, typed launch).
//! - [`ops`]: the kernels: the Inkling attention prologue and the FP8 sparse MLA prefill.
//! - [`model!`]: a model's configuration in, its per-rank kernel and cache types out; a
//!   configuration that breaks a kernel rule does not compile.
//! - [`kernel`]: how to declare a kernel of your own, with its rules, CUDA source and CPU path.
//! - `candle` (features `candle`, `candle-cuda`): candle tensors as checked, zero-copy views and back.

// Kernel constructors carry the rules as where-clauses on `new`; a `Default` impl would restate
// them on a trait impl and give a second, less readable error path.
#![allow(clippy::new_without_default)]

pub mod backend;
#[cfg(feature = "candle")]
pub mod candle;
pub mod dim;
pub mod dtype;
pub mod error;
pub mod kernel;
pub mod layout;
pub mod model;
pub mod ops;
pub mod rules;
pub mod tensor;

pub use error::{Error, Result};

#[doc = include_str!("model.md")]
pub use shapeproof_macros::model;

/// Declares a shape rule of your own kernel: a marker trait on [`Dim<N>`](dim::Dim) with its
/// diagnostic, implemented for the values of a range (`for 32..=1024 step 32`) or a list
/// (`for [8, 16, 32]`). Bound a constructor by it (`where Dim<HD>: WarpHeadDim`) and a value
/// outside it is a compile error with your message, label and note (see [`kernel`]).
///
/// ```
/// shapeproof::dim_rule! {
///     /// A head dim one warp can normalize: 32 lanes × `HD / 32` channels.
///     pub trait WarpHeadDim for 32..=1024 step 32 {
///         message: "head dim `{Self}` is not a multiple of 32 between 32 and 1024",
///         label: "per-head RMSNorm needs HD = 32, 64, …, 1024",
///         note: "one warp normalizes one head; pad the head to a multiple of 32",
///     }
/// }
/// fn needs<const HD: usize>() where shapeproof::dim::Dim<HD>: WarpHeadDim {}
/// needs::<128>();
/// // needs::<100>() is error[E0277]: head dim `Dim<100>` is not a multiple of 32 between 32 and 1024
/// ```
pub use shapeproof_macros::dim_rule;

/// The names most programs need.
pub mod prelude {
    pub use crate::backend::{Backend, Cpu, Cuda};
    pub use crate::dim::Dim;
    pub use crate::dtype::{E8M0, F8E4M3, bf16};
    pub use crate::error::{Error, Result};
    pub use crate::layout::{MlaLatentKv, Mxfp8KvCache, PagedBf16Kv};
    pub use crate::tensor::{Cols, Scalar, Tensor};
}

/// The README's example, compiled as a doctest so it cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
