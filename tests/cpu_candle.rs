//! candle tensors at the boundary (feature `candle`): zero-copy views that check dtype,
//! contiguity and trailing shape, writes into candle-owned storage, shapeproof outputs moved
//! into candle tensors; every wrong case is an `Err` naming the parameter.
#![cfg(feature = "candle")]

use candle_core::{DType, Device, IndexOp, Tensor as Ct};
use shapeproof::backend::Cpu;
use shapeproof::candle::{into_candle, read, with_cpu_mut};
use shapeproof::dtype::bf16;
use shapeproof::tensor::{Cols, Scalar, Tensor};

fn err_text<T>(r: shapeproof::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_view_shares_the_candle_storage() {
    let t = Ct::arange(0f32, 24.0, &Device::Cpu)
        .unwrap()
        .reshape((2, 3, 4))
        .unwrap();
    let r = read("x", &t);
    // [2, 3, 4] as rows of 12 and as rows of 4.
    let rows12 = r.cpu::<f32, Cols<12>>().unwrap();
    assert_eq!(rows12.rows(), 2);
    let rows4 = r.cpu::<f32, Cols<4>>().unwrap();
    assert_eq!(rows4.rows(), 6);
    assert_eq!(rows4.as_slice()[5], 5.0);
    // No copy: the view's elements are candle's.
    let (storage, _) = t.storage_and_layout();
    let candle_ptr = match &*storage {
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => v.as_ptr(),
        _ => unreachable!(),
    };
    assert_eq!(rows12.as_slice().as_ptr(), candle_ptr);
}

#[test]
fn a_narrowed_tensor_views_its_own_rows() {
    let pool = Ct::arange(0f32, 60.0, &Device::Cpu)
        .unwrap()
        .reshape((3, 5, 4))
        .unwrap();
    let layer = pool.i(1).unwrap(); // [5, 4], offset 20
    let r = read("layer", &layer);
    let v = r.cpu::<f32, Cols<4>>().unwrap();
    assert_eq!((v.rows(), v.as_slice()[0]), (5, 20.0));
}

#[test]
fn wrong_dtype_shape_and_strides_are_errors() {
    let t = Ct::zeros((4, 8), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(
        err_text(read("q", &t).cpu::<bf16, Cols<8>>()),
        "`q`: expected dtype BF16, got F32"
    );
    assert_eq!(
        err_text(read("q", &t).cpu::<f32, Cols<16>>()),
        "`q`: expected rows of 16 elements (trailing dims multiplying to 16), got shape [4, 8]"
    );
    let tt = t.t().unwrap(); // [8, 4], strides [1, 8]
    assert!(
        err_text(read("k", &tt).cpu::<f32, Cols<4>>())
            .starts_with("`k`: expected a contiguous tensor, got strides")
    );
    // Writing goes through the same checks.
    assert_eq!(
        err_text(with_cpu_mut::<i64, Scalar, ()>("loc", &t, |_| Ok(()))),
        "`loc`: expected dtype I64, got F32"
    );
    assert!(
        err_text(with_cpu_mut::<f32, Cols<4>, ()>("k", &tt, |_| Ok(())))
            .starts_with("`k`: expected a contiguous tensor")
    );
}

#[test]
fn writes_land_in_the_candle_tensor() {
    let pool = Ct::zeros((3, 2, 4), DType::F32, &Device::Cpu).unwrap();
    let layer = pool.i(2).unwrap();
    let shape_proof = Tensor::<Cpu, f32, Cols<4>>::from_host(&Cpu, "src", &[1.0; 8], 2).unwrap();
    with_cpu_mut::<f32, Cols<4>, _>("layer", &layer, |mut v| {
        v.write(&Cpu, &shape_proof.to_host(&Cpu)?)?;
        Ok(())
    })
    .unwrap();
    let all: Vec<f32> = pool.flatten_all().unwrap().to_vec1().unwrap();
    assert!(
        all[..16].iter().all(|&x| x == 0.0),
        "other layers untouched"
    );
    assert!(all[16..].iter().all(|&x| x == 1.0), "layer 2 written");
}

#[test]
fn outputs_move_into_candle_without_a_copy() {
    let t = Tensor::<Cpu, bf16, Cols<8>>::filled(&Cpu, 3, bf16::ONE).unwrap();
    let ptr = t.buffer().as_ptr();
    let c = into_candle("q", t, (3, 2, 4)).unwrap();
    assert_eq!(c.dims(), &[3, 2, 4]);
    let (storage, _) = c.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(candle_core::CpuStorage::BF16(v)) => assert_eq!(v.as_ptr(), ptr),
        _ => panic!("not a bf16 CPU tensor"),
    }
    drop(storage);
    let t = Tensor::<Cpu, bf16, Cols<8>>::filled(&Cpu, 3, bf16::ONE).unwrap();
    assert_eq!(
        err_text(into_candle("q", t, (3, 4))),
        "`q`: expected a shape of 24 elements, got [3, 4]"
    );
}
