//! Benchmark of the Inkling verify prologue at TP8 geometry (HQ 8, HKV 1, head dim 128, W 4,
//! q = 4 draft tokens, tau on): bf16 store vs MXFP8 store,
//! - small batches B = 1, 4, 16, 64 replayed from a CUDA graph (GPU time per call),
//! - large T = 16384 and 65536 tokens with rotating inputs larger than L2 (bandwidth against the
//!   device copy bandwidth measured in the same run),
//! - host cost of one typed launch against a raw `cuLaunchKernel` of the same kernel.
//!
//! Bytes are the unique bytes a call must move: the q/k/v slices of qkvr, conv history, weights
//! and metadata read; q/k/v outputs, KV rows (+ scales) and saved windows written.
//! Run on the H200 through `scripts/gpu-bundle.sh` (`run.sh bench`); needs `--features gpu-tests`.

mod common;

use std::time::Instant;

use common::{Record, gpu, time_us};
use cudarc::driver::{result, sys};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::dtype::bf16;
use shapeproof::ops::prologue::*;
use shapeproof::tensor::Owned;
use shapeproof::tensor::Tensor;

const DQ: usize = 1024;
const DKV: usize = 128;
const Q: usize = 4;
const W: usize = 4;
const PAGE: usize = 128;
type Row = PackedRow<DQ, DKV, 128>;
type Conv = InklingConv;

/// Unique bytes one verify call moves at this geometry.
fn bytes_moved(tokens: usize, mxfp8: bool) -> f64 {
    let seqs = tokens / Q;
    let read = tokens * (DQ + 2 * DKV) * 2      // q, k, v slices of qkvr
        + seqs * 2 * (W - 1) * DKV * 2         // conv history of k and v
        + 2 * DKV * W * 2 + 2 * 128 * 2        // conv taps, gammas
        + tokens * (8 + 4)                     // loc, tau
        + seqs * (4 + 1); // cache index, mask
    let q_out = if mxfp8 {
        tokens * (DQ + DQ / 32)
    } else {
        tokens * DQ * 2
    };
    let kv_store = if mxfp8 {
        2 * tokens * (DKV + DKV / 32)
    } else {
        2 * tokens * DKV * 2
    };
    let written = q_out + 2 * tokens * DKV * 2 + kv_store + 2 * seqs * Q * (W - 1) * DKV * 2;
    (read + written) as f64
}

/// One verify batch with everything it needs, on the GPU.
struct Batch<S: Store> {
    batch: VerifyBatch<Cuda, Row>,
    windows: VerifyWindows<Cuda, DKV, Conv>,
    conv: ConvState<Cuda, DKV, Conv>,
    out: S::Outputs<Cuda, DQ, DKV, Owned>,
    kv: S::Cache<Cuda, DKV, Owned>,
}

fn weights(g: &Cuda, rng: &mut StdRng) -> PrologueWeights<Cuda, 128, DKV, Conv> {
    let r = |rng: &mut StdRng, n: usize| -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(rng.random::<f32>() - 0.5))
            .collect()
    };
    PrologueWeights::from_host(
        g,
        &r(rng, 128),
        &r(rng, 128),
        &r(rng, DKV * W),
        &r(rng, DKV * W),
        1e-6,
    )
    .unwrap()
}

/// The store-independent part of a verify batch.
struct VerifyParts {
    batch: VerifyBatch<Cuda, Row>,
    windows: VerifyWindows<Cuda, DKV, Conv>,
    conv: ConvState<Cuda, DKV, Conv>,
    pages: usize,
}

fn verify_batch(g: &Cuda, rng: &mut StdRng, tokens: usize) -> VerifyParts {
    let seqs = tokens / Q;
    let qkvr: Vec<bf16> = (0..tokens * 1408)
        .map(|_| bf16::from_f32(rng.random::<f32>() * 2.0 - 1.0))
        .collect();
    let slots = tokens.div_ceil(PAGE) * PAGE;
    let loc: Vec<i64> = (0..tokens as i64).collect();
    let tau: Vec<f32> = (0..tokens)
        .map(|_| 1.0 + rng.random::<f32>() * 0.2)
        .collect();
    let batch = VerifyBatch::new(
        Tensor::from_host(g, "qkvr", &qkvr, tokens).unwrap(),
        Tensor::from_host(
            g,
            "cache_indices",
            &(0..seqs as i32).collect::<Vec<_>>(),
            seqs,
        )
        .unwrap(),
        Tensor::from_host(g, "cache_mask", &vec![1u8; seqs], seqs).unwrap(),
        Tensor::from_host(g, "loc", &loc, tokens).unwrap(),
        Some(Tensor::from_host(g, "tau", &tau, tokens).unwrap()),
        Q,
    )
    .unwrap();
    let windows = VerifyWindows::zeros(g, seqs, Q).unwrap();
    let conv = ConvState::zeros(g, seqs).unwrap();
    VerifyParts {
        batch,
        windows,
        conv,
        pages: slots / PAGE,
    }
}

fn bf16_batch(g: &Cuda, rng: &mut StdRng, tokens: usize) -> Batch<Bf16Store<PAGE>> {
    let VerifyParts {
        batch,
        windows,
        conv,
        pages,
    } = verify_batch(g, rng, tokens);
    Batch {
        batch,
        windows,
        conv,
        out: Bf16Outputs::zeros(g, tokens).unwrap(),
        kv: shapeproof::layout::PagedBf16Kv::zeros(g, pages).unwrap(),
    }
}

fn mxfp8_batch(g: &Cuda, rng: &mut StdRng, tokens: usize) -> Batch<Mxfp8Store<PAGE>> {
    let VerifyParts {
        batch,
        windows,
        conv,
        pages,
    } = verify_batch(g, rng, tokens);
    Batch {
        batch,
        windows,
        conv,
        out: Mxfp8Outputs::zeros(g, tokens).unwrap(),
        kv: shapeproof::layout::Mxfp8KvCache::zeros(g, pages).unwrap(),
    }
}

macro_rules! run {
    ($kernel:expr, $g:expr, $w:expr, $b:expr) => {{
        let b = &mut $b;
        $kernel
            .run(
                $g,
                $w,
                &mut b.conv,
                &b.batch,
                &mut b.windows,
                &mut b.out,
                &mut b.kv,
                None,
            )
            .unwrap()
    }};
}

/// GPU time per call of `calls` launches captured in one graph and replayed.
fn graph_us(g: &Cuda, calls: usize, mut launch: impl FnMut()) -> f64 {
    launch(); // load the kernel before capture
    g.synchronize().unwrap();
    g.stream()
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    for _ in 0..calls {
        launch();
    }
    let graph = g
        .stream()
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a captured graph");
    graph.upload().unwrap();
    time_us(g, 5, 50, |_| graph.launch().unwrap()) / calls as f64
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0x5EED);
    let date = std::env::var("BENCH_DATE").unwrap_or_default();
    println!("# prologue benchmark on {} {date}", g.describe());
    let copy = common::copy_bandwidth_gbs(&g);
    println!("device copy bandwidth (read + write): {copy:.0} GB/s");
    let w = weights(&g, &mut rng);
    let bf = Bf16Prologue::<Verify, 128, DQ, DKV, Row, Conv, PAGE>::new();
    let mx = Mxfp8Prologue::<Verify, DQ, DKV, Row, Conv, PAGE>::new();
    let mut records = vec![Record {
        name: "copy".into(),
        fields: vec![("gbs", copy)],
    }];

    println!("\n| B (q=4) | T | bf16 store µs/call | MXFP8 store µs/call | MXFP8 / bf16 |");
    println!("|---|---|---|---|---|");
    for seqs in [1usize, 4, 16, 64] {
        let tokens = seqs * Q;
        let mut b1 = bf16_batch(&g, &mut rng, tokens);
        let mut b2 = mxfp8_batch(&g, &mut rng, tokens);
        let t_bf = graph_us(&g, 20, || run!(bf, &g, &w, b1));
        let t_mx = graph_us(&g, 20, || run!(mx, &g, &w, b2));
        println!(
            "| {seqs} | {tokens} | {t_bf:.2} | {t_mx:.2} | {:.2} |",
            t_mx / t_bf
        );
        records.push(Record {
            name: format!("graph_B{seqs}"),
            fields: vec![
                ("tokens", tokens as f64),
                ("bf16_us", t_bf),
                ("mxfp8_us", t_mx),
            ],
        });
    }

    println!("\n| T | store | µs | GB/s | of copy |");
    println!("|---|---|---|---|---|");
    for tokens in [16384usize, 65536] {
        // Rotate among input sets totalling well over the 60 MB L2.
        let sets = (400_000_000 / (tokens * 1408 * 2)).clamp(2, 8);
        let mut bfs: Vec<_> = (0..sets)
            .map(|_| bf16_batch(&g, &mut rng, tokens))
            .collect();
        let t_bf = time_us(&g, 3, 30, |i| run!(bf, &g, &w, bfs[i % sets]));
        drop(bfs);
        let mut mxs: Vec<_> = (0..sets)
            .map(|_| mxfp8_batch(&g, &mut rng, tokens))
            .collect();
        let t_mx = time_us(&g, 3, 30, |i| run!(mx, &g, &w, mxs[i % sets]));
        drop(mxs);
        for (store, us, mxfp8) in [("bf16", t_bf, false), ("mxfp8", t_mx, true)] {
            let gbs = bytes_moved(tokens, mxfp8) / (us * 1e-6) / 1e9;
            println!(
                "| {tokens} | {store} | {us:.1} | {gbs:.0} | {:.0}% |",
                100.0 * gbs / copy
            );
            records.push(Record {
                name: format!("large_T{tokens}_{store}"),
                fields: vec![("us", us), ("gbs", gbs), ("copy_fraction", gbs / copy)],
            });
        }
    }

    // Host cost: typed call (boundary ties + parameter block + launch) vs raw cuLaunchKernel.
    let mut b = mxfp8_batch(&g, &mut rng, 4);
    let mut b2 = mxfp8_batch(&g, &mut rng, 4);
    run!(mx, &g, &w, b);
    run!(mx, &g, &w, b2);
    g.synchronize().unwrap();
    let launch = mx
        .launch_plan(
            &g,
            &w,
            &mut b.conv,
            &b.batch,
            &mut b.windows,
            &mut b.out,
            &mut b.kv,
            None,
        )
        .unwrap();
    let function = g
        .function::<Mxfp8Prologue<Verify, DQ, DKV, Row, Conv, PAGE>>()
        .unwrap();
    // Typed and raw launches alternate over rounds (host timings on a VM drift); medians.
    let n = 5_000;
    // The same call with every batch tensor, output and cache plane a view of another
    // allocation (views of `b`'s batch, fresh outputs and a fresh pool lent as `ViewMut`s).
    let parts = b.batch.into_parts();
    let view_batch = VerifyBatch::new(
        parts.qkvr.view(),
        parts.cache_indices.view(),
        parts.cache_mask.view(),
        parts.loc.view(),
        parts.tau.as_ref().map(|t| t.view()),
        Q,
    )
    .unwrap();
    let mut out_parts = Mxfp8Outputs::<Cuda, DQ, DKV>::zeros(&g, 4)
        .unwrap()
        .into_parts();
    let mut pool = shapeproof::layout::Mxfp8KvCache::<Cuda, PAGE, DKV>::zeros(&g, 1)
        .unwrap()
        .into_parts();
    let mut view_out = Mxfp8Outputs::new(
        out_parts.q.view_mut(),
        out_parts.q_scales.view_mut(),
        out_parts.k.view_mut(),
        out_parts.v.view_mut(),
    )
    .unwrap();
    let mut view_kv = shapeproof::layout::Mxfp8KvCache::from_parts(
        shapeproof::layout::Mxfp8KvParts {
            k: pool.k.view_mut(),
            v: pool.v.view_mut(),
            k_scales: pool.k_scales.view_mut(),
            v_scales: pool.v_scales.view_mut(),
        },
        1,
    )
    .unwrap();
    let mut run_views = || {
        mx.run(
            &g,
            &w,
            &mut b.conv,
            &view_batch,
            &mut b.windows,
            &mut view_out,
            &mut view_kv,
            None,
        )
        .unwrap()
    };
    run_views();
    g.synchronize().unwrap();
    let (mut typed_rounds, mut view_rounds, mut raw_rounds) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        let t0 = Instant::now();
        for _ in 0..n {
            run!(mx, &g, &w, b2);
        }
        typed_rounds.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
        g.synchronize().unwrap();
        let t0 = Instant::now();
        for _ in 0..n {
            run_views();
        }
        view_rounds.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
        g.synchronize().unwrap();
        let mut params = launch.params;
        let t0 = Instant::now();
        for _ in 0..n {
            let mut args = [&mut params as *mut PrologueParams as *mut std::ffi::c_void];
            // SAFETY: the parameter block of a checked call on live buffers.
            unsafe {
                result::launch_kernel(
                    function,
                    launch.shape.grid,
                    launch.shape.block,
                    0,
                    g.stream().cu_stream(),
                    &mut args,
                )
                .unwrap()
            };
        }
        raw_rounds.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
        g.synchronize().unwrap();
    }
    let typed = common::median(&mut typed_rounds);
    let views = common::median(&mut view_rounds);
    let raw = common::median(&mut raw_rounds);
    println!(
        "\nhost time per launch: typed run {typed:.2} µs, raw cuLaunchKernel {raw:.2} µs, overhead {:.2} µs",
        typed - raw
    );
    println!(
        "host time per launch from views: {views:.2} µs, overhead over raw {:.2} µs",
        views - raw
    );
    records.push(Record {
        name: "host_launch".into(),
        fields: vec![
            ("typed_us", typed),
            ("raw_us", raw),
            ("overhead_us", typed - raw),
            ("views_us", views),
            ("views_overhead_us", views - raw),
        ],
    });
    common::write_json("prologue.json", &records);
}
