//! CUDA graphs of typed launches that the borrow checker understands.
//!
//! A graph keeps the raw device addresses of the buffers its launches touch and replays them
//! long after the launch returned, so the buffers must outlive every replay and must not move
//! between replays. A [`GraphRecorder<'g>`] takes each op's arguments borrowed for `'g`, and
//! the [`Graph<'g>`] it finishes into keeps those borrows: dropping, freeing or writing a
//! tensor a graph uses, before the graph is dropped, does not compile.
//!
//! ```compile_fail,E0505
//! # use shapeproof::backend::Cuda;
//! # use shapeproof::dtype::{E8M0, F8E4M3, bf16};
//! # use shapeproof::ops::mxfp8_quantize::Mxfp8Quantize;
//! # use shapeproof::tensor::{BlockScales, Cols, Tensor};
//! # fn f(gpu: &Cuda) -> shapeproof::Result<()> {
//! let input = Tensor::<Cuda, bf16, Cols<128>>::zeros(gpu, 4)?;
//! let mut data = Tensor::<Cuda, F8E4M3, Cols<128>>::zeros(gpu, 4)?;
//! let mut scales = Tensor::<Cuda, E8M0, BlockScales<128>>::zeros(gpu, 4)?;
//! let mut recorder = gpu.record_graph()?;
//! Mxfp8Quantize::<128>::new().record(&mut recorder, &input, &mut data, &mut scales)?;
//! let graph = recorder.finish()?;
//! drop(input); // error[E0505]: the graph still borrows `input`
//! graph.replay()?;
//! # Ok(()) }
//! ```
//!
//! How it stays sound:
//! - The launches are captured on a stream of the recorder's own that nothing else can reach
//!   (so no other work joins the graph), and the graph replays on the recording backend's
//!   stream, which is where every buffer of the graph must be ordered ([`super::launch::admit`]):
//!   a replay is ordered after what was queued there before it, and a buffer released after
//!   the graph is dropped is released on that stream, after the last replay.
//! - Only the typed ops record (their `record` methods, with the same boundary checks as
//!   `run`); nothing else can be put in a graph, and no closure of the caller runs while the
//!   capture is open.
//! - A capture begun with cudarc's own API (`CudaStream::begin_capture`), which borrows
//!   nothing, makes every launch and copy of the backend an `Err` instead.
//! - A buffer a recorded op writes stays borrowed mutably by the graph, or comes back as a
//!   [`Recorded`] that only later `record`s read (a cache store's `record`): nothing outside
//!   the graph reads it while replays may be queued. Dropping the graph waits for its replays,
//!   since cudarc's events on its buffers do not know them.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, result, sys};

use super::Cuda;
use crate::error::{Error, Result};

/// The backend a graph is recorded on: implemented by [`Cuda`] only, so an op's `record` can
/// be generic over the same backend parameter as its `run` and still name CUDA.
pub trait IsCuda: crate::backend::Backend + seal::OnlyCuda + Sized {
    /// `cuda` as `Self` (the identity).
    #[doc(hidden)]
    fn from_cuda(cuda: &Cuda) -> &Self;
}

/// The seal of [`IsCuda`], apart from the crate's shared seal so that the types listed in that
/// one's diagnostics stay the ones a kernel trusts.
mod seal {
    pub trait OnlyCuda {}
    impl OnlyCuda for super::Cuda {}
}

impl IsCuda for Cuda {
    fn from_cuda(cuda: &Cuda) -> &Self {
        cuda
    }
}

/// A buffer an op's `record` wrote into a graph, handed back read-only for the graph's life
/// (what a cache store's `record` returns): only later `record`s can read it (they take it
/// where they take a `&'g` borrow, [`GraphRead`]), so every read of it is ordered after the
/// graph's writes on the stream the graph replays on. It gives no other access: a read from
/// another stream could not be ordered after a replay. (It is `Copy`, so another graph recorded
/// while this one lives could take it too; a recording admits only buffers of the stream it
/// replays on, so such a graph replays on this one's stream, ordered after its writes.)
pub struct Recorded<'g, T>(&'g T);

impl<T> Clone for Recorded<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Recorded<'_, T> {}

impl<'g, T> Recorded<'g, T> {
    /// `buffer`, written by a `record` of the graph that borrows it for `'g`.
    pub(crate) fn new(buffer: &'g T) -> Self {
        Self(buffer)
    }
}

/// What an op's `record` reads a buffer through: a plain `&'g` borrow, or a buffer an earlier
/// `record` wrote ([`Recorded`]), both converted with `into()` where a `record` takes it. Its
/// borrow is private: the crate's `record`s alone use it, so a `Recorded` never turns back
/// into a plain borrow outside the graph.
pub struct GraphRead<'g, T>(&'g T);

impl<'g, T> From<&'g T> for GraphRead<'g, T> {
    fn from(buffer: &'g T) -> Self {
        Self(buffer)
    }
}

impl<'g, T> From<Recorded<'g, T>> for GraphRead<'g, T> {
    fn from(buffer: Recorded<'g, T>) -> Self {
        Self(buffer.0)
    }
}

/// The borrow a [`GraphRead`] stands for (the crate's `record` methods).
pub(crate) fn read_ref<'g, T>(buffer: impl Into<GraphRead<'g, T>>) -> &'g T {
    buffer.into().0
}

/// A raw stream of the recorder's own, destroyed with it.
struct CaptureStream {
    stream: Arc<CudaStream>,
}

impl Drop for CaptureStream {
    fn drop(&mut self) {
        let ctx = self.stream.context();
        if ctx.bind_to_thread().is_ok() {
            // SAFETY: the stream was created by `Cuda::record_graph` and is destroyed once.
            ctx.record_err(unsafe { result::stream::destroy(self.stream.cu_stream()) });
        }
    }
}

/// Typed launches being captured into a CUDA graph for the backend that made the recorder;
/// every tensor an op records is borrowed for `'g`, and the [`Graph<'g>`] it finishes into keeps
/// those borrows until it is dropped.
pub struct GraphRecorder<'g> {
    owner: &'g Cuda,
    capture: Cuda,
    stream: Option<CaptureStream>,
    /// Why the recording failed, once one of its launches failed (the capture is then ended
    /// and discarded by `finish`).
    failed: Option<&'static str>,
    _borrows: PhantomData<&'g mut ()>,
}

/// A recorded CUDA graph, replayable on the stream of the backend that recorded it while the
/// tensors of its launches stay borrowed. Dropping it waits (on the host) for the replays it
/// queued: keep a step's graph for as long as the step is replayed.
pub struct Graph<'g> {
    owner: &'g Cuda,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: usize,
    _borrows: PhantomData<&'g mut ()>,
}

// SAFETY: the graph handles may be used from any thread as long as calls on one graph are
// serialized, which `&self` / `&mut self` on a `!Sync` value guarantee.
unsafe impl Send for Graph<'_> {}

impl Cuda {
    /// Starts recording typed launches into a CUDA graph for this backend: each op's `record`
    /// adds its launches (after the same checks as its `run`), [`GraphRecorder::finish`]
    /// instantiates the graph, and [`Graph::replay`] queues it on this backend's stream. Every
    /// buffer recorded must be ordered on this backend's stream.
    pub fn record_graph(&self) -> Result<GraphRecorder<'_>> {
        self.check_queue(super::Work::Launch)?;
        // A raw stream of the recorder's own: made without cudarc's stream counting, so the
        // context's multi-stream mode (which the caller may rely on) does not change.
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        // SAFETY: `raw` is a stream of this context, kept alive (and destroyed) by
        // `CaptureStream`, which outlives every use of the wrapper; only the recorder queues
        // on it.
        let stream = CaptureStream {
            stream: unsafe { self.ctx.wrap_borrowed_stream(raw) },
        };
        // Relaxed: the stream is the recorder's alone, and the first launch of a kernel may
        // load its module while the capture is open.
        // SAFETY: the stream is live.
        unsafe {
            result::stream::begin_capture(
                raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }?;
        Ok(GraphRecorder {
            owner: self,
            capture: self.recorder_on(stream.stream.clone()),
            stream: Some(stream),
            failed: None,
            _borrows: PhantomData,
        })
    }
}

impl<'g> GraphRecorder<'g> {
    /// Runs one typed op on the capture stream. Crate-private: only the ops' `record` methods
    /// call it, with arguments borrowed for `'g`.
    pub(crate) fn record<B: IsCuda>(&mut self, op: impl FnOnce(&B) -> Result<()>) -> Result<()> {
        if let Some(reason) = self.failed {
            return Err(Error::Graph { reason });
        }
        let out = op(B::from_cuda(&self.capture));
        if out.is_err() {
            self.failed = Some("an earlier launch of this recording failed");
        }
        out
    }

    /// Ends the capture and instantiates the graph.
    pub fn finish(mut self) -> Result<Graph<'g>> {
        let graph = self.end_capture()?;
        if let Some(reason) = self.failed {
            // SAFETY: the graph was just made by the capture and is destroyed once.
            let _ = unsafe { result::graph::destroy(graph) };
            return Err(Error::Graph { reason });
        }
        // SAFETY: `graph` is the live graph of the capture.
        let exec =
            match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
                Ok(exec) => exec,
                Err(e) => {
                    // SAFETY: as above.
                    let _ = unsafe { result::graph::destroy(graph) };
                    return Err(e.into());
                }
            };
        let mut nodes = 0usize;
        // SAFETY: `graph` is live; a null node array asks for the count only.
        unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes) }.result()?;
        Ok(Graph {
            owner: self.owner,
            graph,
            exec,
            nodes,
            _borrows: PhantomData,
        })
    }

    /// Ends the capture (once) and destroys the capture stream.
    fn end_capture(&mut self) -> Result<sys::CUgraph> {
        let Some(stream) = self.stream.take() else {
            return Err(Error::Graph {
                reason: "the capture has already ended",
            });
        };
        self.owner.ctx.bind_to_thread()?;
        // SAFETY: the stream is live and capturing (begun in `record_graph`).
        let graph = unsafe { result::stream::end_capture(stream.stream.cu_stream()) };
        drop(stream);
        let graph = graph?;
        if graph.is_null() {
            return Err(Error::Graph {
                reason: "the capture produced no graph",
            });
        }
        Ok(graph)
    }
}

impl Drop for GraphRecorder<'_> {
    fn drop(&mut self) {
        if self.stream.is_some()
            && let Ok(graph) = self.end_capture()
        {
            // SAFETY: the graph of the abandoned capture, destroyed once.
            let _ = unsafe { result::graph::destroy(graph) };
        }
    }
}

impl Graph<'_> {
    /// Queues the graph on the stream of the backend that recorded it (after what was queued
    /// there before). An `Err` while that stream is itself being captured by cudarc's API:
    /// the outer graph would hold this one's buffers without borrowing them.
    pub fn replay(&self) -> Result<()> {
        self.owner.check_queue(super::Work::Launch)?;
        // SAFETY: the graph's buffers are borrowed for as long as `self` lives, and ordered
        // on the owner's stream (the recorder's admission rule).
        unsafe { result::graph::launch(self.exec, self.owner.stream.cu_stream()) }?;
        Ok(())
    }

    /// Nodes of the graph (kernel launches; an op can launch more than one kernel).
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

/// Dropping a graph waits for its queued replays: its borrows end here, and cudarc's events
/// on its buffers do not know the replays, so a later use of a buffer from another stream
/// would not be ordered after them.
impl Drop for Graph<'_> {
    fn drop(&mut self) {
        let ctx = self.owner.context();
        if ctx.bind_to_thread().is_err() {
            return;
        }
        ctx.record_err(self.owner.stream.synchronize());
        // SAFETY: both handles were made by `finish` and are destroyed once; a replay still
        // running completes first (CUDA frees an executing graph when it finishes).
        unsafe {
            ctx.record_err(result::graph::exec_destroy(self.exec));
            ctx.record_err(result::graph::destroy(self.graph));
        }
    }
}
