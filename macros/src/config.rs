//! The model's configuration as typed values: which keys exist, their defaults, and which kind
//! of attention they describe.
//!
//! A model whose config has `kv_lora_rank` is an MLA model (DeepSeek V3.2 style: the sparse MLA
//! prefill); any other is an attention-prologue model (Inkling style), with one or more layer
//! kinds. The numbers are not checked against the kernels' rules here (see `geometry.rs`).

use proc_macro2::Span;

use crate::source::{Map, Origin, Sourced};

/// Keys of the model body.
const MODEL_KEYS: &[&str] = &[
    "config",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "layers",
    "conv_width",
    "conv_silu",
    "conv_residual",
    "rel_head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_topk",
    "index_n_heads",
    "index_head_dim",
    "qk_nope_head_dim",
    "rope_scaling",
    "tensor_parallel",
    "page_size",
    "kv_store",
];

/// Keys of one layer kind in `layers`.
const KIND_KEYS: &[&str] = &[
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "kv_store",
];

/// Where K and V go after the prologue.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreChoice {
    /// Paged bf16 cache.
    Bf16,
    /// MXFP8 cache with interleaved scale planes; the configuration must allow it.
    Mxfp8,
    /// MXFP8 where the head dim and page size allow it, bf16 otherwise (decided by the type
    /// checker through `PreferMxfp8`).
    Auto,
    /// No store: the prologue returns k and v.
    None,
}

/// A whole model definition.
pub struct Model {
    /// Tensor-parallel degree.
    pub tensor_parallel: Sourced<u64>,
    /// What the layers run.
    pub body: Body,
}

/// The attention family of the model.
pub enum Body {
    /// Inkling-style layers: the fused attention prologue.
    Prologue(PrologueModel),
    /// DeepSeek-V3.2-style layers: the FP8 sparse MLA prefill.
    Mla(MlaModel),
}

/// An attention-prologue model.
pub struct PrologueModel {
    /// Its layer kinds (one unnamed kind when `layers` is absent).
    pub kinds: Vec<LayerKind>,
    /// Conv width `W`.
    pub conv_width: Sourced<u64>,
    /// SiLU after the conv.
    pub conv_silu: bool,
    /// Residual add after the conv.
    pub conv_residual: bool,
    /// Relative-position features per q head at the end of the packed row.
    pub rel_head_dim: Sourced<u64>,
    /// KV page size in tokens.
    pub page_size: Sourced<u64>,
}

/// One layer kind of an attention-prologue model.
pub struct LayerKind {
    /// The kind's name (`global`, `sliding`), or `None` for a model without `layers`.
    pub name: Option<(String, Span)>,
    /// Query heads of the whole model.
    pub heads: Sourced<u64>,
    /// KV heads of the whole model.
    pub kv_heads: Sourced<u64>,
    /// Channels per head.
    pub head_dim: Sourced<u64>,
    /// Where K/V go.
    pub store: Sourced<StoreChoice>,
}

/// A sparse-MLA model.
pub struct MlaModel {
    /// Query heads of the whole model.
    pub heads: Sourced<u64>,
    /// Latent channels (the value width).
    pub kv_lora_rank: Sourced<u64>,
    /// RoPE channels appended to the latent for q·k.
    pub qk_rope_head_dim: Sourced<u64>,
    /// Top-k rows each query attends to.
    pub index_topk: Sourced<u64>,
    /// Index heads of the lightning indexer, when the config gives them.
    pub index_n_heads: Option<Sourced<u64>>,
    /// Channels of an index head, when the config gives them.
    pub index_head_dim: Option<Sourced<u64>>,
    /// The softmax scale of the model's q·k, when its config gives `qk_nope_head_dim`
    /// (DeepSeek's rule, YaRN included; see `softmax_scale`).
    pub softmax_scale: Option<f64>,
}

/// DeepSeek's softmax scale: `1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)` (the q·k head dim
/// before absorption), times `mscale²` under YaRN rope scaling with `mscale_all_dim` set, where
/// `mscale = 0.1 · mscale_all_dim · ln(factor) + 1` for a factor above 1 (else 1).
pub fn softmax_scale(nope: u64, rope: u64, yarn: Option<(f64, f64)>) -> f64 {
    let mut scale = 1.0 / (nope.saturating_add(rope) as f64).sqrt();
    if let Some((factor, mscale_all_dim)) = yarn
        && mscale_all_dim != 0.0
        && factor > 1.0
    {
        let mscale = 0.1 * mscale_all_dim * factor.ln() + 1.0;
        scale *= mscale * mscale;
    }
    scale
}

impl Model {
    /// Reads the model from its merged entries; `name` is the module name (defaults point at it).
    pub fn read(mut map: Map, name: Span) -> syn::Result<Model> {
        let default = |key: &str, value: u64| Sourced {
            value,
            at: Origin::inline(name, key),
        };
        let tensor_parallel = map
            .int("tensor_parallel")?
            .unwrap_or_else(|| default("tensor_parallel", 1));
        let body = if map.entries.iter().any(|e| e.key == "kv_lora_rank") {
            Body::Mla(read_mla(&mut map, name)?)
        } else {
            Body::Prologue(read_prologue(&mut map, name)?)
        };
        map.finish(MODEL_KEYS)?;
        Ok(Model {
            tensor_parallel,
            body,
        })
    }
}

/// A key the model must have.
fn required(map: &mut Map, key: &str, name: Span, what: &str) -> syn::Result<Sourced<u64>> {
    map.int(key)?.ok_or_else(|| {
        Origin::inline(name, key).error(
            format!("the model has no `{key}`"),
            format!("`{key}` is {what}; write `{key}: <number>` or put it in the JSON config"),
        )
    })
}

fn read_mla(map: &mut Map, name: Span) -> syn::Result<MlaModel> {
    let heads = required(map, "num_attention_heads", name, "the query-head count")?;
    let kv_lora_rank = required(map, "kv_lora_rank", name, "the MLA latent width")?;
    let qk_rope_head_dim = map.int("qk_rope_head_dim")?.unwrap_or(Sourced {
        value: 0,
        at: Origin::inline(name, "qk_rope_head_dim"),
    });
    let index_topk = required(map, "index_topk", name, "the sparse top-k width")?;
    let index_n_heads = map.int("index_n_heads")?;
    let index_head_dim = map.int("index_head_dim")?;
    let nope = map.int("qk_nope_head_dim")?;
    let yarn = match map.map("rope_scaling")? {
        None => None,
        Some(mut scaling) => {
            let factor = scaling.number("factor")?;
            let mscale_all_dim = scaling.number("mscale_all_dim")?;
            // Only these two keys shape the softmax scale; the others of a Hugging Face
            // `rope_scaling` (type, beta_fast, original_max_position_embeddings, …) are for RoPE.
            scaling.entries.clear();
            factor.map(|f| (f.value, mscale_all_dim.map_or(0.0, |m| m.value)))
        }
    };
    if let Some(n) = &nope
        && n.value == 0
        && qk_rope_head_dim.value == 0
    {
        return Err(n.at.error(
            "`qk_nope_head_dim` 0 with no RoPE channels gives q·k no channels",
            "the softmax scale is 1/sqrt(qk_nope_head_dim + qk_rope_head_dim); give the model's value (DeepSeek V3.2: 128)",
        ));
    }
    let softmax_scale = nope
        .as_ref()
        .map(|nope| softmax_scale(nope.value, qk_rope_head_dim.value, yarn));
    // Keys of a Hugging Face MLA config that the sparse MLA kernel does not use.
    for unused in ["num_key_value_heads", "head_dim", "hidden_size"] {
        map.take(unused);
    }
    for not_mla in [
        "kv_store",
        "page_size",
        "layers",
        "conv_width",
        "conv_silu",
        "conv_residual",
        "rel_head_dim",
    ] {
        if let Some(v) = map.take(not_mla) {
            return Err(v.at.error(
                format!("`{not_mla}` does not apply to a sparse MLA model"),
                "a model with `kv_lora_rank` runs the FP8 sparse MLA prefill over an unpaged latent KV; remove the key",
            ));
        }
    }
    Ok(MlaModel {
        heads,
        kv_lora_rank,
        qk_rope_head_dim,
        index_topk,
        index_n_heads,
        index_head_dim,
        softmax_scale,
    })
}

fn read_prologue(map: &mut Map, name: Span) -> syn::Result<PrologueModel> {
    let heads = required(map, "num_attention_heads", name, "the query-head count")?;
    let hidden = map.int("hidden_size")?;
    let kv_heads = map.int("num_key_value_heads")?.unwrap_or(Sourced {
        value: heads.value,
        at: heads.at.clone(),
    });
    let head_dim = match (map.int("head_dim")?, hidden) {
        (Some(hd), _) => hd,
        // Hugging Face's convention when `head_dim` is absent.
        (None, Some(hidden)) if heads.value > 0 => Sourced {
            value: hidden.value / heads.value,
            at: hidden.at,
        },
        _ => {
            return Err(Origin::inline(name, "head_dim").error(
                "the model has no `head_dim`",
                "write `head_dim: <number>` (or give `hidden_size`, from which head_dim = hidden_size / num_attention_heads)",
            ));
        }
    };
    let store = match map.word("kv_store")? {
        Some(word) => store_choice(word)?,
        None => Sourced {
            value: StoreChoice::Auto,
            at: Origin::inline(name, "kv_store"),
        },
    };
    let default = |key: &str, value: u64| Sourced {
        value,
        at: Origin::inline(name, key),
    };
    let conv_width = map
        .int("conv_width")?
        .unwrap_or_else(|| default("conv_width", 4));
    let conv_silu = map.boolean("conv_silu")?.is_some_and(|b| b.value);
    let conv_residual = map.boolean("conv_residual")?.is_none_or(|b| b.value);
    let rel_head_dim = map
        .int("rel_head_dim")?
        .unwrap_or_else(|| default("rel_head_dim", 16));
    let page_size = map
        .int("page_size")?
        .unwrap_or_else(|| default("page_size", 128));

    let model_kind = |name| LayerKind {
        name,
        heads: heads.clone(),
        kv_heads: kv_heads.clone(),
        head_dim: head_dim.clone(),
        store: store.clone(),
    };
    let kinds = match map.map("layers")? {
        None => vec![model_kind(None)],
        Some(mut layers) => {
            let mut kinds = Vec::new();
            for entry in std::mem::take(&mut layers.entries) {
                let ident_ok = syn::parse_str::<syn::Ident>(&entry.key).is_ok();
                let crate::source::Node::Map(mut body) = entry.node.value else {
                    return Err(entry.node.at.error(
                        format!("layer kind `{}` expects a map `{{ … }}`", entry.key),
                        "write `layers: { global: {}, sliding: { num_key_value_heads: 16 } }`",
                    ));
                };
                if !ident_ok {
                    return Err(entry.node.at.error(
                        format!("layer kind `{}` is not a Rust identifier", entry.key),
                        "each layer kind becomes a module of that name; use names such as `global`, `sliding`",
                    ));
                }
                let mut kind = model_kind(Some((entry.key.clone(), entry.node.at.span)));
                if let Some(v) = body.int("num_attention_heads")? {
                    kind.heads = v;
                }
                if let Some(v) = body.int("num_key_value_heads")? {
                    kind.kv_heads = v;
                }
                if let Some(v) = body.int("head_dim")? {
                    kind.head_dim = v;
                }
                if let Some(word) = body.word("kv_store")? {
                    kind.store = store_choice(word)?;
                }
                body.finish(KIND_KEYS)?;
                kinds.push(kind);
            }
            if kinds.is_empty() {
                return Err(layers.at.error(
                    "`layers` names no layer kind",
                    "write `layers: { global: {}, sliding: { num_key_value_heads: 16 } }`, or leave `layers` out for one kind",
                ));
            }
            kinds
        }
    };
    Ok(PrologueModel {
        kinds,
        conv_width,
        conv_silu,
        conv_residual,
        rel_head_dim,
        page_size,
    })
}

fn store_choice(word: Sourced<String>) -> syn::Result<Sourced<StoreChoice>> {
    let value = match word.value.as_str() {
        "bf16" => StoreChoice::Bf16,
        "mxfp8" => StoreChoice::Mxfp8,
        "auto" => StoreChoice::Auto,
        "none" => StoreChoice::None,
        other => {
            return Err(word.at.error(
                format!("unknown KV store `{other}`"),
                "kv_store is `bf16`, `mxfp8` (needs head_dim 128 and pages of 128·k tokens), `auto` (MXFP8 where the dims allow it, bf16 otherwise) or `none`",
            ));
        }
    };
    Ok(Sourced { value, at: word.at })
}

impl<T: Clone> Clone for Sourced<T> {
    fn clone(&self) -> Self {
        Sourced {
            value: self.value.clone(),
            at: self.at.clone(),
        }
    }
}
