//! The per-rank geometry of each layer kind, and the kernels' rules checked against it.
//!
//! The rules, their limits and their wording come from the rule catalogue (`shapeproof-rules`),
//! the same that `shapeproof::rules` is generated from; each check reports at the span of the
//! field the user has to change. The generated code names the same
//! traits again (`emit.rs`), so the type checker confirms every number computed here.

use crate::config::{Body, LayerKind, MlaModel, Model, PrologueModel, StoreChoice};
use crate::source::{Origin, Sourced};
use shapeproof_rules::{self as rules, Rule};

/// A catalogue number as the macro's integer type.
fn n(value: usize) -> u64 {
    value as u64
}

/// The error for `rule` broken by `value` (with the trait parameter `param`), at `at`, with the
/// catalogue's wording: its message, then a note of the rule, the reason and the fix.
fn broken(at: &Origin, rule: &Rule, value: &str, param: Option<&str>, context: &str) -> syn::Error {
    at.error(
        format!("{}{context}", rule.message(value, param)),
        rule.model_note(value, param),
    )
}

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
    /// Per-rank heads rounded up to the head tile the macro picks (a narrow tile, or a multiple
    /// of the wide one).
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
    /// Top-k rounded up to whole loop steps, `TOPK_STEP` (indices padded with -1).
    pub topk: u64,
    /// Index heads of the lightning indexer, when the config gives `index_n_heads`.
    pub index_heads: Option<u64>,
}

/// Checks the model against the kernels' rules and computes its per-rank geometry.
pub fn plan(model: &Model) -> syn::Result<Plan> {
    let tp = &model.tensor_parallel;
    if !rules::TP_DEGREES.iter().any(|&d| n(d) == tp.value) {
        return Err(tp.at.error(
            format!("tensor-parallel degree `{}` is not supported", tp.value),
            format!(
                "the tensor-parallel tables cover the degrees {}",
                rules::list(&rules::TP_DEGREES, Some("and"))
            ),
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
    if heads.value == 0 || heads.value > n(rules::MAX_HEADS) {
        return Err(heads.at.error(
            format!("`{}` attention heads is not supported{kind}", heads.value),
            format!(
                "the tensor-parallel tables cover 1 ..= {} heads",
                rules::MAX_HEADS
            ),
        ));
    }
    let rule = rules::SHARDS_HEADS;
    if !rule.holds(tp.value, Some(heads.value)) {
        let (value, param) = (tp.value.to_string(), heads.value.to_string());
        return Err(broken(&tp.at, &rule, &value, Some(&param), kind));
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
    if kv.value == 0 || kv.value > n(rules::MAX_HEADS) {
        return Err(kv.at.error(
            format!("`{}` KV heads is not supported{which}", kv.value),
            format!(
                "the tensor-parallel tables cover 1 ..= {} KV heads",
                rules::MAX_HEADS
            ),
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
    let rule = rules::SHARDS_KV_HEADS;
    if !rule.holds(tp.value, Some(kv.value)) {
        let (value, param) = (tp.value.to_string(), kv.value.to_string());
        return Err(broken(&tp.at, &rule, &value, Some(&param), &which));
    }
    let hkv = (kv.value / tp.value).max(1);

    // The head dim against the store (`Mxfp8Width`, `PrologueHeadDim`).
    let hd = &kind.head_dim;
    let store = &kind.store;
    let shown = hd.value.to_string();
    match store.value {
        // A head dim off the scale atoms breaks `Mxfp8Width` for every head count.
        StoreChoice::Mxfp8 if !hd.value.is_multiple_of(n(rules::SCALE_ATOM)) => {
            return Err(broken(&hd.at, &rules::MXFP8_WIDTH, &shown, None, &which));
        }
        StoreChoice::Mxfp8 if hd.value != n(rules::MXFP8_HEAD_DIM) => {
            return Err(hd.at.error(
                format!("head dim `{shown}` is not supported by the MXFP8 fused prologue{which}"),
                format!(
                    "the MXFP8 store is instantiated for {}-channel heads only (one scale atom per head); use `kv_store: bf16` or `kv_store: auto`, which take head dims {}",
                    rules::MXFP8_HEAD_DIM,
                    rules::list(&rules::PROLOGUE_HEAD_DIMS, Some("and"))
                ),
            ));
        }
        _ if !rules::PROLOGUE_HEAD_DIM.holds(hd.value, None) => {
            return Err(broken(
                &hd.at,
                &rules::PROLOGUE_HEAD_DIM,
                &shown,
                None,
                &which,
            ));
        }
        _ => {}
    }

    // Widths (`Mxfp8Width` / `WholeHeads` tables end at MAX_WIDTH).
    let dq = sharding.hq * hd.value;
    let dkv = hkv * hd.value;
    for (what, width, heads) in [("q", dq, sharding.hq), ("kv", dkv, hkv)] {
        let max = rules::MAX_WIDTH;
        if width > n(max) {
            return Err(tp.at.error(
                format!(
                    "per-rank {what} width `{width}` ({heads} heads × {}) is wider than {max}{which}",
                    hd.value
                ),
                format!(
                    "the prologue's width tables end at {max} channels per rank; use a higher tensor_parallel"
                ),
            ));
        }
    }

    // Page size (`PageSize`, `Mxfp8PageSize`).
    let page = &model.page_size;
    let shown = page.value.to_string();
    if !rules::PAGE_SIZE.holds(page.value, None) {
        return Err(broken(&page.at, &rules::PAGE_SIZE, &shown, None, ""));
    }
    if store.value == StoreChoice::Mxfp8 && !rules::MXFP8_PAGE_SIZE.holds(page.value, None) {
        return Err(broken(&page.at, &rules::MXFP8_PAGE_SIZE, &shown, None, ""));
    }

    // Conv (`ConvWidth`).
    let w = &model.conv_width;
    if !rules::CONV_WIDTH.holds(w.value, None) {
        let shown = w.value.to_string();
        return Err(broken(&w.at, &rules::CONV_WIDTH, &shown, None, ""));
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
    let max = rules::MAX_ROW_OFFSET;
    if rel.value > n(max) {
        return Err(rel.at.error(
            format!(
                "rel_head_dim `{}` is longer than a packed qkvr row can be ({max} elements)",
                rel.value
            ),
            format!(
                "the relative-position features of every q head sit in the packed row after q, k and v; the packed-row offset table ends at {max} elements"
            ),
        ));
    }
    let row = kind_plan.row();
    let offsets = rules::ROW_OFFSET;
    let vector = rules::ROW_VECTOR;
    if !row.is_multiple_of(n(vector)) {
        return Err(rel.at.error(
            format!(
                "packed qkvr row of `{row}` elements is not a multiple of {vector}{which}: rel_head_dim {} × {} q heads adds {} elements",
                rel.value,
                kind_plan.sharding.hq,
                kind_plan.rel()
            ),
            format!(
                "{}, so every row must start on a multiple of {vector}; choose rel_head_dim so that q heads per rank × rel_head_dim is a multiple of {vector}",
                offsets.render(offsets.reason, "", None)
            ),
        ));
    }
    if !offsets.holds(row, None) {
        return Err(tp.at.error(
            format!("packed qkvr row of `{row}` elements is longer than {max}{which}"),
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
    let d_v = rules::MLA_D_V;
    if lora.value != n(d_v) {
        return Err(lora.at.error(
            format!(
                "sparse MLA d_v `{}` (kv_lora_rank) is not supported",
                lora.value
            ),
            format!(
                "the sparse MLA prefill reads values as the {d_v} latent channels of a row: kv_lora_rank must be {d_v}"
            ),
        ));
    }
    let sum = lora.value.checked_add(rope.value);
    let d_qk = sum.unwrap_or(u64::MAX);
    let rule = rules::MLA_HEAD_DIM;
    if !rule.holds(d_qk, None) {
        let shown = sum.map_or_else(|| "beyond u64".to_string(), |d| d.to_string());
        let parts = format!(
            " (kv_lora_rank {} + qk_rope_head_dim {})",
            lora.value, rope.value
        );
        return Err(broken(&rope.at, &rule, &shown, None, &parts));
    }

    // `HeadTile` / `PadsTo`: the fastest measured tile that holds the per-rank heads: a narrow
    // tile (each measured faster than the padded 64-head tile on the H200, bench/RESULTS.md),
    // else a multiple of the wide tile (which the CUDA backend runs in the 64-head kernel).
    let wide = n(rules::WIDE_HEAD_TILE);
    let hq_padded = rules::NARROW_HEAD_TILES
        .into_iter()
        .map(n)
        .find(|&tile| sharding.hq <= tile)
        .unwrap_or_else(|| sharding.hq.div_ceil(wide) * wide);
    if !rules::HEAD_TILE.holds(hq_padded, None) {
        return Err(tp.at.error(
            format!(
                "`{hq_padded}` padded query heads per rank is more than {}",
                rules::MAX_HEAD_TILE
            ),
            "the head-tile table ends there; use a higher tensor_parallel",
        ));
    }

    // `TopkWidth`: the library pads the top-k width to whole loop steps.
    let k = &model.index_topk;
    let step = n(rules::TOPK_STEP);
    if k.value == 0 || k.value > n(rules::MAX_TOPK) {
        return Err(k.at.error(
            format!("top-k width `{}` is not supported", k.value),
            format!(
                "the sparse MLA prefill needs 1 ..= {} top-k columns (padded to a multiple of {step} with -1 indices)",
                rules::MAX_TOPK
            ),
        ));
    }
    let topk = k.value.div_ceil(step) * step;

    // The lightning indexer: `IndexerHeads`, a 128-channel head, and `IndexerTopk` on the same
    // padded width (its rows are the prefill's indices).
    if let Some(d) = &model.index_head_dim
        && d.value != n(rules::INDEX_HEAD_DIM)
    {
        return Err(d.at.error(
            format!("index head dim `{}` is not supported", d.value),
            format!(
                "the lightning indexer scores e4m3 heads and keys of {} channels",
                rules::INDEX_HEAD_DIM
            ),
        ));
    }
    if let Some(h) = &model.index_n_heads {
        let rule = rules::INDEXER_HEADS;
        if !rule.holds(h.value, None) {
            return Err(broken(&h.at, &rule, &h.value.to_string(), None, ""));
        }
        let rule = rules::INDEXER_TOPK;
        if !rule.holds(topk, None) {
            return Err(broken(
                &k.at,
                &rule,
                &topk.to_string(),
                None,
                " (the padded index_topk)",
            ));
        }
    }
    Ok(MlaKind {
        sharding,
        hq_padded,
        d_qk,
        kv_lora_rank: lora.value,
        qk_rope_head_dim: rope.value,
        index_topk: k.value,
        topk,
        index_heads: model.index_n_heads.as_ref().map(|h| h.value),
        softmax_scale: model.softmax_scale,
    })
}
