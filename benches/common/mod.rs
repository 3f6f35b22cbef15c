//! Timing helpers shared by the GPU benchmarks: CUDA-event timing, medians, the device copy
//! bandwidth (the limit memory-bound kernels are reported against), and a JSON writer.
#![allow(dead_code)]

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, sys};
use shapeproof::backend::Cuda;

/// The GPU, or a clear failure: benchmarks never run without one.
///
/// The benchmarks run as a single-stream engine would: on a stream of the primary context with
/// cudarc's event tracking switched off (every buffer is used on that one stream), so launches
/// record no events.
pub fn gpu() -> Cuda {
    assert!(
        shapeproof::backend::cuda::driver_present(),
        "benchmarks need a CUDA device: no driver"
    );
    // SAFETY: every buffer of the benchmarks is made after this and used on one stream only.
    unsafe { Cuda::new_untracked(0) }
        .unwrap_or_else(|e| panic!("benchmarks need a CUDA device: {e}"))
}

fn timing_event(g: &Cuda) -> CudaEvent {
    g.context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .expect("event")
}

/// Median GPU time in microseconds of `f`, each run bracketed by events, after `warmup` runs.
pub fn time_us(g: &Cuda, warmup: usize, runs: usize, mut f: impl FnMut(usize)) -> f64 {
    let stream: &Arc<CudaStream> = g.stream();
    for i in 0..warmup {
        f(i);
    }
    let (start, end) = (timing_event(g), timing_event(g));
    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs {
        start.record(stream).unwrap();
        f(i);
        end.record(stream).unwrap();
        end.synchronize().unwrap();
        samples.push(start.elapsed_ms(&end).unwrap() as f64 * 1e3);
    }
    median(&mut samples)
}

/// Median GPU time in microseconds of one of the `calls` calls recorded in `graph`: the
/// replays are timed with events and divided by `calls`, so no host launch gap between the
/// calls is counted (kernels shorter than a launch are otherwise timed at the launch rate).
pub fn graph_call_us(g: &Cuda, graph: &shapeproof::backend::cuda::Graph<'_>, calls: usize) -> f64 {
    time_us(g, 3, 21, |_| graph.replay().unwrap()) / calls as f64
}

/// Median GPU time in microseconds of one of `calls` calls captured from raw launches into one
/// graph and replayed: `launch(i)` queues call `i` on the benchmark's stream while it is
/// captured (raw `cuLaunchKernel`s of checked parameter blocks, e.g. [`raw_launch`]), so no
/// host launch gap between the calls is counted.
pub fn raw_graph_call_us(g: &Cuda, calls: usize, mut launch: impl FnMut(usize)) -> f64 {
    g.stream().synchronize().unwrap();
    g.stream()
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    for i in 0..calls {
        launch(i);
    }
    let graph = g
        .stream()
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a captured graph");
    graph.upload().unwrap();
    time_us(g, 3, 30, |_| graph.launch().unwrap()) / calls as f64
}

/// The median of `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written, over a
/// buffer far larger than L2.
pub fn copy_bandwidth_gbs(g: &Cuda) -> f64 {
    let n = 1usize << 31; // 2 GiB
    let src = g.stream().alloc_zeros::<u8>(n).unwrap();
    let mut dst = g.stream().alloc_zeros::<u8>(n).unwrap();
    let us = time_us(g, 3, 15, |_| {
        g.stream().memcpy_dtod(&src, &mut dst).unwrap()
    });
    2.0 * n as f64 / (us * 1e-6) / 1e9
}

/// The FP8 matmul rate of this device in TFLOP/s, measured by `fp8_matmul_rate.py` (PyTorch
/// `_scaled_mm`, e4m3, 8192³) from the bundle's folder, or none where there is no PyTorch.
pub fn fp8_matmul_limit() -> Option<f64> {
    let script = std::env::current_exe()
        .ok()?
        .parent()?
        .parent()?
        .join("fp8_matmul_rate.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// The three numbers of a profiling variable (`MLA_DECODE_PROFILE="B,S_Q,H"`,
/// `INDEXER_PROFILE="T,HISTORY,H"`): with it set, a benchmark runs that one row alone for a
/// profiler, without limits or JSON. None when the variable is unset; a malformed value panics
/// with `form`, the variable's shape.
pub fn profile_row(var: &str, form: &str) -> Option<[usize; 3]> {
    let spec = std::env::var(var).ok()?;
    let n: Vec<usize> = spec
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var} is {form}"))
        })
        .collect();
    Some(n.try_into().unwrap_or_else(|_| panic!("{var} is {form}")))
}

/// One result row for the JSON file.
pub struct Record {
    pub name: String,
    pub fields: Vec<(&'static str, f64)>,
}

/// Writes the run's results to `$BENCH_JSON_DIR/<file>` (or the current folder) as one JSON
/// object: the commit (`$SHAPEPROOF_COMMIT`, set by the script that runs the benchmarks), the
/// GPU's name, the UTC date, and `records`, each `{"name": …, <field>: <number>, …}`.
/// `bench/render.py` turns these files into the tables of `bench/RESULTS.md`.
pub fn write_json(file: &str, records: &[Record]) {
    let dir = std::env::var("BENCH_JSON_DIR").unwrap_or_else(|_| ".".into());
    let commit = std::env::var("SHAPEPROOF_COMMIT").unwrap_or_else(|_| "unknown".into());
    let gpu = cudarc::driver::CudaContext::new(0)
        .and_then(|c| c.name())
        .unwrap_or_else(|_| "unknown".into());
    let body: Vec<String> = records
        .iter()
        .map(|r| {
            let fields: Vec<String> = r
                .fields
                .iter()
                .map(|(k, v)| format!("\"{k}\": {}", json_number(*v)))
                .collect();
            format!("    {{\"name\": \"{}\", {}}}", r.name, fields.join(", "))
        })
        .collect();
    std::fs::create_dir_all(&dir).unwrap();
    let path = std::path::Path::new(&dir).join(file);
    let text = format!(
        "{{\n  \"commit\": \"{commit}\",\n  \"gpu\": \"{gpu}\",\n  \"date\": \"{}\",\n  \"records\": [\n{}\n  ]\n}}\n",
        utc_date(),
        body.join(",\n")
    );
    std::fs::write(&path, text).unwrap();
    eprintln!("wrote {}", path.display());
}

/// A number as JSON writes it (`null` for NaN and infinities, which JSON has no words for).
fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

/// Today's date in UTC, `YYYY-MM-DD` (civil date from days since 1970, Howard Hinnant's method).
fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Queues one raw `cuLaunchKernel` of `function` with the parameter block `params` on the
/// benchmark's stream.
///
/// # Safety
/// `params` is the parameter block of a checked call of `function`'s kernel (`launch_plan`),
/// launched with that call's `shape`, and its buffers outlive the launch.
pub unsafe fn raw_launch<P: Copy>(
    g: &Cuda,
    function: sys::CUfunction,
    shape: shapeproof::backend::cuda::LaunchShape,
    params: &P,
) {
    let mut block = *params;
    let mut args = [&mut block as *mut P as *mut std::ffi::c_void];
    // SAFETY: forwarded to the caller.
    unsafe {
        cudarc::driver::result::launch_kernel(
            function,
            shape.grid,
            shape.block,
            shape.smem_bytes,
            g.stream().cu_stream(),
            &mut args,
        )
        .unwrap()
    };
}

/// The launches in one timed round of a host launch benchmark ([`LAUNCH_ROUNDS`] rounds, the
/// modes alternating). A round stays far below the depth of the stream's launch queue, and the
/// stream is synchronized (untimed) between rounds. With thousands of launches in a row the
/// queue can fill, and each launch then waits for the GPU to retire one (a microsecond
/// kernel's rate, not the host's): typed − raw read 0.07-0.91 µs in three runs of one build
/// on one H100 host that way, and 0.39-0.43 µs in rounds of 256.
pub const LAUNCHES_A_ROUND: usize = 256;
/// See [`LAUNCHES_A_ROUND`].
pub const LAUNCH_ROUNDS: usize = 120;

/// Host µs per launch of `n` raw `cuLaunchKernel`s of `function` with `plan`'s parameter block:
/// the baseline the typed launch is measured against.
///
/// # Safety
/// `plan` is the parameter block of a checked call (`launch_plan`) of `function`'s kernel, and
/// its buffers outlive the launches.
pub unsafe fn raw_launch_us(
    g: &Cuda,
    function: sys::CUfunction,
    plan: &shapeproof::ops::prologue::PrologueLaunchPlan,
    n: usize,
) -> f64 {
    let mut params = plan.params;
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let mut args = [&mut params as *mut _ as *mut std::ffi::c_void];
        // SAFETY: forwarded to the caller.
        unsafe {
            cudarc::driver::result::launch_kernel(
                function,
                plan.shape.grid,
                plan.shape.block,
                0,
                g.stream().cu_stream(),
                &mut args,
            )
            .unwrap()
        };
    }
    t0.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The cache slots of `tokens` tokens of one sequence whose pages of 64 slots are a random
/// permutation of a cache's `pages` pages (an engine's page table), in sequence order.
pub fn sequence_slots(rng: &mut rand::rngs::StdRng, pages: usize, tokens: usize) -> Vec<usize> {
    use rand::Rng;
    const PAGE: usize = 64;
    let mut order: Vec<usize> = (0..pages).collect();
    for i in 0..order.len() {
        let j = rng.random_range(i..order.len());
        order.swap(i, j);
    }
    (0..tokens)
        .map(|t| order[t / PAGE] * PAGE + t % PAGE)
        .collect()
}
