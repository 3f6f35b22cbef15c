//! Zero-copy interop with candle tensors: feature `candle` for candle's CPU backend, and
//! `candle-cuda` for its CUDA backend too.
//!
//! A candle tensor becomes a typed, checked view for the kernels, and a shapeproof tensor
//! becomes a candle tensor, without copying:
//!
//! - [`read`] locks a candle tensor's storage for reading; [`CandleRead::view`] (or `cpu`,
//!   `cuda`) then lends a [`TensorView`] after checking the device, the dtype, contiguity and
//!   the trailing shape (an `Err` names the parameter, the expected and the actual value).
//! - [`with_mut`] (or [`with_cpu_mut`], `with_cuda_mut`) runs a closure on a [`TensorViewMut`]
//!   of a candle tensor's storage, through candle's own in-place op protocol
//!   ([`candle_core::InplaceOp1`]): the way to write kernel outputs into candle-owned buffers
//!   (an engine's KV pool, a preallocated q).
//! - [`into_candle`] moves a shapeproof tensor's buffer into a candle tensor.
//! - [`CandleBackend::for_device`] gives the backend of a candle device: [`Cpu`], or a
//!   [`Cuda`](crate::backend::Cuda) backend on the device's own stream, so that kernels and
//!   candle's work are ordered on one stream and a graph captured from it holds both.
//!
//! E8M0 scales are lent from `F8E8M0` or `U8` tensors (candle's CUDA backend can create only
//! the latter) and come back as `F8E8M0`.

mod backend;
#[cfg(feature = "candle-cuda")]
mod cuda;
pub(crate) mod sealed {
    /// The seal of the candle traits (kept apart from the crate's other seal so that the
    /// crate's diagnostics do not change with the `candle` feature).
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot implement this trait of shapeproof: it is sealed",
        label = "only the library's own types implement it",
        note = "the kernels trust the views its implementations lend, so only the element types and backends the library checks implement it"
    )]
    pub trait Sealed {}
}
mod element;
mod layout;

pub use backend::CandleBackend;
pub use element::CandleElement;

use std::cell::RefCell;

use candle_core::{CpuStorage, Layout, StorageRef};

use crate::backend::Cpu;
#[cfg(feature = "candle-cuda")]
use crate::backend::Cuda;
use crate::error::Result;
use crate::tensor::{Owned, RowShape, Tensor, TensorView, TensorViewMut};
use layout::mismatch;

/// A candle tensor's storage, locked for reading while views of it exist.
pub struct CandleRead<'t> {
    param: &'static str,
    storage: StorageRef<'t>,
    layout: &'t Layout,
    dtype: candle_core::DType,
}

/// Locks `tensor`'s storage for reading; `param` names it in every error.
pub fn read<'t>(param: &'static str, tensor: &'t candle_core::Tensor) -> CandleRead<'t> {
    let (storage, layout) = tensor.storage_and_layout();
    CandleRead {
        param,
        storage,
        layout,
        dtype: tensor.dtype(),
    }
}

impl CandleRead<'_> {
    /// The tensor as rows of `R` for backend `B`: checked device, dtype `T`, contiguity and
    /// trailing shape (`[rows, …]` whose trailing dims multiply to `R::COLS`).
    pub fn view<B: CandleBackend, T: CandleElement, R: RowShape>(
        &self,
    ) -> Result<TensorView<'_, B, T, R>> {
        B::lend(self.param, &self.storage, self.dtype, self.layout)
    }

    /// [`CandleRead::view`] for the CPU backend.
    pub fn cpu<T: CandleElement, R: RowShape>(&self) -> Result<TensorView<'_, Cpu, T, R>> {
        self.view::<Cpu, T, R>()
    }

    /// [`CandleRead::view`] for the CUDA backend (a tensor of candle's CUDA backend).
    #[cfg(feature = "candle-cuda")]
    pub fn cuda<T: CandleElement, R: RowShape>(&self) -> Result<TensorView<'_, Cuda, T, R>> {
        self.view::<Cuda, T, R>()
    }
}

/// Runs `f` on a writable view of `tensor`'s storage for backend `B` (rows of `R`, dtype `T`,
/// checked as by [`CandleRead::view`]), through candle's in-place op protocol, and returns
/// what `f` returns. The storage is locked for writing while `f` runs; other candle tensors can
/// be read or written (by nesting calls) inside `f`, but not one sharing this storage
/// (`pool.i(1)` and `pool.i(2)` share `pool`'s), and this storage must not be held by a live
/// [`CandleRead`]: candle's lock is not reentrant, so that call would wait forever. (Keep one
/// [`CandleRead`] per storage too: candle's lock lets a waiting writer of another thread go
/// first, so a second read of the same storage on this thread could wait behind it.) Lend one view of the storage and carve it instead
/// (`Backend::chunks_exact_mut` on an owned pool, or one `with_mut` over the whole pool).
pub fn with_mut<B: CandleBackend, T: CandleElement, R: RowShape, Out>(
    param: &'static str,
    tensor: &candle_core::Tensor,
    f: impl FnOnce(TensorViewMut<'_, B, T, R>) -> Result<Out>,
) -> Result<Out> {
    let op = WithMut::<B, T, R, _, Out> {
        param,
        dtype: tensor.dtype(),
        f: RefCell::new(Some(f)),
        out: RefCell::new(None),
        _types: std::marker::PhantomData,
    };
    tensor
        .inplace_op1(&op)
        .map_err(|e| mismatch(param, "a tensor candle can lend for writing", e.to_string()))?;
    op.out.into_inner().unwrap_or_else(|| {
        Err(mismatch(
            param,
            "a tensor of the backend's device",
            "a tensor of another device",
        ))
    })
}

/// [`with_mut`] for the CPU backend.
pub fn with_cpu_mut<T: CandleElement, R: RowShape, Out>(
    param: &'static str,
    tensor: &candle_core::Tensor,
    f: impl FnOnce(TensorViewMut<'_, Cpu, T, R>) -> Result<Out>,
) -> Result<Out> {
    with_mut::<Cpu, T, R, Out>(param, tensor, f)
}

/// [`with_mut`] for the CUDA backend (a tensor of candle's CUDA backend).
#[cfg(feature = "candle-cuda")]
pub fn with_cuda_mut<T: CandleElement, R: RowShape, Out>(
    param: &'static str,
    tensor: &candle_core::Tensor,
    f: impl FnOnce(TensorViewMut<'_, Cuda, T, R>) -> Result<Out>,
) -> Result<Out> {
    with_mut::<Cuda, T, R, Out>(param, tensor, f)
}

/// The types an op lends (a marker: the op holds none of them).
type Lends<B, T, R> = std::marker::PhantomData<fn() -> (B, T, R)>;

/// The in-place op that lends a candle storage to a closure.
struct WithMut<B, T, R, F, Out> {
    param: &'static str,
    dtype: candle_core::DType,
    f: RefCell<Option<F>>,
    out: RefCell<Option<Result<Out>>>,
    _types: Lends<B, T, R>,
}

impl<B, T, R, F, Out> WithMut<B, T, R, F, Out> {
    fn take(&self) -> F {
        self.f.borrow_mut().take().expect("the op runs once")
    }
}

impl<B, T, R, F, Out> candle_core::InplaceOp1 for WithMut<B, T, R, F, Out>
where
    B: CandleBackend,
    T: CandleElement,
    R: RowShape,
    F: FnOnce(TensorViewMut<'_, B, T, R>) -> Result<Out>,
{
    fn name(&self) -> &'static str {
        "shapeproof-view"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let out = B::lend_cpu_mut(self.param, storage, self.dtype, layout, self.take());
        *self.out.borrow_mut() = Some(out);
        Ok(())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        storage: &mut candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<()> {
        let out = B::lend_cuda_mut(self.param, storage, self.dtype, layout, self.take());
        *self.out.borrow_mut() = Some(out);
        Ok(())
    }
}

/// A shapeproof tensor as a candle tensor of `shape` on `device` (whose element count must be
/// the tensor's), moving its buffer: no copy. A CUDA buffer must be on the device's stream
/// (made by [`CandleBackend::for_device`]'s backend).
pub fn into_candle<B: CandleBackend, T: CandleElement, R: RowShape>(
    param: &'static str,
    tensor: Tensor<B, T, R, Owned>,
    shape: impl Into<candle_core::Shape>,
    device: &candle_core::Device,
) -> Result<candle_core::Tensor> {
    let shape = shape.into();
    let len = tensor.rows() * R::COLS;
    if layout::product(shape.dims()) != Some(len) {
        return Err(mismatch(
            param,
            format!("a shape of {len} elements"),
            format!("{shape:?}"),
        ));
    }
    let storage = B::wrap(param, tensor.into_buffer(), device)?;
    Ok(candle_core::Tensor::from_storage(
        storage,
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    ))
}
