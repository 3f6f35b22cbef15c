//! The CPU reference of the sparse MLA prefill against the spec's conventions (§3.3): empty
//! rows, invalid and duplicate indices, top-k lengths, the sink, and the boundary's ties.

mod common;

use common::sparse_mla::{MlaScenario, Variant, run};
use shapeproof::backend::Cpu;
use shapeproof::dtype::{F8E4M3, e4m3_to_f32};
use shapeproof::ops::sparse_mla::*;
use shapeproof::tensor::{Cols, Tensor};

const D: usize = 576;
const TOPK: usize = 128;
const HEADS: usize = 16;

fn scenario(seed_name: &str) -> MlaScenario {
    let mut rng = common::rng(seed_name);
    MlaScenario::random(&mut rng, 8, 300, HEADS, D, TOPK, 0.5, 0.1)
}

#[test]
fn empty_rows_give_zero_minus_inf_plus_inf() {
    let sc = scenario("empty_rows");
    let seen = run::<Cpu, D, 64, TOPK, HEADS>(&Cpu, &sc, Variant::Plain, HeadTiling::Fastest);
    // Row 1 holds only -1: empty.
    for h in 0..HEADS {
        assert_eq!(seen.max_logits[HEADS + h], f32::NEG_INFINITY);
        assert_eq!(seen.lse[HEADS + h], f32::INFINITY);
    }
    assert!(
        seen.out[HEADS * 512..2 * HEADS * 512]
            .iter()
            .all(|v| v.to_f32() == 0.0)
    );
    // A zero top-k length (row 3) is empty too.
    let seen = run::<Cpu, D, 64, TOPK, HEADS>(&Cpu, &sc, Variant::Length, HeadTiling::Fastest);
    assert_eq!(seen.max_logits[3 * HEADS], f32::NEG_INFINITY);
}

/// Out-of-range indices are dropped, duplicates count twice: the plain result of a row equals
/// the result computed by hand from its valid indices.
#[test]
fn invalid_indices_are_masked_and_duplicates_count() {
    let sc = scenario("invalid_and_duplicates");
    let seen = run::<Cpu, D, 64, TOPK, HEADS>(&Cpu, &sc, Variant::Plain, HeadTiling::Fastest);
    let dec = |v: &F8E4M3| e4m3_to_f32(*v) as f64;
    let (i, h) = (0, 5);
    let q = &sc.q[(i * HEADS + h) * D..(i * HEADS + h + 1) * D];
    let rows: Vec<usize> = sc.indices[..TOPK]
        .iter()
        .filter(|&&x| x >= 0 && (x as usize) < sc.s_kv)
        .map(|&x| x as usize)
        .collect();
    assert!(rows.len() < TOPK, "the scenario plants invalid indices");
    let scale = (sc.sm_scale * sc.q_scale * sc.kv_scale) as f64;
    let scores: Vec<f64> = rows
        .iter()
        .map(|&r| {
            scale
                * q.iter()
                    .zip(&sc.kv[r * D..(r + 1) * D])
                    .map(|(a, b)| dec(a) * dec(b))
                    .sum::<f64>()
        })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
    assert!((seen.max_logits[i * HEADS + h] as f64 - m).abs() < 1e-4);
    assert!((seen.lse[i * HEADS + h] as f64 - (m + z.ln())).abs() < 1e-4);
    let out0: f64 = rows
        .iter()
        .zip(&scores)
        .map(|(&r, s)| (s - m).exp() * dec(&sc.kv[r * D]))
        .sum::<f64>()
        * sc.kv_scale as f64
        / z;
    let got = seen.out[(i * HEADS + h) * 512].to_f64();
    assert!(
        (got - out0).abs() <= 1e-2 * out0.abs().max(1e-3),
        "{got} vs {out0}"
    );
}

/// The sink changes the output's denominator only: lse and max_logits stay, +inf zeroes the
/// output, -inf changes nothing.
#[test]
fn sink_scales_the_output_only() {
    let sc = scenario("sink");
    let with_length =
        run::<Cpu, D, 64, TOPK, HEADS>(&Cpu, &sc, Variant::Length, HeadTiling::Fastest);
    let with_sink =
        run::<Cpu, D, 64, TOPK, HEADS>(&Cpu, &sc, Variant::LengthAndSink, HeadTiling::Fastest);
    assert_eq!(with_length.lse, with_sink.lse);
    assert_eq!(with_length.max_logits, with_sink.max_logits);
    for i in 0..sc.s_q {
        let row = |o: &Vec<shapeproof::dtype::bf16>, h: usize| {
            o[(i * HEADS + h) * 512..(i * HEADS + h + 1) * 512].to_vec()
        };
        assert!(
            row(&with_sink.out, 1).iter().all(|v| v.to_f32() == 0.0),
            "+inf sink zeroes the output"
        );
        assert_eq!(
            row(&with_sink.out, 2),
            row(&with_length.out, 2),
            "-inf sink changes nothing"
        );
    }
}

#[test]
fn indices_must_have_one_row_per_query() {
    let b = Cpu;
    let q = Tensor::<Cpu, F8E4M3, QRow<HEADS, D>>::zeros(&b, 4).unwrap();
    let indices = Tensor::<Cpu, i32, Cols<TOPK>>::zeros(&b, 3).unwrap();
    let scale = Tensor::from_host(&b, "q_scale", &[1.0f32], 1).unwrap();
    let e = SparseMlaInputs::new(q, scale, indices, 0.1).err().unwrap();
    assert_eq!(
        e.to_string(),
        "`indices`: expected 4 query rows (as q), got 3"
    );
}
