//! The CUDA backend: a context and stream on one GPU, the NVRTC JIT cache, typed launches.
//!
//! Creating it never panics: without a driver it returns [`Error::NoDriver`]. All work is queued
//! on the backend's one stream, so buffers need no cross-stream events: cudarc's event tracking
//! is switched off, which keeps launches free of per-argument event records.

mod jit;
mod launch;

pub use jit::{Arch, CompiledKernel, KernelCache, compile_kernel};
pub(crate) use launch::DeviceArgs;
pub use launch::{CudaKernel, LaunchShape};

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, sys};

use super::{Backend, Buffer, Element};
use crate::error::{Error, Result};

/// Whether a CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// Whether the NVRTC library can be loaded on this machine.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// One GPU: its context, the stream all work goes to, and the kernels loaded on it.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: Arch,
    name: String,
    cache: KernelCache,
    loaded: Mutex<HashMap<TypeId, launch::LoadedKernel>>,
}

impl Cuda {
    /// Opens GPU `ordinal` with a new stream; fails cleanly when there is no driver or the
    /// device is not a Hopper (sm_90) GPU.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: every buffer of this backend is used on `stream` only, so stream-ordering is
        // all the synchronization they need.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability()?;
        let name = ctx.name()?;
        let arch = Arch::from_compute_capability(major, minor).ok_or(Error::UnsupportedDevice {
            name: name.clone(),
            major,
            minor,
        })?;
        let stream = ctx.new_stream()?;
        Ok(Self {
            ctx,
            stream,
            arch,
            name,
            cache: KernelCache::from_env(),
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The stream all of this backend's work is queued on (for graph capture and events).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The architecture kernels are compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The raw device address of a buffer, for a kernel's parameter block.
    pub fn ptr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        // Event tracking is off, so the returned guard records nothing.
        let (ptr, _guard) = buf.device_ptr(&self.stream);
        ptr
    }

    /// Compiles (or finds in the cache) and loads kernel `K`, ahead of its first launch.
    pub fn precompile<K: CudaKernel>(&self) -> Result<()> {
        self.function::<K>().map(|_| ())
    }
}

impl<T> Buffer<T> for CudaSlice<T> {
    fn len(&self) -> usize {
        CudaSlice::len(self)
    }
}
impl<T> Buffer<T> for CudaView<'_, T> {
    fn len(&self) -> usize {
        CudaView::len(self)
    }
}
impl<T> Buffer<T> for CudaViewMut<'_, T> {
    fn len(&self) -> usize {
        CudaViewMut::len(self)
    }
}

impl Backend for Cuda {
    type Buffer<T: Element> = CudaSlice<T>;
    type Slice<'a, T: Element> = CudaView<'a, T>;
    type SliceMut<'a, T: Element> = CudaViewMut<'a, T>;

    fn zeros<T: Element>(&self, len: usize) -> Result<CudaSlice<T>> {
        Ok(self.stream.alloc_zeros::<T>(len)?)
    }

    fn upload<T: Element>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        Ok(self.stream.clone_htod(host)?)
    }

    fn write<T: Element>(&self, buf: &mut CudaSlice<T>, host: &[T]) -> Result<()> {
        Error::check_extent("host data", "elements", buf.len(), host.len())?;
        Ok(self.stream.memcpy_htod(host, buf)?)
    }

    fn download<T: Element>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(buf)?)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch.as_str())
    }

    fn slice<T: Element>(buf: &CudaSlice<T>) -> CudaView<'_, T> {
        buf.as_view()
    }
    fn slice_mut<T: Element>(buf: &mut CudaSlice<T>) -> CudaViewMut<'_, T> {
        buf.as_view_mut()
    }
    fn reborrow<'b, T: Element>(slice: &'b CudaView<'_, T>) -> CudaView<'b, T> {
        slice.slice(..)
    }
    fn reborrow_mut<'b, T: Element>(slice: &'b mut CudaViewMut<'_, T>) -> CudaViewMut<'b, T> {
        slice.slice_mut(..)
    }
    fn downgrade<'b, T: Element>(slice: &'b CudaViewMut<'_, T>) -> CudaView<'b, T> {
        slice.as_view()
    }
}
