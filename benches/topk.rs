//! Benchmark of the top-k alone (`kernels/topk.cu`): rows of N(0, 1) f32 scores, every column
//! a candidate, top-2048, at the shapes DeepSeek Sparse Attention selects from (one decode row
//! over 65536 positions, four over 131072) and at batches that fill the GPU. The scores stay
//! resident in L2 between runs where they fit, as after the logits kernel that wrote them. GPU
//! time per call: the median of CUDA-event timings of a graph of 20 calls, over 20 (the figure
//! of record, no launch gaps), and of single launches (each with its launch gap), with the
//! bytes of scores read once over it beside the device copy bandwidth of the same run. Row 0 of every shape is checked against
//! the CPU reference first. Run on the H200 through `scripts/gpu-bundle.sh` (`run.sh bench`,
//! which also times `torch.topk` on the same shapes: `bench/topk_torch.py`); needs
//! `--features gpu-tests`.

mod common;

use common::{Record, copy_bandwidth_gbs, gpu, graph_call_us, time_us};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use shapeproof::backend::{Backend, Cuda};
use shapeproof::ops::topk::{TopK, TopkScores, select_row};
use shapeproof::tensor::{Cols, Tensor};

const TOPK: usize = 2048;
/// Calls of one timed graph.
const GRAPH_CALLS: usize = 20;
/// (rows, width): the decode rows of the targets, then batches that fill the GPU.
const SHAPES: [(usize, usize); 6] = [
    (1, 65536),
    (4, 131072),
    (8, 65536),
    (32, 65536),
    (132, 65536),
    (1024, 16384),
];

fn main() {
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(0x70_9C);
    println!("# top-k benchmark on {}", g.describe());
    let copy = copy_bandwidth_gbs(&g);
    println!("copy bandwidth, same run: {copy:.0} GB/s\n");
    let mut records = vec![Record {
        name: "copy".into(),
        fields: vec![("gbs", copy)],
    }];
    println!("| (rows, width, TOPK) | µs (graph) | µs (launched) | scores GB/s | of copy |");
    println!("|---|---|---|---|---|");
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let topk = TopK::<TOPK>::new();
    for (rows, width) in SHAPES {
        let host: Vec<f32> = (0..rows * width).map(|_| normal.sample(&mut rng)).collect();
        let scores = TopkScores::new(
            Tensor::from_host(&g, "scores", &host, rows * width).unwrap(),
            width,
            Tensor::filled(&g, rows, 0).unwrap(),
            Tensor::filled(&g, rows, width as i32).unwrap(),
        )
        .unwrap();
        let mut out = Tensor::<Cuda, i32, Cols<TOPK>>::zeros(&g, rows).unwrap();
        topk.run(&g, &scores, &mut out).unwrap();
        let got = out.to_host(&g).unwrap();
        let want = select_row(&host[..width], 0, width as i32, TOPK);
        assert_eq!(
            &got[..TOPK],
            &want[..],
            "row 0 of ({rows}, {width}) differs from the CPU"
        );
        // Launched one by one (each timed with its launch gap), and as GRAPH_CALLS calls of one
        // graph (GPU time alone: the figure of record).
        let launched = time_us(&g, 5, 51, |_| topk.run(&g, &scores, &mut out).unwrap());
        let mut outs: Vec<_> = (0..GRAPH_CALLS)
            .map(|_| Tensor::<Cuda, i32, Cols<TOPK>>::zeros(&g, rows).unwrap())
            .collect();
        let mut recorder = g.record_graph().unwrap();
        for o in &mut outs {
            topk.record(&mut recorder, &scores, o).unwrap();
        }
        let graph = recorder.finish().unwrap();
        let us = graph_call_us(&g, &graph, GRAPH_CALLS);
        drop(graph);
        assert_eq!(
            outs[GRAPH_CALLS - 1].to_host(&g).unwrap(),
            got,
            "a graph call's rows"
        );
        let gbs = (rows * width * 4) as f64 / (us * 1e-6) / 1e9;
        println!(
            "| ({rows}, {width}, {TOPK}) | {us:.1} | {launched:.1} | {gbs:.0} | {:.0}% |",
            100.0 * gbs / copy
        );
        records.push(Record {
            name: format!("topk_r{rows}_w{width}_k{TOPK}"),
            fields: vec![
                ("rows", rows as f64),
                ("width", width as f64),
                ("topk", TOPK as f64),
                ("us", us),
                ("launched_us", launched),
                ("gbs", gbs),
                ("of_copy", gbs / copy),
            ],
        });
    }
    common::write_json("topk.json", &records);
}
