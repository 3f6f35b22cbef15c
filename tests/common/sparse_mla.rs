//! Sparse MLA scenarios: random e4m3 inputs with invalid, out-of-range and duplicate indices,
//! empty rows, top-k lengths outside `[0, topk]` and sinks; run on any backend.

use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::dim::Dim;
use shapeproof::dtype::{F8E4M3, bf16};
use shapeproof::layout::MlaLatentKv;
use shapeproof::ops::sparse_mla::*;
use shapeproof::rules::MlaHeadDim;
use shapeproof::tensor::{Cols, Tensor};

use super::e4m3_normal;

/// Host inputs of one call.
#[derive(Clone, Debug)]
pub struct MlaScenario {
    pub s_q: usize,
    pub s_kv: usize,
    pub q: Vec<F8E4M3>,
    pub kv: Vec<F8E4M3>,
    pub indices: Vec<i32>,
    pub topk_length: Vec<i32>,
    pub sink: Vec<f32>,
    pub q_scale: f32,
    pub kv_scale: f32,
    pub sm_scale: f32,
}

impl MlaScenario {
    /// Fresh inputs: `std` is the spread of q and kv before the e4m3 cast.
    #[allow(clippy::too_many_arguments)]
    pub fn random(
        rng: &mut StdRng,
        s_q: usize,
        s_kv: usize,
        heads: usize,
        d_qk: usize,
        topk: usize,
        std: f32,
        sm_scale: f32,
    ) -> Self {
        let mut indices: Vec<i32> = (0..s_q * topk)
            .map(|_| rng.random_range(0..s_kv as i32))
            .collect();
        for row in indices.chunks_mut(topk) {
            for j in 0..topk {
                match rng.random_range(0..100) {
                    0..8 => row[j] = -1,
                    8..10 => row[j] = s_kv as i32 + rng.random_range(0..1000),
                    10 => row[j] = i32::MAX,
                    11 => row[j] = i32::MIN,
                    12..16 if j > 0 => row[j] = row[j - 1], // duplicate
                    _ => {}
                }
            }
        }
        // Row 1 has no valid index at all.
        if s_q > 1 {
            indices[topk..2 * topk].fill(-1);
        }
        let mut topk_length: Vec<i32> = (0..s_q)
            .map(|_| rng.random_range(0..=topk as i32))
            .collect();
        for (i, special) in [0, -3, topk as i32 + 77, topk as i32, 1]
            .into_iter()
            .enumerate()
        {
            if i + 2 < s_q {
                topk_length[i + 2] = special;
            }
        }
        let mut sink: Vec<f32> = (0..heads)
            .map(|_| rng.random::<f32>() * 4.0 - 2.0)
            .collect();
        if heads > 3 {
            sink[1] = f32::INFINITY;
            sink[2] = f32::NEG_INFINITY;
        }
        Self {
            s_q,
            s_kv,
            q: e4m3_normal(rng, s_q * heads * d_qk, std),
            kv: e4m3_normal(rng, s_kv * d_qk, std),
            indices,
            topk_length,
            sink,
            q_scale: 1.0 + rng.random::<f32>(),
            kv_scale: 0.5 + rng.random::<f32>(),
            sm_scale,
        }
    }
}

/// The three outputs, as host values.
#[derive(Clone, Debug)]
pub struct MlaObserved {
    pub out: Vec<bf16>,
    pub max_logits: Vec<f32>,
    pub lse: Vec<f32>,
}

/// Which optional inputs a run passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Plain,
    Length,
    LengthAndSink,
}

/// Runs `sc` through `SparseMlaPrefill<D_QK, H_Q, TOPK, _, HEADS>` with head tiling `tiling`
/// (which only the CUDA backend reads) on backend `b`, outputs poisoned (NaN) before the call.
pub fn run<
    B: RunSparseMla,
    const D_QK: usize,
    const H_Q: usize,
    const TOPK: usize,
    const HEADS: usize,
>(
    b: &B,
    sc: &MlaScenario,
    variant: Variant,
    tiling: HeadTiling,
) -> MlaObserved
where
    Dim<D_QK>: MlaHeadDim,
    Dim<H_Q>: shapeproof::rules::HeadTile,
    Dim<TOPK>: shapeproof::rules::TopkWidth,
    Dim<HEADS>: shapeproof::rules::PadsTo<H_Q>,
{
    let kv =
        MlaLatentKv::<B, D_QK>::new(b, b.upload(&sc.kv).unwrap(), sc.s_kv, sc.kv_scale).unwrap();
    let inputs = SparseMlaInputs::<B, D_QK, HEADS, TOPK, Plain>::new(
        Tensor::from_host(b, "q", &sc.q, sc.s_q).unwrap(),
        Tensor::from_host(b, "q_scale", &[sc.q_scale], 1).unwrap(),
        Tensor::from_host(b, "indices", &sc.indices, sc.s_q).unwrap(),
        sc.sm_scale,
    )
    .unwrap();
    let mut out = Tensor::<B, bf16, OutRow<HEADS>>::filled(b, sc.s_q, bf16::NAN).unwrap();
    let mut max_logits = Tensor::<B, f32, Cols<HEADS>>::filled(b, sc.s_q, f32::NAN).unwrap();
    let mut lse = Tensor::<B, f32, Cols<HEADS>>::filled(b, sc.s_q, f32::NAN).unwrap();
    let length = || Tensor::from_host(b, "topk_length", &sc.topk_length, sc.s_q).unwrap();
    match variant {
        Variant::Plain => SparseMlaPrefill::<D_QK, H_Q, TOPK, Plain, HEADS>::new()
            .with_tiling(tiling)
            .run(b, &inputs, &kv, &mut out, &mut max_logits, &mut lse)
            .unwrap(),
        Variant::Length => {
            let inputs = inputs.with_topk_length(length()).unwrap();
            SparseMlaPrefill::<D_QK, H_Q, TOPK, WithLength, HEADS>::new()
                .with_tiling(tiling)
                .run(b, &inputs, &kv, &mut out, &mut max_logits, &mut lse)
                .unwrap()
        }
        Variant::LengthAndSink => {
            let sink = Tensor::from_host(b, "attn_sink", &sc.sink, 1).unwrap();
            let inputs = inputs
                .with_topk_length(length())
                .unwrap()
                .with_sink(sink)
                .unwrap();
            SparseMlaPrefill::<D_QK, H_Q, TOPK, WithLengthAndSink, HEADS>::new()
                .with_tiling(tiling)
                .run(b, &inputs, &kv, &mut out, &mut max_logits, &mut lse)
                .unwrap()
        }
    }
    MlaObserved {
        out: out.to_host(b).unwrap(),
        max_logits: max_logits.to_host(b).unwrap(),
        lse: lse.to_host(b).unwrap(),
    }
}
