//! How to declare a kernel of your own.
//!
//! The library's kernels are built from four parts, and a kernel declared outside the library
//! uses the same four. `examples/user_kernel.rs` (with `examples/kernels/head_rmsnorm.rs` and
//! `.cu`) is a complete one: a per-head RMSNorm with a head-dim rule, a CUDA source, a CPU path,
//! and a comparison of the two on a GPU.
//!
//! # 1. The kernel type and its rules
//!
//! Static facts (head dims, widths, page sizes) are const generics of the kernel type. Each
//! rule is a marker trait on [`Dim<N>`](crate::dim::Dim) with `#[diagnostic::on_unimplemented]`
//! — the message names the value, the label states the rule, the note gives the reason and the
//! fix — implemented for exactly the values that satisfy it (a table: stable Rust cannot compute
//! `N % 32 == 0` in a bound). Mark the table's impls `#[diagnostic::do_not_recommend]` so the
//! error does not list them. Put the bounds on the constructor, not on the struct: one clean
//! `E0277` at the call.
//!
//! ```
//! use shapeproof::dim::Dim;
//!
//! /// A head dim one warp can normalize: 32 lanes × `HD / 32` channels.
//! #[diagnostic::on_unimplemented(
//!     message = "head dim `{Self}` is not a multiple of 32 between 32 and 1024",
//!     label = "per-head RMSNorm needs HD = 32, 64, …, 1024",
//!     note = "one warp normalizes one head; pad the head to a multiple of 32"
//! )]
//! pub trait WarpHeadDim {}
//! macro_rules! warp_head_dims {
//!     ($($k:literal)*) => {$(
//!         #[diagnostic::do_not_recommend]
//!         impl WarpHeadDim for Dim<{ $k * 32 }> {}
//!     )*};
//! }
//! warp_head_dims!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
//!
//! pub struct HeadRmsNorm<const HEADS: usize, const HD: usize> {
//!     eps: f32,
//! }
//! impl<const HEADS: usize, const HD: usize> HeadRmsNorm<HEADS, HD> {
//!     pub fn new(eps: f32) -> Self
//!     where
//!         Dim<HD>: WarpHeadDim,
//!     {
//!         Self { eps }
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
//! ([`RowShape`](crate::tensor::RowShape)) and whose row counts are checked against each other,
//! returning an [`Error`](crate::Error) that names the argument.
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
//! # 3. `impl CudaKernel`
//!
//! Mirror the parameter struct with [`param_block!`](crate::param_block) (device pointers as
//! `u64`, from [`Cuda::ptr`](crate::backend::Cuda::ptr)): a `#[repr(C)]` struct and its layout
//! table, which [`check_params`](crate::backend::cuda::check_params) proves equal to the CUDA
//! struct's with NVRTC `static_assert`s (run it in a test). Then implement
//! [`CudaKernel`](crate::backend::cuda::CudaKernel) on a type that carries the static dims: it
//! names the source and renders the template instantiation. The type is the key of the JIT
//! cache; [`Cuda::launch`](crate::backend::Cuda::launch) then compiles on first use and queues
//! one `cuLaunchKernel` with the parameter block, with no validation in the launch path (the
//! `unsafe` contract: every pointer addresses enough memory for the launch shape — which the
//! typed, row-checked arguments guarantee).
//!
//! ```ignore
//! shapeproof::param_block! {
//!     pub struct HeadRmsNormParams { x: u64, gamma: u64, out: u64, rows: i64, eps: f32 }
//! }
//!
//! pub struct HeadRmsNormKernel<const HEADS: usize, const HD: usize>;
//! impl<const HEADS: usize, const HD: usize> CudaKernel for HeadRmsNormKernel<HEADS, HD> {
//!     const SOURCE: &'static str = include_str!("head_rmsnorm.cu");
//!     type Params = HeadRmsNormParams;
//!     fn instantiation() -> String {
//!         format!("head_rmsnorm_kernel<{HEADS}, {HD}>")
//!     }
//! }
//! ```
//!
//! # 4. The CPU path, and the two doors
//!
//! Declare a `Run…` trait on [`Backend`](crate::backend::Backend) with one method, implement it
//! for [`Cpu`](crate::backend::Cpu) (plain Rust with the kernel's exact semantics, its
//! arithmetic in the same order where the results should agree bit for bit) and for
//! [`Cuda`](crate::backend::Cuda) (fill the parameter block, derive the launch shape, launch).
//! That method is the **raw door**: make it an `unsafe fn` whose `# Safety` section lists the
//! extents the kernel relies on, since it checks nothing. The kernel's `run` is the **safe
//! door**: it checks the runtime extents once (returning an [`Error`](crate::Error) that names
//! the argument) and then calls the raw entry inside `unsafe`, so the same typed call runs on
//! both backends, a test compares them, and no safe caller can reach the kernel with the wrong
//! extents. `examples/kernels/head_rmsnorm.rs` is written this way.
