//! Prologue scenarios: host inputs of one call, and runners that execute the typed API on any
//! backend and bring every output (and every side effect) back to the host as raw bits.

use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::backend::Backend;
use shapeproof::dim::Dim;
use shapeproof::dtype::{E8M0, F8E4M3, bf16};
use shapeproof::layout::{Mxfp8KvCache, PagedBf16Kv};
use shapeproof::ops::prologue::*;
use shapeproof::rules::{Mxfp8PageSize, Mxfp8Width, PageSize};
use shapeproof::tensor::Owned;
use shapeproof::tensor::Tensor;

use super::{bf16_normal, distinct, random_bytes};

/// Page size every scenario's KV pool uses.
pub const PAGE: usize = 128;
/// Conv width (Inkling).
pub const W: usize = 4;
const HISTORY: usize = W - 1;

/// Which entry point a scenario drives, with its sequence structure.
#[derive(Clone, Debug)]
pub enum Shape {
    /// `seqs` sequences of `draft_tokens` tokens.
    Verify { seqs: usize, draft_tokens: usize },
    /// Sequences of the given lengths.
    Extend {
        lens: Vec<usize>,
        track: bool,
        update: bool,
    },
    /// Independent tokens.
    Decode { tokens: usize, track: bool },
}

/// Host inputs of one prologue call.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub shape: Shape,
    pub dq: usize,
    pub dkv: usize,
    pub hd: usize,
    pub row: usize,
    pub tokens: usize,
    pub seqs: usize,
    pub qkvr: Vec<bf16>,
    pub q_gamma: Vec<bf16>,
    pub k_gamma: Vec<bf16>,
    pub k_weight: Vec<bf16>,
    pub v_weight: Vec<bf16>,
    pub conv_slots: usize,
    pub k_cache: Vec<bf16>,
    pub v_cache: Vec<bf16>,
    pub cache_indices: Vec<i32>,
    pub cache_mask: Vec<u8>,
    pub loc: Vec<i64>,
    pub tau: Option<Vec<f32>>,
    pub pages: usize,
    /// Random bytes the KV pool starts with (slots not in `loc` must keep them).
    pub kv_poison: Vec<u8>,
    pub cu_seqlens: Vec<i64>,
    pub seq_of_token: Vec<i32>,
    pub has_initial_state: Vec<u8>,
    pub track_rows: Vec<i64>,
    pub track_mask: Vec<u8>,
    pub track_dst: Vec<i64>,
}

impl Scenario {
    /// Fresh random inputs for `shape` at widths `dq`, `dkv` (head dim `hd`), with a packed row
    /// `[q | k | v | 16·hq extra]`.
    pub fn random(
        rng: &mut StdRng,
        shape: Shape,
        hd: usize,
        dq: usize,
        dkv: usize,
        tau: bool,
    ) -> Self {
        let row = dq + 2 * dkv + 16 * (dq / hd);
        let (tokens, seqs) = match &shape {
            Shape::Verify { seqs, draft_tokens } => (seqs * draft_tokens, *seqs),
            Shape::Extend { lens, .. } => (lens.iter().sum(), lens.len()),
            Shape::Decode { tokens, .. } => (*tokens, *tokens),
        };
        // Slots [0, seqs + 5) hold sequences' states, [seqs + 5, 2·seqs + 5) receive tracking.
        let conv_slots = 2 * seqs + 5;
        // Distinct conv slots; one padding sequence (-1) when there are several.
        let mut cache_indices: Vec<i32> = distinct(rng, seqs, seqs + 5)
            .into_iter()
            .map(|s| s as i32)
            .collect();
        if seqs > 1 {
            cache_indices[1] = -1;
        }
        let cache_mask: Vec<u8> = (0..seqs).map(|i| u8::from(i % 5 != 3)).collect();
        let pages = tokens.div_ceil(PAGE) + 2;
        let mut loc: Vec<i64> = distinct(rng, tokens, pages * PAGE)
            .into_iter()
            .map(|s| s as i64)
            .collect();
        if tokens > 2 {
            loc[2] = -1;
        }
        let (mut cu_seqlens, mut seq_of_token) = (vec![0i64], Vec::new());
        if let Shape::Extend { lens, .. } = &shape {
            for (s, &len) in lens.iter().enumerate() {
                cu_seqlens.push(cu_seqlens[s] + len as i64);
                seq_of_token.extend(std::iter::repeat_n(s as i32, len));
            }
        }
        let track_rows: Vec<i64> = (0..seqs * HISTORY)
            .map(|_| rng.random_range(0..tokens.max(1)) as i64)
            .collect();
        let track_mask: Vec<u8> = (0..seqs).map(|i| u8::from(i % 2 == 0)).collect();
        let track_dst: Vec<i64> = (0..seqs).map(|i| (seqs + 5 + i) as i64).collect();
        Self {
            shape,
            dq,
            dkv,
            hd,
            row,
            tokens,
            seqs,
            qkvr: bf16_normal(rng, tokens * row, 0.0, 1.0),
            q_gamma: bf16_normal(rng, hd, 1.0, 0.2),
            k_gamma: bf16_normal(rng, hd, 1.0, 0.2),
            k_weight: bf16_normal(rng, dkv * W, 0.0, 0.5),
            v_weight: bf16_normal(rng, dkv * W, 0.0, 0.5),
            conv_slots,
            k_cache: bf16_normal(rng, conv_slots * HISTORY * dkv, 0.0, 1.0),
            v_cache: bf16_normal(rng, conv_slots * HISTORY * dkv, 0.0, 1.0),
            cache_indices,
            cache_mask,
            loc,
            tau: tau.then(|| {
                (0..tokens)
                    .map(|_| 1.0 + rng.random::<f32>() * 0.3)
                    .collect()
            }),
            pages,
            kv_poison: random_bytes(rng, 4 * pages * PAGE * dkv),
            cu_seqlens,
            seq_of_token,
            has_initial_state: (0..seqs).map(|i| u8::from(i % 3 != 2)).collect(),
            track_rows,
            track_mask,
            track_dst,
        }
    }
}

impl Scenario {
    /// Plants indices that point outside their buffers: a `loc` beyond the pool, a conv slot
    /// beyond the cache, an extend token of a nonexistent sequence, a tracked row beyond the
    /// batch and a tracking destination beyond the cache. The device must skip and count them.
    pub fn inject_bad_indices(&mut self) {
        let slots = (self.pages * PAGE) as i64;
        self.loc[0] = slots + 7;
        self.cache_indices[0] = self.conv_slots as i32 + 3;
        if let Shape::Extend { .. } = self.shape {
            let last = self.tokens - 1;
            self.seq_of_token[last] = self.seqs as i32 + 2;
        }
        self.track_rows[0] = self.tokens as i64 + 5;
        if self.track_dst.len() > 2 {
            self.track_dst[2] = self.conv_slots as i64 + 1;
        }
    }
}

/// Everything a call produced or changed, as raw bits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// q as bf16 bits, or e4m3 bytes.
    pub q: Vec<u16>,
    pub q_scales: Vec<u8>,
    pub k_out: Vec<bf16>,
    pub v_out: Vec<bf16>,
    /// KV pool K and V as raw bytes (bf16 little-endian or e4m3).
    pub kv_k: Vec<u8>,
    pub kv_v: Vec<u8>,
    pub sfk: Vec<u8>,
    pub sfv: Vec<u8>,
    pub k_cache: Vec<bf16>,
    pub v_cache: Vec<bf16>,
    pub k_inter: Vec<bf16>,
    pub v_inter: Vec<bf16>,
    pub bad_indices: u32,
}

/// Poison for outputs: NaN in every format.
const BF16_NAN: bf16 = bf16::from_bits(0x7FFF);

/// A store the tests can set up and read back on any backend.
pub trait TestStore: Store {
    fn outputs<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        tokens: usize,
    ) -> Self::Outputs<B, DQ, DKV, Owned>;
    fn observe<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        out: &Self::Outputs<B, DQ, DKV, Owned>,
        seen: &mut Observed,
    );
}

/// A KV cache the tests can fill with the scenario's poison and read back.
pub trait TestCache<B: Backend>: Sized {
    fn make(b: &B, sc: &Scenario) -> Self;
    fn observe(&self, b: &B, seen: &mut Observed);
}

impl<B: Backend> TestCache<B> for () {
    fn make(_: &B, _: &Scenario) {}
    fn observe(&self, _: &B, _: &mut Observed) {}
}

impl<B: Backend, const P: usize, const DKV: usize> TestCache<B> for PagedBf16Kv<B, P, DKV>
where
    Dim<P>: PageSize,
{
    fn make(b: &B, sc: &Scenario) -> Self {
        assert_eq!(P, PAGE);
        let n = sc.pages * PAGE * DKV; // elements per buffer
        let k = bf16_from_bytes(&sc.kv_poison[..2 * n]);
        let v = bf16_from_bytes(&sc.kv_poison[2 * n..4 * n]);
        PagedBf16Kv::from_buffers(b.upload(&k).unwrap(), b.upload(&v).unwrap(), sc.pages).unwrap()
    }
    fn observe(&self, b: &B, seen: &mut Observed) {
        seen.kv_k = bits(&self.k().to_host(b).unwrap());
        seen.kv_v = bits(&self.v().to_host(b).unwrap());
    }
}

impl<B: Backend, const P: usize, const DKV: usize> TestCache<B> for Mxfp8KvCache<B, P, DKV>
where
    Dim<P>: Mxfp8PageSize,
    Dim<DKV>: Mxfp8Width,
{
    fn make(b: &B, sc: &Scenario) -> Self {
        assert_eq!(P, PAGE);
        let slots = sc.pages * PAGE;
        let e4 =
            |bytes: &[u8]| -> Vec<F8E4M3> { bytes.iter().map(|&x| F8E4M3::from_bits(x)).collect() };
        let sf = |bytes: &[u8]| -> Vec<E8M0> { bytes.iter().map(|&x| E8M0(x)).collect() };
        let (n, plane) = (slots * DKV, sc.pages * (DKV / 128) * P * 4);
        let planes = &sc.kv_poison[2 * n..];
        Mxfp8KvCache::from_buffers(
            b.upload(&e4(&sc.kv_poison[..n])).unwrap(),
            b.upload(&e4(&sc.kv_poison[n..2 * n])).unwrap(),
            b.upload(&sf(&planes[..plane])).unwrap(),
            b.upload(&sf(&planes[plane..2 * plane])).unwrap(),
            sc.pages,
        )
        .unwrap()
    }
    fn observe(&self, b: &B, seen: &mut Observed) {
        seen.kv_k = self
            .k()
            .to_host(b)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        seen.kv_v = self
            .v()
            .to_host(b)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        seen.sfk = self
            .k_scales()
            .to_host(b)
            .unwrap()
            .iter()
            .map(|x| x.0)
            .collect();
        seen.sfv = self
            .v_scales()
            .to_host(b)
            .unwrap()
            .iter()
            .map(|x| x.0)
            .collect();
    }
}

fn bits(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

fn bf16_from_bytes(b: &[u8]) -> Vec<bf16> {
    b.chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

fn read_bf16_outputs<B: Backend, const DQ: usize, const DKV: usize>(
    b: &B,
    out: &Bf16Outputs<B, DQ, DKV>,
    seen: &mut Observed,
) {
    seen.q = out
        .q()
        .to_host(b)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    seen.k_out = out.k().to_host(b).unwrap();
    seen.v_out = out.v().to_host(b).unwrap();
}

fn bf16_outputs<B: Backend, const DQ: usize, const DKV: usize>(
    b: &B,
    tokens: usize,
) -> Bf16Outputs<B, DQ, DKV> {
    Bf16Outputs::new(
        Tensor::filled(b, tokens, BF16_NAN).unwrap(),
        Tensor::filled(b, tokens, BF16_NAN).unwrap(),
        Tensor::filled(b, tokens, BF16_NAN).unwrap(),
    )
    .unwrap()
}

impl TestStore for NoStore {
    fn outputs<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        tokens: usize,
    ) -> Bf16Outputs<B, DQ, DKV> {
        bf16_outputs(b, tokens)
    }
    fn observe<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        out: &Bf16Outputs<B, DQ, DKV>,
        seen: &mut Observed,
    ) {
        read_bf16_outputs(b, out, seen);
    }
}

impl<const P: usize> TestStore for Bf16Store<P> {
    fn outputs<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        tokens: usize,
    ) -> Bf16Outputs<B, DQ, DKV> {
        bf16_outputs(b, tokens)
    }
    fn observe<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        out: &Bf16Outputs<B, DQ, DKV>,
        seen: &mut Observed,
    ) {
        read_bf16_outputs(b, out, seen);
    }
}

impl<const P: usize> TestStore for Mxfp8Store<P> {
    fn outputs<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        tokens: usize,
    ) -> Mxfp8Outputs<B, DQ, DKV> {
        Mxfp8Outputs::new(
            Tensor::filled(b, tokens, F8E4M3::from_bits(0x7F)).unwrap(),
            Tensor::filled(b, tokens, E8M0(0xFF)).unwrap(),
            Tensor::filled(b, tokens, BF16_NAN).unwrap(),
            Tensor::filled(b, tokens, BF16_NAN).unwrap(),
        )
        .unwrap()
    }
    fn observe<B: Backend, const DQ: usize, const DKV: usize>(
        b: &B,
        out: &Mxfp8Outputs<B, DQ, DKV>,
        seen: &mut Observed,
    ) {
        seen.q = out
            .q()
            .to_host(b)
            .unwrap()
            .iter()
            .map(|x| x.to_bits() as u16)
            .collect();
        seen.q_scales = out
            .q_scales()
            .to_host(b)
            .unwrap()
            .iter()
            .map(|x| x.0)
            .collect();
        seen.k_out = out.k().to_host(b).unwrap();
        seen.v_out = out.v().to_host(b).unwrap();
    }
}

fn weights<B: Backend, const HD: usize, const DKV: usize>(
    b: &B,
    sc: &Scenario,
) -> PrologueWeights<B, HD, DKV, InklingConv> {
    PrologueWeights::from_host(
        b,
        &sc.q_gamma,
        &sc.k_gamma,
        &sc.k_weight,
        &sc.v_weight,
        1e-6,
    )
    .unwrap()
}

fn conv<B: Backend, const DKV: usize>(b: &B, sc: &Scenario) -> ConvState<B, DKV, InklingConv> {
    ConvState::new(
        Tensor::from_host(b, "k_cache", &sc.k_cache, sc.conv_slots).unwrap(),
        Tensor::from_host(b, "v_cache", &sc.v_cache, sc.conv_slots).unwrap(),
    )
    .unwrap()
}

fn vec_tensor<B: Backend, T: shapeproof::backend::Element>(
    b: &B,
    name: &'static str,
    v: &[T],
) -> Tensor<B, T> {
    Tensor::from_host(b, name, v, v.len()).unwrap()
}

/// Runs `kernel` (whose variant matches `sc.shape`) on backend `b` and observes everything.
pub fn run<B, V, S, const HD: usize, const DQ: usize, const DKV: usize, L>(
    b: &B,
    kernel: &Prologue<V, S, HD, DQ, DKV, L, InklingConv>,
    sc: &Scenario,
) -> Observed
where
    B: RunPrologue,
    V: Variant,
    S: TestStore,
    L: QkvrLayout<DQ, DKV>,
    S::Cache<B, DKV, Owned>: KvCacheTarget<B> + TestCache<B>,
    Prologue<V, S, HD, DQ, DKV, L, InklingConv>: Dispatch<B, S, HD, DQ, DKV, L>,
{
    assert_eq!((sc.dq, sc.dkv, sc.hd, sc.row), (DQ, DKV, HD, L::ROW));
    let weights = weights::<B, HD, DKV>(b, sc);
    let mut conv = conv::<B, DKV>(b, sc);
    let mut out = S::outputs::<B, DQ, DKV>(b, sc.tokens);
    let mut cache = <S::Cache<B, DKV, Owned> as TestCache<B>>::make(b, sc);
    let mut errors = ErrorCounter::new(b).unwrap();
    let mut seen = Observed::default();
    kernel.dispatch(
        b,
        sc,
        &weights,
        &mut conv,
        &mut out,
        &mut cache,
        &mut errors,
        &mut seen,
    );
    S::observe(b, &out, &mut seen);
    cache.observe(b, &mut seen);
    seen.k_cache = conv.k().to_host(b).unwrap();
    seen.v_cache = conv.v().to_host(b).unwrap();
    seen.bad_indices = errors.read(b).unwrap();
    seen
}

/// Builds the variant's batch from a scenario and runs it.
pub trait Dispatch<B: Backend, S: Store, const HD: usize, const DQ: usize, const DKV: usize, L> {
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        b: &B,
        sc: &Scenario,
        weights: &PrologueWeights<B, HD, DKV, InklingConv>,
        conv: &mut ConvState<B, DKV, InklingConv>,
        out: &mut S::Outputs<B, DQ, DKV, Owned>,
        cache: &mut S::Cache<B, DKV, Owned>,
        errors: &mut ErrorCounter<B>,
        seen: &mut Observed,
    );
}

fn qkvr<B: Backend, L: RowLayout>(b: &B, sc: &Scenario) -> Tensor<B, bf16, QkvrRow<L>> {
    Tensor::from_host(b, "qkvr", &sc.qkvr, sc.tokens).unwrap()
}

fn tau<B: Backend>(b: &B, sc: &Scenario) -> Option<Tensor<B, f32>> {
    sc.tau.as_ref().map(|t| vec_tensor(b, "tau", t))
}

impl<B, S, const HD: usize, const DQ: usize, const DKV: usize, L> Dispatch<B, S, HD, DQ, DKV, L>
    for Prologue<Verify, S, HD, DQ, DKV, L, InklingConv>
where
    B: RunPrologue,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    S::Cache<B, DKV, Owned>: KvCacheTarget<B>,
{
    fn dispatch(
        &self,
        b: &B,
        sc: &Scenario,
        weights: &PrologueWeights<B, HD, DKV, InklingConv>,
        conv: &mut ConvState<B, DKV, InklingConv>,
        out: &mut S::Outputs<B, DQ, DKV, Owned>,
        cache: &mut S::Cache<B, DKV, Owned>,
        errors: &mut ErrorCounter<B>,
        seen: &mut Observed,
    ) {
        let Shape::Verify { seqs, draft_tokens } = sc.shape else {
            panic!("not a verify scenario")
        };
        let batch = VerifyBatch::<B, L>::new(
            qkvr(b, sc),
            vec_tensor(b, "cache_indices", &sc.cache_indices),
            vec_tensor(b, "cache_mask", &sc.cache_mask),
            vec_tensor(b, "loc", &sc.loc),
            tau(b, sc),
            draft_tokens,
        )
        .unwrap();
        // One spare sequence of capacity, poisoned: rows of padding sequences must stay as they were.
        let poison = vec![BF16_NAN; (seqs + 1) * draft_tokens * HISTORY * DKV];
        let mut windows = VerifyWindows::new(
            Tensor::from_host(b, "k_inter", &poison, (seqs + 1) * draft_tokens).unwrap(),
            Tensor::from_host(b, "v_inter", &poison, (seqs + 1) * draft_tokens).unwrap(),
            draft_tokens,
        )
        .unwrap();
        self.run(
            b,
            weights,
            conv,
            (&batch, &mut windows),
            PrologueTargets {
                out,
                kv: cache,
                errors: Some(errors),
            },
        )
        .unwrap();
        seen.k_inter = windows.k().to_host(b).unwrap();
        seen.v_inter = windows.v().to_host(b).unwrap();
    }
}

impl<B, S, const HD: usize, const DQ: usize, const DKV: usize, L> Dispatch<B, S, HD, DQ, DKV, L>
    for Prologue<Extend, S, HD, DQ, DKV, L, InklingConv>
where
    B: RunPrologue,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    S::Cache<B, DKV, Owned>: KvCacheTarget<B>,
{
    fn dispatch(
        &self,
        b: &B,
        sc: &Scenario,
        weights: &PrologueWeights<B, HD, DKV, InklingConv>,
        conv: &mut ConvState<B, DKV, InklingConv>,
        out: &mut S::Outputs<B, DQ, DKV, Owned>,
        cache: &mut S::Cache<B, DKV, Owned>,
        errors: &mut ErrorCounter<B>,
        _: &mut Observed,
    ) {
        let Shape::Extend { track, update, .. } = sc.shape else {
            panic!("not an extend scenario")
        };
        let track = track.then(|| {
            ExtendTrack::new(
                Tensor::from_host(b, "track_rows", &sc.track_rows, sc.seqs).unwrap(),
                vec_tensor(b, "track_mask", &sc.track_mask),
                vec_tensor(b, "track_dst", &sc.track_dst),
            )
            .unwrap()
        });
        let batch = ExtendBatch::<B, L, InklingConv>::new(ExtendBatchParts {
            qkvr: qkvr(b, sc),
            cu_seqlens: vec_tensor(b, "cu_seqlens", &sc.cu_seqlens),
            seq_of_token: vec_tensor(b, "seq_of_token", &sc.seq_of_token),
            cache_indices: vec_tensor(b, "cache_indices", &sc.cache_indices),
            cache_mask: vec_tensor(b, "cache_mask", &sc.cache_mask),
            has_initial_state: vec_tensor(b, "has_initial_state", &sc.has_initial_state),
            loc: vec_tensor(b, "loc", &sc.loc),
            tau: tau(b, sc),
            track,
            update_conv_state: update,
        })
        .unwrap();
        self.run(
            b,
            weights,
            conv,
            &batch,
            PrologueTargets {
                out,
                kv: cache,
                errors: Some(errors),
            },
        )
        .unwrap();
    }
}

impl<B, S, const HD: usize, const DQ: usize, const DKV: usize, L> Dispatch<B, S, HD, DQ, DKV, L>
    for Prologue<Decode, S, HD, DQ, DKV, L, InklingConv>
where
    B: RunPrologue,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    S::Cache<B, DKV, Owned>: KvCacheTarget<B>,
{
    fn dispatch(
        &self,
        b: &B,
        sc: &Scenario,
        weights: &PrologueWeights<B, HD, DKV, InklingConv>,
        conv: &mut ConvState<B, DKV, InklingConv>,
        out: &mut S::Outputs<B, DQ, DKV, Owned>,
        cache: &mut S::Cache<B, DKV, Owned>,
        errors: &mut ErrorCounter<B>,
        _: &mut Observed,
    ) {
        let Shape::Decode { track, .. } = sc.shape else {
            panic!("not a decode scenario")
        };
        let track = track.then(|| {
            DecodeTrack::new(
                vec_tensor(b, "track_mask", &sc.track_mask),
                vec_tensor(b, "track_indices", &sc.track_dst),
            )
            .unwrap()
        });
        let batch = DecodeBatch::<B, L>::new(
            qkvr(b, sc),
            vec_tensor(b, "cache_indices", &sc.cache_indices),
            vec_tensor(b, "cache_mask", &sc.cache_mask),
            vec_tensor(b, "loc", &sc.loc),
            tau(b, sc),
            track,
        )
        .unwrap();
        self.run(
            b,
            weights,
            conv,
            &batch,
            PrologueTargets {
                out,
                kv: cache,
                errors: Some(errors),
            },
        )
        .unwrap();
    }
}
