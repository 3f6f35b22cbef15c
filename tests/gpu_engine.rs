//! Where the library meets the machinery of an engine, on the H200 (feature `gpu-tests`; fails
//! without a GPU): the kernel cache, CUDA graphs, per-thread default streams and several
//! cudarc context objects of one CUDA context. Each test is a route that once let safe code
//! make a kernel touch memory outside its buffers; each must now be refused or ordered.
//! `scripts/gpu-run.sh sanitize` runs it under compute-sanitizer memcheck, which must report 0
//! errors.
#![cfg(feature = "gpu-tests")]

mod common;

use cudarc::driver::{CudaContext, sys};
use shapeproof::backend::cuda::KernelCache;
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::ops::mxfp8_quantize::Mxfp8Quantize;
use shapeproof::tensor::{BlockScales, Cols, Tensor};

use common::quantize::{ROWS, W, case, encoded};

type Input = Tensor<Cuda, bf16, Cols<W>>;
type Data = Tensor<Cuda, F8E4M3, Cols<W>>;
type Scales = Tensor<Cuda, E8M0, BlockScales<W>>;

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

/// Input, and poisoned outputs, allocated by `b`.
fn tensors(b: &Cuda, x: &[bf16]) -> (Input, Data, Scales) {
    (
        Tensor::from_host(b, "x", x, ROWS).unwrap(),
        Tensor::filled(b, ROWS, F8E4M3::from_bits(0x7F)).unwrap(),
        Tensor::filled(b, ROWS, E8M0(0xFF)).unwrap(),
    )
}

/// A user's source compiled through the public cache under a library kernel's instantiation
/// name is its own entry: the library's `run` still launches the library's kernel (the hostile
/// source writes a gigabyte past its output, which memcheck would report).
#[test]
fn a_user_source_cannot_take_a_library_kernels_place() {
    let (x, expected) = case("a_user_source_cannot_take_a_library_kernels_place");
    let g = gpu();
    let hostile = r#"
        struct Mxfp8QuantizeParams { u8* input; u8* data; u8* scales; i64 rows; };
        template <int WIDTH>
        __global__ void mxfp8_quantize_kernel(const Mxfp8QuantizeParams p) {
            p.data[(1ll << 30) + threadIdx.x] = 0;
        }
    "#;
    KernelCache::from_env()
        .get_or_compile(hostile, &format!("mxfp8_quantize_kernel<{W}>"), g.arch())
        .unwrap();
    let (input, mut data, mut scales) = tensors(&g, &x);
    Mxfp8Quantize::<W>::new()
        .run(&g, &input, &mut data, &mut scales)
        .unwrap();
    assert_eq!(encoded(&g, &data, &scales), expected);
}

/// Typed launches recorded into a graph replay on the backend's stream: the outputs, poisoned
/// before recording, hold the kernels' bytes only after a replay (recording runs nothing), and
/// the graph has one node per launch.
#[test]
fn a_recorded_graph_replays_its_launches() {
    let (x, expected) = case("a_recorded_graph_replays_its_launches");
    let (y, expected_y) = case("a_recorded_graph_replays_its_launches, second op");
    let g = gpu();
    let op = Mxfp8Quantize::<W>::new();
    let (input, mut data, mut scales) = tensors(&g, &x);
    let (input_y, mut data_y, mut scales_y) = tensors(&g, &y);
    let mut recorder = g.record_graph().unwrap();
    op.record(&mut recorder, &input, &mut data, &mut scales)
        .unwrap();
    op.record(&mut recorder, &input_y, &mut data_y, &mut scales_y)
        .unwrap();
    let graph = recorder.finish().unwrap();
    assert_eq!(graph.nodes(), 2);
    graph.replay().unwrap();
    graph.replay().unwrap();
    drop(graph);
    assert_eq!(encoded(&g, &data, &scales), expected);
    assert_eq!(encoded(&g, &data_y, &scales_y), expected_y);
}

/// A graph replays on the backend's stream without waiting for others, so it admits only
/// buffers ordered there: one of another stream is refused, and the recording cannot be
/// finished.
#[test]
fn a_graph_refuses_buffers_of_another_stream() {
    let (x, _) = case("a_graph_refuses_buffers_of_another_stream");
    let (g, other) = (gpu(), gpu());
    let (input, mut data, mut scales) = tensors(&other, &x);
    let mut recorder = g.record_graph().unwrap();
    let err = Mxfp8Quantize::<W>::new()
        .record(&mut recorder, &input, &mut data, &mut scales)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("`input`: the buffer cannot be used by this backend: it is ordered on another stream than the backend's, and a graph replays"),
        "{err}"
    );
    let finish = recorder
        .finish()
        .err()
        .expect("a failed recording")
        .to_string();
    assert!(
        finish.starts_with("CUDA graph: an earlier launch"),
        "{finish}"
    );
    // The backend is usable afterwards.
    let (input, mut data, mut scales) = tensors(&g, &x);
    Mxfp8Quantize::<W>::new()
        .run(&g, &input, &mut data, &mut scales)
        .unwrap();
    g.synchronize().unwrap();
}

/// A capture begun with cudarc's own API borrows nothing, so while the backend's stream is
/// captured so, launches, copies and allocations are errors (and nothing joins the graph).
#[test]
fn a_foreign_capture_takes_no_work() {
    let (x, expected) = case("a_foreign_capture_takes_no_work");
    let g = gpu();
    let op = Mxfp8Quantize::<W>::new();
    let (input, mut data, mut scales) = tensors(&g, &x);
    g.synchronize().unwrap();
    g.stream()
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let launch = op
        .run(&g, &input, &mut data, &mut scales)
        .unwrap_err()
        .to_string();
    let copy = data.to_host(&g).unwrap_err().to_string();
    let alloc = Tensor::<Cuda, bf16, Cols<W>>::zeros(&g, 1)
        .err()
        .unwrap()
        .to_string();
    let graph = g
        .stream()
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap();
    for err in [&launch, &copy, &alloc] {
        assert!(
            err.contains("is being captured into a CUDA graph that would keep raw addresses"),
            "{err}"
        );
    }
    // Nothing joined the capture: replaying its graph leaves the outputs poisoned.
    if let Some(graph) = graph {
        graph.launch().unwrap();
    }
    g.synchronize().unwrap();
    let poisoned = encoded(&g, &data, &scales);
    assert!(poisoned[..ROWS * W].iter().all(|&b| b == 0x7F));
    assert!(poisoned[ROWS * W..].iter().all(|&b| b == 0xFF));
    op.run(&g, &input, &mut data, &mut scales).unwrap();
    assert_eq!(encoded(&g, &data, &scales), expected);
}

/// A backend on the per-thread default stream is bound to the thread that made it: from
/// another thread its launches and copies are errors naming the stream (they would land on
/// that thread's stream, unordered with the backend's); on its thread it runs. A buffer of a
/// per-thread stream is refused by a backend of another stream, and by a per-thread backend of
/// another thread.
#[test]
fn a_per_thread_stream_backend_is_bound_to_its_thread() {
    let (x, expected) = case("a_per_thread_stream_backend_is_bound_to_its_thread");
    let ctx = CudaContext::new(0).unwrap();
    let g = Cuda::from_stream(ctx.per_thread_stream()).unwrap();
    let op = Mxfp8Quantize::<W>::new();
    let (input, mut data, mut scales) = tensors(&g, &x);
    std::thread::scope(|s| {
        s.spawn(|| {
            let launch = op
                .run(&g, &input, &mut data, &mut scales)
                .unwrap_err()
                .to_string();
            let copy = input.to_host(&g).unwrap_err().to_string();
            for err in [launch, copy] {
                assert!(
                    err.starts_with("the stream the per-thread default stream of ThreadId("),
                    "{err}"
                );
            }
            // A per-thread backend of this thread has the same handle but another stream.
            let here = Cuda::from_stream(ctx.per_thread_stream()).unwrap();
            let (mut d, mut s) = (Data::zeros(&here, ROWS).unwrap(), Scales::zeros(&here, ROWS).unwrap());
            let err = op.run(&here, &input, &mut d, &mut s).unwrap_err().to_string();
            assert!(
                err.starts_with("`input`: the buffer cannot be used by this backend: it is ordered on the per-thread default stream"),
                "{err}"
            );
        });
    });
    op.run(&g, &input, &mut data, &mut scales).unwrap();
    assert_eq!(encoded(&g, &data, &scales), expected);
    let own = gpu();
    let (mut out_data, mut out_scales) = (
        Data::zeros(&own, ROWS).unwrap(),
        Scales::zeros(&own, ROWS).unwrap(),
    );
    let err = op
        .run(&own, &input, &mut out_data, &mut out_scales)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("`input`: the buffer cannot be used by this backend: it is ordered on the per-thread default stream"),
        "{err}"
    );
}

/// The per-thread stream object a backend was made from stays bound to that thread: sent to
/// another thread, a second backend of the same object is an `Err` (admission compares stream
/// objects, so it would take the first thread's buffers as its own stream's, unordered with
/// them).
#[test]
fn a_per_thread_stream_object_sent_to_another_thread_is_refused() {
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.per_thread_stream();
    let g = Cuda::from_stream(stream.clone()).unwrap();
    let x = Data::zeros(&g, ROWS).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let err = Cuda::from_stream(stream.clone()).err().unwrap().to_string();
            assert!(
                err.starts_with(
                    "the stream the per-thread default stream object bound to ThreadId("
                ),
                "{err}"
            );
            // This thread's own object binds here.
            assert!(Cuda::from_stream(ctx.per_thread_stream()).is_ok());
        });
    });
    // On its own thread the same object makes another backend, which takes its buffers.
    let again = Cuda::from_stream(stream.clone()).unwrap();
    assert_eq!(
        x.to_host(&again).unwrap().len(),
        x.to_host(&g).unwrap().len()
    );
}

/// Two cudarc context objects of one CUDA context (`Cuda::new` beside a device set up as
/// candle does): cudarc orders a buffer by its own object's event tracking, so a buffer of
/// the other object on another stream is refused in both directions, for launches and
/// copies, instead of being admitted unordered.
#[test]
fn two_context_objects_of_one_context_do_not_mix_streams() {
    let (x, expected) = case("two_context_objects_of_one_context_do_not_mix_streams");
    let a = gpu();
    let ctx_b = CudaContext::new(0).unwrap();
    // SAFETY: every buffer of `ctx_b` below is used on `b`'s stream, or refused.
    unsafe { ctx_b.disable_event_tracking() };
    let b = Cuda::from_stream(ctx_b.new_stream().unwrap()).unwrap();
    assert_eq!(a.context().cu_ctx(), b.context().cu_ctx());
    let op = Mxfp8Quantize::<W>::new();
    for (on, from) in [(&a, &b), (&b, &a)] {
        let (input, mut data, mut scales) = tensors(from, &x);
        let err = op
            .run(on, &input, &mut data, &mut scales)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("`input`: the buffer cannot be used by this backend"),
            "{err}"
        );
        let copy = data.to_host(on).unwrap_err().to_string();
        assert!(
            copy.starts_with("`the copied tensor`: the buffer cannot be used"),
            "{copy}"
        );
        let write = scales
            .write(on, &vec![E8M0(1); ROWS * W / 32])
            .unwrap_err()
            .to_string();
        assert!(
            write.starts_with("`the written tensor`: the buffer cannot be used"),
            "{write}"
        );
        // On their own backend, the same tensors run.
        op.run(from, &input, &mut data, &mut scales).unwrap();
        assert_eq!(encoded(from, &data, &scales), expected);
    }
}

/// With event tracking off, copies follow the launches' rule: a tensor of another stream is
/// an error for `to_host` and `write` too, not an unordered copy.
#[test]
fn copies_of_another_stream_without_events_are_refused() {
    let ctx = CudaContext::new_non_primary(0, 0).unwrap();
    // SAFETY: every buffer of this context is used on the stream of `a`, or refused.
    unsafe { ctx.disable_event_tracking() };
    let a = Cuda::from_stream(ctx.new_stream().unwrap()).unwrap();
    let b = Cuda::from_stream(ctx.new_stream().unwrap()).unwrap();
    let mut t = Tensor::<Cuda, bf16, Cols<8>>::zeros(&a, 2).unwrap();
    let copy = t.to_host(&b).unwrap_err().to_string();
    let write = t.write(&b, &[bf16::ONE; 16]).unwrap_err().to_string();
    for err in [copy, write] {
        assert!(
            err.contains("it is ordered on another stream and the context tracks no events"),
            "{err}"
        );
    }
    t.write(&a, &[bf16::ONE; 16]).unwrap();
    assert_eq!(t.to_host(&a).unwrap(), vec![bf16::ONE; 16]);
}
