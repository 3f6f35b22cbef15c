//! candle tensors at the boundary, for any backend that runs on a candle device: zero-copy
//! views that check device, dtype, contiguity and trailing shape; writes into candle-owned
//! storage that change nothing else; shapeproof outputs moved into candle tensors. Every
//! wrong case is an `Err` naming the parameter, the expected and the actual value.

use candle_core::{DType, Device, IndexOp, Tensor as Ct};
use shapeproof::backend::Backend;
use shapeproof::candle::{CandleBackend, into_candle, read, with_mut};
use shapeproof::dtype::{E8M0, bf16};
use shapeproof::tensor::{Cols, Scalar, Tensor};

/// What a test needs to know about one backend beside its candle device.
pub trait Harness {
    /// The backend under test.
    type B: CandleBackend;
    /// The candle device the backend runs on.
    fn device(&self) -> Device;
    /// Where element 0 of a candle tensor's storage lives (host or device address).
    fn storage_address(&self, t: &Ct) -> u64;
    /// Where a view's first element lives.
    fn view_address<T: shapeproof::backend::Element>(
        &self,
        slice: &<Self::B as Backend>::Slice<'_, T>,
    ) -> u64;
}

pub fn err_text<T>(r: shapeproof::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

pub fn a_view_shares_the_candle_storage<H: Harness>(h: &H) {
    let backend = H::B::for_device(&h.device()).unwrap();
    let t = Ct::arange(0f32, 24.0, &h.device())
        .unwrap()
        .reshape((2, 3, 4))
        .unwrap();
    let r = read("x", &t);
    // [2, 3, 4] as rows of 12 and as rows of 4.
    let rows12 = r.view::<H::B, f32, Cols<12>>().unwrap();
    assert_eq!(rows12.rows(), 2);
    let rows4 = r.view::<H::B, f32, Cols<4>>().unwrap();
    assert_eq!(rows4.rows(), 6);
    assert_eq!(rows4.to_host(&backend).unwrap()[5], 5.0);
    // No copy: the view's elements are candle's.
    let address = h.view_address(&rows12.as_slice());
    assert_eq!(address, h.storage_address(&t));
}

pub fn a_narrowed_tensor_views_its_own_rows<H: Harness>(h: &H) {
    let backend = H::B::for_device(&h.device()).unwrap();
    let pool = Ct::arange(0f32, 60.0, &h.device())
        .unwrap()
        .reshape((3, 5, 4))
        .unwrap();
    let layer = pool.i(1).unwrap(); // [5, 4], offset 20
    let r = read("layer", &layer);
    let v = r.view::<H::B, f32, Cols<4>>().unwrap();
    let host = v.to_host(&backend).unwrap();
    assert_eq!((v.rows(), host[0], host[19]), (5, 20.0, 39.0));
    let address = h.view_address(&v.as_slice());
    assert_eq!(address, h.storage_address(&pool) + 20 * 4);
}

pub fn wrong_dtype_shape_and_strides_are_errors<H: Harness>(h: &H) {
    let t = Ct::zeros((4, 8), DType::F32, &h.device()).unwrap();
    assert_eq!(
        err_text(read("q", &t).view::<H::B, bf16, Cols<8>>()),
        "`q`: expected dtype BF16, got F32"
    );
    assert_eq!(
        err_text(read("q", &t).view::<H::B, f32, Cols<16>>()),
        "`q`: expected rows of 16 elements (trailing dims multiplying to 16), got shape [4, 8]"
    );
    assert_eq!(
        err_text(read("sfk", &t).view::<H::B, E8M0, Cols<8>>()),
        "`sfk`: expected dtype F8E8M0 or U8, got F32"
    );
    // A broadcast shape whose element count overflows usize is an error, not a panic.
    let huge = Ct::zeros((1, 1, 0), DType::F32, &h.device())
        .unwrap()
        .broadcast_as((1usize << 40, 1usize << 40, 0))
        .unwrap();
    assert!(
        err_text(read("x", &huge).view::<H::B, f32, Cols<4>>())
            .starts_with("`x`: expected rows of 4 elements")
    );
    let tt = t.t().unwrap(); // [8, 4], strides [1, 8]
    assert!(
        err_text(read("k", &tt).view::<H::B, f32, Cols<4>>())
            .starts_with("`k`: expected a contiguous tensor, got strides")
    );
    // Writing goes through the same checks.
    assert_eq!(
        err_text(with_mut::<H::B, i64, Scalar, ()>("loc", &t, |_| Ok(()))),
        "`loc`: expected dtype I64, got F32"
    );
    assert!(
        err_text(with_mut::<H::B, f32, Cols<4>, ()>("k", &tt, |_| Ok(())))
            .starts_with("`k`: expected a contiguous tensor")
    );
}

pub fn writes_land_in_the_candle_tensor<H: Harness>(h: &H) {
    let backend = H::B::for_device(&h.device()).unwrap();
    let pool = Ct::zeros((3, 2, 4), DType::F32, &h.device()).unwrap();
    let layer = pool.i(2).unwrap();
    with_mut::<H::B, f32, Cols<4>, _>("layer", &layer, |mut v| {
        v.write(&backend, &[1.0; 8])?;
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

/// E8M0 scales lent from `U8` (an engine's pool) and from `F8E8M0` tensors, at an offset of
/// their storage, read and written; the bytes around the range stay as they were.
pub fn scale_planes_are_lent_from_bytes<H: Harness>(h: &H) {
    let backend = H::B::for_device(&h.device()).unwrap();
    let before: Vec<u8> = (0..96u32).map(|i| (i * 7 % 251) as u8).collect();
    let bytes_pool = Ct::new(before.as_slice(), &h.device())
        .unwrap()
        .reshape((3, 32))
        .unwrap();
    let e8m0: Vec<E8M0> = before.iter().map(|&b| E8M0(b)).collect();
    let owned = Tensor::<H::B, E8M0, Cols<32>>::from_host(&backend, "sf", &e8m0, 3).unwrap();
    let e8m0_pool = into_candle("sf", owned, (3, 32), &h.device()).unwrap();
    assert_eq!(e8m0_pool.dtype(), DType::F8E8M0);
    for pool in [&bytes_pool, &e8m0_pool] {
        let layer = pool.i(1).unwrap(); // bytes 32..64
        let seen = read("sf", &layer)
            .view::<H::B, E8M0, Cols<32>>()
            .unwrap()
            .to_host(&backend)
            .unwrap();
        assert_eq!(seen, e8m0[32..64]);
        let fresh: Vec<E8M0> = (0..32).map(|i| E8M0(200 - i)).collect();
        with_mut::<H::B, E8M0, Cols<32>, _>("sf", &layer, |mut v| v.write(&backend, &fresh))
            .unwrap();
        backend.synchronize().unwrap();
        let after = bytes_of(&backend, pool);
        assert_eq!(
            after[..32],
            before[..32],
            "bytes before the range untouched"
        );
        assert_eq!(after[64..], before[64..], "bytes after the range untouched");
        assert_eq!(
            after[32..64],
            fresh.iter().map(|e| e.0).collect::<Vec<_>>()[..]
        );
        // A range at the start whose length does not divide the storage: bytes 0..64.
        let head = pool.narrow(0, 0, 2).unwrap();
        let firsts: Vec<E8M0> = (0..64).map(|i| E8M0(i + 100)).collect();
        with_mut::<H::B, E8M0, Cols<32>, _>("sf", &head, |mut v| v.write(&backend, &firsts))
            .unwrap();
        backend.synchronize().unwrap();
        let after = bytes_of(&backend, pool);
        assert_eq!(
            after[..64],
            firsts.iter().map(|e| e.0).collect::<Vec<_>>()[..]
        );
        assert_eq!(after[64..], before[64..], "bytes after the range untouched");
        // A range that does not start at a multiple of its length: bytes 40..56.
        let odd = pool.flatten_all().unwrap().narrow(0, 40, 16).unwrap();
        let marks: Vec<E8M0> = (0..16).map(|i| E8M0(3 * i + 1)).collect();
        with_mut::<H::B, E8M0, Cols<16>, _>("sf", &odd, |mut v| v.write(&backend, &marks)).unwrap();
        backend.synchronize().unwrap();
        let again = bytes_of(&backend, pool);
        assert_eq!(
            again[..40],
            after[..40],
            "bytes before the odd range untouched"
        );
        assert_eq!(
            again[56..],
            after[56..],
            "bytes after the odd range untouched"
        );
        assert_eq!(
            again[40..56],
            marks.iter().map(|e| e.0).collect::<Vec<_>>()[..]
        );
    }
}

/// The bytes of a `U8` or `F8E8M0` tensor, read back through a shapeproof view.
fn bytes_of<B: CandleBackend>(backend: &B, t: &Ct) -> Vec<u8> {
    let r = read("bytes", t);
    let v = r.view::<B, E8M0, Cols<32>>().unwrap();
    v.to_host(backend).unwrap().iter().map(|e| e.0).collect()
}

pub fn outputs_move_into_candle_without_a_copy<H: Harness>(h: &H) {
    let backend = H::B::for_device(&h.device()).unwrap();
    let t = Tensor::<H::B, bf16, Cols<8>>::filled(&backend, 3, bf16::ONE).unwrap();
    let address = h.view_address(&t.as_slice());
    let c = into_candle("q", t, (3, 2, 4), &h.device()).unwrap();
    assert_eq!(c.dims(), &[3, 2, 4]);
    assert_eq!(h.storage_address(&c), address);
    let sum: f32 = c
        .to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert_eq!(sum, 24.0);
    let t = Tensor::<H::B, bf16, Cols<8>>::filled(&backend, 3, bf16::ONE).unwrap();
    assert_eq!(
        err_text(into_candle("q", t, (3, 4), &h.device())),
        "`q`: expected a shape of 24 elements, got [3, 4]"
    );
}
