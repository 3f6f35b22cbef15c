//! Zero-copy interop with candle tensors (feature `candle`, candle-core's CPU backend).
//!
//! A candle tensor becomes a typed, checked view for the kernels, and a shapeproof tensor
//! becomes a candle tensor, without copying:
//!
//! - [`read`] locks a candle tensor's storage for reading; [`CandleRead::cpu`] then lends a
//!   [`TensorView`] after checking the device, the dtype, contiguity and the trailing shape (an
//!   `Err` names the parameter, the expected and the actual value).
//! - [`with_cpu_mut`] runs a closure on a [`TensorViewMut`] of a candle tensor's storage,
//!   through candle's own in-place op protocol ([`candle_core::InplaceOp1`]): the way to write
//!   kernel outputs into candle-owned buffers (an engine's KV pool, a preallocated q).
//! - [`into_candle`] moves a shapeproof CPU tensor's `Vec` into a candle tensor.
//!
//! The CUDA half (views of `CudaStorage::as_cuda_slice`, a backend on
//! `CudaDevice::cuda_stream`) needs candle-core's `cuda` feature, which links cudarc
//! dynamically, while this crate loads it at run time: cudarc refuses both at once.

use std::cell::RefCell;

use candle_core::{CpuStorage, DType, Layout, Storage, StorageRef};

use crate::backend::{Cpu, Element};
use crate::dtype::{E8M0, F8E4M3, bf16};
use crate::error::{Error, Result};
use crate::tensor::{Owned, RowShape, Tensor, TensorView, TensorViewMut};

/// An element type shared with candle: its dtype and its slice in a [`CpuStorage`].
pub trait CandleElement: Element {
    /// candle's dtype of this element.
    const DTYPE: DType;
    /// The elements of `s`, if it holds this dtype.
    fn cpu(s: &CpuStorage) -> Option<&[Self]>;
    /// The elements of `s`, mutably, if it holds this dtype.
    fn cpu_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// A storage owning `v`.
    fn storage(v: Vec<Self>) -> CpuStorage;
}

macro_rules! candle_element {
    ($($t:ty => $dtype:ident, $variant:ident;)*) => {$(
        impl CandleElement for $t {
            const DTYPE: DType = DType::$dtype;
            fn cpu(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn cpu_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn storage(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$variant(v)
            }
        }
    )*};
}
candle_element! {
    bf16 => BF16, BF16;
    F8E4M3 => F8E4M3, F8E4M3;
    f32 => F32, F32;
    i32 => I32, I32;
    i64 => I64, I64;
    u8 => U8, U8;
    u32 => U32, U32;
}

/// E8M0 scales are candle's `F8E8M0`, stored as raw bytes.
impl CandleElement for E8M0 {
    const DTYPE: DType = DType::F8E8M0;
    fn cpu(s: &CpuStorage) -> Option<&[Self]> {
        match s {
            // SAFETY: `E8M0` is `#[repr(transparent)]` over `u8`.
            CpuStorage::F8E8M0(v) => {
                Some(unsafe { &*(v.as_slice() as *const [u8] as *const [E8M0]) })
            }
            _ => None,
        }
    }
    fn cpu_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
        match s {
            // SAFETY: as above; every byte is a valid `E8M0`.
            CpuStorage::F8E8M0(v) => {
                Some(unsafe { &mut *(v.as_mut_slice() as *mut [u8] as *mut [E8M0]) })
            }
            _ => None,
        }
    }
    fn storage(v: Vec<Self>) -> CpuStorage {
        CpuStorage::F8E8M0(v.into_iter().map(|e| e.0).collect())
    }
}

fn mismatch(param: &'static str, expected: impl Into<String>, actual: impl Into<String>) -> Error {
    Error::Mismatch {
        param,
        expected: expected.into(),
        actual: actual.into(),
    }
}

/// Checks dtype, contiguity and trailing shape; returns `(first element, rows)`.
fn check_layout<T: CandleElement, R: RowShape>(
    param: &'static str,
    dtype: DType,
    layout: &Layout,
) -> Result<(usize, usize)> {
    if dtype != T::DTYPE {
        return Err(mismatch(
            param,
            format!("dtype {:?}", T::DTYPE),
            format!("{dtype:?}"),
        ));
    }
    if !layout.is_contiguous() {
        return Err(mismatch(
            param,
            "a contiguous tensor",
            format!(
                "strides {:?} for shape {:?}",
                layout.stride(),
                layout.dims()
            ),
        ));
    }
    // Rows are the leading dims, a row the trailing dims whose product is `R::COLS`
    // (`[T, HQ, 4]` and `[T, HQ·4]` are both rows of `HQ·4` scales; `[HD]` is one row).
    let dims = layout.dims();
    let split = (0..=dims.len())
        .rev()
        .find(|&k| dims[k..].iter().product::<usize>() == R::COLS);
    let Some(split) = split else {
        return Err(mismatch(
            param,
            format!(
                "rows of {} elements (trailing dims multiplying to {})",
                R::COLS,
                R::COLS
            ),
            format!("shape {dims:?}"),
        ));
    };
    let rows: usize = dims[..split].iter().product();
    Ok((layout.start_offset(), rows))
}

fn cpu_storage<'s>(param: &'static str, storage: &'s Storage) -> Result<&'s CpuStorage> {
    match storage {
        Storage::Cpu(s) => Ok(s),
        Storage::Cuda(_) => Err(mismatch(param, "a CPU tensor", "a CUDA tensor")),
        Storage::Metal(_) => Err(mismatch(param, "a CPU tensor", "a Metal tensor")),
    }
}

/// A candle tensor's storage, locked for reading while views of it exist.
pub struct CandleRead<'t> {
    param: &'static str,
    storage: StorageRef<'t>,
    layout: &'t Layout,
    dtype: DType,
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
    /// The tensor as rows of `R` on the CPU backend: checked device, dtype `T`, contiguity and
    /// trailing shape (`[rows, …]` whose trailing dims multiply to `R::COLS`).
    pub fn cpu<T: CandleElement, R: RowShape>(&self) -> Result<TensorView<'_, Cpu, T, R>> {
        let (start, rows) = check_layout::<T, R>(self.param, self.dtype, self.layout)?;
        let all = T::cpu(cpu_storage(self.param, &self.storage)?).ok_or_else(|| {
            mismatch(
                self.param,
                format!("dtype {:?}", T::DTYPE),
                format!("{:?}", self.dtype),
            )
        })?;
        let len = Error::elements(self.param, rows, R::COLS)?;
        let slice = all.get(start..start + len).ok_or_else(|| {
            mismatch(
                self.param,
                format!("{len} elements from {start}"),
                format!("a storage of {}", all.len()),
            )
        })?;
        TensorView::from_slice(self.param, slice, rows)
    }
}

/// Runs `f` on a writable view of `tensor`'s CPU storage (rows of `R`, dtype `T`, checked as
/// by [`CandleRead::cpu`]), through candle's in-place op protocol, and returns what `f`
/// returns. The storage is locked for writing while `f` runs; other candle tensors can be read
/// or written (by nesting calls) inside `f`, but not one sharing this storage (`pool.i(1)` and
/// `pool.i(2)` share `pool`'s): candle's lock is not reentrant, so that call would wait
/// forever. Lend one view of the storage and carve it instead (`Backend::chunks_exact_mut` on
/// an owned pool, or one `with_cpu_mut` over the whole pool).
pub fn with_cpu_mut<T: CandleElement, R: RowShape, Out>(
    param: &'static str,
    tensor: &candle_core::Tensor,
    f: impl FnOnce(TensorViewMut<'_, Cpu, T, R>) -> Result<Out>,
) -> Result<Out> {
    let op = WithCpuMut::<T, R, _, Out> {
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
            "a CPU tensor",
            "a tensor of another device",
        ))
    })
}

/// The in-place op that lends a candle storage to a closure.
struct WithCpuMut<T, R, F, Out> {
    param: &'static str,
    dtype: DType,
    f: RefCell<Option<F>>,
    out: RefCell<Option<Result<Out>>>,
    _types: std::marker::PhantomData<fn() -> (T, R)>,
}

impl<T, R, F, Out> candle_core::InplaceOp1 for WithCpuMut<T, R, F, Out>
where
    T: CandleElement,
    R: RowShape,
    F: FnOnce(TensorViewMut<'_, Cpu, T, R>) -> Result<Out>,
{
    fn name(&self) -> &'static str {
        "shapeproof-view"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let result = (|| {
            let (start, rows) = check_layout::<T, R>(self.param, self.dtype, layout)?;
            let all = T::cpu_mut(storage).ok_or_else(|| {
                mismatch(
                    self.param,
                    format!("dtype {:?}", T::DTYPE),
                    format!("{:?}", self.dtype),
                )
            })?;
            let len = Error::elements(self.param, rows, R::COLS)?;
            let total = all.len();
            let slice = all.get_mut(start..start + len).ok_or_else(|| {
                mismatch(
                    self.param,
                    format!("{len} elements from {start}"),
                    format!("a storage of {total}"),
                )
            })?;
            let view = TensorViewMut::from_slice_mut(self.param, slice, rows)?;
            let f = self.f.borrow_mut().take().expect("the op runs once");
            f(view)
        })();
        *self.out.borrow_mut() = Some(result);
        Ok(())
    }
}

/// A shapeproof CPU tensor as a candle tensor of `shape` (whose element count must be the
/// tensor's), moving its `Vec`: no copy.
pub fn into_candle<T: CandleElement, R: RowShape>(
    param: &'static str,
    tensor: Tensor<Cpu, T, R, Owned>,
    shape: impl Into<candle_core::Shape>,
) -> Result<candle_core::Tensor> {
    let shape = shape.into();
    let len = tensor.rows() * R::COLS;
    if shape.elem_count() != len {
        return Err(mismatch(
            param,
            format!("a shape of {len} elements"),
            format!("{shape:?}"),
        ));
    }
    let storage = Storage::Cpu(T::storage(tensor.into_buffer()));
    Ok(candle_core::Tensor::from_storage(
        storage,
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    ))
}
