//! The boundary, tried as a hostile caller would: every extent a safe caller can get wrong
//! gives an `Err` that names the argument, and index values of any kind (garbage `i32`/`i64`
//! anywhere the device reads an index) are guarded, never followed. Run on any backend; on a
//! GPU under compute-sanitizer memcheck.

use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::Error;
use shapeproof::backend::Backend;
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::layout::{MlaLatentKv, Mxfp8KvCache, PagedBf16Kv};
use shapeproof::ops::mxfp8_quantize::{Mxfp8Quantize, RunMxfp8Quantize};
use shapeproof::ops::prologue::*;
use shapeproof::ops::sparse_mla::*;
use shapeproof::tensor::{BlockScales, Cols, Scalar, Tensor};

use super::{bf16_normal, e4m3_normal};

/// Inkling TP8 SWA layer: q 1024 (8 heads), k/v 256 (2 heads), pages of 128.
pub const DQ: usize = 1024;
pub const DKV: usize = 256;
pub const PAGE: usize = 128;
pub type Row = PackedRow<DQ, DKV, 128>;
pub type Conv = InklingConv;
const ROW: usize = DQ + 2 * DKV + 128;
const HISTORY: usize = 3;

/// Sparse MLA: d_qk 576, 16 real heads in a 64-head tile, top-k 128.
pub const D_QK: usize = 576;
pub const HEADS: usize = 16;
pub const TOPK: usize = 128;

/// Asserts that `r` is an error whose message names `param` first.
#[track_caller]
pub fn names<T>(r: shapeproof::Result<T>, param: &str) {
    match r {
        Ok(_) => panic!("expected an error naming `{param}`, got Ok"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("`{param}`")),
                "expected an error naming `{param}`, got: {msg}"
            );
        }
    }
}

fn t<B: Backend, T: shapeproof::backend::Element, R: shapeproof::tensor::RowShape>(
    b: &B,
    rows: usize,
) -> Tensor<B, T, R> {
    Tensor::zeros(b, rows).unwrap()
}

fn weights<B: Backend>(b: &B) -> PrologueWeights<B, 128, DKV, Conv> {
    let one = vec![bf16::ONE; 128];
    let taps = vec![bf16::from_f32(0.25); DKV * 4];
    PrologueWeights::from_host(b, &one, &one, &taps, &taps, 1e-6).unwrap()
}

/// Every extent of the sparse MLA prefill that a safe caller can get wrong.
pub fn sparse_mla_extents<B: RunSparseMla>(b: &B) {
    let kernel = SparseMlaPrefill::<D_QK, 64, TOPK, Plain, HEADS>::new();
    let q_scale = || Tensor::<B, f32, Scalar>::from_host(b, "q_scale", &[1.0], 1).unwrap();
    let inputs = |s_q: usize, idx_rows: usize| {
        SparseMlaInputs::<B, D_QK, HEADS, TOPK, Plain>::new(
            t(b, s_q),
            q_scale(),
            t(b, idx_rows),
            0.1,
        )
    };
    names(inputs(4, 1), "indices");
    names(
        SparseMlaInputs::<B, D_QK, HEADS, TOPK, Plain>::new(t(b, 4), t(b, 0), t(b, 4), 0.1),
        "q_scale",
    );
    names(
        SparseMlaInputs::<B, D_QK, HEADS, TOPK, Plain>::new(t(b, 4), t(b, 2), t(b, 4), 0.1),
        "q_scale",
    );
    names(
        inputs(4, 4).unwrap().with_topk_length(t(b, 3)),
        "topk_length",
    );
    names(
        inputs(4, 4)
            .unwrap()
            .with_topk_length(t(b, 4))
            .unwrap()
            .with_sink(t(b, 2)),
        "attn_sink",
    );
    names(
        MlaLatentKv::<B, D_QK>::new(b, b.zeros(100 * D_QK - 1).unwrap(), 100, 1.0),
        "kv",
    );
    let kv = MlaLatentKv::<B, D_QK>::new(b, b.zeros(100 * D_QK).unwrap(), 100, 1.0).unwrap();
    let inputs = inputs(4, 4).unwrap();
    let (mut out, mut ml, mut lse) = (t(b, 4), t(b, 4), t(b, 4));
    names(
        kernel.run(b, &inputs, &kv, &mut t(b, 3), &mut ml, &mut lse),
        "out",
    );
    names(
        kernel.run(b, &inputs, &kv, &mut out, &mut t(b, 5), &mut lse),
        "max_logits",
    );
    names(
        kernel.run(b, &inputs, &kv, &mut out, &mut ml, &mut t(b, 0)),
        "lse",
    );
    kernel
        .run(b, &inputs, &kv, &mut out, &mut ml, &mut lse)
        .unwrap();
}

/// Every extent of the prologue's arguments that a safe caller can get wrong.
pub fn prologue_extents<B: RunPrologue>(b: &B) {
    let one = vec![bf16::ONE; 128];
    let taps = vec![bf16::ZERO; DKV * 4];
    let w = |q: &[bf16], k: &[bf16], kw: &[bf16], vw: &[bf16]| {
        PrologueWeights::<B, 128, DKV, Conv>::from_host(b, q, k, kw, vw, 1e-6)
    };
    names(w(&one[..127], &one, &taps, &taps), "q_gamma");
    names(w(&one, &one[..1], &taps, &taps), "k_gamma");
    names(w(&one, &one, &taps[..8], &taps), "k_weight");
    names(w(&one, &one, &taps, &[]), "v_weight");
    names(
        PrologueWeights::<B, 128, DKV, Conv>::from_tensors(
            t(b, 1),
            t(b, 2),
            t(b, DKV),
            t(b, DKV),
            1e-6,
        ),
        "k_gamma",
    );
    names(
        PrologueWeights::<B, 128, DKV, Conv>::from_tensors(
            t(b, 1),
            t(b, 1),
            t(b, DKV),
            t(b, 1),
            1e-6,
        ),
        "v_weight",
    );
    names(ConvState::<B, DKV, Conv>::new(t(b, 4), t(b, 3)), "v_cache");
    names(
        PagedBf16Kv::<B, PAGE, DKV>::from_buffers(
            b.zeros(2 * PAGE * DKV - 1).unwrap(),
            b.zeros(2 * PAGE * DKV).unwrap(),
            2,
        ),
        "k_buf",
    );
    let plane = 2 * (DKV / 128) * PAGE * 4;
    let mx = |k: usize, v: usize, sk: usize, sv: usize| {
        Mxfp8KvCache::<B, PAGE, DKV>::from_buffers(
            b.zeros::<F8E4M3>(k).unwrap(),
            b.zeros::<F8E4M3>(v).unwrap(),
            b.zeros::<E8M0>(sk).unwrap(),
            b.zeros::<E8M0>(sv).unwrap(),
            2,
        )
    };
    let n = 2 * PAGE * DKV;
    names(mx(n, n + 1, plane, plane), "v_buf");
    names(mx(n, n, plane - 1, plane), "sfk");
    names(mx(n, n, plane, 0), "sfv");
    mx(n, n, plane, plane).unwrap();
    names(
        Bf16Outputs::<B, DQ, DKV>::new(t(b, 4), t(b, 3), t(b, 4)),
        "k_out",
    );
    names(
        Mxfp8Outputs::<B, DQ, DKV>::new(t(b, 4), t(b, 4), t(b, 4), t(b, 5)),
        "v_out",
    );

    // Verify: B = 2 sequences of 4 draft tokens.
    let verify =
        |qkvr: usize, idx: usize, mask: usize, loc: usize, tau: Option<usize>, q: usize| {
            VerifyBatch::<B, Row>::new(
                t(b, qkvr),
                t(b, idx),
                t(b, mask),
                t(b, loc),
                tau.map(|n| t(b, n)),
                q,
            )
        };
    names(verify(7, 2, 2, 8, None, 4), "qkvr");
    names(verify(8, 2, 1, 8, None, 4), "cache_mask");
    names(verify(8, 2, 2, 9, None, 4), "loc");
    names(verify(8, 2, 2, 8, Some(7), 4), "log_scaling_tau");
    names(verify(0, 0, 0, 0, None, 0), "draft_tokens");
    names(
        VerifyWindows::<B, DKV, Conv>::new(t(b, 8), t(b, 8), 3),
        "k_inter",
    );
    names(
        VerifyWindows::<B, DKV, Conv>::new(t(b, 8), t(b, 4), 4),
        "v_inter",
    );
    let batch = verify(8, 2, 2, 8, Some(8), 4).unwrap();
    let kernel = Mxfp8Prologue::<Verify, DQ, DKV, Row, Conv, PAGE>::new();
    let weights = weights(b);
    let mut conv = ConvState::<B, DKV, Conv>::zeros(b, 4).unwrap();
    let mut kv = Mxfp8KvCache::<B, PAGE, DKV>::zeros(b, 2).unwrap();
    let mut out = Mxfp8Outputs::<B, DQ, DKV>::zeros(b, 8).unwrap();
    let mut short = VerifyWindows::<B, DKV, Conv>::zeros(b, 1, 4).unwrap();
    names(
        kernel.run(
            b,
            &weights,
            &mut conv,
            (&batch, &mut short),
            PrologueTargets {
                out: &mut out,
                kv: &mut kv,
                errors: None,
            },
        ),
        "k_inter",
    );
    let mut other_q = VerifyWindows::<B, DKV, Conv>::zeros(b, 4, 2).unwrap();
    names(
        kernel.run(
            b,
            &weights,
            &mut conv,
            (&batch, &mut other_q),
            PrologueTargets {
                out: &mut out,
                kv: &mut kv,
                errors: None,
            },
        ),
        "k_inter",
    );
    let mut windows = VerifyWindows::<B, DKV, Conv>::zeros(b, 2, 4).unwrap();
    let mut out9 = Mxfp8Outputs::<B, DQ, DKV>::zeros(b, 9).unwrap();
    names(
        kernel.run(
            b,
            &weights,
            &mut conv,
            (&batch, &mut windows),
            PrologueTargets {
                out: &mut out9,
                kv: &mut kv,
                errors: None,
            },
        ),
        "q_out",
    );
    kernel
        .run(
            b,
            &weights,
            &mut conv,
            (&batch, &mut windows),
            PrologueTargets {
                out: &mut out,
                kv: &mut kv,
                errors: None,
            },
        )
        .unwrap();

    // Extend: 2 sequences, 6 tokens.
    names(
        ExtendTrack::<B, Conv>::new(t(b, 2), t(b, 1), t(b, 2)),
        "track_mask",
    );
    names(
        ExtendTrack::<B, Conv>::new(t(b, 2), t(b, 2), t(b, 3)),
        "track_dst",
    );
    #[allow(clippy::type_complexity)]
    let extend = |n: [usize; 7], track: Option<ExtendTrack<B, Conv>>| {
        ExtendBatch::<B, Row, Conv>::new(ExtendBatchParts {
            qkvr: t(b, n[0]),
            cu_seqlens: t(b, n[1]),
            seq_of_token: t(b, n[2]),
            cache_indices: t(b, n[3]),
            cache_mask: t(b, n[4]),
            has_initial_state: t(b, n[5]),
            loc: t(b, n[6]),
            tau: None,
            track,
            update_conv_state: true,
        })
    };
    names(extend([6, 2, 6, 2, 2, 2, 6], None), "cu_seqlens");
    names(extend([6, 3, 5, 2, 2, 2, 6], None), "seq_of_token");
    names(extend([6, 3, 6, 2, 1, 2, 6], None), "cache_mask");
    names(extend([6, 3, 6, 2, 2, 3, 6], None), "has_initial_state");
    names(extend([6, 3, 6, 2, 2, 2, 0], None), "loc");
    let track3 = ExtendTrack::<B, Conv>::new(t(b, 3), t(b, 3), t(b, 3)).unwrap();
    names(extend([6, 3, 6, 2, 2, 2, 6], Some(track3)), "track_rows");

    // Decode: 5 tokens.
    names(DecodeTrack::<B>::new(t(b, 5), t(b, 4)), "track_indices");
    let decode = |n: [usize; 4], tau: Option<usize>, track: Option<DecodeTrack<B>>| {
        DecodeBatch::<B, Row>::new(
            t(b, n[0]),
            t(b, n[1]),
            t(b, n[2]),
            t(b, n[3]),
            tau.map(|n| t(b, n)),
            track,
        )
    };
    names(decode([5, 4, 5, 5], None, None), "cache_indices");
    names(decode([5, 5, 6, 5], None, None), "cache_mask");
    names(decode([5, 5, 5, 4], None, None), "loc");
    names(decode([5, 5, 5, 5], Some(0), None), "log_scaling_tau");
    let track4 = DecodeTrack::<B>::new(t(b, 4), t(b, 4)).unwrap();
    names(decode([5, 5, 5, 5], None, Some(track4)), "track_mask");
}

/// The tensor boundary itself and the quantize op.
pub fn tensor_and_quantize_extents<B: RunMxfp8Quantize>(b: &B) {
    names(
        Tensor::<B, f32, Cols<4>>::from_host(b, "x", &[0.0; 7], 2),
        "x",
    );
    names(
        Tensor::<B, f32, Cols<4>>::from_buffer("x", b.zeros(9).unwrap(), 2),
        "x",
    );
    names(
        Tensor::<B, f32, Cols<4>>::from_buffer("x", b.zeros(0).unwrap(), 1usize << 62),
        "x",
    );
    // No allocation holds 2^61 × 4 f32: an error, not a capacity-overflow panic or an abort.
    assert!(Tensor::<B, f32, Cols<4>>::zeros(b, 1usize << 61).is_err());
    let mut x = Tensor::<B, f32, Cols<4>>::zeros(b, 2).unwrap();
    assert!(matches!(x.write(b, &[0.0; 7]), Err(Error::Extent { .. })));
    let op = Mxfp8Quantize::<256>::new();
    let input = Tensor::<B, bf16, Cols<256>>::zeros(b, 3).unwrap();
    let mut data = Tensor::<B, F8E4M3, Cols<256>>::zeros(b, 3).unwrap();
    let mut scales = Tensor::<B, E8M0, BlockScales<256>>::zeros(b, 3).unwrap();
    names(op.run(b, &input, &mut t(b, 2), &mut scales), "data");
    names(op.run(b, &input, &mut data, &mut t(b, 4)), "scales");
    op.run(b, &input, &mut data, &mut scales).unwrap();
}

fn garbage_i32(rng: &mut StdRng, n: usize) -> Vec<i32> {
    (0..n)
        .map(|_| match rng.random_range(0..4) {
            0 => rng.random(),
            1 => [i32::MIN, i32::MAX, -1, 0][rng.random_range(0..4)],
            _ => rng.random_range(-40..40),
        })
        .collect()
}

fn garbage_i64(rng: &mut StdRng, n: usize) -> Vec<i64> {
    (0..n)
        .map(|_| match rng.random_range(0..4) {
            0 => rng.random(),
            1 => [i64::MIN, i64::MAX, -1, 0][rng.random_range(0..4)],
            _ => rng.random_range(-400..400),
        })
        .collect()
}

fn host<B: Backend, T: shapeproof::backend::Element>(b: &B, v: &[T]) -> Tensor<B, T, Scalar> {
    Tensor::from_host(b, "host", v, v.len()).unwrap()
}

/// Garbage in every index the device reads (conv slots, KV slots, sequence starts and ids,
/// tracked rows and destinations, top-k indices and lengths): the calls succeed, and (under
/// memcheck) touch nothing outside their buffers.
pub fn hostile_index_values<B: RunPrologue + RunSparseMla>(b: &B, rng: &mut StdRng) {
    let weights = weights(b);
    let mut conv = ConvState::<B, DKV, Conv>::zeros(b, 5).unwrap();
    let mut kv = Mxfp8KvCache::<B, PAGE, DKV>::zeros(b, 2).unwrap();
    let mut errors = ErrorCounter::new(b).unwrap();
    let qkvr = |tokens: usize, rng: &mut StdRng| {
        Tensor::<B, bf16, QkvrRow<Row>>::from_host(
            b,
            "qkvr",
            &bf16_normal(rng, tokens * ROW, 0.0, 1.0),
            tokens,
        )
        .unwrap()
    };
    let flags = |n: usize, rng: &mut StdRng| -> Vec<u8> { (0..n).map(|_| rng.random()).collect() };
    for _ in 0..3 {
        // Extend with tracking and the trailing update: 4 sequences, 37 tokens.
        let (seqs, tokens) = (4, 37);
        let track = ExtendTrack::<B, Conv>::new(
            Tensor::from_host(b, "track_rows", &garbage_i64(rng, seqs * HISTORY), seqs).unwrap(),
            host(b, &flags(seqs, rng)),
            host(b, &garbage_i64(rng, seqs)),
        )
        .unwrap();
        let batch = ExtendBatch::<B, Row, Conv>::new(ExtendBatchParts {
            qkvr: qkvr(tokens, rng),
            cu_seqlens: host(b, &garbage_i64(rng, seqs + 1)),
            seq_of_token: host(b, &garbage_i32(rng, tokens)),
            cache_indices: host(b, &garbage_i32(rng, seqs)),
            cache_mask: host(b, &flags(seqs, rng)),
            has_initial_state: host(b, &flags(seqs, rng)),
            loc: host(b, &garbage_i64(rng, tokens)),
            tau: Some(host(b, &vec![1.5f32; tokens])),
            track: Some(track),
            update_conv_state: true,
        })
        .unwrap();
        let mut out = Mxfp8Outputs::<B, DQ, DKV>::zeros(b, tokens).unwrap();
        Mxfp8Prologue::<Extend, DQ, DKV, Row, Conv, PAGE>::new()
            .run(
                b,
                &weights,
                &mut conv,
                &batch,
                PrologueTargets {
                    out: &mut out,
                    kv: &mut kv,
                    errors: Some(&mut errors),
                },
            )
            .unwrap();

        // Decode with tracking: 29 tokens.
        let tokens = 29;
        let track = DecodeTrack::<B>::new(
            host(b, &flags(tokens, rng)),
            host(b, &garbage_i64(rng, tokens)),
        )
        .unwrap();
        let batch = DecodeBatch::<B, Row>::new(
            qkvr(tokens, rng),
            host(b, &garbage_i32(rng, tokens)),
            host(b, &flags(tokens, rng)),
            host(b, &garbage_i64(rng, tokens)),
            None,
            Some(track),
        )
        .unwrap();
        let mut out = Bf16Outputs::<B, DQ, DKV>::zeros(b, tokens).unwrap();
        let mut bf16_kv = PagedBf16Kv::<B, PAGE, DKV>::zeros(b, 1).unwrap();
        Bf16Prologue::<Decode, 128, DQ, DKV, Row, Conv, PAGE>::new()
            .run(
                b,
                &weights,
                &mut conv,
                &batch,
                PrologueTargets {
                    out: &mut out,
                    kv: &mut bf16_kv,
                    errors: Some(&mut errors),
                },
            )
            .unwrap();

        // Verify: 3 sequences of 2 draft tokens, windows for 2 sequences more.
        let (seqs, q) = (3, 2);
        let batch = VerifyBatch::<B, Row>::new(
            qkvr(seqs * q, rng),
            host(b, &garbage_i32(rng, seqs)),
            host(b, &flags(seqs, rng)),
            host(b, &garbage_i64(rng, seqs * q)),
            None,
            q,
        )
        .unwrap();
        let mut windows = VerifyWindows::<B, DKV, Conv>::zeros(b, seqs + 2, q).unwrap();
        let mut out = Mxfp8Outputs::<B, DQ, DKV>::zeros(b, seqs * q).unwrap();
        Mxfp8Prologue::<Verify, DQ, DKV, Row, Conv, PAGE>::new()
            .run(
                b,
                &weights,
                &mut conv,
                (&batch, &mut windows),
                PrologueTargets {
                    out: &mut out,
                    kv: &mut kv,
                    errors: Some(&mut errors),
                },
            )
            .unwrap();

        // Sparse MLA with garbage indices and lengths, and a sink.
        let (s_q, s_kv) = (6, 333);
        let inputs = SparseMlaInputs::<B, D_QK, HEADS, TOPK, Plain>::new(
            Tensor::from_host(b, "q", &e4m3_normal(rng, s_q * HEADS * D_QK, 0.5), s_q).unwrap(),
            host(b, &[0.5f32]),
            Tensor::from_host(b, "indices", &garbage_i32(rng, s_q * TOPK), s_q).unwrap(),
            0.07,
        )
        .unwrap()
        .with_topk_length(host(b, &garbage_i32(rng, s_q)))
        .unwrap()
        .with_sink(Tensor::from_host(b, "sink", &[0.25f32; HEADS], 1).unwrap())
        .unwrap();
        let kv_rows = MlaLatentKv::<B, D_QK>::new(
            b,
            b.upload(&e4m3_normal(rng, s_kv * D_QK, 0.5)).unwrap(),
            s_kv,
            0.5,
        )
        .unwrap();
        let (mut o, mut ml, mut lse) = (t(b, s_q), t(b, s_q), t(b, s_q));
        SparseMlaPrefill::<D_QK, 64, TOPK, WithLengthAndSink, HEADS>::new()
            .run(b, &inputs, &kv_rows, &mut o, &mut ml, &mut lse)
            .unwrap();
    }
    b.synchronize().unwrap();
    assert!(
        errors.read(b).unwrap() > 0,
        "garbage indices were counted as skipped"
    );
}

/// The skipped-index counter wraps at 2^32 as the device's does (never a panic), and a batch
/// of no tokens counts nothing on any backend, whatever its per-sequence indices hold.
pub fn counter_wraps_and_empty_batches_count_nothing<B: RunPrologue>(b: &B) {
    let weights = weights(b);
    let mut conv = ConvState::<B, DKV, Conv>::zeros(b, 5).unwrap();
    let mut kv = PagedBf16Kv::<B, PAGE, DKV>::zeros(b, 1).unwrap();
    let mut errors = ErrorCounter::new(b).unwrap();
    let mut rng = super::rng("counter_wraps_and_empty_batches_count_nothing");
    // Decode, 3 tokens, every conv slot and every KV slot out of range.
    let tokens = 3;
    let decode = DecodeBatch::<B, Row>::new(
        Tensor::from_host(
            b,
            "qkvr",
            &bf16_normal(&mut rng, tokens * ROW, 0.0, 1.0),
            tokens,
        )
        .unwrap(),
        host(b, &[1000i32, -7, i32::MAX]),
        host(b, &[1u8; 3]),
        host(b, &[1i64 << 40, -5, i64::MAX]),
        None,
        None,
    )
    .unwrap();
    let kernel = Bf16Prologue::<Decode, 128, DQ, DKV, Row, Conv, PAGE>::new();
    let mut run = |errors: &mut ErrorCounter<B>| {
        let mut out = Bf16Outputs::<B, DQ, DKV>::zeros(b, tokens).unwrap();
        kernel
            .run(
                b,
                &weights,
                &mut conv,
                &decode,
                PrologueTargets {
                    out: &mut out,
                    kv: &mut kv,
                    errors: Some(errors),
                },
            )
            .unwrap();
    };
    run(&mut errors);
    let per_call = errors.read(b).unwrap();
    assert_eq!(
        per_call, 5,
        "three conv slots, and two loc values beyond the pool"
    );
    errors.set(b, u32::MAX - 1).unwrap();
    run(&mut errors);
    assert_eq!(
        errors.read(b).unwrap(),
        (u32::MAX - 1).wrapping_add(per_call)
    );

    // Extend with 2 sequences and no token: garbage per-sequence indices are never read.
    errors.reset(b).unwrap();
    let empty = ExtendBatch::<B, Row, Conv>::new(ExtendBatchParts {
        qkvr: Tensor::from_host(b, "qkvr", &[], 0).unwrap(),
        cu_seqlens: host(b, &[0i64, 0, 0]),
        seq_of_token: host(b, &[] as &[i32]),
        cache_indices: host(b, &[1000i32, -9]),
        cache_mask: host(b, &[1u8, 1]),
        has_initial_state: host(b, &[1u8, 0]),
        loc: host(b, &[] as &[i64]),
        tau: None,
        track: None,
        update_conv_state: true,
    })
    .unwrap();
    let mut out = Bf16Outputs::<B, DQ, DKV>::zeros(b, 0).unwrap();
    Bf16Prologue::<Extend, 128, DQ, DKV, Row, Conv, PAGE>::new()
        .run(
            b,
            &weights,
            &mut conv,
            &empty,
            PrologueTargets {
                out: &mut out,
                kv: &mut kv,
                errors: Some(&mut errors),
            },
        )
        .unwrap();
    assert_eq!(
        errors.read(b).unwrap(),
        0,
        "a batch of no tokens counts nothing"
    );
}
