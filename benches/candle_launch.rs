//! Host cost of launching the verify prologue (MXFP8 store, TP8 geometry, B = 1, q = 4) from
//! candle CUDA tensors, against a raw `cuLaunchKernel` of the same kernel and parameter block
//! (features `gpu-tests` and `candle-cuda`; fails without a GPU):
//! - `lent once`: every input, output and KV plane a view of a candle tensor, lent once, then
//!   launched repeatedly (the typed boundary alone);
//! - `lent per call`: the views re-lent for every launch (`read` + `with_cuda_mut` of each
//!   tensor, then the launch), as a candle engine does once per step.
//!
//! Both with cudarc's event tracking on (candle's default: every buffer of a launch costs an
//! event wait and an event record) and off (`CudaDevice::disable_event_tracking`, a
//! single-stream engine). Alternating rounds, medians (host timings on a VM drift). Run on the
//! H200 through `scripts/gpu-bundle.sh` (`run.sh bench`).

mod common;

use std::time::Instant;

use candle_core::{DType, Device, Tensor as Ct};
use common::Record;
use shapeproof::backend::{Backend, Cuda};
use shapeproof::candle::{CandleBackend, read, with_cuda_mut};
use shapeproof::dtype::{E8M0, bf16};
use shapeproof::layout::{Mxfp8KvCache, Mxfp8KvParts};
use shapeproof::ops::prologue::*;
use shapeproof::tensor::Scalar;

const DQ: usize = 1024;
const DKV: usize = 128;
const Q: usize = 4;
const PAGE: usize = 128;
const T: usize = 4; // B = 1, q = 4
type Row = PackedRow<DQ, DKV, 128>;
type Conv = InklingConv;
type Kernel = Mxfp8Prologue<Verify, DQ, DKV, Row, Conv, PAGE>;

/// The candle tensors of one call: the engine's buffers.
struct CandleCall {
    qkvr: Ct,          // [T, DQ + 2·DKV + 128] bf16
    cache_indices: Ct, // [1] i32
    cache_mask: Ct,    // [1] u8
    loc: Ct,           // [T] i64
    tau: Ct,           // [T] f32
    q: Ct,             // [T, DQ] e4m3
    q_scales: Ct,      // [T, DQ / 32] bytes
    k: Ct,             // [T, DKV] bf16
    v: Ct,             // [T, DKV] bf16
    k_pool: Ct,        // [PAGE, DKV] e4m3
    v_pool: Ct,        // [PAGE, DKV] e4m3
    k_planes: Ct,      // [1, DKV / 128, 32, PAGE / 32, 4] bytes
    v_planes: Ct,      // [1, DKV / 128, 32, PAGE / 32, 4] bytes
}

impl CandleCall {
    fn new(dev: &Device) -> candle_core::Result<Self> {
        let qkvr =
            (Ct::randn(0f32, 1.0, (T, DQ + 2 * DKV + 128), dev)? * 0.5)?.to_dtype(DType::BF16)?;
        let plane = (1, DKV / 128, 32, PAGE / 32, 4);
        Ok(Self {
            qkvr,
            cache_indices: Ct::new(&[0i32], dev)?,
            cache_mask: Ct::new(&[1u8], dev)?,
            loc: Ct::new(&[0i64, 1, 2, 3], dev)?,
            tau: Ct::ones(T, DType::F32, dev)?,
            q: Ct::zeros((T, DQ), DType::F8E4M3, dev)?,
            q_scales: Ct::zeros((T, DQ / 32), DType::U8, dev)?,
            k: Ct::zeros((T, DKV), DType::BF16, dev)?,
            v: Ct::zeros((T, DKV), DType::BF16, dev)?,
            k_pool: Ct::zeros((PAGE, DKV), DType::F8E4M3, dev)?,
            v_pool: Ct::zeros((PAGE, DKV), DType::F8E4M3, dev)?,
            k_planes: Ct::zeros(plane, DType::U8, dev)?,
            v_planes: Ct::zeros(plane, DType::U8, dev)?,
        })
    }
}

/// The shapeproof-owned state of the layer.
struct Layer {
    weights: PrologueWeights<Cuda, 128, DKV, Conv>,
    conv: ConvState<Cuda, DKV, Conv>,
    windows: VerifyWindows<Cuda, DKV, Conv>,
}

/// Lends every candle tensor of `c` to `f` as the checked arguments of one call.
fn with_call<Out>(
    c: &CandleCall,
    f: impl FnOnce(
        &VerifyBatch<Cuda, Row, shapeproof::tensor::View<'_>>,
        &mut Mxfp8Outputs<Cuda, DQ, DKV, shapeproof::tensor::ViewMut<'_>>,
        &mut Mxfp8KvCache<Cuda, PAGE, DKV, shapeproof::tensor::ViewMut<'_>>,
    ) -> shapeproof::Result<Out>,
) -> shapeproof::Result<Out> {
    let (qkvr, idx, mask, loc, tau) = (
        read("qkvr", &c.qkvr),
        read("cache_indices", &c.cache_indices),
        read("cache_mask", &c.cache_mask),
        read("loc", &c.loc),
        read("log_scaling_tau", &c.tau),
    );
    let batch = VerifyBatch::new(
        qkvr.cuda::<bf16, QkvrRow<Row>>()?,
        idx.cuda::<i32, Scalar>()?,
        mask.cuda::<u8, Scalar>()?,
        loc.cuda::<i64, Scalar>()?,
        Some(tau.cuda::<f32, Scalar>()?),
        Q,
    )?;
    with_cuda_mut("q_out", &c.q, |mut q| {
        with_cuda_mut::<E8M0, _, _>("q_scales", &c.q_scales, |mut q_scales| {
            with_cuda_mut("k_out", &c.k, |mut k| {
                with_cuda_mut("v_out", &c.v, |mut v| {
                    with_cuda_mut("k_buf", &c.k_pool, |mut kb| {
                        with_cuda_mut("v_buf", &c.v_pool, |mut vb| {
                            with_cuda_mut::<E8M0, _, _>("sfk", &c.k_planes, |mut sfk| {
                                with_cuda_mut::<E8M0, _, _>("sfv", &c.v_planes, |mut sfv| {
                                    let mut out = Mxfp8Outputs::new(
                                        q.view_mut(),
                                        q_scales.view_mut(),
                                        k.view_mut(),
                                        v.view_mut(),
                                    )?;
                                    let parts = Mxfp8KvParts {
                                        k: kb.view_mut(),
                                        v: vb.view_mut(),
                                        k_scales: sfk.view_mut(),
                                        v_scales: sfv.view_mut(),
                                    };
                                    let mut kv = Mxfp8KvCache::from_parts(parts, 1)?;
                                    f(&batch, &mut out, &mut kv)
                                })
                            })
                        })
                    })
                })
            })
        })
    })
}

/// Median host µs per launch of (lent once, lent per call, raw) over alternating rounds.
fn measure(dev: &Device) -> (f64, f64, f64) {
    let g = Cuda::for_device(dev).unwrap();
    let kernel = Kernel::new();
    let mut layer = Layer {
        weights: PrologueWeights::from_host(
            &g,
            &[bf16::ONE; 128],
            &[bf16::ONE; 128],
            &[bf16::from_f32(0.25); DKV * 4],
            &[bf16::from_f32(0.25); DKV * 4],
            1e-6,
        )
        .unwrap(),
        conv: ConvState::zeros(&g, 1).unwrap(),
        windows: VerifyWindows::zeros(&g, 1, Q).unwrap(),
    };
    let call = CandleCall::new(dev).unwrap();
    let function = g.function::<Kernel>().unwrap();
    // Short rounds on an idle stream (common::LAUNCHES_A_ROUND says why).
    let n = common::LAUNCHES_A_ROUND;
    let run_once = |layer: &mut Layer| {
        with_call(&call, |batch, out, kv| {
            kernel.run(
                &g,
                &layer.weights,
                &mut layer.conv,
                (batch, &mut layer.windows),
                PrologueTargets {
                    out,
                    kv,
                    errors: None,
                },
            )
        })
        .unwrap()
    };
    run_once(&mut layer);
    g.synchronize().unwrap();
    let (mut once, mut per_call, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..common::LAUNCH_ROUNDS {
        // Lent once, launched n times.
        let (t, plan) = with_call(&call, |batch, out, kv| {
            let t0 = Instant::now();
            for _ in 0..n {
                kernel.run(
                    &g,
                    &layer.weights,
                    &mut layer.conv,
                    (batch, &mut layer.windows),
                    PrologueTargets {
                        out,
                        kv,
                        errors: None,
                    },
                )?;
            }
            let t = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
            let plan = kernel.launch_plan(
                &g,
                &layer.weights,
                &mut layer.conv,
                (batch, &mut layer.windows),
                PrologueTargets {
                    out,
                    kv,
                    errors: None,
                },
            )?;
            Ok((t, plan))
        })
        .unwrap();
        once.push(t);
        g.synchronize().unwrap();
        // Lent per call.
        let t0 = Instant::now();
        for _ in 0..n {
            run_once(&mut layer);
        }
        per_call.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
        g.synchronize().unwrap();
        // Raw launches of the same parameter block (the candle tensors outlive them).
        // SAFETY: the parameter block of a checked call on live candle buffers.
        raw.push(unsafe { common::raw_launch_us(&g, function, &plan, n) });
        g.synchronize().unwrap();
    }
    (
        common::median(&mut once),
        common::median(&mut per_call),
        common::median(&mut raw),
    )
}

/// Host µs of lending one candle tensor: a read view (bf16), a writable view (bf16), and a
/// writable E8M0 view of a byte tensor (lent through a foreign buffer over the same memory).
fn lending_costs(dev: &Device) -> (f64, f64, f64) {
    let data = Ct::zeros((T, DQ), DType::BF16, dev).unwrap();
    let bytes = Ct::zeros((T, DQ / 32), DType::U8, dev).unwrap();
    let n = 20_000;
    let time = |f: &mut dyn FnMut()| {
        let mut rounds: Vec<f64> = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                for _ in 0..n {
                    f();
                }
                t0.elapsed().as_secs_f64() * 1e6 / n as f64
            })
            .collect();
        common::median(&mut rounds)
    };
    let read_us = time(&mut || {
        let r = read("q", &data);
        std::hint::black_box(r.cuda::<bf16, shapeproof::tensor::Cols<DQ>>().unwrap());
    });
    let write_us = time(&mut || {
        with_cuda_mut::<bf16, shapeproof::tensor::Cols<DQ>, _>("q", &data, |v| {
            std::hint::black_box(v);
            Ok(())
        })
        .unwrap()
    });
    let e8m0_us = time(&mut || {
        with_cuda_mut::<E8M0, shapeproof::tensor::Cols<{ DQ / 32 }>, _>("sf", &bytes, |v| {
            std::hint::black_box(v);
            Ok(())
        })
        .unwrap()
    });
    (read_us, write_us, e8m0_us)
}

fn main() {
    let dev = Device::new_cuda(0).unwrap_or_else(|e| panic!("benchmarks need a CUDA device: {e}"));
    let mut records = Vec::new();
    for tracking in [true, false] {
        if !tracking {
            // SAFETY: every tensor made from here on is used on the device's one stream.
            unsafe { dev.as_cuda_device().unwrap().disable_event_tracking() };
        }
        let (once, per_call, raw) = measure(&dev);
        let (read_us, write_us, e8m0_us) = lending_costs(&dev);
        let label = if tracking {
            "event tracking on"
        } else {
            "event tracking off"
        };
        println!(
            "candle launch, {label}: raw cuLaunchKernel {raw:.2} µs; typed from candle views lent once {once:.2} µs (+{:.2}); lent per call {per_call:.2} µs (+{:.2})",
            once - raw,
            per_call - raw
        );
        println!(
            "  lending one tensor: read view {read_us:.3} µs, writable view {write_us:.3} µs, writable E8M0 view of bytes {e8m0_us:.3} µs"
        );
        records.push(Record {
            name: format!("candle_launch_tracking_{tracking}"),
            fields: vec![
                ("raw_us", raw),
                ("lent_once_us", once),
                ("lent_once_overhead_us", once - raw),
                ("lent_per_call_us", per_call),
                ("lent_per_call_overhead_us", per_call - raw),
                ("lend_read_us", read_us),
                ("lend_write_us", write_us),
                ("lend_write_e8m0_us", e8m0_us),
            ],
        });
    }
    common::write_json("candle_launch.json", &records);
}
