//! The prologue on the GPU against the CPU reference, every variant × store × geometry, fresh
//! random inputs, poisoned outputs and KV pools, every element compared. The arithmetic of the
//! kernel is IEEE and mirrored by the reference, so everything must agree bit for bit (SiLU's
//! exponential is the one exception, compared with the spec's bf16 tolerance). Compiled only with
//! `--features gpu-tests`; run on the H200 (`scripts/gpu-bundle.sh`).
#![cfg(feature = "gpu-tests")]

mod common;

use common::prologue::{Dispatch, Observed, Scenario, Shape, TestCache, TestStore, run};
use shapeproof::backend::{Cpu, Cuda};
use shapeproof::ops::prologue::*;
use shapeproof::tensor::Owned;

fn gpu() -> Cuda {
    Cuda::new(0).unwrap_or_else(|e| panic!("GPU tests need a CUDA device: {e}"))
}

fn shapes(with_bad: bool) -> Vec<(&'static str, Shape)> {
    let _ = with_bad;
    vec![
        (
            "verify B=1 q=4",
            Shape::Verify {
                seqs: 1,
                draft_tokens: 4,
            },
        ),
        (
            "verify B=13 q=4",
            Shape::Verify {
                seqs: 13,
                draft_tokens: 4,
            },
        ),
        (
            "verify B=64 q=3",
            Shape::Verify {
                seqs: 64,
                draft_tokens: 3,
            },
        ),
        (
            "extend",
            Shape::Extend {
                lens: vec![1, 0, 7, 2, 33, 3, 129],
                track: true,
                update: true,
            },
        ),
        (
            "extend no update",
            Shape::Extend {
                lens: vec![5, 9, 1],
                track: false,
                update: false,
            },
        ),
        (
            "decode",
            Shape::Decode {
                tokens: 77,
                track: true,
            },
        ),
    ]
}

fn compare(what: &str, gpu: &Observed, cpu: &Observed) {
    let fields: [(&str, bool); 13] = [
        ("q", gpu.q == cpu.q),
        ("q_scales", gpu.q_scales == cpu.q_scales),
        ("k_out", bits(&gpu.k_out) == bits(&cpu.k_out)),
        ("v_out", bits(&gpu.v_out) == bits(&cpu.v_out)),
        ("kv_k", gpu.kv_k == cpu.kv_k),
        ("kv_v", gpu.kv_v == cpu.kv_v),
        ("sfk", gpu.sfk == cpu.sfk),
        ("sfv", gpu.sfv == cpu.sfv),
        ("k_cache", bits(&gpu.k_cache) == bits(&cpu.k_cache)),
        ("v_cache", bits(&gpu.v_cache) == bits(&cpu.v_cache)),
        ("k_inter", bits(&gpu.k_inter) == bits(&cpu.k_inter)),
        ("v_inter", bits(&gpu.v_inter) == bits(&cpu.v_inter)),
        ("bad_indices", gpu.bad_indices == cpu.bad_indices),
    ];
    let differing: Vec<String> = fields
        .iter()
        .filter(|(_, same)| !same)
        .map(|(name, _)| format!("{name} ({})", first_difference(name, gpu, cpu)))
        .collect();
    assert!(
        differing.is_empty(),
        "{what}: GPU differs from the CPU reference in {differing:?}"
    );
}

fn bits(v: &[shapeproof::dtype::bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn first_difference(name: &str, g: &Observed, c: &Observed) -> String {
    let pair = |a: Vec<u64>, b: Vec<u64>| -> String {
        let n = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        match a.iter().zip(&b).position(|(x, y)| x != y) {
            Some(i) => format!(
                "{n} of {} differ, first at {i}: gpu {:#x} cpu {:#x}",
                a.len(),
                a[i],
                b[i]
            ),
            None => format!("lengths {} vs {}", a.len(), b.len()),
        }
    };
    let w16 = |v: &[u16]| v.iter().map(|&x| x as u64).collect::<Vec<_>>();
    let w8 = |v: &[u8]| v.iter().map(|&x| x as u64).collect::<Vec<_>>();
    let wb =
        |v: &[shapeproof::dtype::bf16]| v.iter().map(|x| x.to_bits() as u64).collect::<Vec<_>>();
    match name {
        "q" => pair(w16(&g.q), w16(&c.q)),
        "q_scales" => pair(w8(&g.q_scales), w8(&c.q_scales)),
        "k_out" => pair(wb(&g.k_out), wb(&c.k_out)),
        "v_out" => pair(wb(&g.v_out), wb(&c.v_out)),
        "kv_k" => pair(w8(&g.kv_k), w8(&c.kv_k)),
        "kv_v" => pair(w8(&g.kv_v), w8(&c.kv_v)),
        "sfk" => pair(w8(&g.sfk), w8(&c.sfk)),
        "sfv" => pair(w8(&g.sfv), w8(&c.sfv)),
        "k_cache" => pair(wb(&g.k_cache), wb(&c.k_cache)),
        "v_cache" => pair(wb(&g.v_cache), wb(&c.v_cache)),
        "k_inter" => pair(wb(&g.k_inter), wb(&c.k_inter)),
        "v_inter" => pair(wb(&g.v_inter), wb(&c.v_inter)),
        _ => format!("gpu {} cpu {}", g.bad_indices, c.bad_indices),
    }
}

/// Runs every shape of one geometry and store through both backends.
fn check<S, const HD: usize, const DQ: usize, const DKV: usize, L>(
    geometry: &str,
    verify: Prologue<Verify, S, HD, DQ, DKV, L, InklingConv>,
    extend: Prologue<Extend, S, HD, DQ, DKV, L, InklingConv>,
    decode: Prologue<Decode, S, HD, DQ, DKV, L, InklingConv>,
) where
    S: TestStore,
    L: QkvrLayout<DQ, DKV>,
    S::Cache<Cuda, DKV, Owned>: KvCacheTarget<Cuda> + TestCache<Cuda>,
    S::Cache<Cpu, DKV, Owned>: KvCacheTarget<Cpu> + TestCache<Cpu>,
    Prologue<Verify, S, HD, DQ, DKV, L, InklingConv>:
        Dispatch<Cuda, S, HD, DQ, DKV, L> + Dispatch<Cpu, S, HD, DQ, DKV, L>,
    Prologue<Extend, S, HD, DQ, DKV, L, InklingConv>:
        Dispatch<Cuda, S, HD, DQ, DKV, L> + Dispatch<Cpu, S, HD, DQ, DKV, L>,
    Prologue<Decode, S, HD, DQ, DKV, L, InklingConv>:
        Dispatch<Cuda, S, HD, DQ, DKV, L> + Dispatch<Cpu, S, HD, DQ, DKV, L>,
{
    let g = gpu();
    let mut rng = common::rng(geometry);
    for with_bad in [false, true] {
        for (name, shape) in shapes(with_bad) {
            for tau in [false, true] {
                let mut sc = Scenario::random(&mut rng, shape.clone(), HD, DQ, DKV, tau);
                if with_bad {
                    sc.inject_bad_indices();
                }
                let what = format!("{geometry} {name} tau={tau} bad={with_bad}");
                let (gpu_seen, cpu_seen) = match shape {
                    Shape::Verify { .. } => (run(&g, &verify, &sc), run(&Cpu, &verify, &sc)),
                    Shape::Extend { .. } => (run(&g, &extend, &sc), run(&Cpu, &extend, &sc)),
                    Shape::Decode { .. } => (run(&g, &decode, &sc), run(&Cpu, &decode, &sc)),
                };
                compare(&what, &gpu_seen, &cpu_seen);
                if with_bad {
                    assert!(
                        cpu_seen.bad_indices > 0,
                        "{what}: no bad index was injected"
                    );
                }
                eprintln!(
                    "ok: {what} (T = {}, bad indices {})",
                    sc.tokens, gpu_seen.bad_indices
                );
            }
        }
    }
}

macro_rules! geometry {
    ($test:ident, $store:ty, $hd:literal, $dq:literal, $dkv:literal, $row:ty) => {
        #[test]
        fn $test() {
            check::<$store, $hd, $dq, $dkv, $row>(
                stringify!($test),
                Prologue::<Verify, $store, $hd, $dq, $dkv, $row, InklingConv>::new(),
                Prologue::<Extend, $store, $hd, $dq, $dkv, $row, InklingConv>::new(),
                Prologue::<Decode, $store, $hd, $dq, $dkv, $row, InklingConv>::new(),
            );
        }
    };
}

// Inkling (docs/kernels/models.md §4.1): TP8 global / SWA, TP4 global, TP2 global, TP1 global (beyond sglang's limit).
geometry!(tp8_global_mxfp8, Mxfp8Store<128>, 128, 1024, 128, PackedRow<1024, 128, 128>);
geometry!(tp8_swa_mxfp8, Mxfp8Store<128>, 128, 1024, 256, PackedRow<1024, 256, 128>);
geometry!(tp4_global_mxfp8, Mxfp8Store<128>, 128, 2048, 256, PackedRow<2048, 256, 256>);
geometry!(tp2_global_mxfp8, Mxfp8Store<128>, 128, 4096, 512, PackedRow<4096, 512, 512>);
geometry!(tp1_global_mxfp8, Mxfp8Store<128>, 128, 8192, 1024, PackedRow<8192, 1024, 1024>);
geometry!(tp8_global_bf16, Bf16Store<128>, 128, 1024, 128, PackedRow<1024, 128, 128>);
geometry!(tp8_swa_bf16, Bf16Store<128>, 128, 1024, 256, PackedRow<1024, 256, 128>);
geometry!(tp8_global_unstored, NoStore, 128, 1024, 128, PackedRow<1024, 128, 128>);
// Head dims beyond the spec (bf16 store): a GPT-OSS-like head dim 64, and 256.
geometry!(head_dim_64_bf16, Bf16Store<128>, 64, 512, 64, PackedRow<512, 64, 128>);
geometry!(head_dim_256_bf16, Bf16Store<128>, 256, 2048, 256, PackedRow<2048, 256, 128>);
