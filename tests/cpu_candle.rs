//! candle tensors at the boundary on candle's CPU backend (feature `candle`): the scenarios of
//! `common::candle` with the CPU backend, and the device checks.
#![cfg(feature = "candle")]

mod common;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor as Ct};
use common::candle::{self as scenario, Harness};
use shapeproof::backend::Cpu;
use shapeproof::candle::{CandleBackend, into_candle};
use shapeproof::dtype::bf16;
use shapeproof::tensor::{Cols, Tensor};

struct OnCpu;

impl Harness for OnCpu {
    type B = Cpu;
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn storage_address(&self, t: &Ct) -> u64 {
        let (storage, _) = t.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            panic!("not a CPU tensor")
        };
        (match cpu {
            CpuStorage::F32(v) => v.as_ptr() as usize,
            CpuStorage::BF16(v) => v.as_ptr() as usize,
            CpuStorage::U8(v) | CpuStorage::F8E8M0(v) => v.as_ptr() as usize,
            _ => panic!("unexpected dtype"),
        }) as u64
    }
    fn view_address<T: shapeproof::backend::Element>(&self, slice: &&[T]) -> u64 {
        slice.as_ptr() as u64
    }
}

#[test]
fn a_view_shares_the_candle_storage() {
    scenario::a_view_shares_the_candle_storage(&OnCpu);
}

#[test]
fn a_narrowed_tensor_views_its_own_rows() {
    scenario::a_narrowed_tensor_views_its_own_rows(&OnCpu);
}

#[test]
fn wrong_dtype_shape_and_strides_are_errors() {
    scenario::wrong_dtype_shape_and_strides_are_errors(&OnCpu);
}

#[test]
fn writes_land_in_the_candle_tensor() {
    scenario::writes_land_in_the_candle_tensor(&OnCpu);
}

#[test]
fn scale_planes_are_lent_from_bytes() {
    scenario::scale_planes_are_lent_from_bytes(&OnCpu);
}

#[test]
fn outputs_move_into_candle_without_a_copy() {
    scenario::outputs_move_into_candle_without_a_copy(&OnCpu);
}

#[test]
fn the_cpu_backend_runs_on_the_cpu_device_only() {
    assert!(Cpu::for_device(&Device::Cpu).is_ok());
    let t = Tensor::<Cpu, bf16, Cols<8>>::filled(&Cpu, 1, bf16::ONE).unwrap();
    let c = into_candle("q", t, (1, 8), &Device::Cpu).unwrap();
    assert_eq!(c.dtype(), DType::BF16);
}
