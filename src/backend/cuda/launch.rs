//! Kernel declarations and the typed launch.
//!
//! A kernel type implements [`CudaKernel`]: its source file, its `#[repr(C)]` parameter block
//! and the template instantiation its static dims select. The type is the cache key, so a launch
//! is one map lookup and one `cuLaunchKernel` with a single by-value parameter block: no
//! validation, no allocation, no host synchronization, and capturable in a CUDA graph.

use std::any::TypeId;
use std::ffi::c_void;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaFunction, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DeviceSlice, SyncOnDrop, result, sys,
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
    /// Whether the kernel's compile-time cluster (`__cluster_dims__`) has more than the 8 CTAs
    /// every sm_90 part guarantees: the loader then allows the function a non-portable
    /// cluster size (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`), without which its
    /// launch fails.
    const NON_PORTABLE_CLUSTER: bool = false;
    /// The parameter block, field for field the kernel's parameter struct (declared with
    /// [`param_block!`](crate::param_block), so [`check_params`](super::check_params) can
    /// prove the two layouts equal).
    type Params: super::ParamBlock;
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

impl LaunchShape {
    /// A one-dimensional grid of `block`-thread blocks covering `threads` threads (at least
    /// one block), no dynamic shared memory; an `Err` naming `param` when the grid would not
    /// fit the device's 2^31 - 1 blocks.
    pub fn linear(param: &'static str, threads: usize, block: u32) -> Result<Self> {
        let blocks = threads.div_ceil(block as usize).max(1);
        if blocks > i32::MAX as usize {
            return Err(Error::Value {
                param,
                value: threads as i128,
                range: format!(
                    "0 ..= {} threads in blocks of {block}",
                    i32::MAX as usize * block as usize
                ),
            });
        }
        Ok(Self {
            grid: (blocks as u32, 1, 1),
            block: (block, 1, 1),
            smem_bytes: 0,
        })
    }
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
    /// The clusters of the kernel the device holds at once, once asked
    /// ([`Cuda::max_active_clusters`]).
    max_clusters: Option<u32>,
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
        if K::NON_PORTABLE_CLUSTER {
            function.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )?;
        }
        let raw = function.cu_function();
        self.loaded.lock().expect("kernel table lock").insert(
            id,
            LoadedKernel {
                function,
                max_clusters: None,
            },
        );
        Ok(raw)
    }

    /// [`Cuda::function`] for a launch whose queue [`Cuda::check_queue`] has just checked: a
    /// first use compiles and loads the kernel (up to seconds), time in which another thread
    /// could begin a capture of the stream, so the check runs again after it.
    fn function_to_queue<K: CudaKernel>(&self) -> Result<sys::CUfunction> {
        let id = TypeId::of::<K>();
        if let Some(k) = self.loaded.lock().expect("kernel table lock").get(&id) {
            return Ok(k.function.cu_function());
        }
        let function = self.function::<K>()?;
        self.check_queue(super::Work::Launch)?;
        Ok(function)
    }

    /// How many clusters of kernel `K` (its compile-time cluster, blocks of `block` threads
    /// with [`CudaKernel::DYNAMIC_SMEM_BYTES`] of dynamic shared memory) the device holds at
    /// once (`cuOccupancyMaxActiveClusters`), asked once per backend and kernel: a cluster
    /// larger than 8 CTAs needs that many SMs of one GPC, and how many GPCs have them differs
    /// between parts. A driver that cannot answer counts as none (the caller then keeps to
    /// portable clusters); an `Err` only when the kernel itself cannot be loaded.
    pub(crate) fn max_active_clusters<K: CudaKernel>(
        &self,
        cluster: u32,
        block: u32,
    ) -> Result<u32> {
        let id = TypeId::of::<K>();
        if let Some(n) = self
            .loaded
            .lock()
            .expect("kernel table lock")
            .get(&id)
            .and_then(|k| k.max_clusters)
        {
            return Ok(n); // one lookup once asked
        }
        let function = self.function::<K>()?;
        let config = sys::CUlaunchConfig {
            gridDimX: cluster,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: K::DYNAMIC_SMEM_BYTES,
            hStream: std::ptr::null_mut(),
            attrs: std::ptr::null_mut(),
            numAttrs: 0,
        };
        let mut n: std::ffi::c_int = 0;
        self.ctx.bind_to_thread()?;
        // SAFETY: `function` is a loaded function of this context, `config` a complete
        // configuration without attributes (the kernel's compile-time cluster applies) and `n`
        // a valid output.
        let asked = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, function, &config) };
        let n = if asked.result().is_ok() {
            u32::try_from(n).unwrap_or(0)
        } else {
            0
        };
        if let Some(k) = self.loaded.lock().expect("kernel table lock").get_mut(&id) {
            k.max_clusters = Some(n);
        }
        Ok(n)
    }

    /// Queues kernel `K` on the backend's stream with `params` passed by value.
    ///
    /// This door admits nothing and checks no queue: no buffer's context or stream, no thread of
    /// a per-thread stream, no capture begun outside [`Cuda::record_graph`].
    ///
    /// # Safety
    /// Every pointer in `params` must address a live allocation of this backend's context large
    /// enough for every access the kernel makes under `shape`, and every tensor map in `params`
    /// must describe a box of such an allocation (its base and extents within the buffer). Every
    /// other use of those buffers must be ordered against this launch on the backend's stream
    /// (the launch records no event), and the buffers must stay alive until it has run. The
    /// typed ops guarantee all of this by construction of their arguments.
    pub unsafe fn launch<K: CudaKernel>(
        &self,
        shape: LaunchShape,
        params: &K::Params,
    ) -> Result<()> {
        let function = self.function::<K>()?;
        self.ctx.bind_to_thread()?;
        // SAFETY: forwarded to the caller; the context is current.
        unsafe { self.queue_launch::<K>(function, shape, params) }
    }

    /// `cuLaunchKernel` of `function` (kernel `K`'s) on the backend's stream, with `params`
    /// by value.
    ///
    /// # Safety
    /// As [`Cuda::launch`], and the backend's context is current on this thread.
    unsafe fn queue_launch<K: CudaKernel>(
        &self,
        function: sys::CUfunction,
        shape: LaunchShape,
        params: &K::Params,
    ) -> Result<()> {
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

impl Cuda {
    /// `cuLaunchKernelEx` of `function` (kernel `K`'s) on the backend's stream, with `params`
    /// by value, as a programmatic dependent launch: the kernel may start while the kernel
    /// queued before it still runs (it is scheduled once every block of that one has begun or
    /// ended), which hides its launch and start behind that kernel's tail.
    ///
    /// # Safety
    /// As [`DeviceArgs::launch_dependent`], and the backend's context is current on this
    /// thread.
    unsafe fn queue_dependent_launch<K: CudaKernel>(
        &self,
        function: sys::CUfunction,
        shape: LaunchShape,
        params: &K::Params,
    ) -> Result<()> {
        let mut block = *params;
        let mut args = [&mut block as *mut K::Params as *mut c_void];
        // SAFETY: an all-zero attribute is a valid C value (the id is overwritten below).
        let mut overlap: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        overlap.id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        overlap.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: shape.grid.0,
            gridDimY: shape.grid.1,
            gridDimZ: shape.grid.2,
            blockDimX: shape.block.0,
            blockDimY: shape.block.1,
            blockDimZ: shape.block.2,
            sharedMemBytes: shape.smem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut overlap,
            numAttrs: 1,
        };
        // SAFETY: the kernel takes exactly one parameter of type `K::Params`, the caller vouches
        // for the pointers inside it and for the kernel's wait before its global accesses;
        // `config`, `overlap` and `args` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(&config, function, args.as_mut_ptr(), std::ptr::null_mut())
                .result()?;
        }
        Ok(())
    }
}

/// Where an admitted buffer is ordered, relative to the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Home {
    /// On the stream the work is queued on (or, in a graph, the stream it replays on):
    /// ordered by the stream itself.
    Same,
    /// On another stream of the same context object, which tracks events: ordered by them.
    Other,
}

/// The admission rule of every device access (launches and copies alike): may work queued on
/// `cuda`'s stream use a buffer whose home stream is `home`?
///
/// - The buffer must belong to the backend's CUDA context (another device's memory would
///   otherwise be reached through unified addressing).
/// - A buffer of the per-thread default stream is on "the same stream" only for the backend
///   made from its very stream object, bound to its thread ([`Cuda::from_stream`]); otherwise
///   which stream it names depends on the thread that used it, and it is refused.
/// - A buffer on the same stream (the same CUDA handle in the same context) needs nothing.
/// - A buffer of another stream is ordered by cudarc's events: cudarc waits for them when the
///   *buffer's* context object tracks events and records the launch's use when the *launch
///   stream's* object does, so it is admitted only when both do (two objects of one CUDA
///   context, e.g. `Cuda::new` beside a candle device, can disagree).
/// - While a graph is recorded, every buffer must be ordered on the stream the graph replays
///   on: a replay cannot wait for other streams' events.
#[inline]
pub(crate) fn admit(cuda: &Cuda, param: &'static str, home: &CudaStream) -> Result<Home> {
    if std::ptr::eq(home, &*cuda.stream) {
        return Ok(Home::Same);
    }
    admit_other(cuda, param, home)
}

/// [`admit`] of a buffer whose home is not the backend's own stream object (kept out of line:
/// the launches of one engine stream never get here).
#[cold]
#[inline(never)]
fn admit_other(cuda: &Cuda, param: &'static str, home: &CudaStream) -> Result<Home> {
    let ours = &*cuda.stream;
    if home.context().cu_ctx() != ours.context().cu_ctx() {
        return Err(Error::ForeignBuffer {
            param,
            reason: "it was allocated in another CUDA context (another device or backend)",
        });
    }
    let target = cuda.recording_for.as_deref().unwrap_or(ours);
    if home.cu_stream() as usize == super::PER_THREAD_STREAM {
        // The handle alone does not say which thread's stream the buffer was ordered on: only
        // the bound backend's own stream object (whose every use `check_queue` keeps on its
        // thread) does. A per-thread backend of another thread has another object.
        if std::ptr::eq(home, target) {
            return Ok(Home::Same);
        }
        return Err(Error::ForeignBuffer {
            param,
            reason: "it is ordered on the per-thread default stream, which names another stream on every host thread; use it with the backend whose stream allocated it, or allocate it on a stream of its own",
        });
    }
    if home.cu_stream() == target.cu_stream() {
        return Ok(Home::Same);
    }
    if cuda.recording_for.is_some() {
        return Err(Error::ForeignBuffer {
            param,
            reason: "it is ordered on another stream than the backend's, and a graph replays on the backend's stream without waiting for other streams; allocate it on the backend's stream",
        });
    }
    // cudarc waits for a buffer's events when the *buffer's* context object tracks them, and
    // records the launch's use when the *launch stream's* object does: both must.
    let tracked = |s: &CudaStream| s.context().is_managing_stream_synchronization();
    if !(tracked(home) && tracked(ours)) {
        let reason = if Arc::ptr_eq(home.context(), ours.context()) {
            "it is ordered on another stream and the context tracks no events, so the launch could not be ordered after its writes or before its release; use one stream, or keep cudarc's event tracking on"
        } else {
            "it is ordered on another stream of another cudarc context object of the same CUDA context (the context opened twice), and the two objects do not both track events, so cudarc would not order the launch against the buffer's other uses; use the buffer's own stream, or one `CudaContext` for both"
        };
        return Err(Error::ForeignBuffer { param, reason });
    }
    Ok(Home::Other)
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

/// A use of a buffer that cudarc records once the launch is queued: the buffer's read or write
/// event and the launch's stream (what cudarc's `SyncOnDrop::Record` holds).
type Use<'a> = (&'a CudaEvent, &'a CudaStream);

/// The device addresses of one launch's buffers, admitted one by one, with the uses cudarc
/// records for them held until the launch has been queued.
///
/// Admitting a buffer checks where it lives, never its extent (the typed boundary did that):
/// it must belong to the backend's context, and it must be ordered on the backend's stream
/// unless the context tracks cross-stream use with events. When the context tracks events,
/// admission makes the launch wait for earlier writes, the launch's reads and writes are
/// recorded in the buffers' events after it is queued, and each buffer's other home stream
/// then waits for it (see `Drop`), so a buffer on another stream is neither reused nor freed
/// under the kernel (outside graph capture). Nothing here allocates, and nothing is
/// initialized for buffers a launch does not pass.
///
/// Every launch of the library goes through it, and a kernel declared outside the library
/// uses it the same way (`shapeproof::kernel`, part 3): `new`, one `read` / `write` (or their
/// `_vectors` forms) a buffer into the parameter block, `launch`.
pub struct DeviceArgs<'a> {
    cuda: &'a Cuda,
    stream: &'a CudaStream,
    /// The uses to record after the launch; the first `n_uses` are initialized.
    uses: [MaybeUninit<Use<'a>>; MAX_DEVICE_ARGS],
    n_uses: usize,
    /// The other streams whose buffers the launch uses (distinct; see `Drop`); the first
    /// `n_homes` are initialized.
    homes: [MaybeUninit<Arc<CudaStream>>; MAX_DEVICE_ARGS],
    n_homes: usize,
}

impl<'a> DeviceArgs<'a> {
    /// An empty argument list for a launch on `cuda`'s stream, once the stream can take it
    /// (`Cuda::check_queue`: the right thread, no foreign graph capture).
    #[inline]
    pub fn new(cuda: &'a Cuda) -> Result<Self> {
        cuda.check_queue(super::Work::Launch)?;
        Ok(Self {
            cuda,
            stream: &cuda.stream,
            uses: [const { MaybeUninit::uninit() }; MAX_DEVICE_ARGS],
            n_uses: 0,
            homes: [const { MaybeUninit::uninit() }; MAX_DEVICE_ARGS],
            n_homes: 0,
        })
    }

    /// Admits a buffer of `home` ([`admit`]) and remembers `home` when it is another stream.
    /// Returns the stream to take the buffer's address on: the launch's own, or, while a graph
    /// is recorded, the stream it replays on, which is the buffer's (so cudarc's protocol runs
    /// outside the capture).
    #[inline]
    fn admit(&mut self, param: &'static str, home: &Arc<CudaStream>) -> Result<&'a CudaStream> {
        if admit(self.cuda, param, home)? == Home::Same {
            return Ok(self.cuda.recording_for.as_deref().unwrap_or(self.stream));
        }
        self.remember_home(param, home)?;
        Ok(self.stream)
    }

    /// Remembers `home`, another stream, once (see `Drop`).
    #[cold]
    #[inline(never)]
    fn remember_home(&mut self, param: &'static str, home: &Arc<CudaStream>) -> Result<()> {
        let initialized = &self.homes[..self.n_homes];
        // SAFETY: the first `n_homes` entries are initialized.
        let known = initialized
            .iter()
            .any(|h| unsafe { h.assume_init_ref() }.cu_stream() == home.cu_stream());
        if known {
            return Ok(());
        }
        let Some(slot) = self.homes.get_mut(self.n_homes) else {
            return Err(Error::Value {
                param,
                value: self.n_homes as i128 + 1,
                range: format!("1 ..= {MAX_DEVICE_ARGS} streams of device arguments a launch"),
            });
        };
        slot.write(home.clone()); // a reference count, no allocation
        self.n_homes += 1;
        Ok(())
    }

    /// Takes the use cudarc would record when `guard` drops, to record it after the launch.
    #[inline]
    fn hold(&mut self, param: &'static str, guard: SyncOnDrop<'a>) -> Result<()> {
        let mut guard = ManuallyDrop::new(guard);
        let SyncOnDrop::Record(target) = &mut *guard else {
            // `device_ptr` of a view never asks for a synchronization: refuse what it would mean.
            drop(ManuallyDrop::into_inner(guard));
            return Err(Error::Stream {
                stream: format!("{:#x}", self.stream.cu_stream() as usize),
                reason: "cudarc asked to synchronize the stream after a buffer's use, which a queued launch cannot",
            });
        };
        // What is left, `Record(None)`, records nothing when dropped: it is not dropped.
        let Some(used) = target.take() else {
            return Ok(()); // a buffer without events (tracking off): nothing to record later
        };
        let Some(slot) = self.uses.get_mut(self.n_uses) else {
            return Err(Error::Value {
                param,
                value: self.n_uses as i128 + 1,
                range: format!("1 ..= {MAX_DEVICE_ARGS} device arguments a launch"),
            });
        };
        slot.write(used);
        self.n_uses += 1;
        Ok(())
    }

    /// The address of a buffer the kernel reads.
    #[inline]
    pub fn read<T>(&mut self, param: &'static str, view: &'a CudaView<'_, T>) -> Result<u64> {
        let on = self.admit(param, view.stream())?;
        let (ptr, guard) = view.device_ptr(on);
        self.hold(param, guard)?;
        Ok(ptr)
    }

    /// The address of a buffer the kernel writes (and may read).
    #[inline]
    pub fn write<T>(
        &mut self,
        param: &'static str,
        view: &'a mut CudaViewMut<'_, T>,
    ) -> Result<u64> {
        let on = self.admit(param, view.stream())?;
        let (ptr, guard) = view.device_ptr_mut(on);
        self.hold(param, guard)?;
        Ok(ptr)
    }

    /// The address of a buffer the kernel reads in 16-byte vectors (`cp.async`, 16-byte loads):
    /// it must start at a multiple of 16 bytes (`VECTOR_BYTES`). A view at another offset is
    /// an `Err` before anything is queued; the kernel would otherwise fault on a misaligned
    /// access, which poisons the whole CUDA context.
    #[inline]
    pub fn read_vectors<T>(
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
    #[inline]
    pub fn write_vectors<T>(
        &mut self,
        param: &'static str,
        view: &'a mut CudaViewMut<'_, T>,
    ) -> Result<u64> {
        let ptr = self.write(param, view)?;
        check_vector_aligned(param, ptr)?;
        Ok(ptr)
    }

    /// The address of an optional input, 0 when absent.
    pub fn read_opt<T>(
        &mut self,
        param: &'static str,
        view: Option<&'a CudaView<'_, T>>,
    ) -> Result<u64> {
        view.map_or(Ok(0), |v| self.read(param, v))
    }

    /// Queues kernel `K` with `params` on the stream these buffers were admitted for: the one
    /// launch path of the library's ops (admit every buffer into `params`, launch, and let the
    /// arguments drop, which records the launch's uses). [`DeviceArgs::new`] checked the queue
    /// and made the context current, so a launch costs the kernel lookup and `cuLaunchKernel`.
    ///
    /// # Safety
    /// Every device address in `params` was returned by this argument list (or is 0 where the
    /// kernel reads an absent input as none), every tensor map in `params` was encoded from
    /// such an address with extents within that buffer, and under `shape` the kernel touches
    /// only the extents its call checked.
    pub unsafe fn launch<K: CudaKernel>(
        &self,
        shape: LaunchShape,
        params: &K::Params,
    ) -> Result<()> {
        let function = self.cuda.function_to_queue::<K>()?;
        // SAFETY: forwarded to the caller; `new` made the context current on this thread (a
        // first use's compile and module load keep it so).
        unsafe { self.cuda.queue_launch::<K>(function, shape, params) }
    }

    /// As [`DeviceArgs::launch`], as a programmatic dependent launch: kernel `K` may start
    /// while the kernel this argument list launched before it still runs, so its launch and
    /// start hide behind that kernel's tail (a split decode's combine behind its splits).
    ///
    /// # Safety
    /// As [`DeviceArgs::launch`], and kernel `K` executes `griddepcontrol.wait` before its first
    /// access to global memory. That wait holds it until the kernel queued before it on the
    /// stream (whichever, from whatever thread) has ended and its writes are visible; every
    /// kernel of the crate launched this way waits so, so each ends only after all work queued
    /// before it, and the stream's order holds for every buffer.
    pub(crate) unsafe fn launch_dependent<K: CudaKernel>(
        &self,
        shape: LaunchShape,
        params: &K::Params,
    ) -> Result<()> {
        let function = self.cuda.function_to_queue::<K>()?;
        // SAFETY: forwarded to the caller; `new` made the context current on this thread.
        unsafe {
            self.cuda
                .queue_dependent_launch::<K>(function, shape, params)
        }
    }

    /// The address of an optional output, 0 when absent.
    pub fn write_opt<T>(
        &mut self,
        param: &'static str,
        view: Option<&'a mut CudaViewMut<'_, T>>,
    ) -> Result<u64> {
        view.map_or(Ok(0), |v| self.write(param, v))
    }
}

/// After the launch: the launch's reads and writes are recorded in its buffers' events (the
/// uses `hold` took from cudarc's guards), and every other stream whose buffers it used waits
/// for the launch. cudarc keeps one read event per buffer, which a later read on the home
/// stream replaces, so without the wait a buffer could be freed on its home stream while this
/// launch still reads it. Inside a graph
/// capture the wait is not queued (it would pull the home stream into the capture): ordering
/// a captured launch against other streams is the capturing caller's.
impl Drop for DeviceArgs<'_> {
    fn drop(&mut self) {
        let uses = std::mem::take(&mut self.n_uses);
        for used in &self.uses[..uses] {
            // SAFETY: the first `n_uses` entries are initialized (plain references).
            let (event, stream) = unsafe { used.assume_init_read() };
            // What cudarc's guard does when it drops: record this launch's use.
            let ctx = stream.context();
            if ctx.is_managing_stream_synchronization() {
                ctx.record_err(event.record(stream));
            }
        }
        let n_homes = std::mem::take(&mut self.n_homes);
        if n_homes == 0 {
            return;
        }
        // SAFETY: the first `n_homes` entries are initialized, and `n_homes` is now 0, so each
        // is read out (and dropped at the end of this function) once.
        let homes: [Option<Arc<CudaStream>>; MAX_DEVICE_ARGS] = std::array::from_fn(|i| {
            (i < n_homes).then(|| unsafe { self.homes[i].assume_init_read() })
        });
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
                for home in homes.iter().flatten() {
                    ctx.record_err(home.wait(&launched));
                }
            }
            Err(e) => ctx.record_err::<()>(Err(e)),
        }
    }
}
