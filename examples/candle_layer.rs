//! One Inkling attention layer step inside a candle program (feature `candle`).
//!
//! A candle matmul of the hidden states produces `qkvr`; the shapeproof verify prologue (MXFP8
//! store) reads it as a checked view, writes K/V straight into layer 1 of a candle-owned
//! three-layer KV pool, and gives q back as a candle tensor that candle code consumes next.
//! Nothing is copied between the two libraries. The example checks itself: the pool bytes it
//! wrote through candle's storage equal a run of the same call on shapeproof-owned tensors,
//! and layers 0 and 2 of the pool are untouched.
//!
//! ```text
//! cargo run --example candle_layer --features candle
//! ```

use candle_core::{DType, Device, IndexOp, Tensor as Ct};
use shapeproof::backend::Cpu;
use shapeproof::candle::{into_candle, read, with_cpu_mut};
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::layout::{Mxfp8KvCache, Mxfp8KvParts, ScalePlanePage};
use shapeproof::ops::prologue::*;
use shapeproof::tensor::{Scalar, Tensor};

/// Inkling TP8, sliding-window layer: 8 q heads and 2 KV heads of 128 channels per rank.
const HD: usize = 128;
const DQ: usize = 1024;
const DKV: usize = 256;
const ROW: usize = DQ + 2 * DKV + 128; // [q | k | v | r]
type Row = PackedRow<DQ, DKV, 128>;
const PAGE: usize = 128;
const HIDDEN: usize = 512;
const SEQS: usize = 4;
const DRAFT: usize = 4;
const T: usize = SEQS * DRAFT;
const LAYERS: usize = 3;
const PAGES: usize = 2; // per layer
const SLOTS: usize = PAGES * PAGE;

type Kernel = Mxfp8Prologue<Verify, DQ, DKV, Row, InklingConv, PAGE>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::Cpu;
    // The projection: candle code, candle tensors.
    let hidden = Ct::randn(0f32, 1.0, (T, HIDDEN), &dev)?.to_dtype(DType::BF16)?;
    let w_qkvr = (Ct::randn(0f32, 1.0, (HIDDEN, ROW), &dev)? * 0.05)?.to_dtype(DType::BF16)?;
    let qkvr = hidden.matmul(&w_qkvr)?; // [T, ROW] bf16

    // The engine's KV pool, owned by candle: e4m3 data and E8M0 scale planes for 3 layers.
    let k_pool = Ct::zeros((LAYERS, SLOTS, DKV), DType::F8E4M3, &dev)?;
    let v_pool = Ct::zeros((LAYERS, SLOTS, DKV), DType::F8E4M3, &dev)?;
    let plane_shape = (LAYERS * PAGES, DKV / 128, 32, PAGE / 32, 4);
    let planes = || Tensor::<Cpu, E8M0, ScalePlanePage<PAGE, DKV>>::zeros(&Cpu, LAYERS * PAGES);
    let sfk_pool = into_candle("sfk", planes()?, plane_shape)?.reshape((
        LAYERS,
        PAGES,
        DKV / 128,
        32,
        PAGE / 32,
        4,
    ))?;
    let sfv_pool = into_candle("sfv", planes()?, plane_shape)?.reshape((
        LAYERS,
        PAGES,
        DKV / 128,
        32,
        PAGE / 32,
        4,
    ))?;

    // The step's metadata, as candle tensors too.
    let loc = Ct::new(
        (0..T as i64)
            .map(|t| 5 * t + 3)
            .collect::<Vec<_>>()
            .as_slice(),
        &dev,
    )?;
    let cache_indices = Ct::new(&[2i32, 0, -1, 1], &dev)?;
    let cache_mask = Ct::new(&[1u8, 0, 0, 1], &dev)?;
    let tau = Ct::ones(T, DType::F32, &dev)?;

    // The layer's own parameters and state, owned by shapeproof.
    let gamma: Vec<bf16> = (0..HD)
        .map(|i| bf16::from_f32(0.75 + i as f32 / 256.0))
        .collect();
    let taps: Vec<bf16> = (0..DKV * 4)
        .map(|i| bf16::from_f32(((i % 5) as f32 - 2.0) / 4.0))
        .collect();
    let weights = PrologueWeights::<Cpu, HD, DKV, InklingConv>::from_host(
        &Cpu, &gamma, &gamma, &taps, &taps, 1e-6,
    )?;
    let kernel = Kernel::new();

    // The call: candle storage lent as checked views, K/V written into layer 1 of the pool.
    let (qkvr_r, loc_r, idx_r, mask_r, tau_r) = (
        read("qkvr", &qkvr),
        read("loc", &loc),
        read("cache_indices", &cache_indices),
        read("cache_mask", &cache_mask),
        read("log_scaling_tau", &tau),
    );
    let batch = VerifyBatch::new(
        qkvr_r.cpu::<bf16, QkvrRow<Row>>()?,
        idx_r.cpu::<i32, Scalar>()?,
        mask_r.cpu::<u8, Scalar>()?,
        loc_r.cpu::<i64, Scalar>()?,
        Some(tau_r.cpu::<f32, Scalar>()?),
        DRAFT,
    )?;
    let mut conv = ConvState::<Cpu, DKV, InklingConv>::zeros(&Cpu, SEQS)?;
    let mut windows = VerifyWindows::<Cpu, DKV, InklingConv>::zeros(&Cpu, SEQS, DRAFT)?;
    let mut out = Mxfp8Outputs::<Cpu, DQ, DKV>::zeros(&Cpu, T)?;
    let (k1, v1, sfk1, sfv1) = (k_pool.i(1)?, v_pool.i(1)?, sfk_pool.i(1)?, sfv_pool.i(1)?);
    with_cpu_mut("k_buf", &k1, |mut k| {
        with_cpu_mut("v_buf", &v1, |mut v| {
            with_cpu_mut("sfk", &sfk1, |mut k_scales| {
                with_cpu_mut("sfv", &sfv1, |mut v_scales| {
                    // The four lent views, reborrowed for this scope.
                    let parts = Mxfp8KvParts {
                        k: k.view_mut(),
                        v: v.view_mut(),
                        k_scales: k_scales.view_mut(),
                        v_scales: v_scales.view_mut(),
                    };
                    let mut kv = Mxfp8KvCache::from_parts(parts, PAGES)?;
                    kernel.run(
                        &Cpu,
                        &weights,
                        &mut conv,
                        &batch,
                        &mut windows,
                        &mut out,
                        &mut kv,
                        None,
                    )
                })
            })
        })
    })?;

    // q back to candle, consumed by candle code: per-head e4m3 logits against k_out.
    let parts = out.into_parts();
    let q = into_candle("q_out", parts.q, (T, DQ / HD, HD))?;
    let k_out = into_candle("k_out", parts.k, (T, DKV / HD, HD))?;
    let q_head0 = q.i((.., 0, ..))?.to_dtype(DType::F32)?; // [T, HD] (e4m3 values, unscaled)
    let k_head0 = k_out.i((.., 0, ..))?.to_dtype(DType::F32)?; // [T, HD]
    let logits = q_head0.matmul(&k_head0.t()?)?; // [T, T]
    println!(
        "candle consumed q: logits {:?}, sum {:.3}",
        logits.dims(),
        logits.sum_all()?.to_scalar::<f32>()?
    );

    // The same call on shapeproof-owned tensors must write the same bytes.
    let reference = reference_pool(&qkvr, &weights, &kernel)?;
    let written: Vec<u8> = k_pool
        .i(1)?
        .flatten_all()?
        .to_vec1::<F8E4M3>()?
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let others: Vec<u8> = [k_pool.i(0)?, k_pool.i(2)?]
        .iter()
        .flat_map(|t| t.flatten_all().unwrap().to_vec1::<F8E4M3>().unwrap())
        .map(|x| x.to_bits())
        .collect();
    let differ = written
        .iter()
        .zip(&reference)
        .filter(|(a, b)| a != b)
        .count();
    println!(
        "layer 1 of the candle KV pool: {differ} of {} bytes differ from the owned run",
        written.len()
    );
    if differ != 0 || others.iter().any(|&b| b != 0) || written.iter().all(|&b| b == 0) {
        eprintln!("the candle-pool run and the owned run disagree, or other layers changed");
        std::process::exit(1);
    }
    println!("layers 0 and 2 of the pool untouched; q and k_out handed to candle without a copy");
    Ok(())
}

/// The K bytes of the same call with every tensor owned by shapeproof.
fn reference_pool(
    qkvr: &Ct,
    weights: &PrologueWeights<Cpu, HD, DKV, InklingConv>,
    kernel: &Kernel,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let host: Vec<bf16> = qkvr.flatten_all()?.to_vec1()?;
    let tensor = |v: Vec<i64>| Tensor::<Cpu, i64>::from_host(&Cpu, "loc", &v, v.len());
    let batch = VerifyBatch::<Cpu, Row>::new(
        Tensor::from_host(&Cpu, "qkvr", &host, T)?,
        Tensor::from_host(&Cpu, "cache_indices", &[2, 0, -1, 1], SEQS)?,
        Tensor::from_host(&Cpu, "cache_mask", &[1, 0, 0, 1], SEQS)?,
        tensor((0..T as i64).map(|t| 5 * t + 3).collect())?,
        Some(Tensor::from_host(&Cpu, "tau", &[1.0; T], T)?),
        DRAFT,
    )?;
    let mut conv = ConvState::zeros(&Cpu, SEQS)?;
    let mut windows = VerifyWindows::zeros(&Cpu, SEQS, DRAFT)?;
    let mut out = Mxfp8Outputs::zeros(&Cpu, T)?;
    let mut kv = Mxfp8KvCache::<Cpu, PAGE, DKV>::zeros(&Cpu, PAGES)?;
    kernel.run(
        &Cpu,
        weights,
        &mut conv,
        &batch,
        &mut windows,
        &mut out,
        &mut kv,
        None,
    )?;
    Ok(kv.k().to_host(&Cpu)?.iter().map(|x| x.to_bits()).collect())
}
