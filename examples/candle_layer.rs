//! One Inkling attention layer step inside a candle program (feature `candle`; with
//! `candle-cuda` also on candle's CUDA backend).
//!
//! A candle matmul of the hidden states produces `qkvr`; the shapeproof verify prologue (MXFP8
//! store) reads it as a checked view, writes K/V straight into layer 1 of a candle-owned
//! three-layer KV pool, and gives q back as a candle tensor that candle code consumes next.
//! Nothing is copied between the two libraries. The example checks itself:
//! - on the CPU (candle CPU + the CPU backend): the pool bytes it wrote through candle's storage
//!   equal a run of the same call on shapeproof-owned tensors, and layers 0 and 2 are untouched;
//! - with `candle-cuda` (candle CUDA + the CUDA backend, on the candle device's stream; needs an
//!   sm_90 GPU and fails without one): the same step on the GPU, from a `qkvr` made by candle's
//!   CUDA matmul, writes the same bytes (every layer of both pools and both scale planes, q, its
//!   scales and k) as the CPU step given that same `qkvr`: the prologue is bit-exact.
//!
//! ```text
//! cargo run --example candle_layer --features candle
//! cargo run --release --example candle_layer --features candle-cuda   # on the GPU machine
//! ```

use candle_core::{DType, Device, IndexOp, Tensor as Ct};
use shapeproof::backend::Cpu;
use shapeproof::candle::{CandleBackend, into_candle, read, with_mut};
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::layout::{Mxfp8KvCache, Mxfp8KvParts};
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
type Error = Box<dyn std::error::Error>;

/// Everything one step wrote, as bytes on the host (for comparing runs).
#[derive(PartialEq)]
struct StepBytes {
    /// Every layer of the K and V pools, `[LAYERS, SLOTS, DKV]` e4m3 each.
    k_pool: Vec<u8>,
    v_pool: Vec<u8>,
    /// Every layer of both scale planes, `[LAYERS, PAGES, DKV/128, 32, PAGE/32, 4]` each.
    k_scales: Vec<u8>,
    v_scales: Vec<u8>,
    /// q `[T, DQ]` e4m3 and its scales `[T, DQ/32]`.
    q: Vec<u8>,
    q_scales: Vec<u8>,
    /// k after conv + RMSNorm, `[T, DKV]` bf16 bits.
    k: Vec<u16>,
}

fn main() -> Result<(), Error> {
    // The projection: candle code, candle tensors.
    let cpu = Device::Cpu;
    let hidden = Ct::randn(0f32, 1.0, (T, HIDDEN), &cpu)?.to_dtype(DType::BF16)?;
    let w_qkvr = (Ct::randn(0f32, 1.0, (HIDDEN, ROW), &cpu)? * 0.05)?.to_dtype(DType::BF16)?;
    let qkvr = hidden.matmul(&w_qkvr)?; // [T, ROW] bf16

    let on_cpu = layer_step::<Cpu>(&cpu, &qkvr)?;
    // The same call on shapeproof-owned tensors must write the same bytes.
    let reference = reference_pool(&qkvr)?;
    let layer = SLOTS * DKV;
    let written = &on_cpu.k_pool[layer..2 * layer];
    let differ = written
        .iter()
        .zip(&reference)
        .filter(|(a, b)| a != b)
        .count();
    println!(
        "CPU: layer 1 of the candle KV pool: {differ} of {} bytes differ from the owned run",
        written.len()
    );
    let others_zero = on_cpu.k_pool[..layer]
        .iter()
        .chain(&on_cpu.k_pool[2 * layer..])
        .all(|&b| b == 0);
    if differ != 0 || !others_zero || written.iter().all(|&b| b == 0) {
        return Err(
            "the candle-pool run and the owned run disagree, or other layers changed".into(),
        );
    }
    println!(
        "CPU: layers 0 and 2 of the pool untouched; q and k_out handed to candle without a copy"
    );

    #[cfg(feature = "candle-cuda")]
    on_the_gpu(&hidden, &w_qkvr, &qkvr)?;
    Ok(())
}

/// The step on candle's CUDA backend, compared byte for byte with the CPU step on the same
/// `qkvr` (candle's CUDA matmul rounds differently from its CPU one, so the CPU step is given
/// the GPU's projection).
#[cfg(feature = "candle-cuda")]
fn on_the_gpu(hidden: &Ct, w_qkvr: &Ct, cpu_qkvr: &Ct) -> Result<(), Error> {
    use shapeproof::backend::Cuda;
    let gpu = Device::new_cuda(0)?;
    let qkvr = hidden.to_device(&gpu)?.matmul(&w_qkvr.to_device(&gpu)?)?; // [T, ROW] bf16
    let on_gpu = layer_step::<Cuda>(&gpu, &qkvr)?;
    let host_qkvr = qkvr.to_device(&Device::Cpu)?;
    let on_cpu = layer_step::<Cpu>(&Device::Cpu, &host_qkvr)?;
    let projection_gap = (host_qkvr.to_dtype(DType::F32)? - cpu_qkvr.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    println!("GPU: candle's CUDA matmul vs its CPU matmul: max |difference| {projection_gap:.4}");
    let fields = [
        ("K pool", on_gpu.k_pool == on_cpu.k_pool),
        ("V pool", on_gpu.v_pool == on_cpu.v_pool),
        ("K scale planes", on_gpu.k_scales == on_cpu.k_scales),
        ("V scale planes", on_gpu.v_scales == on_cpu.v_scales),
        ("q", on_gpu.q == on_cpu.q),
        ("q scales", on_gpu.q_scales == on_cpu.q_scales),
        ("k", on_gpu.k == on_cpu.k),
    ];
    for (name, same) in fields {
        println!(
            "GPU vs CPU, same qkvr: {name}: {}",
            if same { "bit-exact" } else { "DIFFERENT" }
        );
    }
    if on_gpu != on_cpu || on_gpu.k_pool.iter().all(|&b| b == 0) {
        return Err("the GPU step and the CPU step disagree".into());
    }
    println!("GPU: the candle CUDA step equals the CPU step, every byte of all {LAYERS} layers");
    Ok(())
}

/// One layer step on `device` with backend `B`: candle-owned pools and metadata, views lent
/// to the kernel, q and k handed back to candle; returns every byte written.
fn layer_step<B: CandleBackend + RunPrologue>(
    device: &Device,
    qkvr: &Ct,
) -> Result<StepBytes, Error> {
    let backend = B::for_device(device)?;
    // The engine's KV pool, owned by candle: e4m3 data and E8M0 scale planes (as bytes) for 3
    // layers.
    let k_pool = Ct::zeros((LAYERS, SLOTS, DKV), DType::F8E4M3, device)?;
    let v_pool = Ct::zeros((LAYERS, SLOTS, DKV), DType::F8E4M3, device)?;
    let plane_shape = (LAYERS, PAGES, DKV / 128, 32, PAGE / 32, 4);
    let sfk_pool = Ct::zeros(plane_shape, DType::U8, device)?;
    let sfv_pool = Ct::zeros(plane_shape, DType::U8, device)?;

    // The step's metadata, as candle tensors too.
    let loc: Vec<i64> = (0..T as i64).map(|t| 5 * t + 3).collect();
    let loc = Ct::new(loc.as_slice(), device)?;
    let cache_indices = Ct::new(&[2i32, 0, -1, 1], device)?;
    let cache_mask = Ct::new(&[1u8, 0, 0, 1], device)?;
    let tau = Ct::ones(T, DType::F32, device)?;

    // The layer's own parameters and state, owned by shapeproof.
    let (gamma, taps) = parameters();
    let weights = PrologueWeights::<B, HD, DKV, InklingConv>::from_host(
        &backend, &gamma, &gamma, &taps, &taps, 1e-6,
    )?;
    let kernel = Kernel::new();

    // The call: candle storage lent as checked views, K/V written into layer 1 of the pool.
    let (qkvr_r, loc_r, idx_r, mask_r, tau_r) = (
        read("qkvr", qkvr),
        read("loc", &loc),
        read("cache_indices", &cache_indices),
        read("cache_mask", &cache_mask),
        read("log_scaling_tau", &tau),
    );
    let batch = VerifyBatch::new(
        qkvr_r.view::<B, bf16, QkvrRow<Row>>()?,
        idx_r.view::<B, i32, Scalar>()?,
        mask_r.view::<B, u8, Scalar>()?,
        loc_r.view::<B, i64, Scalar>()?,
        Some(tau_r.view::<B, f32, Scalar>()?),
        DRAFT,
    )?;
    let mut conv = ConvState::<B, DKV, InklingConv>::zeros(&backend, SEQS)?;
    let mut windows = VerifyWindows::<B, DKV, InklingConv>::zeros(&backend, SEQS, DRAFT)?;
    let mut out = Mxfp8Outputs::<B, DQ, DKV>::zeros(&backend, T)?;
    let (k1, v1, sfk1, sfv1) = (k_pool.i(1)?, v_pool.i(1)?, sfk_pool.i(1)?, sfv_pool.i(1)?);
    with_mut::<B, _, _, _>("k_buf", &k1, |mut k| {
        with_mut::<B, _, _, _>("v_buf", &v1, |mut v| {
            with_mut::<B, E8M0, _, _>("sfk", &sfk1, |mut k_scales| {
                with_mut::<B, E8M0, _, _>("sfv", &sfv1, |mut v_scales| {
                    // The four lent views, reborrowed for this scope.
                    let parts = Mxfp8KvParts {
                        k: k.view_mut(),
                        v: v.view_mut(),
                        k_scales: k_scales.view_mut(),
                        v_scales: v_scales.view_mut(),
                    };
                    let mut kv = Mxfp8KvCache::from_parts(parts, PAGES)?;
                    kernel.run(
                        &backend,
                        &weights,
                        &mut conv,
                        (&batch, &mut windows),
                        PrologueTargets {
                            out: &mut out,
                            kv: &mut kv,
                            errors: None,
                        },
                    )
                })
            })
        })
    })?;

    // q and k back to candle, consumed by candle code: k's head 0 cast to f32 where it lies
    // (a candle kernel reading the prologue's output), q moved to the host and cast there, then
    // per-head e4m3 logits. (candle 0.11.1's CUDA backend has no working e4m3 kernels: its copy
    // and cast kernels are looked up as `…_f8e4m3…` but named `…_f8_e4m3…`, so on the GPU e4m3
    // tensors can only be moved.)
    let parts = out.into_parts();
    let q_scales = parts.q_scales.to_host(&backend)?;
    let q = into_candle("q_out", parts.q, (T, DQ / HD, HD), device)?;
    let k_out = into_candle("k_out", parts.k, (T, DKV / HD, HD), device)?;
    let k_head0 = k_out.i((.., 0, ..))?.to_dtype(DType::F32)?; // [T, HD], on `device`
    let host = Device::Cpu;
    let q_head0 = q.to_device(&host)?.i((.., 0, ..))?.to_dtype(DType::F32)?; // e4m3 values
    let logits = q_head0.matmul(&k_head0.to_device(&host)?.t()?)?; // [T, T]
    println!(
        "{}: candle consumed q: logits {:?}, sum {:.3}",
        B::describe(&backend),
        logits.dims(),
        logits.sum_all()?.to_scalar::<f32>()?
    );

    let e4m3 = |t: &Ct| -> Result<Vec<u8>, Error> {
        let host = t
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<F8E4M3>()?;
        Ok(host.iter().map(|x| x.to_bits()).collect())
    };
    let bytes = |t: &Ct| -> Result<Vec<u8>, Error> {
        Ok(t.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<u8>()?)
    };
    Ok(StepBytes {
        k_pool: e4m3(&k_pool)?,
        v_pool: e4m3(&v_pool)?,
        k_scales: bytes(&sfk_pool)?,
        v_scales: bytes(&sfv_pool)?,
        q: e4m3(&q)?,
        q_scales: q_scales.iter().map(|s| s.0).collect(),
        k: k_out
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<bf16>()?
            .iter()
            .map(|x| x.to_bits())
            .collect(),
    })
}

/// The layer's RMSNorm gammas and conv taps (deterministic, not trivial).
fn parameters() -> (Vec<bf16>, Vec<bf16>) {
    let gamma = (0..HD)
        .map(|i| bf16::from_f32(0.75 + i as f32 / 256.0))
        .collect();
    let taps = (0..DKV * 4)
        .map(|i| bf16::from_f32(((i % 5) as f32 - 2.0) / 4.0))
        .collect();
    (gamma, taps)
}

/// The K bytes of the same call with every tensor owned by shapeproof.
fn reference_pool(qkvr: &Ct) -> Result<Vec<u8>, Error> {
    let (gamma, taps) = parameters();
    let weights = &PrologueWeights::<Cpu, HD, DKV, InklingConv>::from_host(
        &Cpu, &gamma, &gamma, &taps, &taps, 1e-6,
    )?;
    let kernel = Kernel::new();
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
        (&batch, &mut windows),
        PrologueTargets {
            out: &mut out,
            kv: &mut kv,
            errors: None,
        },
    )?;
    Ok(kv.k().to_host(&Cpu)?.iter().map(|x| x.to_bits()).collect())
}
