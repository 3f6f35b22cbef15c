//! The runtime boundary on the H200 (feature `gpu-tests`; fails without a GPU): every extent a
//! safe caller can get wrong is an `Err` before anything is queued, garbage index values are
//! guarded on the device, and buffers of another context, or of another stream when nothing
//! orders them, are refused. `scripts/gpu-run.sh sanitize` runs it under compute-sanitizer
//! memcheck, racecheck and synccheck, which must report 0 errors.
#![cfg(feature = "gpu-tests")]

mod common;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::ops::mxfp8_quantize::Mxfp8Quantize;
use shapeproof::tensor::{BlockScales, Cols, Tensor};

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

#[test]
fn sparse_mla_extents_are_errors() {
    common::boundary::sparse_mla_extents(&gpu());
}

#[test]
fn prologue_extents_are_errors() {
    common::boundary::prologue_extents(&gpu());
}

#[test]
fn tensor_and_quantize_extents_are_errors() {
    common::boundary::tensor_and_quantize_extents(&gpu());
}

#[test]
fn counter_wraps_and_empty_batches_count_nothing() {
    common::boundary::counter_wraps_and_empty_batches_count_nothing(&gpu());
}

#[test]
fn garbage_index_values_are_guarded() {
    let g = gpu();
    let mut rng = common::rng("garbage_index_values_are_guarded");
    common::boundary::hostile_index_values(&g, &mut rng);
}

use common::quantize::{ROWS, W, case as quantize_case, encoded};

/// Runs the quantize op on `on`, with tensors allocated by `from`; poisoned outputs.
fn quantize_across(on: &Cuda, from: &Cuda, x: &[bf16]) -> shapeproof::Result<Vec<u8>> {
    let input = Tensor::<Cuda, bf16, Cols<W>>::from_host(from, "x", x, ROWS)?;
    let mut data = Tensor::filled(from, ROWS, F8E4M3::from_bits(0x7F))?;
    let mut scales = Tensor::filled(from, ROWS, E8M0(0xFF))?;
    Mxfp8Quantize::<W>::new().run(on, &input, &mut data, &mut scales)?;
    on.synchronize()?;
    Ok(encoded(from, &data, &scales))
}

/// With event tracking on (cudarc's default, which the backend leaves alone), buffers of
/// another stream of the same context are ordered by events: the launch is correct.
#[test]
fn buffers_of_another_stream_are_ordered_by_events() {
    let (x, expected) = quantize_case("buffers_of_another_stream_are_ordered_by_events");
    let (a, b) = (gpu(), gpu());
    assert!(a.context().is_event_tracking());
    assert_eq!(quantize_across(&b, &a, &x).unwrap(), expected);
}

/// A context of its own with event tracking off: a buffer of another stream is refused (the
/// launch could not be ordered against its writes or its release), one of the backend's own
/// stream runs.
#[test]
fn buffers_of_another_stream_without_events_are_refused() {
    let (x, expected) = quantize_case("buffers_of_another_stream_without_events_are_refused");
    let ctx = CudaContext::new_non_primary(0, 0).unwrap();
    // SAFETY: every buffer made in this context below is used on one stream, or refused.
    unsafe { ctx.disable_event_tracking() };
    let a = Cuda::from_stream(ctx.new_stream().unwrap()).unwrap();
    let b = Cuda::from_stream(ctx.new_stream().unwrap()).unwrap();
    let err = quantize_across(&b, &a, &x).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "`input`: the buffer cannot be used by this backend: it is ordered on another stream"
        ),
        "{err}"
    );
    assert_eq!(quantize_across(&a, &a, &x).unwrap(), expected);
}

/// A buffer of another context (another device, or another context of this one) is refused.
#[test]
fn buffers_of_another_context_are_refused() {
    let (x, _) = quantize_case("buffers_of_another_context_are_refused");
    let primary = gpu();
    let other = Cuda::from_stream(
        CudaContext::new_non_primary(0, 0)
            .unwrap()
            .new_stream()
            .unwrap(),
    )
    .unwrap();
    let err = quantize_across(&other, &primary, &x)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("`input`: the buffer cannot be used by this backend: it was allocated in another CUDA context"),
        "{err}"
    );
    // Copies refuse them too.
    let mut t = Tensor::<Cuda, bf16, Cols<8>>::zeros(&primary, 2).unwrap();
    let copy = t.to_host(&other).unwrap_err().to_string();
    assert!(
        copy.starts_with("`the copied tensor`: the buffer cannot be used by this backend"),
        "{copy}"
    );
    let write = t.write(&other, &[bf16::ONE; 16]).unwrap_err().to_string();
    assert!(
        write.starts_with("`the written tensor`: the buffer cannot be used by this backend"),
        "{write}"
    );
}

/// A backend on the caller's stream: the caller's upload queued just before the launch is
/// what the kernel reads, and the caller's download queued just after sees its writes.
#[test]
fn a_backend_on_the_callers_stream_is_ordered_with_its_work() {
    let (x, expected) = quantize_case("a_backend_on_the_callers_stream_is_ordered_with_its_work");
    let ctx = CudaContext::new(0).unwrap();
    let stream: Arc<CudaStream> = ctx.new_stream().unwrap();
    let g = Cuda::from_stream(stream.clone()).unwrap();
    // The caller's own allocations and copies, on its stream.
    let mut input_buf = stream.alloc_zeros::<bf16>(ROWS * W).unwrap();
    stream.memcpy_htod(&x, &mut input_buf).unwrap();
    let input = Tensor::<Cuda, bf16, Cols<W>>::from_buffer("x", input_buf, ROWS).unwrap();
    let mut data = Tensor::<Cuda, F8E4M3, Cols<W>>::from_buffer(
        "data",
        stream.alloc_zeros(ROWS * W).unwrap(),
        ROWS,
    )
    .unwrap();
    let mut scales = Tensor::<Cuda, E8M0, BlockScales<W>>::from_buffer(
        "scales",
        stream.alloc_zeros(ROWS * W / 32).unwrap(),
        ROWS,
    )
    .unwrap();
    Mxfp8Quantize::<W>::new()
        .run(&g, &input, &mut data, &mut scales)
        .unwrap();
    let mut bytes: Vec<u8> = stream
        .clone_dtoh(data.buffer())
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    bytes.extend(
        stream
            .clone_dtoh(scales.buffer())
            .unwrap()
            .iter()
            .map(|s| s.0),
    );
    assert_eq!(bytes, expected);
}

/// Memory with no Rust owner enters through the `unsafe` door and is then checked like any
/// view: a raw device pointer wrapped as `ForeignDeviceBuffer`, written by the typed launch,
/// never freed by the library.
#[test]
fn foreign_device_memory_through_the_unsafe_door() {
    use shapeproof::backend::cuda::ForeignDeviceBuffer;
    use shapeproof::tensor::{TensorView, TensorViewMut};
    let (x, expected) = quantize_case("foreign_device_memory_through_the_unsafe_door");
    let g = gpu();
    let stream = g.stream().clone();
    // An allocation owned by "someone else": leaked from cudarc, freed by hand at the end.
    let raw_in = stream.clone_htod(&x).unwrap().leak();
    let raw_data = stream.alloc_zeros::<F8E4M3>(ROWS * W).unwrap().leak();
    let raw_scales = stream.alloc_zeros::<E8M0>(ROWS * W / 32).unwrap().leak();
    {
        // SAFETY: the three allocations above are live, of these lengths, on `stream`, and
        // freed only after the buffers are dropped.
        let (input, mut data, mut scales) = unsafe {
            (
                ForeignDeviceBuffer::<bf16>::new(&stream, raw_in, ROWS * W).unwrap(),
                ForeignDeviceBuffer::<F8E4M3>::new(&stream, raw_data, ROWS * W).unwrap(),
                ForeignDeviceBuffer::<E8M0>::new(&stream, raw_scales, ROWS * W / 32).unwrap(),
            )
        };
        let input_view =
            TensorView::<Cuda, bf16, Cols<W>>::from_slice("x", input.view(), ROWS).unwrap();
        let mut data_view =
            TensorViewMut::<Cuda, F8E4M3, Cols<W>>::from_slice_mut("data", data.view_mut(), ROWS)
                .unwrap();
        // A foreign buffer of the wrong length is still an error.
        assert!(
            TensorViewMut::<Cuda, E8M0, BlockScales<W>>::from_slice_mut(
                "scales",
                scales.view_mut(),
                ROWS + 1
            )
            .is_err()
        );
        let mut scales_view = TensorViewMut::<Cuda, E8M0, BlockScales<W>>::from_slice_mut(
            "scales",
            scales.view_mut(),
            ROWS,
        )
        .unwrap();
        Mxfp8Quantize::<W>::new()
            .run(&g, &input_view, &mut data_view, &mut scales_view)
            .unwrap();
        let mut bytes: Vec<u8> = data_view
            .to_host(&g)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        bytes.extend(scales_view.to_host(&g).unwrap().iter().map(|s| s.0));
        assert_eq!(bytes, expected);
    }
    // SAFETY: the pointers came from `leak` above and are freed once.
    unsafe {
        drop(stream.upgrade_device_ptr::<bf16>(raw_in, ROWS * W));
        drop(stream.upgrade_device_ptr::<F8E4M3>(raw_data, ROWS * W));
        drop(stream.upgrade_device_ptr::<E8M0>(raw_scales, ROWS * W / 32));
    }
}
