//! The sparse MLA decode's CPU reference (docs/kernels/mla_cache.md §8.5) and its split plan:
//! the reference agrees with the sparse MLA prefill's reference on the gathered workspace where
//! the gather is exact (the two families' semantics meet), a single slot gives back its value
//! row, padding, slots past the cache and zero lengths are no keys (an empty row is `out = 0`,
//! `lse = +inf`), a repeated slot counts twice, and extents that disagree are an `Err` naming
//! the parameter; the split of the top-k over CTAs covers every block once. The step through the
//! prefill (`DecodeThroughPrefill`) is the decode where its e4m3 casts are exact, lengths and
//! bad slots included.

mod common;

use common::boundary::names;
use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::backend::Cpu;
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32, e4m3_to_f32};
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM, MlaLatentKv, mla_fp8_decode_row};
use shapeproof::ops::mla_cache::{MlaCacheGather, MlaCacheStore, MlaKvRows};
use shapeproof::ops::sparse_mla::{OutRow, SparseMlaInputs, SparseMlaPrefill};
use shapeproof::ops::sparse_mla_decode::{
    DecodeQueries, DecodeThroughPrefill, DecodeWorkspace, PrefillDecodeWorkspace, SparseMlaDecode,
};
use shapeproof::tensor::{Cols, Tensor};

const H: usize = 16;
const TOPK: usize = 128;
const SM_SCALE: f32 = 2e-4;

/// A random e4m3 value (never NaN), as an f32.
fn e4m3_value(rng: &mut StdRng) -> f32 {
    let b: u8 = rng.random();
    e4m3_to_f32(F8E4M3::from_bits(if b & 0x7f == 0x7f { b ^ 1 } else { b }))
}

/// Queries of `rows` rows whose every value is e4m3-exact (random e4m3 values / 64, kept exact
/// through the e4m3 cast), so a cast of q to e4m3 changes nothing.
fn exact_queries(rng: &mut StdRng, rows: usize) -> Vec<bf16> {
    (0..rows * H * MLA_CACHE_DIM)
        .map(|_| bf16::from_f32(e4m3_to_f32(e4m3_from_f32(e4m3_value(rng) / 64.0))))
        .collect()
}

/// A cache of `pages` pages holding rows whose every value is an e4m3 value and whose every
/// latent group has 448 as its largest magnitude, so the group scale is exactly 1 and both the
/// store and the gather are exact.
fn exact_cache(rng: &mut StdRng, pages: usize) -> (DeepSeekV32KvCache<Cpu>, Vec<bf16>) {
    let slots = pages * 64;
    let mut rows: Vec<bf16> = (0..slots * MLA_CACHE_DIM)
        .map(|_| bf16::from_f32(e4m3_value(rng)))
        .collect();
    for s in 0..slots {
        for g in 0..4 {
            rows[s * MLA_CACHE_DIM + g * 128 + rng.random_range(0..128)] = bf16::from_f32(448.0);
        }
    }
    (store(&rows, (0..slots as i64).collect(), pages), rows)
}

fn store(rows: &[bf16], loc: Vec<i64>, pages: usize) -> DeepSeekV32KvCache<Cpu> {
    let mut cache = DeepSeekV32KvCache::<Cpu>::zeros(&Cpu, pages).unwrap();
    let n = loc.len();
    let rows = MlaKvRows::new(
        Tensor::from_host(&Cpu, "kv", rows, n).unwrap(),
        Tensor::from_host(&Cpu, "loc", &loc, n).unwrap(),
    )
    .unwrap();
    MlaCacheStore::<64, 128>::new()
        .run(&Cpu, &rows, &mut cache, None)
        .unwrap();
    cache
}

/// The queries of a step: `q` `[rows, H, 576]`, `indices` `[rows, TOPK]`, optional lengths.
fn queries(q: &[bf16], indices: &[i32], lengths: Option<&[i32]>) -> DecodeQueries<Cpu, H, TOPK> {
    let rows = indices.len() / TOPK;
    let queries = DecodeQueries::new(
        Tensor::from_host(&Cpu, "q", q, rows).unwrap(),
        Tensor::from_host(&Cpu, "indices", indices, rows).unwrap(),
        SM_SCALE,
    )
    .unwrap();
    match lengths {
        Some(l) => queries
            .with_lengths(Tensor::from_host(&Cpu, "lengths", l, rows).unwrap())
            .unwrap(),
        None => queries,
    }
}

/// Output tensors of `rows` rows, poisoned (NaN) before a run.
fn poisoned(rows: usize) -> (Tensor<Cpu, bf16, OutRow<H>>, Tensor<Cpu, f32, Cols<H>>) {
    (
        Tensor::filled(&Cpu, rows, bf16::NAN).unwrap(),
        Tensor::filled(&Cpu, rows, f32::NAN).unwrap(),
    )
}

/// Runs the decode; returns `out` (as f32) and `lse`.
fn decode(
    cache: &DeepSeekV32KvCache<Cpu>,
    q: &[bf16],
    indices: &[i32],
    lengths: Option<&[i32]>,
) -> (Vec<f32>, Vec<f32>) {
    let rows = indices.len() / TOPK;
    let queries = queries(q, indices, lengths);
    let (mut out, mut lse) = poisoned(rows);
    let mut ws = DecodeWorkspace::new(&Cpu, rows).unwrap();
    SparseMlaDecode::<H, TOPK>::new()
        .run(&Cpu, &queries, cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    let out = out.into_buffer().iter().map(|v| v.to_f32()).collect();
    (out, lse.into_buffer())
}

#[test]
fn the_decode_agrees_with_the_prefill_on_an_exact_gather() {
    let mut rng = common::rng("the_decode_agrees_with_the_prefill_on_an_exact_gather");
    let pages = 6;
    let slots = pages * 64;
    let (cache, _) = exact_cache(&mut rng, pages);
    let rows = 9;
    let q = exact_queries(&mut rng, rows);
    let indices: Vec<i32> = (0..rows * TOPK)
        .map(|_| match rng.random_range(0..10) {
            0 => -1,
            _ => rng.random_range(0..slots as i32),
        })
        .collect();
    let (out, lse) = decode(&cache, &q, &indices, None);

    // The prefill over the whole cache gathered in slot order: workspace row = slot.
    let index =
        Tensor::from_host(&Cpu, "index", &(0..slots as i32).collect::<Vec<_>>(), slots).unwrap();
    let mut kv =
        MlaLatentKv::<Cpu, 576>::new(&Cpu, vec![F8E4M3::default(); slots * 576], slots, 0.0)
            .unwrap();
    MlaCacheGather::<64, 128>::new()
        .run(&Cpu, &cache, &index, &mut kv, None)
        .unwrap();
    let q8: Vec<F8E4M3> = q.iter().map(|v| e4m3_from_f32(v.to_f32())).collect();
    assert!(
        q8.iter()
            .zip(&q)
            .all(|(a, b)| e4m3_to_f32(*a) == b.to_f32()),
        "q is e4m3-exact"
    );
    let inputs = SparseMlaInputs::new(
        Tensor::from_host(&Cpu, "q", &q8, rows).unwrap(),
        Tensor::from_host(&Cpu, "q_scale", &[1.0f32], 1).unwrap(),
        Tensor::from_host(&Cpu, "indices", &indices, rows).unwrap(),
        SM_SCALE,
    )
    .unwrap();
    let mut p_out = Tensor::filled(&Cpu, rows, bf16::NAN).unwrap();
    let mut p_max = Tensor::filled(&Cpu, rows, f32::NAN).unwrap();
    let mut p_lse = Tensor::filled(&Cpu, rows, f32::NAN).unwrap();
    SparseMlaPrefill::<576, H, TOPK>::new()
        .run(&Cpu, &inputs, &kv, &mut p_out, &mut p_max, &mut p_lse)
        .unwrap();
    // The prefill sums each score in f32, the decode in f64: lse within 1e-4, out within a
    // bf16 step (2^-8 relative) of values up to 448.
    for (i, (a, b)) in lse.iter().zip(p_lse.buffer()).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs().max(1.0),
            "lse {i}: {a} vs {b}"
        );
    }
    for (i, (a, b)) in out.iter().zip(p_out.buffer()).enumerate() {
        let b = b.to_f32();
        assert!(
            (a - b).abs() <= b.abs() / 128.0 + 1e-3,
            "out {i}: {a} vs {b}"
        );
    }
}

#[test]
fn one_slot_gives_back_its_value_row() {
    let mut rng = common::rng("one_slot_gives_back_its_value_row");
    let rows: Vec<bf16> = common::bf16_normal(&mut rng, 64 * MLA_CACHE_DIM, 0.0, 1.0);
    let cache = store(&rows, (0..64).collect(), 1);
    let q = common::bf16_normal(&mut rng, H * MLA_CACHE_DIM, 0.0, 1.0);
    let mut indices = vec![-1; TOPK];
    indices[77] = 5;
    let (out, lse) = decode(&cache, &q, &indices, None);
    let bytes = cache.bytes().buffer()[5 * 656..6 * 656].try_into().unwrap();
    let k = mla_fp8_decode_row(bytes);
    for h in 0..H {
        let qh = &q[h * MLA_CACHE_DIM..(h + 1) * MLA_CACHE_DIM];
        let s: f64 = qh.iter().zip(&k).map(|(a, &b)| a.to_f64() * b as f64).sum();
        assert_eq!(
            lse[h],
            (SM_SCALE as f64 * s) as f32,
            "head {h}: lse is the one score"
        );
        for d in 0..512 {
            assert_eq!(
                out[h * 512 + d],
                bf16::from_f32(k[d]).to_f32(),
                "head {h} dim {d}"
            );
        }
    }
}

#[test]
fn rows_without_a_valid_slot_are_empty() {
    let mut rng = common::rng("rows_without_a_valid_slot_are_empty");
    let rows = common::bf16_normal(&mut rng, 64 * MLA_CACHE_DIM, 0.0, 1.0);
    let cache = store(&rows, (0..64).collect(), 1);
    let q = common::bf16_normal(&mut rng, 3 * H * MLA_CACHE_DIM, 0.0, 1.0);
    // Row 0: padding and slots past the cache; row 1: valid slots behind a zero length; row 2:
    // one valid slot inside its length.
    let mut indices = vec![-1; 3 * TOPK];
    indices[3] = 64;
    indices[4] = i32::MAX;
    indices[TOPK] = 7;
    indices[2 * TOPK + 1] = 9;
    let (out, lse) = decode(&cache, &q, &indices, Some(&[TOPK as i32, 0, 2]));
    for r in 0..2 {
        assert!(
            lse[r * H..(r + 1) * H].iter().all(|&l| l == f32::INFINITY),
            "row {r}"
        );
        assert!(
            out[r * H * 512..(r + 1) * H * 512]
                .iter()
                .all(|&v| v == 0.0),
            "row {r}"
        );
    }
    assert!(lse[2 * H..].iter().all(|l| l.is_finite()));
}

#[test]
fn a_repeated_slot_counts_twice() {
    let mut rng = common::rng("a_repeated_slot_counts_twice");
    let rows = common::bf16_normal(&mut rng, 64 * MLA_CACHE_DIM, 0.0, 1.0);
    let cache = store(&rows, (0..64).collect(), 1);
    let q = common::bf16_normal(&mut rng, H * MLA_CACHE_DIM, 0.0, 1.0);
    let one = |slots: &[i32]| {
        let mut indices = vec![-1; TOPK];
        indices[..slots.len()].copy_from_slice(slots);
        decode(&cache, &q, &indices, None)
    };
    let (_, once) = one(&[3]);
    let (_, twice) = one(&[3, 3]);
    for h in 0..H {
        let want = once[h] as f64 + 2f64.ln();
        assert!(
            (twice[h] as f64 - want).abs() < 1e-5,
            "head {h}: {} vs {want}",
            twice[h]
        );
    }
}

#[test]
fn bad_extents_name_the_parameter() {
    let q = Tensor::<Cpu, bf16, _>::zeros(&Cpu, 2).unwrap();
    names(
        DecodeQueries::<Cpu, H, TOPK>::new(q, Tensor::zeros(&Cpu, 3).unwrap(), 1.0),
        "indices",
    );
    let queries = DecodeQueries::<Cpu, H, TOPK>::new(
        Tensor::zeros(&Cpu, 2).unwrap(),
        Tensor::zeros(&Cpu, 2).unwrap(),
        1.0,
    )
    .unwrap();
    let cache = DeepSeekV32KvCache::<Cpu>::zeros(&Cpu, 1).unwrap();
    let decode = SparseMlaDecode::<H, TOPK>::new();
    let mut ws = DecodeWorkspace::new(&Cpu, 2).unwrap();
    let (mut out, mut lse) = (
        Tensor::zeros(&Cpu, 1).unwrap(),
        Tensor::zeros(&Cpu, 2).unwrap(),
    );
    names(
        decode.run(&Cpu, &queries, &cache, &mut ws, &mut out, &mut lse),
        "out",
    );
    let mut out = Tensor::zeros(&Cpu, 2).unwrap();
    let mut lse = Tensor::zeros(&Cpu, 3).unwrap();
    names(
        decode.run(&Cpu, &queries, &cache, &mut ws, &mut out, &mut lse),
        "lse",
    );
    // A workspace made for another row count.
    let mut lse = Tensor::zeros(&Cpu, 2).unwrap();
    let mut other = DecodeWorkspace::new(&Cpu, 3).unwrap();
    names(
        decode.run(&Cpu, &queries, &cache, &mut other, &mut out, &mut lse),
        "workspace",
    );
    // The workspace takes the queries' row rule (rows × H_Q within i32) on every backend.
    names(
        DecodeWorkspace::<Cpu, 16, 128>::new(&Cpu, i32::MAX as usize / 16 + 1),
        "rows",
    );
    names(
        DecodeWorkspace::<Cpu, 16, 128>::new(&Cpu, usize::MAX),
        "rows",
    );
    names(
        queries.with_lengths(Tensor::zeros(&Cpu, 1).unwrap()),
        "lengths",
    );
}

#[test]
fn the_top_k_split_covers_every_block_once() {
    use shapeproof::ops::sparse_mla_decode::decode_splits;
    for (rows, heads, topk) in [
        (1, 16, 2048),
        (1, 128, 2048),
        (8, 16, 2048),
        (256, 128, 2048),
        (3, 8, 128),
        (300, 8, 2048),
        (1, 16, 4096),
        (1, 8, 8192),
        (2, 128, 8192),
    ] {
        let blocks = topk / 64;
        let (splits, per_split) = decode_splits(rows, heads, topk);
        assert!(splits >= 1 && per_split >= 1, "{rows} {heads} {topk}");
        // Every block in exactly one split: the splits cover the blocks and none is empty.
        assert!(splits * per_split >= blocks && (splits - 1) * per_split < blocks);
        // The combine merges at most 32 splits of a row.
        assert!(splits <= 32, "{rows} {heads} {topk}: {splits} splits");
        let ctas = rows * heads.div_ceil(16);
        if ctas >= 264 {
            assert_eq!(splits, 1, "a batch that fills the GPU is not split");
        }
    }
    // One row of 16 heads: every 64-position block its own CTA.
    assert_eq!(decode_splits(1, 16, 2048), (32, 1));
    // Any row count plans without overflow: a batch that large is one split.
    assert_eq!(decode_splits(usize::MAX, 128, 2048), (1, 32));
}

/// Runs the decode through the prefill; returns `out` (as f32) and `lse`.
fn decode_through_prefill(
    cache: &DeepSeekV32KvCache<Cpu>,
    q: &[bf16],
    indices: &[i32],
    lengths: Option<&[i32]>,
) -> (Vec<f32>, Vec<f32>) {
    let rows = indices.len() / TOPK;
    let queries = queries(q, indices, lengths);
    let (mut out, mut lse) = poisoned(rows);
    let mut ws = PrefillDecodeWorkspace::new(&Cpu, rows).unwrap();
    DecodeThroughPrefill::<H, TOPK>::new()
        .run(&Cpu, &queries, cache, &mut ws, &mut out, &mut lse)
        .unwrap();
    let out = out.into_buffer().iter().map(|v| v.to_f32()).collect();
    (out, lse.into_buffer())
}

#[test]
fn the_step_through_the_prefill_is_the_decode_where_e4m3_is_exact() {
    let mut rng = common::rng("the_step_through_the_prefill_is_the_decode_where_e4m3_is_exact");
    let pages = 5;
    let slots = pages * 64;
    // Every cached value (RoPE included) and every q value e4m3-exact, the group scales 1:
    // the route's casts change nothing, so it is the decode up to the prefill's f32 sums.
    let (cache, _) = exact_cache(&mut rng, pages);
    let rows = 10;
    let q = exact_queries(&mut rng, rows);
    let indices: Vec<i32> = (0..rows * TOPK)
        .map(|_| match rng.random_range(0..12) {
            0 => -1,
            1 => slots as i32 + rng.random_range(0..9), // past the cache: no key
            _ => rng.random_range(0..slots as i32),
        })
        .collect();
    // Full, clamped, short, empty and negative lengths.
    let lengths: Vec<i32> = (0..rows as i32)
        .map(|r| match r % 5 {
            0 => TOPK as i32,
            1 => TOPK as i32 + 40,
            2 => rng.random_range(1..TOPK as i32),
            3 => 0,
            _ => -3,
        })
        .collect();
    let (out, lse) = decode(&cache, &q, &indices, Some(&lengths));
    let (p_out, p_lse) = decode_through_prefill(&cache, &q, &indices, Some(&lengths));
    for (i, (a, b)) in lse.iter().zip(&p_lse).enumerate() {
        if a.is_infinite() {
            assert_eq!(a, b, "lse {i} of an empty row");
            continue;
        }
        assert!(
            (a - b).abs() <= 1e-4 * b.abs().max(1.0),
            "lse {i}: {a} vs {b}"
        );
    }
    for (i, (a, b)) in out.iter().zip(&p_out).enumerate() {
        assert!(
            (a - b).abs() <= b.abs() / 128.0 + 1e-3,
            "out {i}: {a} vs {b}"
        );
    }
    // Rows 3 and 4 (lengths 0 and -3) are empty: out 0, lse +inf.
    for r in [3, 4] {
        assert!(
            p_lse[r * H..(r + 1) * H]
                .iter()
                .all(|&l| l == f32::INFINITY)
        );
        assert!(
            p_out[r * H * 512..(r + 1) * H * 512]
                .iter()
                .all(|&v| v == 0.0)
        );
    }
}

#[test]
fn the_step_through_the_prefill_names_a_workspace_of_another_row_count() {
    let mut rng = common::rng("the_step_through_the_prefill_names_a_workspace");
    let (cache, _) = exact_cache(&mut rng, 1);
    let queries = DecodeQueries::new(
        Tensor::from_host(&Cpu, "q", &vec![bf16::ZERO; 3 * H * MLA_CACHE_DIM], 3).unwrap(),
        Tensor::from_host(&Cpu, "indices", &vec![0i32; 3 * TOPK], 3).unwrap(),
        SM_SCALE,
    )
    .unwrap();
    let mut out = Tensor::zeros(&Cpu, 3).unwrap();
    let mut lse = Tensor::zeros(&Cpu, 3).unwrap();
    let mut ws = PrefillDecodeWorkspace::<Cpu, H, TOPK>::new(&Cpu, 2).unwrap();
    let err = DecodeThroughPrefill::<H, TOPK>::new()
        .run(&Cpu, &queries, &cache, &mut ws, &mut out, &mut lse)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("workspace") && err.contains('3') && err.contains('2'),
        "{err}"
    );
}

#[test]
fn a_workspace_past_i32_positions_is_refused() {
    // rows × TOPK past i32::MAX: refused before anything is allocated.
    let rows = (i32::MAX as usize / 2048) + 1;
    let err = match PrefillDecodeWorkspace::<Cpu, H, 2048>::new(&Cpu, rows) {
        Ok(_) => panic!("a workspace of {rows} rows × 2048 positions was made"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("rows") && err.contains(&rows.to_string()),
        "{err}"
    );
}

shapeproof::model! {
    /// DeepSeek V3.2 on 2 ranks: 64 heads a rank, where the step through the prefill pays.
    mod deepseek_v32_tp2 {
        config: "examples/models/deepseek_v32.json",
        tensor_parallel: 2,
    }
}

/// `model!` derives both decode routes from the config: the decode and the step through the
/// prefill, with the rank's heads unpadded and the config's top-k.
#[test]
fn the_model_derives_both_decode_routes() {
    use deepseek_v32_tp2 as ds;
    assert_eq!((ds::HQ, ds::TOPK), (64, 2048));
    let _: SparseMlaDecode<64, 2048> = ds::Decode::new();
    let _: DecodeThroughPrefill<64, 2048> = ds::DecodeThroughPrefill::new();
}

/// The paged prefill's rule for re-casting a latent byte in f16 (`scale_exact_in_f16` in
/// kernels/sparse_mla_prefill.cu): for every scale it admits, every e4m3 byte comes out of the
/// f16 arithmetic (`cvt` e4m3x2→f16x2, the scale rounded to f16, one f16 multiply,
/// `cvt.satfinite` back) as the cache gather's f32 arithmetic writes it. Checked exhaustively
/// over the bytes for every power of two from 2^-149 to 2^127, zero, subnormals, infinities and
/// NaN, on the host: the f32 product of two f16 values is exact, so rounding it to f16 is the
/// f16 multiply. Two scales outside the rule (2^16, and one that is not a power of two) differ
/// for some byte: the rule is what keeps the fast path exact.
#[test]
fn the_paged_prefills_f16_rescale_is_the_gathers_value_wherever_it_is_taken() {
    use half::f16;
    // The kernel's predicate, as written there.
    fn scale_exact_in_f16(scale: f32) -> bool {
        let bits = scale.to_bits();
        let e = (bits >> 23) & 0xff;
        e == 0 || e == 0xff || ((bits & 0x7f_ffff) == 0 && e <= 127 + 15)
    }
    let through_f16 = |byte: u8, scale: f32| {
        let x = f16::from_f32(e4m3_to_f32(F8E4M3::from_bits(byte)));
        let s = f16::from_f32(scale);
        e4m3_from_f32(f16::from_f32(x.to_f32() * s.to_f32()).to_f32()).to_bits()
    };
    let through_f32 = |byte: u8, scale: f32| {
        e4m3_from_f32(e4m3_to_f32(F8E4M3::from_bits(byte)) * scale).to_bits()
    };
    let mut scales: Vec<f32> = (-149..=127).map(|e| 2f32.powi(e)).collect();
    scales.extend([
        0.0,
        -0.0,
        f32::from_bits(1),
        f32::from_bits(0x0040_0001),
        f32::INFINITY,
        f32::NAN,
    ]);
    let mut checked = 0;
    for &scale in &scales {
        if !scale_exact_in_f16(scale) {
            continue;
        }
        for byte in 0..=255u8 {
            assert_eq!(
                through_f16(byte, scale),
                through_f32(byte, scale),
                "byte {byte:#04x} times {scale:e}"
            );
        }
        checked += 1;
    }
    assert!(checked > 150, "{checked} scales admitted");
    // 1.0625 + 2^-20: f16 rounds it to 1.0625, so 1.0 times it lands on the midpoint between
    // 1.0 and 1.125 (rounding to 1.0) instead of just above it (1.125).
    for scale in [2f32.powi(16), 1.0625 + 2f32.powi(-20)] {
        assert!(!scale_exact_in_f16(scale));
        assert!(
            (0..=255u8).any(|b| through_f16(b, scale) != through_f32(b, scale)),
            "{scale:e} outside the rule differs for some byte"
        );
    }
}
