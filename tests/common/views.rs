//! Borrowed views in every argument: one layer's K/V rows and scale planes carved out of a pool
//! that holds several layers, qkvr as rows of a larger GEMM output, outputs written into larger
//! buffers. The same call on owned copies must give the same bytes, and nothing outside the
//! viewed ranges may change.

use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::backend::Backend;
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::layout::{MlaLatentKv, Mxfp8KvCache, Mxfp8KvParts};
use shapeproof::ops::prologue::*;
use shapeproof::ops::sparse_mla::*;
use shapeproof::tensor::{Cols, Scalar, Tensor, TensorView, TensorViewMut};

use super::boundary::names;
use super::{bf16_normal, distinct, e4m3_normal, random_bytes};

const DQ: usize = 1024;
const DKV: usize = 256;
const PAGE: usize = 128;
const ROW: usize = DQ + 2 * DKV + 128;
type Row = PackedRow<DQ, DKV, 128>;
type Conv = InklingConv;
const LAYERS: usize = 3;
const PAGES: usize = 2; // per layer
const SLOTS: usize = PAGES * PAGE;
const PLANE: usize = PAGES * (DKV / 128) * PAGE * 4; // scale bytes per layer
const SEQS: usize = 5;
const Q: usize = 4;
const T: usize = SEQS * Q;

fn e4(bytes: &[u8]) -> Vec<F8E4M3> {
    bytes.iter().map(|&x| F8E4M3::from_bits(x)).collect()
}
fn sf(bytes: &[u8]) -> Vec<E8M0> {
    bytes.iter().map(|&x| E8M0(x)).collect()
}

/// Everything the prologue call reads, on the host.
struct Host {
    qkvr: Vec<bf16>,   // [T + 7, ROW]: a GEMM output with rows after the batch
    k_pool: Vec<u8>,   // [LAYERS, SLOTS, DKV] e4m3
    v_pool: Vec<u8>,   // [LAYERS, SLOTS, DKV]
    sfk_pool: Vec<u8>, // [LAYERS, PAGES, HKV, 32, PAGE/32, 4]
    sfv_pool: Vec<u8>,
    loc: Vec<i64>, // [T]
    cache_indices: Vec<i32>,
    cache_mask: Vec<u8>,
    tau: Vec<f32>,
    conv_k: Vec<bf16>, // [SEQS, W-1, DKV]
    conv_v: Vec<bf16>,
}

fn host(rng: &mut StdRng) -> Host {
    let mut loc: Vec<i64> = distinct(rng, T, SLOTS)
        .into_iter()
        .map(|s| s as i64)
        .collect();
    loc[3] = -1; // not stored
    Host {
        qkvr: bf16_normal(rng, (T + 7) * ROW, 0.0, 1.0),
        k_pool: random_bytes(rng, LAYERS * SLOTS * DKV),
        v_pool: random_bytes(rng, LAYERS * SLOTS * DKV),
        sfk_pool: random_bytes(rng, LAYERS * PLANE),
        sfv_pool: random_bytes(rng, LAYERS * PLANE),
        loc,
        cache_indices: (0..SEQS as i32).rev().collect(),
        cache_mask: (0..SEQS).map(|s| (s % 2) as u8).collect(),
        tau: (0..T).map(|_| rng.random_range(1.0..1.5)).collect(),
        conv_k: bf16_normal(rng, SEQS * 3 * DKV, 0.0, 1.0),
        conv_v: bf16_normal(rng, SEQS * 3 * DKV, 0.0, 1.0),
    }
}

fn weights<B: Backend>(b: &B) -> PrologueWeights<B, 128, DKV, Conv> {
    let g: Vec<bf16> = (0..128)
        .map(|i| bf16::from_f32(0.5 + i as f32 / 128.0))
        .collect();
    let taps: Vec<bf16> = (0..DKV * 4)
        .map(|i| bf16::from_f32(((i % 7) as f32 - 3.0) / 8.0))
        .collect();
    PrologueWeights::from_host(b, &g, &g, &taps, &taps, 1e-6).unwrap()
}

fn bytes<T: Copy>(t: &[T], f: impl Fn(T) -> u8) -> Vec<u8> {
    t.iter().map(|&x| f(x)).collect()
}

/// Layer 1 of a three-layer MXFP8 pool, written through views, equals an owned cache holding
/// layer 1's bytes; layers 0 and 2, the GEMM rows after the batch and the output rows after it
/// stay as they were.
pub fn prologue_through_views<B: RunPrologue>(b: &B, rng: &mut StdRng) {
    let h = host(rng);
    let kernel = Mxfp8Prologue::<Verify, DQ, DKV, Row, Conv, PAGE>::new();
    let weights = weights(b);
    let tensor = |v: &[i64]| Tensor::<B, i64, Scalar>::from_host(b, "loc", v, v.len()).unwrap();
    let (loc, tau) = (
        tensor(&h.loc),
        Tensor::<B, f32>::from_host(b, "tau", &h.tau, T).unwrap(),
    );
    let idx = Tensor::<B, i32>::from_host(b, "cache_indices", &h.cache_indices, SEQS).unwrap();
    let mask = Tensor::<B, u8>::from_host(b, "cache_mask", &h.cache_mask, SEQS).unwrap();
    let conv = || {
        ConvState::<B, DKV, Conv>::new(
            Tensor::from_host(b, "k_cache", &h.conv_k, SEQS).unwrap(),
            Tensor::from_host(b, "v_cache", &h.conv_v, SEQS).unwrap(),
        )
        .unwrap()
    };

    // Owned reference: layer 1's bytes in a cache of its own.
    let layer = |pool: &[u8], per: usize| pool[per..2 * per].to_vec();
    let mut owned_kv = Mxfp8KvCache::<B, PAGE, DKV>::from_buffers(
        b.upload(&e4(&layer(&h.k_pool, SLOTS * DKV))).unwrap(),
        b.upload(&e4(&layer(&h.v_pool, SLOTS * DKV))).unwrap(),
        b.upload(&sf(&layer(&h.sfk_pool, PLANE))).unwrap(),
        b.upload(&sf(&layer(&h.sfv_pool, PLANE))).unwrap(),
        PAGES,
    )
    .unwrap();
    let owned_batch = VerifyBatch::<B, Row>::new(
        Tensor::from_host(b, "qkvr", &h.qkvr[..T * ROW], T).unwrap(),
        Tensor::from_host(b, "cache_indices", &h.cache_indices, SEQS).unwrap(),
        Tensor::from_host(b, "cache_mask", &h.cache_mask, SEQS).unwrap(),
        tensor(&h.loc),
        Some(Tensor::from_host(b, "tau", &h.tau, T).unwrap()),
        Q,
    )
    .unwrap();
    let mut owned_out = Mxfp8Outputs::<B, DQ, DKV>::zeros(b, T).unwrap();
    let mut owned_windows = VerifyWindows::<B, DKV, Conv>::zeros(b, SEQS, Q).unwrap();
    let mut owned_conv = conv();
    kernel
        .run(
            b,
            &weights,
            &mut owned_conv,
            (&owned_batch, &mut owned_windows),
            PrologueTargets {
                out: &mut owned_out,
                kv: &mut owned_kv,
                errors: None,
            },
        )
        .unwrap();

    // Views: the pool, the GEMM output, and output buffers with 3 spare rows each.
    let mut k_pool = b.upload(&e4(&h.k_pool)).unwrap();
    let mut v_pool = b.upload(&e4(&h.v_pool)).unwrap();
    let mut sfk_pool = b.upload(&sf(&h.sfk_pool)).unwrap();
    let mut sfv_pool = b.upload(&sf(&h.sfv_pool)).unwrap();
    let gemm = b.upload(&h.qkvr).unwrap();
    let poison_q = vec![F8E4M3::from_bits(0x7F); (T + 3) * DQ];
    let mut q_buf = b.upload(&poison_q).unwrap();
    let mut qs_buf = b.upload(&vec![E8M0(0xFF); (T + 3) * DQ / 32]).unwrap();
    let mut k_buf = b.upload(&vec![bf16::NAN; (T + 3) * DKV]).unwrap();
    let mut v_buf = b.upload(&vec![bf16::NAN; (T + 3) * DKV]).unwrap();
    {
        let mut k_layers = B::chunks_exact_mut(&mut k_pool, SLOTS * DKV).unwrap();
        let mut v_layers = B::chunks_exact_mut(&mut v_pool, SLOTS * DKV).unwrap();
        let mut sfk_layers = B::chunks_exact_mut(&mut sfk_pool, PLANE).unwrap();
        let mut sfv_layers = B::chunks_exact_mut(&mut sfv_pool, PLANE).unwrap();
        let mut kv = Mxfp8KvCache::from_parts(
            Mxfp8KvParts {
                k: TensorViewMut::from_slice_mut("k_buf", k_layers.swap_remove(1), SLOTS).unwrap(),
                v: TensorViewMut::from_slice_mut("v_buf", v_layers.swap_remove(1), SLOTS).unwrap(),
                k_scales: TensorViewMut::from_slice_mut("sfk", sfk_layers.swap_remove(1), PAGES)
                    .unwrap(),
                v_scales: TensorViewMut::from_slice_mut("sfv", sfv_layers.swap_remove(1), PAGES)
                    .unwrap(),
            },
            PAGES,
        )
        .unwrap();
        let qkvr = TensorView::<B, bf16, QkvrRow<Row>>::from_slice(
            "qkvr",
            B::slice_range(&gemm, 0..T * ROW).unwrap(),
            T,
        )
        .unwrap();
        let batch = VerifyBatch::new(
            qkvr,
            idx.view(),
            mask.view(),
            loc.view(),
            Some(tau.view()),
            Q,
        )
        .unwrap();
        let first = |n: usize| n * T; // elements of the first T rows
        let mut out = Mxfp8Outputs::new(
            TensorViewMut::from_slice_mut("q_out", head_mut::<B, _>(&mut q_buf, first(DQ)), T)
                .unwrap(),
            TensorViewMut::from_slice_mut(
                "q_scale",
                head_mut::<B, _>(&mut qs_buf, first(DQ / 32)),
                T,
            )
            .unwrap(),
            TensorViewMut::from_slice_mut("k_out", head_mut::<B, _>(&mut k_buf, first(DKV)), T)
                .unwrap(),
            TensorViewMut::from_slice_mut("v_out", head_mut::<B, _>(&mut v_buf, first(DKV)), T)
                .unwrap(),
        )
        .unwrap();
        let mut windows = VerifyWindows::<B, DKV, Conv>::zeros(b, SEQS, Q).unwrap();
        let mut conv = conv();
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
        // The view and the owned run agree on everything they wrote.
        let same = |a: Vec<u8>, c: Vec<u8>, what: &str| assert!(a == c, "{what} differs");
        same(
            bytes(&kv.k().to_host(b).unwrap(), |x| x.to_bits()),
            bytes(&owned_kv.k().to_host(b).unwrap(), |x| x.to_bits()),
            "k pool layer",
        );
        same(
            bytes(&kv.v_scales().to_host(b).unwrap(), |x| x.0),
            bytes(&owned_kv.v_scales().to_host(b).unwrap(), |x| x.0),
            "v scales layer",
        );
        same(
            bytes(&out.q().to_host(b).unwrap(), |x| x.to_bits()),
            bytes(&owned_out.q().to_host(b).unwrap(), |x| x.to_bits()),
            "q_out",
        );
        assert_eq!(
            out.k()
                .to_host(b)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            owned_out
                .k()
                .to_host(b)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            "k_out differs"
        );
        assert_eq!(
            windows
                .k()
                .to_host(b)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            owned_windows
                .k()
                .to_host(b)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            "windows differ"
        );
    }
    // Outside the views nothing changed: layers 0 and 2 of the pool, the spare output rows.
    let k_after: Vec<u8> = b
        .download(&k_pool)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let per = SLOTS * DKV;
    assert!(
        k_after[..per] == h.k_pool[..per],
        "layer 0 of the K pool changed"
    );
    assert!(
        k_after[2 * per..] == h.k_pool[2 * per..],
        "layer 2 of the K pool changed"
    );
    let sfk_after: Vec<u8> = b.download(&sfk_pool).unwrap().iter().map(|x| x.0).collect();
    assert!(
        sfk_after[..PLANE] == h.sfk_pool[..PLANE]
            && sfk_after[2 * PLANE..] == h.sfk_pool[2 * PLANE..]
    );
    let q_after = b.download(&q_buf).unwrap();
    assert!(
        q_after[T * DQ..].iter().all(|x| x.to_bits() == 0x7F),
        "spare q rows changed"
    );
    let k_out_after = b.download(&k_buf).unwrap();
    assert!(
        k_out_after[T * DKV..].iter().all(|x| x.is_nan()),
        "spare k_out rows changed"
    );
    // Slots not in `loc` of layer 1 are byte-identical: the owned run checked the rest.
    let layer1: Vec<u8> = k_after[per..2 * per].to_vec();
    let stored: std::collections::HashSet<usize> = h
        .loc
        .iter()
        .filter(|&&l| l >= 0)
        .map(|&l| l as usize)
        .collect();
    let rewritten = stored
        .iter()
        .filter(|&&slot| {
            layer1[slot * DKV..(slot + 1) * DKV]
                != h.k_pool[per + slot * DKV..per + (slot + 1) * DKV]
        })
        .count();
    assert!(
        rewritten > stored.len() / 2,
        "the slots in `loc` were not written ({rewritten} of {})",
        stored.len()
    );
    for slot in 0..SLOTS {
        if !stored.contains(&slot) {
            assert!(
                layer1[slot * DKV..(slot + 1) * DKV]
                    == h.k_pool[per + slot * DKV..per + (slot + 1) * DKV],
                "slot {slot} not in loc changed"
            );
        }
    }
}

/// The first `n` elements of `buf`, borrowed mutably (the rest stays outside the view).
fn head_mut<B: Backend, T: shapeproof::backend::Element>(
    buf: &mut B::Buffer<T>,
    n: usize,
) -> B::SliceMut<'_, T> {
    B::slice_range_mut(buf, 0..n).expect("a head inside the buffer")
}

/// Wrong-length views are refused, naming the argument.
pub fn wrong_views_are_errors<B: RunSparseMla>(b: &B) {
    let pool = b.zeros::<F8E4M3>(100 * 576).unwrap();
    names(
        TensorView::<B, F8E4M3, Cols<576>>::from_slice(
            "kv",
            B::slice_range(&pool, 0..576 * 10 - 1).unwrap(),
            10,
        ),
        "kv",
    );
    assert!(B::slice_range(&pool, 0..100 * 576 + 1).is_none());
    let mut out = b.zeros::<bf16>(1000).unwrap();
    assert!(B::chunks_exact_mut(&mut out, 0).is_none());
    assert!(B::chunks_exact_mut(&mut out, 300).is_none());
    assert!(B::slice_range_mut(&mut out, 990..1001).is_none());
}

/// The sparse MLA prefill reading the latent KV as a range of a larger cache and q as rows of
/// a larger buffer, writing into the first rows of larger outputs: the same bytes as owned.
pub fn sparse_mla_through_views<B: RunSparseMla>(b: &B, rng: &mut StdRng) {
    const D: usize = 576;
    const H: usize = 16;
    const K: usize = 128;
    let (s_q, s_kv, extra) = (5, 300, 40);
    let q_host = e4m3_normal(rng, (s_q + 2) * H * D, 0.5);
    let kv_host = e4m3_normal(rng, (s_kv + extra) * D, 0.5);
    let idx: Vec<i32> = (0..s_q * K)
        .map(|_| rng.random_range(-5..s_kv as i32 + 5))
        .collect();
    let kernel = SparseMlaPrefill::<D, 64, K, Plain, H>::new();
    let idx_t = Tensor::<B, i32, Cols<K>>::from_host(b, "indices", &idx, s_q).unwrap();
    let scale = Tensor::<B, f32>::from_host(b, "q_scale", &[0.5], 1).unwrap();
    // Owned.
    let inputs = SparseMlaInputs::<B, D, H, K, Plain>::new(
        Tensor::from_host(b, "q", &q_host[..s_q * H * D], s_q).unwrap(),
        Tensor::from_host(b, "q_scale", &[0.5], 1).unwrap(),
        Tensor::from_host(b, "indices", &idx, s_q).unwrap(),
        0.07,
    )
    .unwrap();
    let kv =
        MlaLatentKv::<B, D>::new(b, b.upload(&kv_host[..s_kv * D]).unwrap(), s_kv, 0.25).unwrap();
    let (mut o, mut m, mut l) = (
        Tensor::zeros(b, s_q).unwrap(),
        Tensor::zeros(b, s_q).unwrap(),
        Tensor::zeros(b, s_q).unwrap(),
    );
    kernel.run(b, &inputs, &kv, &mut o, &mut m, &mut l).unwrap();
    // Views.
    let q_buf = b.upload(&q_host).unwrap();
    let kv_buf = b.upload(&kv_host).unwrap();
    let kv_scale = Tensor::<B, f32>::from_host(b, "kv_scale", &[0.25], 1).unwrap();
    let view_inputs = SparseMlaInputs::<B, D, H, K, Plain, _>::new(
        TensorView::from_slice("q", B::slice_range(&q_buf, 0..s_q * H * D).unwrap(), s_q).unwrap(),
        scale.view(),
        idx_t.view(),
        0.07,
    )
    .unwrap();
    let view_kv = MlaLatentKv::<B, D, _>::from_tensors(
        TensorView::from_slice("kv", B::slice_range(&kv_buf, 0..s_kv * D).unwrap(), s_kv).unwrap(),
        kv_scale.view(),
    )
    .unwrap();
    let mut out_buf = b.upload(&vec![bf16::NAN; (s_q + 1) * H * 512]).unwrap();
    let mut ml_buf = b.upload(&vec![f32::NAN; (s_q + 1) * H]).unwrap();
    let mut lse_buf = b.upload(&vec![f32::NAN; (s_q + 1) * H]).unwrap();
    {
        let mut vo = TensorViewMut::from_slice_mut(
            "out",
            head_mut::<B, _>(&mut out_buf, s_q * H * 512),
            s_q,
        )
        .unwrap();
        let mut vm = TensorViewMut::from_slice_mut(
            "max_logits",
            head_mut::<B, _>(&mut ml_buf, s_q * H),
            s_q,
        )
        .unwrap();
        let mut vl =
            TensorViewMut::from_slice_mut("lse", head_mut::<B, _>(&mut lse_buf, s_q * H), s_q)
                .unwrap();
        kernel
            .run(b, &view_inputs, &view_kv, &mut vo, &mut vm, &mut vl)
            .unwrap();
    }
    let out_after = b.download(&out_buf).unwrap();
    let owned = o.to_host(b).unwrap();
    assert!(
        out_after[..s_q * H * 512]
            .iter()
            .zip(&owned)
            .all(|(a, c)| a.to_bits() == c.to_bits()),
        "out through views differs from owned"
    );
    assert!(
        out_after[s_q * H * 512..].iter().all(|x| x.is_nan()),
        "spare out row changed"
    );
    let lse_after = b.download(&lse_buf).unwrap();
    let lse_owned = l.to_host(b).unwrap();
    assert!(
        lse_after[..s_q * H]
            .iter()
            .zip(&lse_owned)
            .all(|(a, c)| a.to_bits() == c.to_bits())
    );
    assert!(lse_after[s_q * H..].iter().all(|x| x.is_nan()));
    let _ = m;
}

/// Views at offsets the kernels cannot access in 16-byte vectors (q, kv, out of the sparse MLA,
/// the quantizer's input and output) are refused on the GPU, naming the argument, and nothing
/// is written; the same views at 16-byte offsets run. The CPU backend has no such rule.
pub fn misaligned_views_are_errors<B>(b: &B, rng: &mut StdRng)
where
    B: RunSparseMla + shapeproof::ops::mxfp8_quantize::RunMxfp8Quantize,
{
    const D: usize = 576;
    const H: usize = 16;
    const K: usize = 128;
    let (s_q, s_kv) = (3, 200);
    let q_host = e4m3_normal(rng, (s_q + 1) * H * D, 0.5);
    let kv_host = e4m3_normal(rng, (s_kv + 1) * D, 0.5);
    let idx: Vec<i32> = (0..s_q * K)
        .map(|_| rng.random_range(0..s_kv as i32))
        .collect();
    let kernel = SparseMlaPrefill::<D, 64, K, Plain, H>::new();
    let idx_t = Tensor::<B, i32, Cols<K>>::from_host(b, "indices", &idx, s_q).unwrap();
    let scale = Tensor::<B, f32>::from_host(b, "q_scale", &[0.5], 1).unwrap();
    let kv_scale = Tensor::<B, f32>::from_host(b, "kv_scale", &[0.25], 1).unwrap();
    let q_buf = b.upload(&q_host).unwrap();
    let kv_buf = b.upload(&kv_host).unwrap();
    let mut out_buf = b.upload(&vec![bf16::NAN; (s_q * H + 1) * 512]).unwrap();
    let mut ml_buf = b.zeros::<f32>(s_q * H).unwrap();
    let mut lse_buf = b.zeros::<f32>(s_q * H).unwrap();
    // q at byte offset `qo`, kv at `ko`, out at element offset `oo`.
    let mut run = |out_buf: &mut B::Buffer<bf16>, qo: usize, ko: usize, oo: usize| {
        let inputs = SparseMlaInputs::<B, D, H, K, Plain, _>::new(
            TensorView::from_slice(
                "q",
                B::slice_range(&q_buf, qo..qo + s_q * H * D).unwrap(),
                s_q,
            )
            .unwrap(),
            scale.view(),
            idx_t.view(),
            0.07,
        )
        .unwrap();
        let kv = MlaLatentKv::<B, D, _>::from_tensors(
            TensorView::from_slice(
                "kv",
                B::slice_range(&kv_buf, ko..ko + s_kv * D).unwrap(),
                s_kv,
            )
            .unwrap(),
            kv_scale.view(),
        )
        .unwrap();
        let mut out = TensorViewMut::from_slice_mut(
            "out",
            B::slice_range_mut(out_buf, oo..oo + s_q * H * 512).unwrap(),
            s_q,
        )
        .unwrap();
        let mut ml = TensorViewMut::from_slice_mut(
            "max_logits",
            head_mut::<B, _>(&mut ml_buf, s_q * H),
            s_q,
        )
        .unwrap();
        let mut lse =
            TensorViewMut::from_slice_mut("lse", head_mut::<B, _>(&mut lse_buf, s_q * H), s_q)
                .unwrap();
        kernel.run(b, &inputs, &kv, &mut out, &mut ml, &mut lse)
    };
    names(run(&mut out_buf, 1, 0, 0), "q");
    names(run(&mut out_buf, D / 2 + 8, 0, 0), "q"); // 8 bytes past a 16-byte boundary
    names(run(&mut out_buf, 0, 4, 0), "kv");
    names(run(&mut out_buf, 0, 0, 2), "out"); // 4 bytes past one
    let untouched = b.download(&out_buf).unwrap();
    assert!(
        untouched.iter().all(|x| x.is_nan()),
        "a refused call wrote out"
    );
    run(&mut out_buf, 16, D, 8).expect("16-byte offsets are accepted");
    let written = b.download(&out_buf).unwrap();
    assert!(
        written[..8].iter().all(|x| x.is_nan()),
        "out before the view changed"
    );
    assert!(
        !written[8..8 + s_q * H * 512].iter().any(|x| x.is_nan()),
        "out not written"
    );

    // The quantizer reads bf16 and writes e4m3 in 16-byte vectors.
    use shapeproof::ops::mxfp8_quantize::Mxfp8Quantize;
    use shapeproof::tensor::BlockScales;
    const W: usize = 128;
    let x = bf16_normal(rng, 4 * W + 8, 0.0, 1.0);
    let x_buf = b.upload(&x).unwrap();
    let mut data_buf = b.zeros::<F8E4M3>(4 * W + 16).unwrap();
    let mut scale_buf = b.zeros::<E8M0>(4 * W / 32).unwrap();
    let mut quantize = |xo: usize, dout: usize| {
        let input = TensorView::<B, bf16, Cols<W>>::from_slice(
            "input",
            B::slice_range(&x_buf, xo..xo + 4 * W).unwrap(),
            4,
        )
        .unwrap();
        let mut data = TensorViewMut::<B, F8E4M3, Cols<W>>::from_slice_mut(
            "data",
            B::slice_range_mut(&mut data_buf, dout..dout + 4 * W).unwrap(),
            4,
        )
        .unwrap();
        let mut scales = TensorViewMut::<B, E8M0, BlockScales<W>>::from_slice_mut(
            "scales",
            B::slice_range_mut(&mut scale_buf, 0..4 * W / 32).unwrap(),
            4,
        )
        .unwrap();
        Mxfp8Quantize::<W>::new().run(b, &input, &mut data, &mut scales)
    };
    names(quantize(1, 0), "input");
    names(quantize(0, 8), "data");
    quantize(8, 16).expect("16-byte offsets are accepted");
}
