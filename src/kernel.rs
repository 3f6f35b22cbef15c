//! How to declare a kernel of your own.
//!
//! The library's kernels are built from four parts, and a kernel declared outside the library
//! uses the same four, with the same helpers (one import: [`prelude`]). `examples/user_kernel.rs` (with
//! `examples/kernels/head_rmsnorm.rs` and `.cu`) is a complete one: a per-head RMSNorm with a
//! head-dim rule, a CUDA source, a CPU path, and a comparison of the two on a GPU.
//!
//! # 1. The kernel type and its rules
//!
//! Static facts (head dims, widths, page sizes) are const generics of the kernel type. Each
//! rule is a marker trait on [`Dim<N>`](crate::dim::Dim) implemented for exactly the values
//! that satisfy it (stable Rust cannot compute `N % 32 == 0` in a bound), with a diagnostic
//! whose message names the value, whose label states the rule and whose note gives the reason
//! and the fix. [`dim_rule!`](crate::dim_rule) declares one from a range or a list. Put the
//! bounds on the constructor, not on the struct: one clean `E0277` at the call.
//!
//! ```
//! use shapeproof::dim::Dim;
//!
//! shapeproof::dim_rule! {
//!     /// A head dim one warp can normalize: 32 lanes × `HD / 32` channels.
//!     pub trait WarpHeadDim for 32..=1024 step 32 {
//!         message: "head dim `{Self}` is not a multiple of 32 between 32 and 1024",
//!         label: "per-head RMSNorm needs HD = 32, 64, …, 1024",
//!         note: "one warp normalizes one head; pad the head to a multiple of 32",
//!     }
//! }
//!
//! pub struct HeadRmsNorm<const HEADS: usize, const HD: usize>(f32);
//! impl<const HEADS: usize, const HD: usize> HeadRmsNorm<HEADS, HD> {
//!     pub fn new(eps: f32) -> Self
//!     where
//!         Dim<HD>: WarpHeadDim,
//!     {
//!         Self(eps)
//!     }
//! }
//!
//! let _ok = HeadRmsNorm::<8, 128>::new(1e-6);
//! // HeadRmsNorm::<8, 100>::new(1e-6) is error[E0277]:
//! //     head dim `Dim<100>` is not a multiple of 32 between 32 and 1024
//! ```
//!
//! Runtime extents (rows, tokens) are not types: tie them once where the caller's buffers
//! enter, with [`Tensor`](crate::tensor::Tensor)s whose row shape is static
//! ([`RowShape`](crate::tensor::RowShape); `Heads<H, HD>`, `Cols<N>`) and whose row counts are
//! checked against each other, returning an [`Error`](crate::Error) that names the argument.
//!
//! # 2. The CUDA source
//!
//! One file, compiled with NVRTC at first use for the device's architecture. The library
//! prepends `kernels/common.cuh` (the integer typedefs, `bf16_t`, bf16/e4m3 conversions in inline
//! PTX), so the file has no `#include` and uses no toolkit header. The kernel is a template over
//! the static dims and takes **one parameter struct by value**:
//!
//! ```text
//! struct HeadRmsNormParams { const bf16_t* x; const bf16_t* gamma; bf16_t* out; i64 rows; float eps; };
//!
//! template <int HEADS, int HD>
//! __global__ void head_rmsnorm_kernel(const HeadRmsNormParams p) { … }
//! ```
//!
//! # 3. The kernel's CUDA identity and its launch
//!
//! [`cuda_kernel!`](crate::cuda_kernel) declares the Rust mirror of the parameter struct (a
//! `#[repr(C)]` struct with a layout table, as [`param_block!`](crate::param_block)) and
//! implements [`CudaKernel`](crate::backend::cuda::CudaKernel) on the kernel type: the source and
//! the template instantiation its const parameters select. The type is the key of the JIT
//! cache. [`check_params`](crate::backend::cuda::check_params) proves the mirror's layout equal
//! to the CUDA struct's with NVRTC `static_assert`s (run it in a test).
//!
//! ```ignore
//! shapeproof::cuda_kernel! {
//!     impl CudaKernel for HeadRmsNorm<const HEADS: usize, const HD: usize> {
//!         source: include_str!("head_rmsnorm.cu"),
//!         instantiation: "head_rmsnorm_kernel<{HEADS}, {HD}>",
//!         params: pub struct HeadRmsNormParams { x: u64, gamma: u64, out: u64, rows: i64, eps: f32 },
//!     }
//! }
//! ```
//!
//! The launch goes through [`DeviceArgs`](crate::backend::cuda::DeviceArgs), as every launch
//! of the library does: each buffer is admitted into the parameter block (it must belong to the
//! backend's context and be ordered on its stream, or be synchronized with events; a view that
//! a kernel reads in 16-byte vectors must start aligned), then `launch` queues one
//! `cuLaunchKernel` under a [`LaunchShape`](crate::backend::cuda::LaunchShape). `launch` is
//! `unsafe`: the extents are the caller's promise.
//!
//! # 4. The call, the CPU path, and the two doors
//!
//! Implement [`Kernel`] on the kernel type: its **call** is a struct generic over the backend
//! holding one call's borrowed slices (`B::Slice`, `B::SliceMut`), with private fields, so
//! that only the kernel's own module can assemble one. Implement [`Run<K>`](Run) on
//! [`Cpu`](crate::backend::Cpu) (plain Rust with the kernel's exact semantics, its arithmetic
//! in the same order where the results should agree bit for bit) and on
//! [`Cuda`](crate::backend::Cuda) (part 3). `Run::enter` is the **raw door**: it checks
//! nothing, so it is `unsafe`, and the call's documentation lists the extents the kernel relies
//! on. The kernel's `run` is the **safe door**: generic over `B: Run<Self>`, it checks the
//! runtime extents once (returning an [`Error`](crate::Error) that names the argument) and then
//! enters the raw door inside `unsafe`, so the same typed call runs on both backends, a test
//! compares them, no safe caller can reach the kernel with the wrong extents, and code generic
//! over backends names one bound (`B: Run<HeadRmsNorm<8, 128>>`).

use crate::backend::Backend;
use crate::error::Result;

/// A kernel declared outside the library: the type of one call (its buffers and runtime
/// parameters) on a backend (see the
/// [module docs](self), part 4). The library's own families have the same parts, sealed
/// (`<Family>Call`, `<Family>Entry`).
pub trait Kernel {
    /// One call on backend `B`: borrowed buffers and runtime parameters, assembled only by the
    /// kernel's safe `run`.
    type Call<'a, B: Backend>;
}

/// A backend that runs kernel `K`: the raw door `K`'s safe `run` enters once the extents are
/// tied, and the bound that code generic over backends names.
pub trait Run<K: Kernel>: Backend + Sized {
    /// Runs one call of `K`.
    ///
    /// # Safety
    /// `call` has the extents `K`'s `run` ties, as the call type's documentation states them: a
    /// CUDA kernel checks no bound.
    unsafe fn enter(&self, call: K::Call<'_, Self>) -> Result<()>;
}

/// Everything a kernel declared outside the library names: the crate [`prelude`](crate::prelude),
/// the two traits of part 4, the launch helpers of part 3 and the row shape of per-head rows.
/// `use shapeproof::kernel::prelude::*;` is the one import of
/// `examples/kernels/head_rmsnorm.rs`.
pub mod prelude {
    pub use super::{Kernel, Run};
    pub use crate::backend::cuda::{DeviceArgs, LaunchShape};
    pub use crate::prelude::*;
    pub use crate::tensor::Heads;
}
