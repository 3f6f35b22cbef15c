//! Which shapeproof backend runs on which candle device, and how it borrows candle storage.

use candle_core::{CpuStorage, Device, Layout, Storage};

use super::element::CandleElement;
use super::layout::{Rows, mismatch};
use crate::backend::{Backend, Cpu};
use crate::error::Result;
use crate::tensor::{RowShape, TensorView, TensorViewMut};

/// A backend whose kernels can read and write candle storage in place: [`Cpu`] for candle's
/// CPU tensors and, with feature `candle-cuda`, [`Cuda`](crate::backend::Cuda) for its CUDA
/// tensors (on the device's own stream).
///
/// Sealed: the views it lends are trusted to cover exactly the checked elements.
pub trait CandleBackend: Backend + super::sealed::Sealed + Sized {
    /// The backend that runs on `device`; an `Err` when `device` is of another kind. For CUDA,
    /// a backend on the device's stream ([`CudaDevice::cuda_stream`]), so launches are ordered
    /// with candle's own work on it. Make it once per device and keep it. (`Device::new_cuda`
    /// gives candle's per-thread default stream, one stream per host thread: launch from the
    /// thread that runs the candle ops, or make the device with `Device::new_cuda_with_stream`.)
    ///
    /// [`CudaDevice::cuda_stream`]: candle_core::CudaDevice
    fn for_device(device: &Device) -> Result<Self>;

    /// Rows of `R` of `storage`, at the checked range of `layout`.
    #[doc(hidden)]
    fn lend<'s, T: CandleElement, R: RowShape>(
        param: &'static str,
        storage: &'s Storage,
        dtype: candle_core::DType,
        layout: &Layout,
    ) -> Result<TensorView<'s, Self, T, R>>;

    /// Runs `f` on rows of `R` of a CPU storage, writable.
    #[doc(hidden)]
    fn lend_cpu_mut<T: CandleElement, R: RowShape, Out>(
        param: &'static str,
        storage: &mut CpuStorage,
        dtype: candle_core::DType,
        layout: &Layout,
        f: impl FnOnce(TensorViewMut<'_, Self, T, R>) -> Result<Out>,
    ) -> Result<Out>;

    /// Runs `f` on rows of `R` of a CUDA storage, writable.
    #[doc(hidden)]
    #[cfg(feature = "candle-cuda")]
    fn lend_cuda_mut<T: CandleElement, R: RowShape, Out>(
        param: &'static str,
        storage: &mut candle_core::CudaStorage,
        dtype: candle_core::DType,
        layout: &Layout,
        f: impl FnOnce(TensorViewMut<'_, Self, T, R>) -> Result<Out>,
    ) -> Result<Out>;

    /// A candle storage owning `buffer` on `device`, moved, not copied.
    #[doc(hidden)]
    fn wrap<T: CandleElement>(
        param: &'static str,
        buffer: Self::Buffer<T>,
        device: &Device,
    ) -> Result<Storage>;
}

/// What a device is, in an `Err`.
pub(crate) fn device_name(device: &Device) -> String {
    match device {
        Device::Cpu => "the CPU".into(),
        other => format!("{:?}", other.location()),
    }
}

fn storage_name(storage: &Storage) -> &'static str {
    match storage {
        Storage::Cpu(_) => "a CPU tensor",
        Storage::Cuda(_) => "a CUDA tensor",
        Storage::Metal(_) => "a Metal tensor",
    }
}

impl CandleBackend for Cpu {
    fn for_device(device: &Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Cpu),
            other => Err(mismatch("device", "the CPU", device_name(other))),
        }
    }

    fn lend<'s, T: CandleElement, R: RowShape>(
        param: &'static str,
        storage: &'s Storage,
        dtype: candle_core::DType,
        layout: &Layout,
    ) -> Result<TensorView<'s, Self, T, R>> {
        let Storage::Cpu(cpu) = storage else {
            return Err(mismatch(param, "a CPU tensor", storage_name(storage)));
        };
        let all = T::cpu(cpu).ok_or_else(|| mismatch(param, T::EXPECTED, format!("{dtype:?}")))?;
        let rows = Rows::check::<T, R>(param, dtype, layout, all.len())?;
        TensorView::from_slice(param, &all[rows.range], rows.rows)
    }

    fn lend_cpu_mut<T: CandleElement, R: RowShape, Out>(
        param: &'static str,
        storage: &mut CpuStorage,
        dtype: candle_core::DType,
        layout: &Layout,
        f: impl FnOnce(TensorViewMut<'_, Self, T, R>) -> Result<Out>,
    ) -> Result<Out> {
        let all = T::cpu_mut(storage)
            .ok_or_else(|| mismatch(param, T::EXPECTED, format!("{dtype:?}")))?;
        let rows = Rows::check::<T, R>(param, dtype, layout, all.len())?;
        f(TensorViewMut::from_slice_mut(
            param,
            &mut all[rows.range],
            rows.rows,
        )?)
    }

    #[cfg(feature = "candle-cuda")]
    fn lend_cuda_mut<T: CandleElement, R: RowShape, Out>(
        param: &'static str,
        _: &mut candle_core::CudaStorage,
        _: candle_core::DType,
        _: &Layout,
        _: impl FnOnce(TensorViewMut<'_, Self, T, R>) -> Result<Out>,
    ) -> Result<Out> {
        Err(mismatch(param, "a CPU tensor", "a CUDA tensor"))
    }

    fn wrap<T: CandleElement>(
        param: &'static str,
        buffer: Vec<T>,
        device: &Device,
    ) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(T::cpu_storage(buffer))),
            other => Err(mismatch(param, "the CPU device", device_name(other))),
        }
    }
}

#[cfg(feature = "candle-cuda")]
mod cuda_backend {
    use candle_core::{CpuStorage, Device, Layout, Storage};
    use cudarc::driver::CudaSlice;

    use super::{CandleBackend, CandleElement, Rows, device_name, mismatch, storage_name};
    use crate::backend::Cuda;
    use crate::error::Result;
    use crate::tensor::{RowShape, TensorView, TensorViewMut};

    impl CandleBackend for Cuda {
        fn for_device(device: &Device) -> Result<Self> {
            match device {
                Device::Cuda(d) => Cuda::from_stream(d.cuda_stream()),
                other => Err(mismatch("device", "a CUDA device", device_name(other))),
            }
        }

        fn lend<'s, T: CandleElement, R: RowShape>(
            param: &'static str,
            storage: &'s Storage,
            dtype: candle_core::DType,
            layout: &Layout,
        ) -> Result<TensorView<'s, Self, T, R>> {
            let Storage::Cuda(cuda) = storage else {
                return Err(mismatch(param, "a CUDA tensor", storage_name(storage)));
            };
            let rows = Rows::check::<T, R>(param, dtype, layout, storage_len(cuda))?;
            let view = T::cuda(cuda, rows.range)
                .ok_or_else(|| mismatch(param, T::EXPECTED, format!("{dtype:?}")))?;
            TensorView::from_slice(param, view, rows.rows)
        }

        fn lend_cpu_mut<T: CandleElement, R: RowShape, Out>(
            param: &'static str,
            _: &mut CpuStorage,
            _: candle_core::DType,
            _: &Layout,
            _: impl FnOnce(TensorViewMut<'_, Self, T, R>) -> Result<Out>,
        ) -> Result<Out> {
            Err(mismatch(param, "a CUDA tensor", "a CPU tensor"))
        }

        fn lend_cuda_mut<T: CandleElement, R: RowShape, Out>(
            param: &'static str,
            storage: &mut candle_core::CudaStorage,
            dtype: candle_core::DType,
            layout: &Layout,
            f: impl FnOnce(TensorViewMut<'_, Self, T, R>) -> Result<Out>,
        ) -> Result<Out> {
            let rows = Rows::check::<T, R>(param, dtype, layout, storage_len(storage))?;
            let n = rows.rows;
            T::with_cuda_mut(storage, rows.range, |view| {
                f(TensorViewMut::from_slice_mut(param, view, n)?)
            })
            .unwrap_or_else(|| Err(mismatch(param, T::EXPECTED, format!("{dtype:?}"))))
        }

        fn wrap<T: CandleElement>(
            param: &'static str,
            buffer: CudaSlice<T>,
            device: &Device,
        ) -> Result<Storage> {
            let Device::Cuda(d) = device else {
                return Err(mismatch(param, "a CUDA device", device_name(device)));
            };
            let stream = d.cuda_stream();
            // Stream handles alone do not name a stream: the legacy and per-thread default
            // streams have the same handle in every context.
            let same_context = buffer.context().cu_ctx() == stream.context().cu_ctx();
            if !same_context || buffer.stream().cu_stream() != stream.cu_stream() {
                return Err(mismatch(
                    param,
                    format!("a buffer on the stream of {}", device_name(device)),
                    "a buffer of another stream or context",
                ));
            }
            Ok(Storage::Cuda(T::cuda_storage(buffer, d.clone())))
        }
    }

    /// Elements in a CUDA storage, whatever their dtype.
    fn storage_len(s: &candle_core::CudaStorage) -> usize {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        match &s.slice {
            S::U8(v) | S::F6E2M3(v) | S::F6E3M2(v) | S::F4(v) | S::F8E8M0(v) => v.len(),
            S::U32(v) => v.len(),
            S::I16(v) => v.len(),
            S::I32(v) => v.len(),
            S::I64(v) => v.len(),
            S::BF16(v) => v.len(),
            S::F16(v) => v.len(),
            S::F32(v) => v.len(),
            S::F64(v) => v.len(),
            S::F8E4M3(v) => v.len(),
        }
    }
}

impl super::sealed::Sealed for Cpu {}
#[cfg(feature = "candle-cuda")]
impl super::sealed::Sealed for crate::backend::Cuda {}
