//! The per-rank geometry of each layer kind, and the kernels' rules checked against it.
//!
//! Each check mirrors one rule trait of `shapeproof::rules` (same limits, same wording) and
//! reports at the span of the field the user has to change. The generated code names the same
//! traits again (`emit.rs`), so the type checker confirms every number computed here.

use crate::config::{Body, LayerKind, MlaModel, Model, PrologueModel, StoreChoice};
use crate::source::Sourced;

/// Tensor-parallel degrees of the `ShardsHeads` / `ShardsKvHeads` tables.
const TP_DEGREES: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Largest head count of the tensor-parallel tables (`MAX_HEADS`).
const MAX_HEADS: u64 = 256;
/// Largest width of the `Mxfp8Width` / `WholeHeads` tables (`MAX_WIDTH`).
const MAX_WIDTH: u64 = 16384;
/// Largest packed-row offset of the `RowOffset` table (`MAX_ROW_OFFSET`).
const MAX_ROW: u64 = 32768;
/// Largest page of the `PageSize` table (`MAX_PAGE`).
const MAX_PAGE: u64 = 4096;
/// Largest top-k width of the `TopkWidth` table (`MAX_TOPK`).
const MAX_TOPK: u64 = 8192;
/// Largest padded head count of the `HeadTile` table (`MAX_HEAD_TILE`).
const MAX_HEAD_TILE: u64 = 1024;
/// Query heads per wide sparse-MLA tile.
const HEAD_TILE: u64 = 64;
/// Narrow sparse-MLA head tiles the model macro picks, smallest first: each measured faster than
/// the padded 64-head tile on the H200 (bench/RESULTS.md), so 17..=32 heads per rank get the
/// 32-head tile and 33..=64 pad to 64 (which the CUDA backend runs in the 64-head kernel).
const NARROW_HEAD_TILES: [u64; 3] = [8, 16, 32];
/// Top-k columns per sparse-MLA loop step.
const TOPK_STEP: u64 = 128;
/// Latent (value) width of the sparse MLA prefill.
const MLA_D_V: u64 = 512;

/// What the macro emits for one model.
pub enum Plan {
    /// The layer kinds of an attention-prologue model.
    Prologue(Vec<PrologueKind>),
    /// The single attention kind of a sparse-MLA model.
    Mla(MlaKind),
}

/// The per-rank numbers of one tensor-parallel deployment.
pub struct Sharding {
    /// Query heads of the whole model.
    pub heads: u64,
    /// Query heads on each rank.
    pub hq: u64,
}

/// One layer kind of an attention-prologue model, per rank.
pub struct PrologueKind {
    /// Module name of the kind (`None`: items go into the model module itself).
    pub name: Option<(String, proc_macro2::Span)>,
    /// Query heads of the model and per rank.
    pub sharding: Sharding,
    /// KV heads of the whole model.
    pub kv_heads: u64,
    /// KV heads per rank, `max(1, kv_heads / TP)`.
    pub hkv: u64,
    /// Head dim.
    pub hd: u64,
    /// `hq · hd`.
    pub dq: u64,
    /// `hkv · hd`.
    pub dkv: u64,
    /// Relative-position features per q head.
    pub rel_head_dim: u64,
    /// The KV store the user asked for.
    pub store: StoreChoice,
    /// KV page size.
    pub page: u64,
    /// Conv width, SiLU, residual.
    pub conv: (u64, bool, bool),
}

impl PrologueKind {
    /// Offset of k in the packed row (`[q | k | v | rel]`).
    pub fn k_off(&self) -> u64 {
        self.dq
    }
    /// Offset of v.
    pub fn v_off(&self) -> u64 {
        self.dq + self.dkv
    }
    /// Offset of the relative-position features.
    pub fn rel_off(&self) -> u64 {
        self.dq + 2 * self.dkv
    }
    /// Width of the relative-position features, `hq · rel_head_dim`.
    pub fn rel(&self) -> u64 {
        self.sharding.hq * self.rel_head_dim
    }
    /// Elements per packed row.
    pub fn row(&self) -> u64 {
        self.rel_off() + self.rel()
    }
}

/// The sparse-MLA attention of a model, per rank.
pub struct MlaKind {
    /// Query heads of the model and per rank.
    pub sharding: Sharding,
    /// Per-rank heads rounded up to the head tile the macro picks (8, 16, 32 or a multiple of 64).
    pub hq_padded: u64,
    /// `kv_lora_rank + qk_rope_head_dim`.
    pub d_qk: u64,
    /// Latent width.
    pub kv_lora_rank: u64,
    /// RoPE channels.
    pub qk_rope_head_dim: u64,
    /// The model's top-k.
    pub index_topk: u64,
    /// The softmax scale the config implies, when it gives `qk_nope_head_dim`.
    pub softmax_scale: Option<f64>,
    /// Top-k rounded up to a multiple of 128 (indices padded with -1).
    pub topk: u64,
}

/// Checks the model against the kernels' rules and computes its per-rank geometry.
pub fn plan(model: &Model) -> syn::Result<Plan> {
    let tp = &model.tensor_parallel;
    if !TP_DEGREES.contains(&tp.value) {
        return Err(tp.at.error(
            format!("tensor-parallel degree `{}` is not supported", tp.value),
            "the tensor-parallel tables cover powers of two up to 64 (1, 2, 4, 8, 16, 32, 64)",
        ));
    }
    match &model.body {
        Body::Prologue(p) => p
            .kinds
            .iter()
            .map(|kind| prologue_kind(p, kind, tp))
            .collect::<syn::Result<_>>()
            .map(Plan::Prologue),
        Body::Mla(m) => mla(m, tp).map(Plan::Mla),
    }
}

/// " (layer kind `global`)", or nothing for a model with one kind.
fn in_kind(name: &Option<(String, proc_macro2::Span)>) -> String {
    match name {
        Some((name, _)) => format!(" (layer kind `{name}`)"),
        None => String::new(),
    }
}

/// `ShardsHeads`: the degree divides the query heads.
fn shard_heads(heads: &Sourced<u64>, tp: &Sourced<u64>, kind: &str) -> syn::Result<Sharding> {
    if heads.value == 0 || heads.value > MAX_HEADS {
        return Err(heads.at.error(
            format!("`{}` attention heads is not supported{kind}", heads.value),
            format!("the tensor-parallel tables cover 1 ..= {MAX_HEADS} heads"),
        ));
    }
    if !heads.value.is_multiple_of(tp.value) {
        return Err(tp.at.error(
            format!(
                "tensor-parallel degree `{}` does not divide {} attention heads{kind}",
                tp.value, heads.value
            ),
            "every rank must get the same number of query heads; choose a tensor-parallel degree that divides the head count (powers of two up to 64 are supported)",
        ));
    }
    Ok(Sharding {
        heads: heads.value,
        hq: heads.value / tp.value,
    })
}

fn prologue_kind(
    model: &PrologueModel,
    kind: &LayerKind,
    tp: &Sourced<u64>,
) -> syn::Result<PrologueKind> {
    let which = in_kind(&kind.name);
    let sharding = shard_heads(&kind.heads, tp, &which)?;

    // `ShardsKvHeads`: split evenly, or replicate when the degree exceeds the KV heads.
    let kv = &kind.kv_heads;
    if kv.value == 0 || kv.value > MAX_HEADS {
        return Err(kv.at.error(
            format!("`{}` KV heads is not supported{which}", kv.value),
            format!("the tensor-parallel tables cover 1 ..= {MAX_HEADS} KV heads"),
        ));
    }
    if !sharding.heads.is_multiple_of(kv.value) {
        return Err(kv.at.error(
            format!(
                "`{}` KV heads do not divide {} attention heads{which}",
                kv.value, sharding.heads
            ),
            "grouped-query attention gives every KV head the same number of query heads (heads / kv_heads); choose a KV head count that divides the attention heads",
        ));
    }
    if !kv.value.is_multiple_of(tp.value) && !tp.value.is_multiple_of(kv.value) {
        return Err(tp.at.error(
            format!(
                "tensor-parallel degree `{}` neither divides nor is a multiple of {} KV heads{which}",
                tp.value, kv.value
            ),
            "KV heads are split evenly, or replicated when the degree exceeds them: with TP > kv_heads each KV head is replicated on TP / kv_heads ranks, which needs kv_heads to divide TP",
        ));
    }
    let hkv = (kv.value / tp.value).max(1);

    // The head dim against the store (`Mxfp8Width`, `PrologueHeadDim`).
    let hd = &kind.head_dim;
    let store = &kind.store;
    match store.value {
        StoreChoice::Mxfp8 if !hd.value.is_multiple_of(128) => {
            return Err(hd.at.error(
                format!(
                    "`{}` is not a multiple of 128: MXFP8 fused prologue requires head_dim-aligned Q/K/V{which}",
                    hd.value
                ),
                "MXFP8 quantizes 32-element blocks inside 128-channel scale atoms, one atom per head; use head_dim 128, or `kv_store: bf16` / `kv_store: auto`, which also take head dims 64 and 256",
            ));
        }
        StoreChoice::Mxfp8 if hd.value != 128 => {
            return Err(hd.at.error(
                format!(
                    "head dim `{}` is not supported by the MXFP8 fused prologue{which}",
                    hd.value
                ),
                "the MXFP8 store is instantiated for 128-channel heads only (one scale atom per head); use `kv_store: bf16` or `kv_store: auto`, which take head dims 64, 128 and 256",
            ));
        }
        _ if ![64, 128, 256].contains(&hd.value) => {
            return Err(hd.at.error(
                format!(
                    "head dim `{}` is not supported by the fused prologue{which}",
                    hd.value
                ),
                "one head is normalized by one aligned group of 8-channel lanes; 64, 128 and 256 are instantiated (MXFP8 needs 128)",
            ));
        }
        _ => {}
    }

    // Widths (`Mxfp8Width` / `WholeHeads` tables end at MAX_WIDTH).
    let dq = sharding.hq * hd.value;
    let dkv = hkv * hd.value;
    for (what, width, heads) in [("q", dq, sharding.hq), ("kv", dkv, hkv)] {
        if width > MAX_WIDTH {
            return Err(tp.at.error(
                format!(
                    "per-rank {what} width `{width}` ({heads} heads × {}) is wider than {MAX_WIDTH}{which}",
                    hd.value
                ),
                format!(
                    "the prologue's width tables end at {MAX_WIDTH} channels per rank; use a higher tensor_parallel"
                ),
            ));
        }
    }

    // Page size (`PageSize`, `Mxfp8PageSize`).
    let page = &model.page_size;
    if page.value == 0 || !page.value.is_multiple_of(32) || page.value > MAX_PAGE {
        return Err(page.at.error(
            format!(
                "page size `{}` is not a positive multiple of 32",
                page.value
            ),
            format!(
                "KV pages are tiled in 32-token scale chunks: use 32, 64, 128, … (up to {MAX_PAGE})"
            ),
        ));
    }
    if store.value == StoreChoice::Mxfp8 && !page.value.is_multiple_of(128) {
        return Err(page.at.error(
            format!(
                "page size `{}` is not a multiple of 128, as the MXFP8 interleaved scale planes require",
                page.value
            ),
            "the scale planes are [pages, HKV, 32, PAGE/32, 4]: whole 128-row scale tiles per page, which block-scaled attention reads; use page_size 128, or `kv_store: auto`, which takes bf16 for such pages",
        ));
    }

    // Conv (`ConvWidth`).
    let w = &model.conv_width;
    if !(2..=8).contains(&w.value) {
        return Err(w.at.error(
            format!("conv width `{}` is not supported", w.value),
            "the short convolution needs a width W with 2 <= W <= 8: W - 1 history rows live in the conv-state cache; W = 1 would have no history, and widths above 8 are not instantiated",
        ));
    }

    let kind_plan = PrologueKind {
        name: kind.name.clone(),
        sharding,
        kv_heads: kv.value,
        hkv,
        hd: hd.value,
        dq,
        dkv,
        rel_head_dim: model.rel_head_dim.value,
        store: store.value,
        page: page.value,
        conv: (w.value, model.conv_silu, model.conv_residual),
    };

    // The packed row (`RowOffset`): q, k, v start on whole heads, so only the row length can
    // break the 8-element alignment, through the relative-position features. Bounded first,
    // so the row's arithmetic cannot overflow.
    let rel = &model.rel_head_dim;
    if rel.value > MAX_ROW {
        return Err(rel.at.error(
            format!("rel_head_dim `{}` is longer than a packed qkvr row can be ({MAX_ROW} elements)", rel.value),
            "the relative-position features of every q head sit in the packed row after q, k and v; the packed-row offset table ends at 32768 elements",
        ));
    }
    let row = kind_plan.row();
    if !row.is_multiple_of(8) {
        return Err(rel.at.error(
            format!(
                "packed qkvr row of `{row}` elements is not a multiple of 8{which}: rel_head_dim {} × {} q heads adds {} elements",
                rel.value,
                kind_plan.sharding.hq,
                kind_plan.rel()
            ),
            "each lane loads 8 channels as one 16-byte vector, so every row must start on a multiple of 8; choose rel_head_dim so that q heads per rank × rel_head_dim is a multiple of 8",
        ));
    }
    if row > MAX_ROW {
        return Err(tp.at.error(
            format!("packed qkvr row of `{row}` elements is longer than {MAX_ROW}{which}"),
            "the packed-row offset table ends there; use a higher tensor_parallel",
        ));
    }
    Ok(kind_plan)
}

fn mla(model: &MlaModel, tp: &Sourced<u64>) -> syn::Result<MlaKind> {
    let sharding = shard_heads(&model.heads, tp, "")?;

    // `MlaHeadDim`, and the value width the kernel hard-codes.
    let lora = &model.kv_lora_rank;
    let rope = &model.qk_rope_head_dim;
    if lora.value != MLA_D_V {
        return Err(lora.at.error(
            format!(
                "sparse MLA d_v `{}` (kv_lora_rank) is not supported",
                lora.value
            ),
            "the sparse MLA prefill reads values as the 512 latent channels of a row: kv_lora_rank must be 512",
        ));
    }
    let sum = lora.value.checked_add(rope.value);
    let d_qk = sum.unwrap_or(u64::MAX);
    if d_qk != 512 && d_qk != 576 {
        let shown = sum.map_or_else(|| "beyond u64".to_string(), |d| d.to_string());
        return Err(rope.at.error(
            format!(
                "sparse MLA d_qk `{shown}` (kv_lora_rank {} + qk_rope_head_dim {}) is not supported",
                lora.value, rope.value
            ),
            "the sparse MLA prefill supports d_qk = 512 or 576: 512 latent channels + 0 or 64 RoPE channels (DeepSeek V3.2: 576; GLM-5.3-Flash, DeepSeek V4: 512)",
        ));
    }

    // `HeadTile` / `PadsTo`: the fastest measured tile that holds the per-rank heads: 8, 16 or 32
    // (narrow kernel), else a multiple of 64.
    let hq_padded = NARROW_HEAD_TILES
        .into_iter()
        .find(|&tile| sharding.hq <= tile)
        .unwrap_or_else(|| sharding.hq.div_ceil(HEAD_TILE) * HEAD_TILE);
    if hq_padded > MAX_HEAD_TILE {
        return Err(tp.at.error(
            format!("`{hq_padded}` padded query heads per rank is more than {MAX_HEAD_TILE}"),
            "the head-tile table ends there; use a higher tensor_parallel",
        ));
    }

    // `TopkWidth`: the library pads the top-k width to 128-column steps.
    let k = &model.index_topk;
    if k.value == 0 || k.value > MAX_TOPK {
        return Err(k.at.error(
            format!("top-k width `{}` is not supported", k.value),
            format!(
                "the sparse MLA prefill needs 1 ..= {MAX_TOPK} top-k columns (padded to a multiple of 128 with -1 indices)"
            ),
        ));
    }
    let topk = k.value.div_ceil(TOPK_STEP) * TOPK_STEP;
    Ok(MlaKind {
        sharding,
        hq_padded,
        d_qk,
        kv_lora_rank: lora.value,
        qk_rope_head_dim: rope.value,
        index_topk: k.value,
        topk,
        softmax_scale: model.softmax_scale,
    })
}
