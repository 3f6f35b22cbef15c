//! The CPU reference of the prologue against the spec: its worked example, the equivalences
//! between variants, an independent formulation of the conv and of the windows, the store's
//! placement, and the boundary's errors.

mod common;

use common::prologue::{Observed, PAGE, Scenario, Shape, TestStore, W, run};
use shapeproof::backend::Cpu;
use shapeproof::dtype::{E8M0, bf16, mxfp8_encode_block};
use shapeproof::layout::scale_plane_offset;
use shapeproof::ops::prologue::*;
use shapeproof::tensor::Tensor;

type Row = PackedRow<1024, 256, 128>; // Inkling TP8 SWA: HQ 8, HKV 2
const HISTORY: usize = W - 1;

fn swa_mxfp8<V: Variant>() -> Mxfp8Prologue<V, 1024, 256, Row, InklingConv, PAGE> {
    Mxfp8Prologue::new()
}

/// docs/kernels/prologue.md §1.7's worked example through the whole prologue: q = 128 ones, gamma 1.5, tau of
/// positions 127 999, 255 999 and 1 048 575 -> (scale, byte) 0x77/0x7C, 0x77/0x7D, 0x78/0x76.
#[test]
fn spec_worked_example_bytes() {
    let mut rng = common::rng("spec_worked_example_bytes");
    let mut sc = Scenario::random(
        &mut rng,
        Shape::Decode {
            tokens: 3,
            track: false,
        },
        128,
        1024,
        256,
        true,
    );
    for t in 0..3 {
        sc.qkvr[t * sc.row..t * sc.row + 1024].fill(bf16::ONE);
    }
    sc.q_gamma = vec![bf16::from_f32(1.5); 128];
    sc.tau = Some(
        [127_999u64, 255_999, 1_048_575]
            .map(|pos| log_scaling_tau(pos, 128_000.0, 0.1))
            .to_vec(),
    );
    let seen = run(&Cpu, &swa_mxfp8::<Decode>(), &sc);
    for (t, (scale, byte)) in [(0x77u8, 0x7Cu16), (0x77, 0x7D), (0x78, 0x76)]
        .into_iter()
        .enumerate()
    {
        assert!(
            seen.q[t * 1024..(t + 1) * 1024].iter().all(|&b| b == byte),
            "token {t}"
        );
        assert!(
            seen.q_scales[t * 32..(t + 1) * 32]
                .iter()
                .all(|&s| s == scale),
            "token {t}"
        );
    }
}

/// MXFP8 bytes equal "bf16 prologue, then the encoder": the same call with the bf16 store
/// gives q/k/v whose encoding is exactly what the MXFP8 store wrote, at the offsets of docs/kernels/prologue.md §1.8.
#[test]
fn mxfp8_store_is_bf16_then_encoder() {
    let mut rng = common::rng("mxfp8_store_is_bf16_then_encoder");
    let sc = Scenario::random(
        &mut rng,
        Shape::Verify {
            seqs: 5,
            draft_tokens: 4,
        },
        128,
        1024,
        256,
        true,
    );
    let mx = run(&Cpu, &swa_mxfp8::<Verify>(), &sc);
    let bf = run(
        &Cpu,
        &Bf16Prologue::<Verify, 128, 1024, 256, Row, InklingConv, PAGE>::new(),
        &sc,
    );
    assert_eq!(mx.k_out, bf.k_out);
    assert_eq!(mx.v_out, bf.v_out);
    for t in 0..sc.tokens {
        for c0 in (0..1024).step_by(32) {
            let block: [f32; 32] =
                std::array::from_fn(|i| bf16::from_bits(bf.q[t * 1024 + c0 + i]).to_f32());
            let (scale, q) = mxfp8_encode_block(&block);
            assert_eq!(mx.q_scales[t * 32 + c0 / 32], scale.0);
            for (got, want) in mx.q[t * 1024 + c0..t * 1024 + c0 + 32].iter().zip(q) {
                assert_eq!(*got, want.to_bits() as u16);
            }
        }
    }
    check_store(&sc, &mx);
}

/// K/V rows at every `loc` slot encode k_out/v_out; every other byte of the pool and of the
/// scale planes is the poison the pool started with.
fn check_store(sc: &Scenario, seen: &Observed) {
    let (dkv, hkv) = (256, 2);
    let slots = sc.pages * PAGE;
    let n = slots * dkv;
    let plane = sc.pages * hkv * PAGE * 4;
    let mut expect_k = sc.kv_poison[..n].to_vec();
    let mut expect_v = sc.kv_poison[n..2 * n].to_vec();
    let mut expect_sfk = sc.kv_poison[2 * n..2 * n + plane].to_vec();
    let mut expect_sfv = sc.kv_poison[2 * n + plane..2 * n + 2 * plane].to_vec();
    for (t, &l) in sc.loc.iter().enumerate() {
        if l < 0 {
            continue;
        }
        let slot = l as usize;
        for (rows, data, planes) in [
            (&seen.k_out, &mut expect_k, &mut expect_sfk),
            (&seen.v_out, &mut expect_v, &mut expect_sfv),
        ] {
            for c0 in (0..dkv).step_by(32) {
                let block: [f32; 32] = std::array::from_fn(|i| rows[t * dkv + c0 + i].to_f32());
                let (scale, q) = mxfp8_encode_block(&block);
                for (d, v) in data[slot * dkv + c0..slot * dkv + c0 + 32]
                    .iter_mut()
                    .zip(q)
                {
                    *d = v.to_bits();
                }
                planes[scale_plane_offset(slot, c0, PAGE, hkv)] = scale.0;
            }
        }
    }
    assert!(seen.kv_k == expect_k, "K pool differs from loc-only writes");
    assert!(seen.kv_v == expect_v, "V pool differs from loc-only writes");
    assert!(
        seen.sfk == expect_sfk,
        "K scale plane differs from loc-only writes"
    );
    assert!(
        seen.sfv == expect_sfv,
        "V scale plane differs from loc-only writes"
    );
}

/// Extend over sequences of equal length `q` computes what verify computes.
#[test]
fn extend_of_uniform_lengths_equals_verify() {
    let mut rng = common::rng("extend_of_uniform_lengths_equals_verify");
    let verify = Scenario::random(
        &mut rng,
        Shape::Verify {
            seqs: 4,
            draft_tokens: 3,
        },
        128,
        1024,
        256,
        false,
    );
    let mut extend = verify.clone();
    extend.shape = Shape::Extend {
        lens: vec![3; 4],
        track: false,
        update: false,
    };
    extend.cu_seqlens = (0..=4).map(|s| 3 * s as i64).collect();
    extend.seq_of_token = (0..12).map(|t| t / 3).collect();
    // Extend gates history by cache_mask alone; verify by mask and slot validity. Padding
    // sequences never read history in either.
    let a = run(&Cpu, &swa_mxfp8::<Verify>(), &verify);
    let b = run(&Cpu, &swa_mxfp8::<Extend>(), &extend);
    assert_eq!(
        (a.q, a.q_scales, a.k_out, a.v_out),
        (b.q, b.q_scales, b.k_out, b.v_out)
    );
    assert_eq!((a.kv_k, a.sfk), (b.kv_k, b.sfk));
}

/// The conv and RMSNorm against an independent formulation in f64: each sequence's inputs
/// prefixed by its K cached rows (zeros without history), convolved; v compared within bf16
/// rounding, k through its norm.
#[test]
fn conv_matches_prefixed_sequence_formulation() {
    let mut rng = common::rng("conv_matches_prefixed_sequence_formulation");
    let sc = Scenario::random(
        &mut rng,
        Shape::Extend {
            lens: vec![1, 5, 2, 0, 7],
            track: false,
            update: false,
        },
        128,
        1024,
        256,
        false,
    );
    let seen = run(&Cpu, &swa_mxfp8::<Extend>(), &sc);
    let dkv = 256;
    for s in 0..sc.seqs {
        let (bos, eos) = (sc.cu_seqlens[s] as usize, sc.cu_seqlens[s + 1] as usize);
        let slot = sc.cache_indices[s];
        let gate = slot >= 0 && sc.cache_mask[s] != 0;
        for (off, cache, weight, out) in [(1280usize, &sc.v_cache, &sc.v_weight, &seen.v_out)] {
            for c in 0..dkv {
                // The prefixed sequence of channel c.
                let mut xs: Vec<f64> = (0..HISTORY)
                    .map(|i| {
                        if gate {
                            cache[(slot as usize * HISTORY + i) * dkv + c].to_f64()
                        } else {
                            0.0
                        }
                    })
                    .collect();
                xs.extend((bos..eos).map(|t| sc.qkvr[t * sc.row + off + c].to_f64()));
                for t in bos..eos {
                    let p = t - bos + HISTORY; // position of token t in xs
                    let acc: f64 = (0..W)
                        .map(|i| xs[p + 1 - W + i] * weight[c * W + i].to_f64())
                        .sum::<f64>()
                        + xs[p];
                    let got = out[t * dkv + c].to_f64();
                    assert!(
                        (got - acc).abs() <= 1e-2 * acc.abs().max(1.0),
                        "seq {s} token {t} ch {c}: {got} vs {acc}"
                    );
                }
            }
        }
    }
    // k: per-head RMS of the output is ~|gamma| (normalized rows).
    for t in 0..sc.tokens {
        for h in 0..2 {
            let row = &seen.k_out[t * dkv + h * 128..t * dkv + (h + 1) * 128];
            let ms: f64 = row
                .iter()
                .zip(&sc.k_gamma)
                .map(|(k, g)| (k.to_f64() / g.to_f64()).powi(2))
                .sum::<f64>()
                / 128.0;
            assert!(
                (ms - 1.0).abs() < 0.05,
                "token {t} head {h}: mean square {ms}"
            );
        }
    }
}

/// Windows: `inter[s][p]` is the last K pre-conv inputs after draft token p, for sequences
/// with a slot; padding sequences' rows and the spare capacity row stay poisoned.
#[test]
fn verify_windows_are_the_conv_state_after_each_draft_token() {
    let mut rng = common::rng("verify_windows");
    let q = 4;
    let sc = Scenario::random(
        &mut rng,
        Shape::Verify {
            seqs: 3,
            draft_tokens: q,
        },
        128,
        1024,
        256,
        false,
    );
    let seen = run(&Cpu, &swa_mxfp8::<Verify>(), &sc);
    let dkv = 256;
    for s in 0..4 {
        let slot = sc.cache_indices.get(s).copied().unwrap_or(-1);
        for p in 0..q {
            for w in 0..HISTORY {
                for c in 0..dkv {
                    let got = seen.k_inter[((s * q + p) * HISTORY + w) * dkv + c];
                    if slot < 0 {
                        assert!(got.is_nan(), "row of a padding/spare sequence was written");
                        continue;
                    }
                    let x = p + 1 + w; // index into [cache rows ++ tokens]
                    let expect = if x < HISTORY {
                        sc.k_cache[(slot as usize * HISTORY + x) * dkv + c]
                    } else {
                        sc.qkvr[(s * q + x - HISTORY) * sc.row + 1024 + c]
                    };
                    assert_eq!(got.to_bits(), expect.to_bits());
                }
            }
        }
    }
    // Verify never writes the conv caches.
    assert_eq!(seen.k_cache, sc.k_cache);
}

/// Decode is verify with one draft token, plus the in-place window shift.
#[test]
fn decode_equals_single_token_verify_and_shifts_the_window() {
    let mut rng = common::rng("decode");
    let sc = Scenario::random(
        &mut rng,
        Shape::Decode {
            tokens: 6,
            track: true,
        },
        128,
        1024,
        256,
        true,
    );
    let mut as_verify = sc.clone();
    as_verify.shape = Shape::Verify {
        seqs: 6,
        draft_tokens: 1,
    };
    let d = run(&Cpu, &swa_mxfp8::<Decode>(), &sc);
    let v = run(&Cpu, &swa_mxfp8::<Verify>(), &as_verify);
    assert_eq!((&d.q, &d.k_out, &d.v_out), (&v.q, &v.k_out, &v.v_out));
    let dkv = 256;
    for t in 0..6 {
        let slot = sc.cache_indices[t];
        if slot < 0 {
            continue;
        }
        let gate = sc.cache_mask[t] != 0;
        let mut dsts = vec![slot as usize];
        if sc.track_mask[t] != 0 {
            dsts.push(sc.track_dst[t] as usize);
        }
        for dst in dsts {
            for w in 0..HISTORY {
                for c in 0..dkv {
                    let got = d.k_cache[(dst * HISTORY + w) * dkv + c];
                    let expect = if w + 1 < HISTORY {
                        if gate {
                            sc.k_cache[(slot as usize * HISTORY + w + 1) * dkv + c]
                        } else {
                            bf16::ZERO
                        }
                    } else {
                        sc.qkvr[t * sc.row + 1024 + c]
                    };
                    assert_eq!(
                        got.to_bits(),
                        expect.to_bits(),
                        "token {t} dst {dst} w {w} c {c}"
                    );
                }
            }
        }
    }
}

/// Out-of-range `loc` values are skipped and counted; negative ones skipped silently.
#[test]
fn bad_loc_is_skipped_and_counted() {
    let mut rng = common::rng("bad_loc");
    let mut sc = Scenario::random(
        &mut rng,
        Shape::Verify {
            seqs: 2,
            draft_tokens: 4,
        },
        128,
        1024,
        256,
        false,
    );
    let slots = (sc.pages * PAGE) as i64;
    sc.loc[0] = slots;
    sc.loc[5] = slots + 1000;
    let seen = run(&Cpu, &swa_mxfp8::<Verify>(), &sc);
    assert_eq!(seen.bad_indices, 2);
    check_store(
        &Scenario {
            loc: sc
                .loc
                .iter()
                .map(|&l| if l >= slots { -1 } else { l })
                .collect(),
            ..sc
        },
        &seen,
    );
}

/// The boundary names the parameter and both extents.
#[test]
fn boundary_errors_name_the_parameter() {
    let b = Cpu;
    let t = |n: usize| Tensor::<Cpu, i64>::zeros(&b, n).unwrap();
    let qkvr = |n: usize| Tensor::<Cpu, bf16, QkvrRow<Row>>::zeros(&b, n).unwrap();
    let idx = Tensor::<Cpu, i32>::zeros(&b, 3).unwrap();
    let mask = || Tensor::<Cpu, u8>::zeros(&b, 3).unwrap();
    // T != B·q
    let e = VerifyBatch::<Cpu, Row>::new(qkvr(11), idx, mask(), t(11), None, 4)
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "`qkvr`: expected 12 tokens (T = B·q), got 11"
    );
    // tau shorter than T
    let idx = Tensor::<Cpu, i32>::zeros(&b, 3).unwrap();
    let tau = Tensor::<Cpu, f32>::zeros(&b, 10).unwrap();
    let e = VerifyBatch::<Cpu, Row>::new(qkvr(12), idx, mask(), t(12), Some(tau), 4)
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "`log_scaling_tau`: expected 12 values (one per token), got 10"
    );
    // windows for fewer sequences than the batch
    let idx = Tensor::<Cpu, i32>::zeros(&b, 3).unwrap();
    let batch = VerifyBatch::<Cpu, Row>::new(qkvr(12), idx, mask(), t(12), None, 4).unwrap();
    let mut windows = VerifyWindows::<Cpu, 256, InklingConv>::zeros(&b, 2, 4).unwrap();
    let weights = PrologueWeights::<Cpu, 128, 256, InklingConv>::from_host(
        &b,
        &[bf16::ONE; 128],
        &[bf16::ONE; 128],
        &[bf16::ONE; 256 * W],
        &[bf16::ONE; 256 * W],
        1e-6,
    )
    .unwrap();
    let mut conv = ConvState::zeros(&b, 4).unwrap();
    let mut out = <Mxfp8Store<PAGE> as TestStore>::outputs::<Cpu, 1024, 256>(&b, 12);
    let mut kv = shapeproof::layout::Mxfp8KvCache::<Cpu, PAGE, 256>::zeros(&b, 1).unwrap();
    let e = swa_mxfp8::<Verify>()
        .run(
            &b,
            &weights,
            &mut conv,
            (&batch, &mut windows),
            PrologueTargets {
                out: &mut out,
                kv: &mut kv,
                errors: None,
            },
        )
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "`k_inter`: expected 3 sequences (at least B), got 2"
    );
    // outputs for another token count
    let mut windows = VerifyWindows::<Cpu, 256, InklingConv>::zeros(&b, 3, 4).unwrap();
    let mut out = <Mxfp8Store<PAGE> as TestStore>::outputs::<Cpu, 1024, 256>(&b, 8);
    let e = swa_mxfp8::<Verify>()
        .run(
            &b,
            &weights,
            &mut conv,
            (&batch, &mut windows),
            PrologueTargets {
                out: &mut out,
                kv: &mut kv,
                errors: None,
            },
        )
        .err()
        .unwrap();
    assert_eq!(e.to_string(), "`q_out`: expected 12 tokens, got 8");
    // q scales for another token count than q: the output set cannot even be made
    let e = Mxfp8Outputs::<Cpu, 1024, 256>::new(
        Tensor::zeros(&b, 12).unwrap(),
        Tensor::zeros(&b, 8).unwrap(),
        Tensor::zeros(&b, 12).unwrap(),
        Tensor::zeros(&b, 12).unwrap(),
    )
    .err()
    .unwrap();
    assert_eq!(
        e.to_string(),
        "`q_scale`: expected 12 tokens (as q_out), got 8"
    );
    let _ = E8M0(0);
}
