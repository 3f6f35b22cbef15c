//! Benchmark of the Inkling prologue at TP8 geometry (HQ 8, HKV 1, head dim 128, W 4, tau on):
//! bf16 store vs MXFP8 store,
//! - small verify batches (q = 4 draft tokens) B = 1, 4, 16, 32, 64 replayed from a CUDA graph
//!   (GPU time per call),
//! - long batches T = 4096, 16384 and 65536 of the verify step (q = 4) and of the extend step
//!   (prefill: sequences of 1024 tokens with cached history, conv state updated after), as an
//!   engine runs them: GPU time per call of a graph of back-to-back calls rotating over input
//!   sets larger than L2, against the device copy bandwidth measured in the same run,
//! - host cost of one typed launch against a raw `cuLaunchKernel` of the same kernel (alone
//!   with `BENCH_HOST_ONLY=1`, e.g. under the null driver of `scripts/null-driver`).
//!
//! Bytes are the unique bytes a call must move: the q/k/v slices of qkvr, conv history, weights
//! and metadata read; q/k/v outputs, KV rows (+ scales), saved windows (verify) and the new conv
//! state (extend) written. Every row goes to `prologue.json` ($BENCH_JSON_DIR or ./), which
//! `bench/prologue_torch.py` reads to print the same steps in PyTorch beside these figures.
//! Run on the H200 through `scripts/gpu-bundle.sh` (`run.sh bench`); needs `--features gpu-tests`.

mod common;

use std::time::Instant;

use common::{Record, gpu};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shapeproof::backend::cuda::DeviceArgs;
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
const ROW: usize = 1408;
/// Tokens per sequence of the extend (prefill) batches.
const EXTEND_SEQ_LEN: usize = 1024;
/// Token counts of the long batches.
const LONG_TOKENS: [usize; 3] = [4096, 16384, 65536];
/// Calls per captured graph.
const GRAPH_CALLS: usize = 20;
/// Buffers the MXFP8 verify call admits (batch 5 with tau, weights 4, conv 2, outputs and store
/// 8, windows 2): the admission breakdown admits as many.
const ADMITTED_BUFFERS: usize = 21;
type Row = PackedRow<DQ, DKV, 128>;
type Conv = InklingConv;

/// The two steps that run long batches.
#[derive(Clone, Copy, PartialEq)]
enum Step {
    Verify,
    Extend,
}

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::Verify => "verify",
            Step::Extend => "extend",
        }
    }
    fn seqs(self, tokens: usize) -> usize {
        match self {
            Step::Verify => tokens / Q,
            Step::Extend => tokens.div_ceil(EXTEND_SEQ_LEN),
        }
    }
}

/// Unique bytes one call of `step` moves at this geometry.
fn bytes_moved(step: Step, tokens: usize, mxfp8: bool) -> f64 {
    let seqs = step.seqs(tokens);
    let history = seqs * 2 * (W - 1) * DKV * 2; // conv state of k and v, one [W-1, DKV] each
    let (token_meta, seq_meta) = match step {
        Step::Verify => (8 + 4, 4 + 1),         // loc, tau; cache index, mask
        Step::Extend => (8 + 4 + 4, 8 + 4 + 2), // + seq_of_token; cu_seqlens, index, two masks
    };
    let read = tokens * (DQ + 2 * DKV) * 2      // q, k, v slices of qkvr
        + history
        + 2 * DKV * W * 2 + 2 * 128 * 2        // conv taps, gammas
        + tokens * token_meta
        + seqs * seq_meta;
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
    let state = match step {
        Step::Verify => 2 * seqs * Q * (W - 1) * DKV * 2, // saved windows
        Step::Extend => history,                          // the updated conv state
    };
    let written = q_out + 2 * tokens * DKV * 2 + kv_store + state;
    (read + written) as f64
}

/// The kernels, outputs and KV pool of a store, made for the benchmark.
trait BenchStore: Store + Sized {
    fn verify_kernel() -> Prologue<Verify, Self, 128, DQ, DKV, Row, Conv>;
    fn extend_kernel() -> Prologue<Extend, Self, 128, DQ, DKV, Row, Conv>;
    fn outputs(g: &Cuda, tokens: usize) -> Self::Outputs<Cuda, DQ, DKV, Owned>;
    fn pool(g: &Cuda, pages: usize) -> Self::Cache<Cuda, DKV, Owned>;
}

impl BenchStore for Bf16Store<PAGE> {
    fn verify_kernel() -> Bf16Prologue<Verify, 128, DQ, DKV, Row, Conv, PAGE> {
        Bf16Prologue::new()
    }
    fn extend_kernel() -> Bf16Prologue<Extend, 128, DQ, DKV, Row, Conv, PAGE> {
        Bf16Prologue::new()
    }
    fn outputs(g: &Cuda, tokens: usize) -> Bf16Outputs<Cuda, DQ, DKV> {
        Bf16Outputs::zeros(g, tokens).unwrap()
    }
    fn pool(g: &Cuda, pages: usize) -> shapeproof::layout::PagedBf16Kv<Cuda, PAGE, DKV> {
        shapeproof::layout::PagedBf16Kv::zeros(g, pages).unwrap()
    }
}

impl BenchStore for Mxfp8Store<PAGE> {
    fn verify_kernel() -> Mxfp8Prologue<Verify, DQ, DKV, Row, Conv, PAGE> {
        Mxfp8Prologue::new()
    }
    fn extend_kernel() -> Mxfp8Prologue<Extend, DQ, DKV, Row, Conv, PAGE> {
        Mxfp8Prologue::new()
    }
    fn outputs(g: &Cuda, tokens: usize) -> Mxfp8Outputs<Cuda, DQ, DKV> {
        Mxfp8Outputs::zeros(g, tokens).unwrap()
    }
    fn pool(g: &Cuda, pages: usize) -> shapeproof::layout::Mxfp8KvCache<Cuda, PAGE, DKV> {
        shapeproof::layout::Mxfp8KvCache::zeros(g, pages).unwrap()
    }
}

/// Host inputs shared by the batches of one token count (every set gets its own device copy).
struct HostInputs {
    qkvr: Vec<bf16>,
    tau: Vec<f32>,
}

fn host_inputs(rng: &mut StdRng, tokens: usize) -> HostInputs {
    HostInputs {
        qkvr: (0..tokens * ROW)
            .map(|_| bf16::from_f32(rng.random::<f32>() * 2.0 - 1.0))
            .collect(),
        tau: (0..tokens)
            .map(|_| 1.0 + rng.random::<f32>() * 0.2)
            .collect(),
    }
}

/// A verify call's tensors, on the GPU.
struct VerifyCase<S: BenchStore> {
    batch: VerifyBatch<Cuda, Row>,
    windows: VerifyWindows<Cuda, DKV, Conv>,
    conv: ConvState<Cuda, DKV, Conv>,
    out: S::Outputs<Cuda, DQ, DKV, Owned>,
    kv: S::Cache<Cuda, DKV, Owned>,
}

/// An extend call's tensors, on the GPU.
struct ExtendCase<S: BenchStore> {
    batch: ExtendBatch<Cuda, Row, Conv>,
    conv: ConvState<Cuda, DKV, Conv>,
    out: S::Outputs<Cuda, DQ, DKV, Owned>,
    kv: S::Cache<Cuda, DKV, Owned>,
}

fn pages(tokens: usize) -> usize {
    tokens.div_ceil(PAGE)
}

fn verify_case<S: BenchStore>(g: &Cuda, host: &HostInputs) -> VerifyCase<S> {
    let tokens = host.tau.len();
    let seqs = tokens / Q;
    let loc: Vec<i64> = (0..tokens as i64).collect();
    let batch = VerifyBatch::new(
        Tensor::from_host(g, "qkvr", &host.qkvr, tokens).unwrap(),
        Tensor::from_host(
            g,
            "cache_indices",
            &(0..seqs as i32).collect::<Vec<_>>(),
            seqs,
        )
        .unwrap(),
        Tensor::from_host(g, "cache_mask", &vec![1u8; seqs], seqs).unwrap(),
        Tensor::from_host(g, "loc", &loc, tokens).unwrap(),
        Some(Tensor::from_host(g, "tau", &host.tau, tokens).unwrap()),
        Q,
    )
    .unwrap();
    VerifyCase {
        batch,
        windows: VerifyWindows::zeros(g, seqs, Q).unwrap(),
        conv: ConvState::zeros(g, seqs).unwrap(),
        out: S::outputs(g, tokens),
        kv: S::pool(g, pages(tokens)),
    }
}

fn extend_case<S: BenchStore>(g: &Cuda, host: &HostInputs) -> ExtendCase<S> {
    let tokens = host.tau.len();
    let seqs = Step::Extend.seqs(tokens);
    let cu: Vec<i64> = (0..=seqs)
        .map(|s| (s * EXTEND_SEQ_LEN).min(tokens) as i64)
        .collect();
    let seq_of_token: Vec<i32> = (0..tokens).map(|t| (t / EXTEND_SEQ_LEN) as i32).collect();
    let loc: Vec<i64> = (0..tokens as i64).collect();
    let batch = ExtendBatch::new(ExtendBatchParts {
        qkvr: Tensor::from_host(g, "qkvr", &host.qkvr, tokens).unwrap(),
        cu_seqlens: Tensor::from_host(g, "cu_seqlens", &cu, seqs + 1).unwrap(),
        seq_of_token: Tensor::from_host(g, "seq_of_token", &seq_of_token, tokens).unwrap(),
        cache_indices: Tensor::from_host(
            g,
            "cache_indices",
            &(0..seqs as i32).collect::<Vec<_>>(),
            seqs,
        )
        .unwrap(),
        cache_mask: Tensor::from_host(g, "cache_mask", &vec![1u8; seqs], seqs).unwrap(),
        has_initial_state: Tensor::from_host(g, "has_initial_state", &vec![1u8; seqs], seqs)
            .unwrap(),
        loc: Tensor::from_host(g, "loc", &loc, tokens).unwrap(),
        tau: Some(Tensor::from_host(g, "tau", &host.tau, tokens).unwrap()),
        track: None,
        update_conv_state: true,
    })
    .unwrap();
    ExtendCase {
        batch,
        conv: ConvState::zeros(g, seqs).unwrap(),
        out: S::outputs(g, tokens),
        kv: S::pool(g, pages(tokens)),
    }
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

/// `$method` (`run` or `launch_plan`) of a verify kernel on case `$c`, unwrapped.
macro_rules! verify_call {
    ($method:ident, $kernel:expr, $g:expr, $w:expr, $c:expr) => {{
        let c = &mut $c;
        $kernel
            .$method(
                $g,
                $w,
                &mut c.conv,
                (&c.batch, &mut c.windows),
                PrologueTargets {
                    out: &mut c.out,
                    kv: &mut c.kv,
                    errors: None,
                },
            )
            .unwrap()
    }};
}

macro_rules! run_verify {
    ($($t:tt)*) => { verify_call!(run, $($t)*) };
}

macro_rules! plan_verify {
    ($($t:tt)*) => { verify_call!(launch_plan, $($t)*) };
}

macro_rules! plan_extend {
    ($kernel:expr, $g:expr, $w:expr, $c:expr) => {{
        let c = &mut $c;
        $kernel
            .launch_plan(
                $g,
                $w,
                &mut c.conv,
                &c.batch,
                PrologueTargets {
                    out: &mut c.out,
                    kv: &mut c.kv,
                    errors: None,
                },
            )
            .unwrap()
    }};
}

/// GPU time per call of `calls` calls captured in one graph and replayed; `plan(i)` gives call
/// `i`'s checked launches (`launch_plan`; the benchmark rotates input sets with it). The graph
/// is built from raw launches of those parameter blocks, the `unsafe` replay door: the typed
/// recorder (`Cuda::record_graph`) borrows each written tensor once for the graph's life, and
/// these graphs write the same outputs many times over.
fn graph_us<K: PrologueKernel>(
    g: &Cuda,
    calls: usize,
    mut plan: impl FnMut(usize) -> PrologueLaunchPlan,
) -> f64 {
    let main = g.function::<K>().unwrap();
    let update = g.function::<K::Update>().unwrap();
    let plans: Vec<PrologueLaunchPlan> = (0..calls).map(&mut plan).collect();
    common::raw_graph_call_us(g, calls, |i| {
        let p = &plans[i];
        // SAFETY: checked parameter blocks (`launch_plan`) of buffers that outlive the graph,
        // all on the benchmark's one stream.
        unsafe {
            common::raw_launch(g, main, p.shape, &p.params);
            if let Some((shape, params)) = &p.update {
                common::raw_launch(g, update, *shape, params);
            }
        }
    })
}

/// Input sets to rotate over so that one call's inputs are evicted from the 60 MB L2 before
/// they are read again (at least 400 MB of qkvr in all, 2 to 8 sets).
fn rotating_sets(tokens: usize) -> usize {
    (400_000_000 / (tokens * ROW * 2)).clamp(2, 8)
}

/// GPU time per call of one long batch of `step` with store `S`, graph of back-to-back calls.
fn long_batch_us<S: BenchStore>(
    g: &Cuda,
    w: &PrologueWeights<Cuda, 128, DKV, Conv>,
    step: Step,
    host: &HostInputs,
) -> f64
where
    Prologue<Verify, S, 128, DQ, DKV, Row, Conv>: PrologueKernel,
    Prologue<Extend, S, 128, DQ, DKV, Row, Conv>: PrologueKernel,
{
    let sets = rotating_sets(host.tau.len());
    match step {
        Step::Verify => {
            let kernel = S::verify_kernel();
            let mut cases: Vec<_> = (0..sets).map(|_| verify_case::<S>(g, host)).collect();
            graph_us::<Prologue<Verify, S, 128, DQ, DKV, Row, Conv>>(g, GRAPH_CALLS, |i| {
                plan_verify!(kernel, g, w, cases[i % sets])
            })
        }
        Step::Extend => {
            let kernel = S::extend_kernel();
            let mut cases: Vec<_> = (0..sets).map(|_| extend_case::<S>(g, host)).collect();
            graph_us::<Prologue<Extend, S, 128, DQ, DKV, Row, Conv>>(g, GRAPH_CALLS, |i| {
                plan_extend!(kernel, g, w, cases[i % sets])
            })
        }
    }
}

/// Host cost of one typed launch (boundary ties, parameter block, admissions, launch) against a
/// raw `cuLaunchKernel` of the same block, with where the typed time goes.
fn host_cost(
    g: &Cuda,
    w: &PrologueWeights<Cuda, 128, DKV, Conv>,
    mx: &Mxfp8Prologue<Verify, DQ, DKV, Row, Conv, PAGE>,
    rng: &mut StdRng,
) -> Record {
    // Host cost: typed call (boundary ties + parameter block + launch) vs raw cuLaunchKernel.
    let host = host_inputs(rng, 4);
    let mut b = verify_case::<Mxfp8Store<PAGE>>(g, &host);
    let mut b2 = verify_case::<Mxfp8Store<PAGE>>(g, &host);
    run_verify!(mx, g, w, b);
    run_verify!(mx, g, w, b2);
    g.synchronize().unwrap();
    let launch = mx
        .launch_plan(
            g,
            w,
            &mut b.conv,
            (&b.batch, &mut b.windows),
            PrologueTargets {
                out: &mut b.out,
                kv: &mut b.kv,
                errors: None,
            },
        )
        .unwrap();
    let function = g
        .function::<Mxfp8Prologue<Verify, DQ, DKV, Row, Conv, PAGE>>()
        .unwrap();
    // Typed and raw launches alternate over rounds (host timings on a VM drift); medians.
    let n = 5_000; // calls a round of the host-only parts
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
    let mut out_parts = Mxfp8Outputs::<Cuda, DQ, DKV>::zeros(g, 4)
        .unwrap()
        .into_parts();
    let mut pool = shapeproof::layout::Mxfp8KvCache::<Cuda, PAGE, DKV>::zeros(g, 1)
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
            g,
            w,
            &mut b.conv,
            (&view_batch, &mut b.windows),
            PrologueTargets {
                out: &mut view_out,
                kv: &mut view_kv,
                errors: None,
            },
        )
        .unwrap()
    };
    run_views();
    g.synchronize().unwrap();
    let (mut typed_rounds, mut view_rounds, mut raw_rounds) = (Vec::new(), Vec::new(), Vec::new());
    // Where the typed launch's time goes: the checked call without the launch (`launch_plan`:
    // the boundary ties, the queue check and every buffer's admission), the kernel lookup, and
    // the two driver queries of every launch (the current context, the stream's capture state).
    let (mut plan_rounds, mut lookup_rounds, mut ctx_rounds, mut capture_rounds) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // And of the checked call: an empty argument list (the queue check, made and dropped), and
    // one with as many admitted buffers as this call has (all of one allocation).
    let (mut empty_args_rounds, mut admit_rounds) = (Vec::new(), Vec::new());
    let probe = g.stream().alloc_zeros::<u8>(256).unwrap();
    let probe = probe.as_view();
    let buffers = ADMITTED_BUFFERS;
    let per_call = |rounds: &mut Vec<f64>, f: &mut dyn FnMut()| {
        let t0 = Instant::now();
        for _ in 0..n {
            f();
        }
        rounds.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
    };
    // The host-only parts: many calls a round, no launch.
    for _ in 0..7 {
        per_call(&mut plan_rounds, &mut || {
            std::hint::black_box(plan_verify!(mx, g, &w, b2));
        });
        per_call(&mut lookup_rounds, &mut || {
            std::hint::black_box(
                g.function::<Mxfp8Prologue<Verify, DQ, DKV, Row, Conv, PAGE>>()
                    .unwrap(),
            );
        });
        per_call(&mut empty_args_rounds, &mut || {
            std::hint::black_box(DeviceArgs::new(g).unwrap());
        });
        per_call(&mut admit_rounds, &mut || {
            let mut args = DeviceArgs::new(g).unwrap();
            for _ in 0..buffers {
                std::hint::black_box(args.read("probe", &probe).unwrap());
            }
        });
        per_call(&mut ctx_rounds, &mut || {
            std::hint::black_box(cudarc::driver::result::ctx::get_current().unwrap());
        });
        per_call(&mut capture_rounds, &mut || {
            // SAFETY: the benchmark's live stream.
            let status = unsafe {
                cudarc::driver::result::stream::is_capturing(g.stream().cu_stream()).unwrap()
            };
            std::hint::black_box(status);
        });
    }
    // The launches: short rounds on an idle stream (common::LAUNCHES_A_ROUND says why),
    // typed, from views and raw in turn.
    let launches = common::LAUNCHES_A_ROUND;
    for _ in 0..common::LAUNCH_ROUNDS {
        let t0 = Instant::now();
        for _ in 0..launches {
            run_verify!(mx, g, &w, b2);
        }
        typed_rounds.push(t0.elapsed().as_secs_f64() * 1e6 / launches as f64);
        g.synchronize().unwrap();
        let t0 = Instant::now();
        for _ in 0..launches {
            run_views();
        }
        view_rounds.push(t0.elapsed().as_secs_f64() * 1e6 / launches as f64);
        g.synchronize().unwrap();
        // SAFETY: the parameter block of a checked call on live buffers.
        raw_rounds.push(unsafe { common::raw_launch_us(g, function, &launch, launches) });
        g.synchronize().unwrap();
    }
    let typed = common::median(&mut typed_rounds);
    let views = common::median(&mut view_rounds);
    let raw = common::median(&mut raw_rounds);
    let plan = common::median(&mut plan_rounds);
    let lookup = common::median(&mut lookup_rounds);
    let ctx_query = common::median(&mut ctx_rounds);
    let capture_query = common::median(&mut capture_rounds);
    let empty_args = common::median(&mut empty_args_rounds);
    let admit = common::median(&mut admit_rounds);
    println!(
        "of which: checked call without launch {plan:.3} µs, kernel lookup {lookup:.3} µs, cuCtxGetCurrent {ctx_query:.3} µs, cuStreamIsCapturing {capture_query:.3} µs"
    );
    println!(
        "argument list made and dropped {empty_args:.3} µs; with {buffers} buffers admitted {admit:.3} µs ({:.4} µs a buffer)",
        (admit - empty_args) / buffers as f64
    );
    println!(
        "\nhost time per launch: typed run {typed:.2} µs, raw cuLaunchKernel {raw:.2} µs, overhead {:.2} µs",
        typed - raw
    );
    println!(
        "host time per launch from views: {views:.2} µs, overhead over raw {:.2} µs",
        views - raw
    );
    Record {
        name: "host_launch".into(),
        fields: vec![
            ("typed_us", typed),
            ("raw_us", raw),
            ("overhead_us", typed - raw),
            ("views_us", views),
            ("views_overhead_us", views - raw),
            ("checked_call_us", plan),
            ("kernel_lookup_us", lookup),
            ("ctx_query_us", ctx_query),
            ("capture_query_us", capture_query),
            ("empty_args_us", empty_args),
            ("admit_us", admit),
            ("admitted_buffers", buffers as f64),
        ],
    }
}

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0x5EED);
    let date = std::env::var("BENCH_DATE").unwrap_or_default();
    println!("# prologue benchmark on {} {date}", g.describe());
    let w = weights(&g, &mut rng);
    let bf = Bf16Prologue::<Verify, 128, DQ, DKV, Row, Conv, PAGE>::new();
    let mx = Mxfp8Prologue::<Verify, DQ, DKV, Row, Conv, PAGE>::new();
    if std::env::var_os("BENCH_HOST_ONLY").is_some() {
        // The host cost alone (e.g. under scripts/null-driver, to profile it without a GPU).
        let record = host_cost(&g, &w, &mx, &mut rng);
        common::write_json("prologue_host.json", &[record]);
        return;
    }
    let copy = common::copy_bandwidth_gbs(&g);
    println!("device copy bandwidth (read + write): {copy:.0} GB/s");
    let mut records = vec![Record {
        name: "copy".into(),
        fields: vec![("gbs", copy)],
    }];

    println!("\n| B (q=4) | T | bf16 store µs/call | MXFP8 store µs/call | MXFP8 / bf16 |");
    println!("|---|---|---|---|---|");
    for seqs in [1usize, 4, 16, 32, 64] {
        let tokens = seqs * Q;
        let host = host_inputs(&mut rng, tokens);
        let mut b1 = verify_case::<Bf16Store<PAGE>>(&g, &host);
        let mut b2 = verify_case::<Mxfp8Store<PAGE>>(&g, &host);
        let t_bf = graph_us::<Bf16Prologue<Verify, 128, DQ, DKV, Row, Conv, PAGE>>(
            &g,
            GRAPH_CALLS,
            |_| plan_verify!(bf, &g, &w, b1),
        );
        let t_mx =
            graph_us::<Mxfp8Prologue<Verify, DQ, DKV, Row, Conv, PAGE>>(&g, GRAPH_CALLS, |_| {
                plan_verify!(mx, &g, &w, b2)
            });
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

    println!(
        "\nLong batches: graph of {GRAPH_CALLS} back-to-back calls, inputs rotating over sets larger than L2; extend = sequences of {EXTEND_SEQ_LEN} tokens + conv-state update."
    );
    println!("\n| step | T | store | µs/call | GB/s | of copy ({copy:.0} GB/s) |");
    println!("|---|---|---|---|---|---|");
    for step in [Step::Verify, Step::Extend] {
        for tokens in LONG_TOKENS {
            let host = host_inputs(&mut rng, tokens);
            let t_bf = long_batch_us::<Bf16Store<PAGE>>(&g, &w, step, &host);
            let t_mx = long_batch_us::<Mxfp8Store<PAGE>>(&g, &w, step, &host);
            for (store, us, mxfp8) in [("bf16", t_bf, false), ("mxfp8", t_mx, true)] {
                let gbs = bytes_moved(step, tokens, mxfp8) / (us * 1e-6) / 1e9;
                println!(
                    "| {} | {tokens} | {store} | {us:.1} | {gbs:.0} | {:.0}% |",
                    step.name(),
                    100.0 * gbs / copy
                );
                records.push(Record {
                    name: format!("{}_T{tokens}_{store}", step.name()),
                    fields: vec![
                        ("tokens", tokens as f64),
                        ("us", us),
                        ("gbs", gbs),
                        ("copy_fraction", gbs / copy),
                    ],
                });
            }
        }
    }

    records.push(host_cost(&g, &w, &mx, &mut rng));
    common::write_json("prologue.json", &records);
}
