//! Kernel declarations and the typed launch.
//!
//! A kernel type implements [`CudaKernel`]: its source file, its `#[repr(C)]` parameter block
//! and the template instantiation its static dims select. The type is the cache key, so a launch
//! is one map lookup and one `cuLaunchKernel` with a single by-value parameter block: no
//! validation, no allocation, no host synchronization, and capturable in a CUDA graph.

use std::any::TypeId;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice,
    SyncOnDrop, result, sys,
};
use cudarc::nvrtc::Ptx;

use super::Cuda;
use crate::error::{Error, Result};

/// A CUDA kernel instantiation, declared by a type.
///
/// Built-in kernels implement it, and so can users: point `SOURCE` at a file whose kernel takes
/// one parameter struct by value (`common.cuh` is prepended), mirror that struct in
/// `Params` with `#[repr(C)]`, and name the instantiation.
pub trait CudaKernel: 'static {
    /// The kernel source (a file of `kernels/`, usually `include_str!`), without `common.cuh`.
    const SOURCE: &'static str;
    /// Dynamic shared memory per block, in bytes (raises the kernel's limit when above 48 KiB).
    const DYNAMIC_SMEM_BYTES: u32 = 0;
    /// The parameter block, field for field the kernel's parameter struct.
    type Params: Copy + 'static;
    /// The template instantiation, e.g. `mxfp8_quantize_kernel<128>`.
    fn instantiation() -> String;
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    /// Blocks.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
}

/// Hashes a `TypeId` by its own bits: it is already a hash, so the kernel lookup of every
/// launch need not run SipHash over it.
#[derive(Clone, Copy, Default)]
pub(super) struct TypeIdHash;
impl std::hash::BuildHasher for TypeIdHash {
    type Hasher = TypeIdHasher;
    fn build_hasher(&self) -> TypeIdHasher {
        TypeIdHasher(0)
    }
}
/// The hasher of [`TypeIdHash`]: folds the written words.
pub(super) struct TypeIdHasher(u64);
impl std::hash::Hasher for TypeIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = self.0.rotate_left(5) ^ v;
    }
}

pub(super) struct LoadedKernel {
    function: CudaFunction,
}

impl Cuda {
    /// The loaded function of kernel `K`, compiling and loading it on first use (for raw
    /// driver launches, e.g. a benchmark's baseline or the caller's own graph building).
    pub fn function<K: CudaKernel>(&self) -> Result<sys::CUfunction> {
        let id = TypeId::of::<K>();
        if let Some(k) = self.loaded.lock().expect("kernel table lock").get(&id) {
            return Ok(k.function.cu_function());
        }
        let compiled = self
            .cache
            .get_or_compile(K::SOURCE, &K::instantiation(), self.arch)?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(compiled.cubin.clone()))?;
        let function = module.load_function(&compiled.lowered_name)?;
        if K::DYNAMIC_SMEM_BYTES > 48 * 1024 {
            function.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                K::DYNAMIC_SMEM_BYTES as i32,
            )?;
        }
        let raw = function.cu_function();
        self.loaded
            .lock()
            .expect("kernel table lock")
            .insert(id, LoadedKernel { function });
        Ok(raw)
    }

    /// Queues kernel `K` on the backend's stream with `params` passed by value.
    ///
    /// # Safety
    /// Every pointer in `params` must address a live allocation of this backend's context large
    /// enough for every access the kernel makes under `shape`; the typed ops guarantee this by
    /// construction of their arguments.
    pub unsafe fn launch<K: CudaKernel>(
        &self,
        shape: LaunchShape,
        params: &K::Params,
    ) -> Result<()> {
        let function = self.function::<K>()?;
        self.ctx.bind_to_thread()?;
        let mut block = *params;
        let mut args = [&mut block as *mut K::Params as *mut c_void];
        // SAFETY: the kernel takes exactly one parameter of type `K::Params` (the contract of
        // `CudaKernel`), and the caller vouches for the pointers inside it.
        unsafe {
            result::launch_kernel(
                function,
                shape.grid,
                shape.block,
                shape.smem_bytes,
                self.stream.cu_stream(),
                &mut args,
            )?;
        }
        Ok(())
    }
}

/// A buffer of `home` belongs to the context of `ours`, or it is refused (launches and copies
/// alike: another device's memory would otherwise be reached through unified addressing).
pub(crate) fn same_context(
    param: &'static str,
    home: &CudaStream,
    ours: &CudaStream,
) -> Result<()> {
    if home.context().cu_ctx() != ours.context().cu_ctx() {
        return Err(Error::ForeignBuffer {
            param,
            reason: "it was allocated in another CUDA context (another device or backend)",
        });
    }
    Ok(())
}

/// The width of the kernels' vector accesses (16-byte loads and stores, `cp.async`, bulk
/// copies): a buffer accessed so must start at a multiple of it. cudarc's views keep only the
/// element type's alignment, so a view of bytes or of bf16 can start anywhere.
pub(crate) const VECTOR_BYTES: u64 = 16;

/// `Err` naming `param` unless the device address `ptr` is a multiple of [`VECTOR_BYTES`].
fn check_vector_aligned(param: &'static str, ptr: u64) -> Result<()> {
    if ptr.is_multiple_of(VECTOR_BYTES) {
        return Ok(());
    }
    Err(Error::Mismatch {
        param,
        expected: format!(
            "a device address that is a multiple of {VECTOR_BYTES} bytes (the kernel accesses it in {VECTOR_BYTES}-byte vectors; a view must start at such an offset)"
        ),
        actual: format!("{ptr:#x} ({} bytes past one)", ptr % VECTOR_BYTES),
    })
}

/// Most buffers one launch passes (the prologue's main kernel and its trailing update together
/// have the most, 26).
const MAX_DEVICE_ARGS: usize = 26;

/// The device addresses of one launch's buffers, admitted one by one, with cudarc's stream
/// synchronization guards held until the launch has been queued.
///
/// Admitting a buffer checks where it lives, never its extent (the typed boundary did that):
/// it must belong to the backend's context, and it must be ordered on the backend's stream
/// unless the context tracks cross-stream use with events. When the context tracks events,
/// the guards make the launch wait for earlier writes and record its own reads and writes in
/// the buffer's events, and after the launch each buffer's other home stream waits for it (see
/// `Drop`), so a buffer on another stream is neither reused nor freed under the kernel (outside
/// graph capture). Nothing here allocates.
pub(crate) struct DeviceArgs<'a> {
    stream: &'a CudaStream,
    guards: [Option<SyncOnDrop<'a>>; MAX_DEVICE_ARGS],
    held: usize,
    /// The other streams whose buffers the launch uses (distinct; see `Drop`).
    homes: [Option<Arc<CudaStream>>; MAX_DEVICE_ARGS],
    n_homes: usize,
}

impl<'a> DeviceArgs<'a> {
    /// An empty argument list for a launch on `cuda`'s stream.
    pub(crate) fn new(cuda: &'a Cuda) -> Self {
        Self {
            stream: &cuda.stream,
            guards: [const { None }; MAX_DEVICE_ARGS],
            held: 0,
            homes: [const { None }; MAX_DEVICE_ARGS],
            n_homes: 0,
        }
    }

    /// Admits a buffer of `home` (see `check_home`) and remembers `home` when it is another
    /// stream.
    fn admit(&mut self, param: &'static str, home: &Arc<CudaStream>) -> Result<()> {
        self.check_home(param, home)?;
        let other = home.cu_stream() != self.stream.cu_stream();
        let known = self.homes[..self.n_homes].iter().any(|h| {
            h.as_ref()
                .is_some_and(|h| h.cu_stream() == home.cu_stream())
        });
        if other && !known {
            self.homes[self.n_homes] = Some(home.clone()); // a reference count, no allocation
            self.n_homes += 1;
        }
        Ok(())
    }

    fn check_home(&self, param: &'static str, home: &CudaStream) -> Result<()> {
        let ours = self.stream;
        if std::ptr::eq(home, ours) {
            return Ok(()); // the backend's own stream object: same stream, same context
        }
        same_context(param, home, ours)?;
        if home.cu_stream() != ours.cu_stream()
            && !ours.context().is_managing_stream_synchronization()
        {
            return Err(Error::ForeignBuffer {
                param,
                reason: "it is ordered on another stream and the context tracks no events, so the launch could not be ordered after its writes or before its release; use one stream, or keep cudarc's event tracking on",
            });
        }
        Ok(())
    }

    fn hold(&mut self, guard: SyncOnDrop<'a>) {
        if matches!(guard, SyncOnDrop::Record(None)) {
            return; // a buffer without events (tracking off): nothing to record later
        }
        // The bound is a property of the kernels' parameter blocks, not of the caller's input.
        assert!(
            self.held < MAX_DEVICE_ARGS,
            "more device arguments than any kernel has"
        );
        self.guards[self.held] = Some(guard);
        self.held += 1;
    }

    /// The address of a buffer the kernel reads.
    pub(crate) fn read<T>(
        &mut self,
        param: &'static str,
        view: &'a CudaView<'_, T>,
    ) -> Result<u64> {
        self.admit(param, view.stream())?;
        let (ptr, guard) = view.device_ptr(self.stream);
        self.hold(guard);
        Ok(ptr)
    }

    /// The address of a buffer the kernel writes (and may read).
    pub(crate) fn write<T>(
        &mut self,
        param: &'static str,
        view: &'a mut CudaViewMut<'_, T>,
    ) -> Result<u64> {
        self.admit(param, view.stream())?;
        let (ptr, guard) = view.device_ptr_mut(self.stream);
        self.hold(guard);
        Ok(ptr)
    }

    /// The address of a buffer the kernel reads in 16-byte vectors (`cp.async`, 16-byte loads):
    /// it must start at a multiple of [`VECTOR_BYTES`]. A view at another offset is an `Err`
    /// before anything is queued; the kernel would otherwise fault on a misaligned access,
    /// which poisons the whole CUDA context.
    pub(crate) fn read_vectors<T>(
        &mut self,
        param: &'static str,
        view: &'a CudaView<'_, T>,
    ) -> Result<u64> {
        let ptr = self.read(param, view)?;
        check_vector_aligned(param, ptr)?;
        Ok(ptr)
    }

    /// The address of a buffer the kernel writes in 16-byte vectors or bulk copies: as
    /// [`DeviceArgs::read_vectors`].
    pub(crate) fn write_vectors<T>(
        &mut self,
        param: &'static str,
        view: &'a mut CudaViewMut<'_, T>,
    ) -> Result<u64> {
        let ptr = self.write(param, view)?;
        check_vector_aligned(param, ptr)?;
        Ok(ptr)
    }

    /// The address of an optional input, 0 when absent.
    pub(crate) fn read_opt<T>(
        &mut self,
        param: &'static str,
        view: Option<&'a CudaView<'_, T>>,
    ) -> Result<u64> {
        view.map_or(Ok(0), |v| self.read(param, v))
    }

    /// The address of an optional output, 0 when absent.
    pub(crate) fn write_opt<T>(
        &mut self,
        param: &'static str,
        view: Option<&'a mut CudaViewMut<'_, T>>,
    ) -> Result<u64> {
        view.map_or(Ok(0), |v| self.write(param, v))
    }
}

/// After the launch: the launch's reads and writes are recorded in its buffers' events (the
/// guards), and every other stream whose buffers it used waits for the launch. cudarc keeps one
/// read event per buffer, which a later read on the home stream replaces, so without the wait a
/// buffer could be freed on its home stream while this launch still reads it. Inside a graph
/// capture the wait is not queued (it would pull the home stream into the capture): ordering
/// a captured launch against other streams is the capturing caller's.
impl Drop for DeviceArgs<'_> {
    fn drop(&mut self) {
        for guard in &mut self.guards[..self.held] {
            drop(guard.take()); // records this launch's reads and writes
        }
        if self.n_homes == 0 {
            return;
        }
        let capturing = !matches!(
            self.stream.capture_status(),
            Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        );
        if capturing {
            return;
        }
        let ctx = self.stream.context();
        match self.stream.record_event(None) {
            Ok(launched) => {
                for home in self.homes[..self.n_homes].iter().flatten() {
                    ctx.record_err(home.wait(&launched));
                }
            }
            Err(e) => ctx.record_err::<()>(Err(e)),
        }
    }
}
