//! The CPU reference of the sparse MLA prefill against the conventions of docs/kernels/sparse_mla.md §3.3: empty
//! rows, invalid and duplicate indices, top-k lengths, the sink, and the boundary's ties.

mod common;

use common::sparse_mla::{MlaScenario, Variant, run};
use rand::Rng;
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

shapeproof::model! {
    /// A model whose top-k (100) is not a multiple of 128: `TOPK` is padded to 128.
    mod topk_100 {
        num_attention_heads: 16, kv_lora_rank: 512, qk_rope_head_dim: 64,
        index_topk: 100, tensor_parallel: 1,
    }
}

/// Rows of the model's own top-k width are padded with -1 to `TOPK`; a buffer of the padded
/// width passed where the model's width is expected (or any other length) names both widths,
/// and the plain tensor constructor shows the row width it got.
#[test]
fn padded_topk_rows_say_how_they_were_padded() {
    let b = Cpu;
    assert_eq!((topk_100::INDEX_TOPK, topk_100::TOPK), (100, 128));
    let mut rng = common::rng("padded_topk");
    let host: Vec<i32> = (0..2 * 100).map(|_| rng.random_range(0..300)).collect(); // [2, 100]
    let padded = topk_100::indices_from_host(&b, &host, 2)
        .unwrap()
        .to_host(&b)
        .unwrap();
    for (row, given) in padded.chunks(128).zip(host.chunks(100)) {
        assert_eq!(&row[..100], given);
        assert!(row[100..].iter().all(|&i| i == -1));
    }

    let e = topk_100::indices_from_host(&b, &vec![0; 256], 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`indices`: expected 2 rows of index_topk = 100 = 200 elements (padded here with -1 to TOPK = 128), got 256 elements"
    );
    let e = Tensor::<Cpu, i32, Cols<{ topk_100::TOPK }>>::from_host(&b, "indices", &host, 2)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "`indices`: expected 2 rows of 128 = 256 elements, got 200 (2 rows of 100)"
    );
    // The padded tensor is what the model's prefill takes.
    let q = Tensor::<Cpu, F8E4M3, QRow<{ topk_100::HQ_PADDED }, D>>::zeros(&b, 2).unwrap();
    let scale = Tensor::from_host(&b, "q_scale", &[1.0f32], 1).unwrap();
    let indices = topk_100::indices_from_host(&b, &host, 2).unwrap();
    assert!(SparseMlaInputs::new(q, scale, indices, 0.1).is_ok());
}
