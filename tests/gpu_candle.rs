//! candle tensors at the boundary on candle's CUDA backend (features `gpu-tests` and
//! `candle-cuda`; fails without a GPU): the scenarios of `common::candle` with the CUDA backend
//! on the candle device's stream, and every wrong device or stream as an `Err`.
#![cfg(all(feature = "gpu-tests", feature = "candle-cuda"))]

mod common;

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{DType, Device, Storage, Tensor as Ct};
use common::candle::{self as scenario, Harness, err_text};
use cudarc::driver::{DevicePtr, DeviceSlice};
use shapeproof::backend::{Cpu, Cuda};
use shapeproof::candle::{CandleBackend, into_candle, read, with_mut};
use shapeproof::dtype::bf16;
use shapeproof::tensor::{Cols, Tensor};

struct OnGpu(Device);

fn on_gpu() -> OnGpu {
    OnGpu(Device::new_cuda(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}")))
}

impl Harness for OnGpu {
    type B = Cuda;
    fn device(&self) -> Device {
        self.0.clone()
    }
    fn storage_address(&self, t: &Ct) -> u64 {
        let (storage, _) = t.storage_and_layout();
        let Storage::Cuda(cuda) = &*storage else {
            panic!("not a CUDA tensor")
        };
        let stream = cuda.device.cuda_stream();
        match &cuda.slice {
            CudaStorageSlice::F32(v) => v.device_ptr(&stream).0,
            CudaStorageSlice::BF16(v) => v.device_ptr(&stream).0,
            CudaStorageSlice::U8(v) | CudaStorageSlice::F8E8M0(v) => v.device_ptr(&stream).0,
            _ => panic!("unexpected dtype"),
        }
    }
    fn view_address<T: shapeproof::backend::Element>(
        &self,
        slice: &cudarc::driver::CudaView<'_, T>,
    ) -> u64 {
        slice.device_ptr(slice.stream()).0
    }
}

#[test]
fn a_view_shares_the_candle_storage() {
    scenario::a_view_shares_the_candle_storage(&on_gpu());
}

#[test]
fn a_narrowed_tensor_views_its_own_rows() {
    scenario::a_narrowed_tensor_views_its_own_rows(&on_gpu());
}

#[test]
fn wrong_dtype_shape_and_strides_are_errors() {
    scenario::wrong_dtype_shape_and_strides_are_errors(&on_gpu());
}

#[test]
fn writes_land_in_the_candle_tensor() {
    scenario::writes_land_in_the_candle_tensor(&on_gpu());
}

#[test]
fn scale_planes_are_lent_from_bytes() {
    scenario::scale_planes_are_lent_from_bytes(&on_gpu());
}

#[test]
fn outputs_move_into_candle_without_a_copy() {
    scenario::outputs_move_into_candle_without_a_copy(&on_gpu());
}

#[test]
fn a_tensor_of_the_other_device_is_an_error() {
    let gpu = on_gpu().0;
    let on_cpu = Ct::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
    let on_cuda = Ct::zeros((2, 4), DType::F32, &gpu).unwrap();
    assert_eq!(
        err_text(read("q", &on_cpu).view::<Cuda, f32, Cols<4>>()),
        "`q`: expected a CUDA tensor, got a CPU tensor"
    );
    assert_eq!(
        err_text(read("q", &on_cuda).view::<Cpu, f32, Cols<4>>()),
        "`q`: expected a CPU tensor, got a CUDA tensor"
    );
    assert_eq!(
        err_text(with_mut::<Cuda, f32, Cols<4>, ()>("k", &on_cpu, |_| Ok(()))),
        "`k`: expected a CUDA tensor, got a CPU tensor"
    );
    assert_eq!(
        err_text(with_mut::<Cpu, f32, Cols<4>, ()>("k", &on_cuda, |_| Ok(()))),
        "`k`: expected a CPU tensor, got a CUDA tensor"
    );
    assert!(
        err_text(Cuda::for_device(&Device::Cpu)).starts_with("`device`: expected a CUDA device")
    );
    assert!(err_text(Cpu::for_device(&gpu)).starts_with("`device`: expected the CPU, got Cuda"));
    let t = Tensor::<Cpu, bf16, Cols<4>>::filled(&Cpu, 2, bf16::ONE).unwrap();
    assert!(
        err_text(into_candle("q", t, (2, 4), &gpu)).starts_with("`q`: expected the CPU device")
    );
}

#[test]
fn a_buffer_of_another_stream_does_not_become_a_candle_tensor() {
    let gpu = on_gpu().0;
    // A backend with its own stream (not the candle device's).
    let own = Cuda::new(0).unwrap();
    let t = Tensor::<Cuda, bf16, Cols<4>>::filled(&own, 2, bf16::ONE).unwrap();
    assert!(
        err_text(into_candle("q", t, (2, 4), &gpu))
            .starts_with("`q`: expected a buffer on the stream of Cuda")
    );
    // The device's own backend is accepted.
    let backend = Cuda::for_device(&gpu).unwrap();
    let t = Tensor::<Cuda, bf16, Cols<4>>::filled(&backend, 2, bf16::ONE).unwrap();
    let c = into_candle("q", t, (2, 4), &gpu).unwrap();
    let host: Vec<bf16> = c.flatten_all().unwrap().to_vec1().unwrap();
    assert!(host.iter().all(|&x| x == bf16::ONE));
}
