//! Which candle storage holds which shapeproof element type.

use candle_core::{CpuStorage, DType};

use crate::backend::Element;
use crate::dtype::{E8M0, F8E4M3, bf16};

/// An element type shared with candle: the dtypes whose storage holds it, and its slice in a
/// [`CpuStorage`] (and, with feature `candle-cuda`, in a `CudaStorage`).
///
/// Sealed: the views it lends are trusted to hold exactly `Self` values.
pub trait CandleElement: Element + super::sealed::Sealed {
    /// The candle dtype a shapeproof tensor of this element becomes.
    const DTYPE: DType;
    /// What an `Err` says is expected (`"dtype BF16"`; E8M0 also accepts raw bytes).
    const EXPECTED: &'static str;
    /// Whether a candle tensor of `dtype` can be lent as elements of this type.
    fn accepts(dtype: DType) -> bool {
        dtype == Self::DTYPE
    }
    /// The elements of `s`, if it holds this type.
    fn cpu(s: &CpuStorage) -> Option<&[Self]>;
    /// The elements of `s`, mutably, if it holds this type.
    fn cpu_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// A storage owning `v` (moved, not copied).
    fn cpu_storage(v: Vec<Self>) -> CpuStorage;
    /// Elements `range` of `s`, if it holds this type and the range is inside it.
    #[cfg(feature = "candle-cuda")]
    fn cuda(
        s: &candle_core::CudaStorage,
        range: std::ops::Range<usize>,
    ) -> Option<cudarc::driver::CudaView<'_, Self>>;
    /// Runs `f` on elements `range` of `s`, mutably, if it holds this type and the range is
    /// inside it (a callback: a byte storage is lent as `E8M0` only while `f` runs).
    #[cfg(feature = "candle-cuda")]
    fn with_cuda_mut<Out>(
        s: &mut candle_core::CudaStorage,
        range: std::ops::Range<usize>,
        f: impl FnOnce(cudarc::driver::CudaViewMut<'_, Self>) -> Out,
    ) -> Option<Out>;
    /// A storage owning `slice` (moved, not copied).
    #[cfg(feature = "candle-cuda")]
    fn cuda_storage(
        slice: cudarc::driver::CudaSlice<Self>,
        device: candle_core::CudaDevice,
    ) -> candle_core::CudaStorage;
}

macro_rules! candle_element {
    ($($t:ty => $variant:ident, $expected:literal;)*) => {$(
        impl super::sealed::Sealed for $t {}
        impl CandleElement for $t {
            const DTYPE: DType = DType::$variant;
            const EXPECTED: &'static str = $expected;
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
            fn cpu_storage(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$variant(v)
            }
            #[cfg(feature = "candle-cuda")]
            fn cuda(
                s: &candle_core::CudaStorage,
                range: std::ops::Range<usize>,
            ) -> Option<cudarc::driver::CudaView<'_, Self>> {
                s.as_cuda_slice::<Self>().ok()?.try_slice(range)
            }
            #[cfg(feature = "candle-cuda")]
            fn with_cuda_mut<Out>(
                s: &mut candle_core::CudaStorage,
                range: std::ops::Range<usize>,
                f: impl FnOnce(cudarc::driver::CudaViewMut<'_, Self>) -> Out,
            ) -> Option<Out> {
                Some(f(s.as_cuda_slice_mut::<Self>().ok()?.try_slice_mut(range)?))
            }
            #[cfg(feature = "candle-cuda")]
            fn cuda_storage(
                slice: cudarc::driver::CudaSlice<Self>,
                device: candle_core::CudaDevice,
            ) -> candle_core::CudaStorage {
                candle_core::CudaStorage::wrap_cuda_slice(slice, device)
            }
        }
    )*};
}
candle_element! {
    bf16 => BF16, "dtype BF16";
    F8E4M3 => F8E4M3, "dtype F8E4M3";
    f32 => F32, "dtype F32";
    i32 => I32, "dtype I32";
    i64 => I64, "dtype I64";
    u8 => U8, "dtype U8";
    u32 => U32, "dtype U32";
}

impl super::sealed::Sealed for E8M0 {}

/// E8M0 scales are bytes: candle's `F8E8M0` (which candle stores as raw bytes) or `U8` (what an
/// engine on candle's CUDA backend allocates, since that backend cannot create `F8E8M0`).
/// Outputs become `F8E8M0` tensors.
impl CandleElement for E8M0 {
    const DTYPE: DType = DType::F8E8M0;
    const EXPECTED: &'static str = "dtype F8E8M0 or U8";
    fn accepts(dtype: DType) -> bool {
        matches!(dtype, DType::F8E8M0 | DType::U8)
    }
    fn cpu(s: &CpuStorage) -> Option<&[Self]> {
        match s {
            // SAFETY: `E8M0` is `#[repr(transparent)]` over `u8`.
            CpuStorage::F8E8M0(v) | CpuStorage::U8(v) => {
                Some(unsafe { &*(v.as_slice() as *const [u8] as *const [E8M0]) })
            }
            _ => None,
        }
    }
    fn cpu_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
        match s {
            // SAFETY: as above; every byte is a valid `E8M0`.
            CpuStorage::F8E8M0(v) | CpuStorage::U8(v) => {
                Some(unsafe { &mut *(v.as_mut_slice() as *mut [u8] as *mut [E8M0]) })
            }
            _ => None,
        }
    }
    fn cpu_storage(v: Vec<Self>) -> CpuStorage {
        let mut v = std::mem::ManuallyDrop::new(v);
        // SAFETY: `E8M0` is `#[repr(transparent)]` over `u8` (same size and alignment), so the
        // allocation, length and capacity are those of a `Vec<u8>`; `v` is not dropped.
        let bytes =
            unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<u8>(), v.len(), v.capacity()) };
        CpuStorage::F8E8M0(bytes)
    }
    #[cfg(feature = "candle-cuda")]
    fn cuda(
        s: &candle_core::CudaStorage,
        range: std::ops::Range<usize>,
    ) -> Option<cudarc::driver::CudaView<'_, Self>> {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        match &s.slice {
            S::F8E8M0(v) | S::U8(v) => {
                let bytes = v.try_slice(range)?;
                // SAFETY: bytes viewed as as many `E8M0` (`repr(transparent)` over `u8`).
                unsafe { bytes.transmute::<E8M0>(bytes.len()) }
            }
            _ => None,
        }
    }
    #[cfg(feature = "candle-cuda")]
    fn with_cuda_mut<Out>(
        s: &mut candle_core::CudaStorage,
        range: std::ops::Range<usize>,
        f: impl FnOnce(cudarc::driver::CudaViewMut<'_, Self>) -> Out,
    ) -> Option<Out> {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        match &mut s.slice {
            S::F8E8M0(v) | S::U8(v) => super::cuda::with_bytes_as_e8m0(v, range, f),
            _ => None,
        }
    }
    #[cfg(feature = "candle-cuda")]
    fn cuda_storage(
        slice: cudarc::driver::CudaSlice<Self>,
        device: candle_core::CudaDevice,
    ) -> candle_core::CudaStorage {
        let (len, stream) = (slice.len(), slice.stream().clone());
        // SAFETY: `leak` hands over the allocation (after ordering its pending uses on its
        // stream); `upgrade_device_ptr` takes it back as as many bytes on the same stream, which
        // now owns and frees it.
        let bytes = unsafe { stream.upgrade_device_ptr::<u8>(slice.leak(), len) };
        candle_core::CudaStorage {
            slice: candle_core::cuda_backend::CudaStorageSlice::F8E8M0(bytes),
            device,
        }
    }
}
