//! The CUDA backend: a stream on one GPU (its own, or the caller's), the NVRTC JIT cache, typed
//! launches.
//!
//! Creating it never panics: without a driver it returns [`Error::NoDriver`]. All work is queued
//! on the backend's one stream. The backend changes no state it shares with the caller: cudarc's
//! event tracking stays as the caller set it. With tracking on, a launch waits for earlier
//! writes to its buffers and records its own uses (cudarc's protocol), so buffers of other
//! streams are safe to pass; with tracking off (a single-stream engine's choice, and the fastest
//! launches), buffers must be ordered on the backend's stream, which the launch checks.
//!
//! Every device access (launches, copies, allocations) goes through one admission rule
//! (`launch::admit`): the buffer's stream and context are compared by what they are (CUDA
//! handles and cudarc context objects), a per-thread default stream is bound to its thread,
//! and a stream being captured into a CUDA graph by anyone but this crate's
//! [`GraphRecorder`] takes no work (a graph captured elsewhere would keep raw addresses of
//! buffers it does not borrow).

mod foreign;
mod graph;
mod jit;
mod launch;
mod params;
mod tensor_map;

pub use foreign::ForeignDeviceBuffer;
pub(crate) use graph::read_ref;
pub use graph::{Graph, GraphRead, GraphRecorder, IsCuda, Recorded};
pub use jit::{Arch, CompiledKernel, KernelCache, compile_kernel, compile_kernel_reported};
pub use launch::{CudaKernel, DeviceArgs, LaunchShape};
pub use params::{ParamBlock, ParamField, check_params, layout_asserts};
pub use tensor_map::TensorMap;

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceSlice,
};

use super::{Backend, Buffer, Element};
use crate::error::{Error, Result};

/// Whether a CUDA driver library can be loaded on this machine. With feature `cuda-linked`
/// the program is linked against it, so it is present whenever the program runs.
pub fn driver_present() -> bool {
    #[cfg(not(feature = "cuda-linked"))]
    // SAFETY: only tries to dlopen the library.
    return unsafe { cudarc::driver::sys::is_culib_present() };
    #[cfg(feature = "cuda-linked")]
    true
}

/// Whether the NVRTC library can be loaded on this machine (always, with `cuda-linked`).
pub fn nvrtc_present() -> bool {
    #[cfg(not(feature = "cuda-linked"))]
    // SAFETY: only tries to dlopen the library.
    return unsafe { cudarc::nvrtc::sys::is_culib_present() };
    #[cfg(feature = "cuda-linked")]
    true
}

/// The kernels one backend has loaded, by kernel type (shared with the backends that record
/// graphs for it).
type LoadedTable = Mutex<HashMap<TypeId, launch::LoadedKernel, launch::TypeIdHash>>;

/// CUDA's handle of the per-thread default stream (`CU_STREAM_PER_THREAD`): one handle that
/// names a different stream on every host thread.
const PER_THREAD_STREAM: usize = 0x2;

/// The thread each per-thread default stream object is bound to, once a backend was made
/// from it (dead objects pruned on every use). The object is what admission compares, and it
/// can be sent to another thread: a second backend of the same object on another thread would
/// take the first thread's buffers as its own stream's, unordered. So the first binding holds
/// for the object's life.
static PER_THREAD_BINDINGS: Mutex<Vec<(Weak<CudaStream>, ThreadId)>> = Mutex::new(Vec::new());

/// Binds the per-thread stream object `stream` to the calling thread, or names the thread an
/// earlier backend bound it to.
fn bind_per_thread_stream(stream: &Arc<CudaStream>) -> Result<ThreadId> {
    let here = std::thread::current().id();
    let mut bindings = PER_THREAD_BINDINGS
        .lock()
        .expect("per-thread stream bindings");
    bindings.retain(|(object, _)| object.strong_count() > 0);
    match bindings
        .iter()
        .find(|(object, _)| std::ptr::eq(object.as_ptr(), Arc::as_ptr(stream)))
    {
        Some(&(_, thread)) if thread != here => Err(Error::Stream {
            stream: format!("the per-thread default stream object bound to {thread:?}"),
            reason: "a backend made from it on that thread orders its buffers on that thread's stream, which work from this thread would not be ordered with; make the backend here from this thread's own `CudaContext::per_thread_stream()`, or use a stream of its own",
        }),
        Some(_) => Ok(here),
        None => {
            bindings.push((Arc::downgrade(stream), here));
            Ok(here)
        }
    }
}

/// One GPU: its context, the stream all work goes to, and the kernels loaded on it.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: Arch,
    name: String,
    sm_count: u32,
    cache: KernelCache,
    loaded: Arc<LoadedTable>,
    /// For a backend on the per-thread default stream: the thread whose stream it is. Work
    /// from any other thread is refused (it would land on that thread's stream).
    thread: Option<ThreadId>,
    /// For the backend a [`GraphRecorder`] captures on: the stream of the backend the graph
    /// is recorded for, on which its buffers must be ordered and the graph replays.
    recording_for: Option<Arc<CudaStream>>,
}

impl Cuda {
    /// Opens GPU `ordinal` (its primary context) with a new stream; fails cleanly when there
    /// is no driver or the device is not a Hopper (sm_90) GPU.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        let arch = Self::arch_of(&ctx)?;
        Self::with_stream(ctx.new_stream()?, arch)
    }

    /// Opens GPU `ordinal` like [`Cuda::new`], after switching cudarc's event tracking off for
    /// its primary context: the configuration of a single-stream program, whose launches then
    /// record no events (with tracking on, each buffer of a launch costs an event wait and an
    /// event record).
    ///
    /// # Safety
    /// cudarc's `disable_event_tracking` contract, for the whole process (the primary context is
    /// shared): every buffer of the context created from now on is used on one stream, or its
    /// cross-stream uses (and its release) are ordered by the caller.
    pub unsafe fn new_untracked(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: forwarded to the caller.
        unsafe { ctx.disable_event_tracking() };
        let arch = Self::arch_of(&ctx)?;
        Self::with_stream(ctx.new_stream()?, arch)
    }

    /// A backend that queues every launch on the caller's `stream` (and so in its context):
    /// what the caller queued before a launch is visible to the kernel, and what it queues
    /// after sees the kernel's writes. Kernels already compiled in this process are reused;
    /// nothing the context shares is changed.
    ///
    /// The per-thread default stream (`CudaContext::per_thread_stream`, what candle's
    /// `Device::new_cuda` uses) is a different stream on every host thread: a backend on it is
    /// bound to the thread that calls `from_stream`, and work from another thread is an `Err`
    /// naming the stream. That stream object stays bound to that thread while it lives: a
    /// `from_stream` of the same object on another thread is an `Err` too. To capture the backend's launches in a CUDA graph, record them with
    /// [`Cuda::record_graph`]; a capture begun with cudarc's own API makes every launch and
    /// copy an `Err` instead.
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let arch = Self::arch_of(stream.context())?;
        Self::with_stream(stream, arch)
    }

    fn arch_of(ctx: &CudaContext) -> Result<Arch> {
        let (major, minor) = ctx.compute_capability()?;
        Arch::from_compute_capability(major, minor).ok_or_else(|| {
            let name = ctx.name().unwrap_or_else(|_| "unknown".into());
            Error::UnsupportedDevice { name, major, minor }
        })
    }

    fn with_stream(stream: Arc<CudaStream>, arch: Arch) -> Result<Self> {
        let ctx = stream.context().clone();
        let name = ctx.name()?;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?
            .max(1) as u32;
        let thread = if stream.cu_stream() as usize == PER_THREAD_STREAM {
            Some(bind_per_thread_stream(&stream)?)
        } else {
            None
        };
        Ok(Self {
            ctx,
            stream,
            arch,
            name,
            sm_count,
            cache: KernelCache::from_env(),
            loaded: Arc::new(Mutex::new(HashMap::default())),
            thread,
            recording_for: None,
        })
    }

    /// The same device, kernels and thread binding, queuing on `stream` while it records a
    /// graph for this backend (see [`GraphRecorder`]).
    fn recorder_on(&self, stream: Arc<CudaStream>) -> Self {
        Self {
            ctx: self.ctx.clone(),
            stream,
            arch: self.arch,
            name: self.name.clone(),
            sm_count: self.sm_count,
            cache: self.cache.clone(),
            loaded: self.loaded.clone(),
            thread: self.thread,
            recording_for: Some(self.stream.clone()),
        }
    }

    /// `Ok` when this backend's stream can take `work` from the calling thread now: the
    /// thread of a per-thread stream, and no graph capture the backend did not begin
    /// (including the capture of another stream this one joined through an event).
    pub(crate) fn check_queue(&self, work: Work) -> Result<()> {
        if let Some(thread) = self.thread
            && thread != std::thread::current().id()
        {
            return Err(Error::Stream {
                stream: format!("the per-thread default stream of {thread:?}"),
                reason: "that handle names another stream on every host thread, so work from this thread would not be ordered with the backend's; use the backend on the thread that made it, or give it a stream of its own (`CudaContext::new_stream`)",
            });
        }
        if self.recording_for.is_some() {
            return match work {
                Work::Launch => Ok(()),
                Work::Copy => Err(Error::Stream {
                    stream: "a graph recorder's capture stream".into(),
                    reason: "a graph records launches only",
                }),
            };
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: the stream is live (held by `self`).
        let status =
            unsafe { cudarc::driver::result::stream::is_capturing(self.stream.cu_stream()) }?;
        if status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::Stream {
                stream: format!("{:#x}", self.stream.cu_stream() as usize),
                reason: "it is being captured into a CUDA graph that would keep raw addresses of buffers it does not borrow; record typed launches with `Cuda::record_graph` instead",
            });
        }
        Ok(())
    }

    /// The stream all of this backend's work is queued on (for graph capture and events).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Streaming multiprocessors of the device (sizes the persistent grids).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The architecture kernels are compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The raw device address of a buffer, for a parameter block of the caller's own raw
    /// launch ([`Cuda::launch`]). It records no event use: with event tracking on, ordering the
    /// buffer's other uses against that launch is part of the caller's `unsafe` contract.
    pub fn ptr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        let (ptr, _guard) = buf.device_ptr(&self.stream);
        ptr
    }

    /// Compiles (or finds in the cache) and loads kernel `K`, ahead of its first launch.
    pub fn precompile<K: CudaKernel>(&self) -> Result<()> {
        self.function::<K>().map(|_| ())
    }
}

/// What a caller queues on the backend's stream (a graph recorder takes launches only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// A kernel launch.
    Launch,
    /// An allocation, a copy or a synchronization.
    Copy,
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
        self.check_queue(Work::Copy)?;
        // cudarc computes the byte count as `len * size_of::<T>()` without a check: a length
        // whose byte count wraps would allocate a short buffer that still reports `len`.
        if len.checked_mul(std::mem::size_of::<T>()).is_none() {
            return Err(Error::Alloc {
                elements: len,
                element_bytes: std::mem::size_of::<T>(),
            });
        }
        Ok(self.stream.alloc_zeros::<T>(len)?)
    }

    fn upload<T: Element>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.check_queue(Work::Copy)?;
        Ok(self.stream.clone_htod(host)?)
    }

    fn download_slice<T: Element>(&self, slice: &CudaView<'_, T>) -> Result<Vec<T>> {
        self.check_queue(Work::Copy)?;
        launch::admit(self, "the copied tensor", slice.stream())?;
        Ok(self.stream.clone_dtoh(slice)?)
    }

    fn write_slice<T: Element>(&self, slice: &mut CudaViewMut<'_, T>, host: &[T]) -> Result<()> {
        self.check_queue(Work::Copy)?;
        launch::admit(self, "the written tensor", slice.stream())?;
        Error::check_extent("host data", "elements", slice.len(), host.len())?;
        Ok(self.stream.memcpy_htod(host, slice)?)
    }

    fn synchronize(&self) -> Result<()> {
        self.check_queue(Work::Copy)?;
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
    fn slice_range<T: Element>(
        buf: &CudaSlice<T>,
        range: std::ops::Range<usize>,
    ) -> Option<CudaView<'_, T>> {
        (range.start <= range.end && range.end <= buf.len()).then(|| buf.slice(range))
    }
    fn slice_range_mut<T: Element>(
        buf: &mut CudaSlice<T>,
        range: std::ops::Range<usize>,
    ) -> Option<CudaViewMut<'_, T>> {
        (range.start <= range.end && range.end <= buf.len()).then(|| buf.slice_mut(range))
    }
    fn chunks_exact_mut<T: Element>(
        buf: &mut CudaSlice<T>,
        chunk: usize,
    ) -> Option<Vec<CudaViewMut<'_, T>>> {
        (chunk > 0 && buf.len().is_multiple_of(chunk))
            .then(|| buf.as_view_mut().chunks_exact_mut(chunk).collect())
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
