//! The catalogue of shapeproof's shape rules, each stated once.
//!
//! A rule of the kernels (MXFP8 widths are whole scale atoms, KV pages whole scale chunks up to
//! a largest page, …) is checked in two places: by a marker trait of `shapeproof::rules`, implemented for
//! the `Dim<N>` values that satisfy it, and by the `model!` macro, which reports a broken rule at
//! the span of the configuration field to change. Both take the rule from here: its allowed
//! values as data ([`Values`]) and its wording as templates ([`Rule`]). The main crate's build
//! script generates the traits (doc comment, `#[diagnostic::on_unimplemented]`) and their
//! implementation tables from [`CATALOGUE`]; the macro checks values with [`Rule::holds`] and
//! words its errors with [`Rule::message`] and [`Rule::model_note`].
//!
//! # Templates
//!
//! The wording of a rule is written with placeholders in braces:
//!
//! - `{value}`: the value that breaks the rule (the trait's `{Self}`, the macro's number);
//! - the name of the trait's const parameter (`{HD}`, `{H_Q}`, `{HEADS}`): its value;
//! - `{first}`, `{step}`, `{last}`: the rule's own [`Values::Steps`];
//! - `{tiles}`: which real head counts each tile of a [`Values::PadsTo`] rule takes;
//! - the name of a constant of [`CONSTANTS`] (`{MAX_WIDTH}`), with `|or` or `|and` to write a
//!   list as "a, b or c" / "a, b and c" instead of "a, b, c".
//!
//! An unknown placeholder is a bug of the catalogue; rendering it panics, and this crate's tests
//! render every template.

/// Channels of one MXFP8 scale atom (four 32-element blocks, one head of the MXFP8 store), and
/// tokens of one scale tile of the MXFP8 KV scale planes.
pub const SCALE_ATOM: usize = 128;
/// Largest width (`DQ`, `DKV`) the MXFP8 and whole-head tables cover, with room above Inkling at
/// TP1 (64 query heads of 128 channels).
pub const MAX_WIDTH: usize = 16384;
/// The head dim of the MXFP8 store: one scale atom a head.
pub const MXFP8_HEAD_DIM: usize = SCALE_ATOM;
/// The head dims the prologue takes with a bf16 KV store only.
pub const BF16_ONLY_HEAD_DIMS: [usize; 2] = [64, 256];
/// Head dims the fused prologue is instantiated for, ascending.
pub const PROLOGUE_HEAD_DIMS: [usize; 3] = [
    BF16_ONLY_HEAD_DIMS[0],
    MXFP8_HEAD_DIM,
    BF16_ONLY_HEAD_DIMS[1],
];
/// Smallest causal-conv width: one history tap.
pub const MIN_CONV_WIDTH: usize = 2;
/// Largest causal-conv width the prologue is instantiated for.
pub const MAX_CONV_WIDTH: usize = 8;
/// Elements of one 16-byte bf16 vector: packed-row offsets are multiples of it.
pub const ROW_VECTOR: usize = 8;
/// Largest element offset inside a packed projection row.
pub const MAX_ROW_OFFSET: usize = 32768;
/// Tokens of one scale chunk of a KV page: page sizes are multiples of it.
pub const PAGE_CHUNK: usize = 32;
/// Largest KV page size.
pub const MAX_PAGE: usize = 4096;
/// Latent (value) channels of the sparse MLA prefill, `d_v`.
pub const MLA_D_V: usize = 512;
/// RoPE channels the sparse MLA prefill takes beside the latent ones.
pub const MLA_ROPE_DIMS: [usize; 2] = [0, 64];
/// Head dims `d_qk` of the sparse MLA prefill: the latent channels and the RoPE channels.
pub const MLA_HEAD_DIMS: [usize; 2] = [MLA_D_V + MLA_ROPE_DIMS[0], MLA_D_V + MLA_ROPE_DIMS[1]];
/// Head tiles of the narrow sparse MLA kernel (fewer than 64 heads a rank, not padded to 64),
/// smallest first.
pub const NARROW_HEAD_TILES: [usize; 3] = [8, 16, 32];
/// Query heads of one tile of the 64-head sparse MLA kernel: larger head counts are multiples.
pub const WIDE_HEAD_TILE: usize = 64;
/// Largest padded query-head count of the sparse MLA prefill.
pub const MAX_HEAD_TILE: usize = 1024;
/// Top-k columns of one sparse MLA loop iteration (two 64-token blocks).
pub const TOPK_STEP: usize = 128;
/// Largest top-k width of the sparse MLA prefill.
pub const MAX_TOPK: usize = 8192;
/// Index heads of the lightning indexer (DeepSeek V3.2: 64; GLM-5.2: 32).
pub const INDEX_HEADS: [usize; 2] = [32, 64];
/// Channels of one index head and of one index key (e4m3 bytes).
pub const INDEX_HEAD_DIM: usize = 128;
/// Largest top-k width of the lightning indexer (its candidate buffers live in shared memory).
pub const MAX_INDEX_TOPK: usize = 2048;
/// Query heads the sparse MLA decode runs without padding (a rank's share of DeepSeek V3.2 or
/// GLM-5 at TP 16 down to TP 1).
pub const MLA_DECODE_HEADS: [usize; 5] = [8, 16, 32, 64, 128];
/// Tokens of one page of the FP8 sparse MLA cache (DeepSeek V3.2's "FP8 with scale" format).
pub const MLA_CACHE_PAGE: usize = 64;
/// Latent channels that share one f32 scale in the FP8 sparse MLA cache.
pub const MLA_SCALE_GROUP: usize = 128;
/// Tokens of one page of the lightning indexer's paged key cache (the pages of the FP8 sparse
/// MLA cache: one block table serves both).
pub const INDEX_CACHE_PAGE: usize = 64;
/// Tensor-parallel degrees the tables cover, ascending.
pub const TP_DEGREES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Largest attention-head (or KV-head) count the tensor-parallel tables cover.
pub const MAX_HEADS: usize = 256;

/// The constants by name, for the templates (`{MAX_WIDTH}`, `{TP_DEGREES|or}`).
pub const CONSTANTS: &[(&str, &[usize])] = &[
    ("SCALE_ATOM", &[SCALE_ATOM]),
    ("MAX_WIDTH", &[MAX_WIDTH]),
    ("MXFP8_HEAD_DIM", &[MXFP8_HEAD_DIM]),
    ("BF16_ONLY_HEAD_DIMS", &BF16_ONLY_HEAD_DIMS),
    ("PROLOGUE_HEAD_DIMS", &PROLOGUE_HEAD_DIMS),
    ("MIN_CONV_WIDTH", &[MIN_CONV_WIDTH]),
    ("MAX_CONV_WIDTH", &[MAX_CONV_WIDTH]),
    ("ROW_VECTOR", &[ROW_VECTOR]),
    ("MAX_ROW_OFFSET", &[MAX_ROW_OFFSET]),
    ("PAGE_CHUNK", &[PAGE_CHUNK]),
    ("MAX_PAGE", &[MAX_PAGE]),
    ("MLA_D_V", &[MLA_D_V]),
    ("MLA_ROPE_DIMS", &MLA_ROPE_DIMS),
    ("MLA_HEAD_DIMS", &MLA_HEAD_DIMS),
    ("NARROW_HEAD_TILES", &NARROW_HEAD_TILES),
    ("WIDE_HEAD_TILE", &[WIDE_HEAD_TILE]),
    ("MAX_HEAD_TILE", &[MAX_HEAD_TILE]),
    ("TOPK_STEP", &[TOPK_STEP]),
    ("MAX_TOPK", &[MAX_TOPK]),
    ("INDEX_HEADS", &INDEX_HEADS),
    ("INDEX_HEAD_DIM", &[INDEX_HEAD_DIM]),
    ("MAX_INDEX_TOPK", &[MAX_INDEX_TOPK]),
    ("MLA_DECODE_HEADS", &MLA_DECODE_HEADS),
    ("MLA_CACHE_PAGE", &[MLA_CACHE_PAGE]),
    ("MLA_SCALE_GROUP", &[MLA_SCALE_GROUP]),
    ("INDEX_CACHE_PAGE", &[INDEX_CACHE_PAGE]),
    ("TP_DEGREES", &TP_DEGREES),
    ("MAX_HEADS", &[MAX_HEADS]),
];

/// The values a rule accepts: `Self` of its trait, and the trait's const parameter where it has
/// one.
#[derive(Clone, Copy, Debug)]
pub enum Values {
    /// `first`, `first + step`, … up to `last`.
    Steps {
        /// The smallest value.
        first: usize,
        /// The distance between values.
        step: usize,
        /// The largest value.
        last: usize,
    },
    /// Exactly these values.
    Set(&'static [usize]),
    /// The values of any of these.
    Either(&'static [Values]),
    /// For each parameter `P` of `params`, the positive multiples of `P` up to `last`
    /// (`WholeHeads<HD>`).
    MultiplesOfParam {
        /// The parameters the table covers.
        params: &'static [usize],
        /// The largest value.
        last: usize,
    },
    /// A real head count that the padded count (the parameter) holds with no smaller tile beside
    /// it: a narrow tile takes the counts above the next smaller narrow tile (12 -> 16), the
    /// first wide tile every count up to it (the padded wide path stays available), a multiple
    /// `k · wide` the counts above `(k - 1) · wide`. A count that is no tile "pads" to itself, so
    /// that an unpadded count reports only the head-tile rule, not a second error.
    PadsTo {
        /// The narrow tiles, ascending.
        narrow: &'static [usize],
        /// The wide tile; its multiples up to `last` are tiles too.
        wide: usize,
        /// The largest padded count.
        last: usize,
    },
    /// A degree of `degrees` that divides the parameter, a count in `1 ..= max`.
    Divides {
        /// The degrees the table covers.
        degrees: &'static [usize],
        /// The largest count.
        max: usize,
    },
    /// A degree of `degrees` that divides the parameter (a count in `1 ..= max`) or is a multiple
    /// of it (the parameter is replicated).
    DividesOrReplicates {
        /// The degrees the table covers.
        degrees: &'static [usize],
        /// The largest count.
        max: usize,
    },
}

impl Values {
    /// Whether `value` (with the trait's parameter `param`, for the rules that have one) is
    /// accepted.
    pub fn holds(&self, value: u64, param: Option<u64>) -> bool {
        let p = || param.expect("this rule has a parameter");
        let fits = |v: u64, first: usize, last: usize| first as u64 <= v && v <= last as u64;
        let listed = |set: &[usize], v: u64| set.iter().any(|&s| s as u64 == v);
        match *self {
            Values::Steps { first, step, last } => {
                fits(value, first, last) && (value - first as u64).is_multiple_of(step as u64)
            }
            Values::Set(set) => listed(set, value),
            Values::Either(parts) => parts.iter().any(|v| v.holds(value, param)),
            Values::MultiplesOfParam { params, last } => {
                let hd = p();
                listed(params, hd) && fits(value, 1, last) && value.is_multiple_of(hd)
            }
            Values::PadsTo { narrow, wide, last } => {
                let tile = p();
                let wide = wide as u64;
                if let Some(i) = narrow.iter().position(|&t| t as u64 == tile) {
                    let below = if i == 0 { 0 } else { narrow[i - 1] as u64 };
                    return below < value && value <= tile;
                }
                if fits(tile, 1, last) && tile.is_multiple_of(wide) {
                    return tile.saturating_sub(wide) < value && value <= tile;
                }
                // A count that is no tile pads to itself.
                tile == value && fits(value, 1, last) && !listed(narrow, value)
            }
            Values::Divides { degrees, max } => {
                let heads = p();
                listed(degrees, value) && fits(heads, 1, max) && heads.is_multiple_of(value)
            }
            Values::DividesOrReplicates { degrees, max } => {
                let heads = p();
                listed(degrees, value)
                    && fits(heads, 1, max)
                    && (heads.is_multiple_of(value) || value.is_multiple_of(heads))
            }
        }
    }

    /// Every accepted `(parameter, value)` pair (parameter `None` for the rules without one), in
    /// table order: what the trait is implemented for.
    pub fn members(&self) -> Vec<(Option<usize>, usize)> {
        match *self {
            Values::Steps { first, step, last } => {
                (first..=last).step_by(step).map(|v| (None, v)).collect()
            }
            Values::Set(set) => set.iter().map(|&v| (None, v)).collect(),
            Values::Either(parts) => parts.iter().flat_map(Values::members).collect(),
            Values::MultiplesOfParam { params, last } => params
                .iter()
                .flat_map(|&hd| (hd..=last).step_by(hd).map(move |v| (Some(hd), v)))
                .collect(),
            Values::PadsTo { narrow, wide, last } => {
                let mut out = Vec::new();
                let mut below = 0;
                for &tile in narrow {
                    out.extend((below + 1..=tile).map(|heads| (Some(tile), heads)));
                    below = tile;
                }
                for tile in (wide..=last).step_by(wide) {
                    for heads in tile - wide + 1..=tile {
                        out.push((Some(tile), heads));
                        if heads % wide != 0 && !narrow.contains(&heads) {
                            out.push((Some(heads), heads));
                        }
                    }
                }
                out
            }
            Values::Divides { degrees, max } => degrees
                .iter()
                .flat_map(|&tp| {
                    (1..=max)
                        .filter(move |h| h % tp == 0)
                        .map(move |h| (Some(h), tp))
                })
                .collect(),
            Values::DividesOrReplicates { degrees, max } => degrees
                .iter()
                .flat_map(|&tp| {
                    (1..=max)
                        .filter(move |h| h % tp == 0 || tp % h == 0)
                        .map(move |h| (Some(h), tp))
                })
                .collect(),
        }
    }
}

/// One shape rule: the marker trait that states it, the values it accepts, and its wording.
///
/// The trait's diagnostic is `message` (naming the value), `label` (stating the rule) and a note
/// of `reason` and `fix`; the `model!` macro reports `message` and a note of `label`, `reason`
/// and `model_fix` (or `fix`), joined by "; ", so the two never word the same rule differently.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// Name of the marker trait (`Mxfp8Width`).
    pub name: &'static str,
    /// Name of the trait's const parameter (`HD` of `WholeHeads<const HD: usize>`), if any.
    pub param: Option<&'static str>,
    /// The trait's doc comment: what a value that satisfies the rule is.
    pub doc: &'static str,
    /// The values the rule accepts.
    pub values: Values,
    /// The diagnostic's first line, naming the offending `{value}`.
    pub message: &'static str,
    /// The rule itself, shown at the offending span.
    pub label: &'static str,
    /// Why the rule exists (may be empty).
    pub reason: &'static str,
    /// What to change, in terms of the library's types (may be empty).
    pub fix: &'static str,
    /// What to change in a `model!` definition, where it differs from `fix`.
    pub model_fix: Option<&'static str>,
}

/// A width that the MXFP8 store can quantize.
pub const MXFP8_WIDTH: Rule = Rule {
    name: "Mxfp8Width",
    param: None,
    doc: "A width (`DQ` or `DKV`) that the MXFP8 store can quantize: whole {step}-channel heads, each one\nscale atom of four 32-element blocks.",
    values: Values::Steps {
        first: SCALE_ATOM,
        step: SCALE_ATOM,
        last: MAX_WIDTH,
    },
    message: "`{value}` is not a multiple of {step}: MXFP8 fused prologue requires head_dim-aligned Q/K/V",
    label: "MXFP8 needs a width that is a multiple of {step} ({first} ..= {last})",
    reason: "MXFP8 quantizes 32-element blocks inside {step}-channel scale atoms, one atom per head",
    fix: "use head dims that are multiples of {step}, or a bf16 KV store (`Bf16Store`), which also takes head dims {BF16_ONLY_HEAD_DIMS|and}",
    model_fix: Some(
        "use head_dim {MXFP8_HEAD_DIM}, or `kv_store: bf16` / `kv_store: auto`, which also take head dims {BF16_ONLY_HEAD_DIMS|and}",
    ),
};

/// A head dim the fused prologue is instantiated for.
pub const PROLOGUE_HEAD_DIM: Rule = Rule {
    name: "PrologueHeadDim",
    param: None,
    doc: "A head dim the bf16-store prologue is instantiated for.",
    values: Values::Set(&PROLOGUE_HEAD_DIMS),
    message: "head dim `{value}` is not supported by the fused prologue",
    label: "the fused prologue takes head dims {PROLOGUE_HEAD_DIMS|or}",
    reason: "one head is normalized by one aligned group of 8-channel lanes",
    fix: "{PROLOGUE_HEAD_DIMS|and} are instantiated (MXFP8 needs {MXFP8_HEAD_DIM})",
    model_fix: None,
};

/// A width that is a whole number of heads.
pub const WHOLE_HEADS: Rule = Rule {
    name: "WholeHeads",
    param: Some("HD"),
    doc: "A width that is a whole number of `HD`-wide heads.",
    values: Values::MultiplesOfParam {
        params: &PROLOGUE_HEAD_DIMS,
        last: MAX_WIDTH,
    },
    message: "`{value}` is not a whole number of {HD}-wide heads",
    label: "the prologue needs widths that are multiples of the head dim {HD} (up to {MAX_WIDTH})",
    reason: "RMSNorm runs per head, so DQ = heads × head_dim and DKV = kv_heads × head_dim",
    fix: "check the per-rank head counts",
    model_fix: None,
};

/// A causal-conv width the prologue can run.
pub const CONV_WIDTH: Rule = Rule {
    name: "ConvWidth",
    param: None,
    doc: "A causal-conv width the prologue can run: at least one history tap.",
    values: Values::Steps {
        first: MIN_CONV_WIDTH,
        step: 1,
        last: MAX_CONV_WIDTH,
    },
    message: "conv width `{value}` is not supported",
    label: "the short convolution needs a width W with {first} <= W <= {last}",
    reason: "W - 1 history rows live in the conv-state cache",
    fix: "W = 1 would have no history (use no conv), and widths above {last} are not instantiated",
    model_fix: Some("W = 1 would have no history, and widths above {last} are not instantiated"),
};

/// An offset inside a packed projection row that starts a 16-byte vector.
pub const ROW_OFFSET: Rule = Rule {
    name: "RowOffset",
    param: None,
    doc: "An element offset inside a packed projection row that starts a 16-byte vector.",
    values: Values::Steps {
        first: 0,
        step: ROW_VECTOR,
        last: MAX_ROW_OFFSET,
    },
    message: "packed-row offset `{value}` is not a multiple of {step}",
    label: "offsets inside a bf16 qkvr row must be multiples of {step} elements (16 bytes), up to {last}",
    reason: "each lane loads {step} channels as one 16-byte vector",
    fix: "move the slice so that it starts on a multiple of {step}",
    model_fix: None,
};

/// A KV page size.
pub const PAGE_SIZE: Rule = Rule {
    name: "PageSize",
    param: None,
    doc: "A KV page size: a positive multiple of {step} tokens.",
    values: Values::Steps {
        first: PAGE_CHUNK,
        step: PAGE_CHUNK,
        last: MAX_PAGE,
    },
    message: "page size `{value}` is not a positive multiple of {step}",
    label: "KV page sizes must be positive multiples of {step} tokens (up to {last})",
    reason: "pages are tiled in {step}-token scale chunks",
    fix: "use 32, 64, 128, …",
    model_fix: Some("use page_size 32, 64, 128, …"),
};

/// A page size the MXFP8 scale planes support.
pub const MXFP8_PAGE_SIZE: Rule = Rule {
    name: "Mxfp8PageSize",
    param: None,
    doc: "A page size the MXFP8 interleaved scale planes support.",
    values: Values::Steps {
        first: SCALE_ATOM,
        step: SCALE_ATOM,
        last: MAX_PAGE,
    },
    message: "page size `{value}` is not a multiple of {step}, as the MXFP8 interleaved scale planes require",
    label: "MXFP8 KV pages must be multiples of {step} tokens",
    reason: "the scale planes are [pages, HKV, 32, PAGE/32, 4]: whole {step}-row scale tiles per page, which block-scaled attention reads",
    fix: "use PAGE = {step}",
    model_fix: Some("use page_size {step}, or `kv_store: auto`, which takes bf16 for such pages"),
};

/// A head dim of the sparse MLA prefill.
pub const MLA_HEAD_DIM: Rule = Rule {
    name: "MlaHeadDim",
    param: None,
    doc: "A head dim the sparse MLA prefill supports.",
    values: Values::Set(&MLA_HEAD_DIMS),
    message: "sparse MLA d_qk `{value}` is not supported",
    label: "the sparse MLA prefill supports d_qk = {MLA_HEAD_DIMS|or}",
    reason: "d_qk = {MLA_D_V} latent channels + {MLA_ROPE_DIMS|or} RoPE channels (DeepSeek V3.2: 576; GLM-5.3-Flash, DeepSeek V4: 512)",
    fix: "",
    model_fix: None,
};

/// A query-head count the sparse MLA prefill runs as whole head tiles.
pub const HEAD_TILE: Rule = Rule {
    name: "HeadTile",
    param: None,
    doc: "A query-head count the sparse MLA prefill runs as whole head tiles: one narrow tile of\n{NARROW_HEAD_TILES|or} heads (`kernels/sparse_mla_narrow.cu`), or a multiple of {WIDE_HEAD_TILE}, which the CUDA\nbackend runs in {WIDE_HEAD_TILE}-head tiles of `kernels/sparse_mla_prefill.cu` (`HeadTiling`); only tiles\nholding a real head are launched.",
    values: Values::Either(&[
        Values::Set(&NARROW_HEAD_TILES),
        Values::Steps {
            first: WIDE_HEAD_TILE,
            step: WIDE_HEAD_TILE,
            last: MAX_HEAD_TILE,
        },
    ]),
    message: "query-head count `{value}` is not a sparse MLA head tile",
    label: "the sparse MLA prefill runs head tiles of {NARROW_HEAD_TILES|or} heads, or multiples of {WIDE_HEAD_TILE}: H_Q must be {NARROW_HEAD_TILES}, 64, 128, … (up to {MAX_HEAD_TILE})",
    reason: "",
    fix: "name the tile and the real count: `SparseMlaPrefill<D_QK, 16, TOPK, Plain, 12>` runs 12 real heads in one 16-head tile (the kernel pads; the caller passes the real heads)",
    model_fix: None,
};

/// A real query-head count that a padded head count holds.
pub const PADS_TO: Rule = Rule {
    name: "PadsTo",
    param: Some("H_Q"),
    doc: "A real query-head count (`Self`) that the padded head count `H_Q` holds: `HEADS <= H_Q` with\nno smaller tile that holds it, except that the {WIDE_HEAD_TILE}-head tile takes every count up to {WIDE_HEAD_TILE}.",
    values: Values::PadsTo {
        narrow: &NARROW_HEAD_TILES,
        wide: WIDE_HEAD_TILE,
        last: MAX_HEAD_TILE,
    },
    message: "real query-head count `{value}` does not pad to {H_Q} heads",
    label: "{tiles}",
    reason: "",
    fix: "pad to the smallest tile that holds the real heads (12 -> 16, 20 -> 32, 40 -> 64, 128 -> 128)",
    model_fix: None,
};

/// A top-k width the sparse MLA prefill can loop over.
pub const TOPK_WIDTH: Rule = Rule {
    name: "TopkWidth",
    param: None,
    doc: "A top-k width the sparse MLA prefill can loop over: a positive multiple of {step}.",
    values: Values::Steps {
        first: TOPK_STEP,
        step: TOPK_STEP,
        last: MAX_TOPK,
    },
    message: "top-k width `{value}` is not a positive multiple of {step}",
    label: "the sparse MLA prefill needs TOPK = 128, 256, … (up to {last})",
    reason: "each loop iteration consumes two 64-token blocks",
    fix: "pad the index rows with -1 up to the next multiple of {step}",
    model_fix: None,
};

/// A tensor-parallel degree that splits the attention heads evenly.
pub const SHARDS_HEADS: Rule = Rule {
    name: "ShardsHeads",
    param: Some("HEADS"),
    doc: "A tensor-parallel degree (`Self`) that splits `HEADS` attention heads evenly.",
    values: Values::Divides {
        degrees: &TP_DEGREES,
        max: MAX_HEADS,
    },
    message: "tensor-parallel degree `{value}` does not divide {HEADS} attention heads",
    label: "every rank must get the same number of query heads",
    reason: "",
    fix: "choose a tensor-parallel degree that divides the head count ({TP_DEGREES|and} are supported)",
    model_fix: None,
};

/// A tensor-parallel degree that splits or replicates the KV heads.
pub const SHARDS_KV_HEADS: Rule = Rule {
    name: "ShardsKvHeads",
    param: Some("HEADS"),
    doc: "A tensor-parallel degree (`Self`) that splits `HEADS` KV heads evenly, or replicates them\nwhen it exceeds them.",
    values: Values::DividesOrReplicates {
        degrees: &TP_DEGREES,
        max: MAX_HEADS,
    },
    message: "tensor-parallel degree `{value}` neither divides nor is a multiple of {HEADS} KV heads",
    label: "KV heads are split evenly, or replicated when the degree exceeds them",
    reason: "with TP > kv_heads each KV head is replicated on TP / kv_heads ranks, which needs kv_heads to divide TP",
    fix: "",
    model_fix: None,
};

/// An index-head count the lightning indexer runs.
pub const INDEXER_HEADS: Rule = Rule {
    name: "IndexerHeads",
    param: None,
    doc: "An index-head count the lightning indexer runs: {INDEX_HEADS|or} heads of {INDEX_HEAD_DIM} channels.",
    values: Values::Set(&INDEX_HEADS),
    message: "lightning indexer with `{value}` index heads is not supported",
    label: "the lightning indexer runs H_IDX = {INDEX_HEADS|or} index heads",
    reason: "the kernel's tensor-core tile holds the heads of whole query tokens (DeepSeek V3.2: 64; GLM-5.2: 32)",
    fix: "",
    model_fix: Some("`index_n_heads` must be {INDEX_HEADS|or}"),
};

/// A top-k width the lightning indexer selects.
pub const INDEXER_TOPK: Rule = Rule {
    name: "IndexerTopk",
    param: None,
    doc: "A top-k width the lightning indexer and the top-k alone select: a positive multiple of {step} up
to {last}, so their indices are rows the sparse MLA prefill takes as they are.",
    values: Values::Steps {
        first: TOPK_STEP,
        step: TOPK_STEP,
        last: MAX_INDEX_TOPK,
    },
    message: "top-k width `{value}` is not a multiple of {step} up to {last}",
    label: "the lightning indexer and the top-k select TOPK = 128, 256, … {last} positions",
    reason: "its rows feed the sparse MLA prefill (multiples of {step}); the candidates of a query token live in shared memory ({last} at most)",
    fix: "pad to the next multiple of {step} (the extra columns hold -1 when fewer positions are valid)",
    model_fix: None,
};

/// A query-head count the sparse MLA decode runs.
pub const DECODE_HEADS: Rule = Rule {
    name: "DecodeHeads",
    param: None,
    doc: "A query-head count the sparse MLA decode runs as it is, without padding: {MLA_DECODE_HEADS|or}.",
    values: Values::Set(&MLA_DECODE_HEADS),
    message: "sparse MLA decode with `{value}` query heads is not supported",
    label: "the sparse MLA decode runs H_Q = {MLA_DECODE_HEADS|or} query heads",
    reason: "a rank holds a power-of-two share of the model's 64 or 128 heads (DeepSeek V3.2 at TP8: 16; GLM-5: 8)",
    fix: "run the next count up and give the extra heads zero queries",
    model_fix: None,
};

/// A page size of the FP8 sparse MLA cache.
pub const MLA_CACHE_PAGE_SIZE: Rule = Rule {
    name: "MlaCachePage",
    param: None,
    doc: "A page size of the FP8 sparse MLA cache: {MLA_CACHE_PAGE} tokens, the pages DeepSeek V3.2's \"FP8 with\nscale\" cache is laid out in.",
    values: Values::Set(&[MLA_CACHE_PAGE]),
    message: "FP8 sparse MLA cache pages of `{value}` tokens are not supported",
    label: "the FP8 sparse MLA cache has pages of PAGE = {MLA_CACHE_PAGE} tokens",
    reason: "the format's pages (FlashMLA's FP8 sparse kernels, the SM90 paged indexer) hold {MLA_CACHE_PAGE} tokens, and the cache shares its page table with them",
    fix: "use `MlaFp8KvCache<B, {MLA_CACHE_PAGE}, {MLA_SCALE_GROUP}>` (`DeepSeekV32KvCache<B>`); an engine with another page size keeps {MLA_CACHE_PAGE}-token pages for this cache",
    model_fix: None,
};

/// A scale-group width of the FP8 sparse MLA cache.
pub const MLA_SCALE_GROUP_WIDTH: Rule = Rule {
    name: "MlaScaleGroup",
    param: None,
    doc: "A scale-group width of the FP8 sparse MLA cache: {MLA_SCALE_GROUP} latent channels share one f32 scale,\nfour groups a token.",
    values: Values::Set(&[MLA_SCALE_GROUP]),
    message: "FP8 sparse MLA cache scale groups of `{value}` channels are not supported",
    label: "the FP8 sparse MLA cache scales GROUP = {MLA_SCALE_GROUP} latent channels with one f32",
    reason: "the 656-byte row of DeepSeek V3.2 holds 512 e4m3 latent values, four f32 scales and 64 bf16 RoPE values; other groupings are other formats (DeepSeek V4's rows have E8M0 scales per 64 channels)",
    fix: "use `MlaFp8KvCache<B, {MLA_CACHE_PAGE}, {MLA_SCALE_GROUP}>` (`DeepSeekV32KvCache<B>`)",
    model_fix: None,
};

/// A page size of the lightning indexer's paged key cache.
pub const INDEX_CACHE_PAGE_SIZE: Rule = Rule {
    name: "IndexCachePage",
    param: None,
    doc: "A page size of the lightning indexer's paged key cache: {INDEX_CACHE_PAGE} tokens, the pages of the FP8\nsparse MLA cache, so that one block table addresses both.",
    values: Values::Set(&[INDEX_CACHE_PAGE]),
    message: "index-key cache pages of `{value}` tokens are not supported",
    label: "the index-key cache has pages of PAGE = {INDEX_CACHE_PAGE} tokens",
    reason: "a page of the index-key cache is one 64-key block of the paged indexer (its keys one contiguous tile, then their scales), and the cache shares its block table with the FP8 sparse MLA cache's {MLA_CACHE_PAGE}-token pages",
    fix: "use `IndexKeyCache<B, {INDEX_CACHE_PAGE}>` (`DeepSeekV32IndexCache<B>`)",
    model_fix: None,
};

/// Every rule, in the order of `shapeproof::rules`.
pub const CATALOGUE: &[Rule] = &[
    MXFP8_WIDTH,
    PROLOGUE_HEAD_DIM,
    WHOLE_HEADS,
    CONV_WIDTH,
    ROW_OFFSET,
    PAGE_SIZE,
    MXFP8_PAGE_SIZE,
    MLA_HEAD_DIM,
    HEAD_TILE,
    PADS_TO,
    TOPK_WIDTH,
    SHARDS_HEADS,
    SHARDS_KV_HEADS,
    INDEXER_HEADS,
    INDEXER_TOPK,
    DECODE_HEADS,
    MLA_CACHE_PAGE_SIZE,
    MLA_SCALE_GROUP_WIDTH,
    INDEX_CACHE_PAGE_SIZE,
];

impl Rule {
    /// Whether `value` satisfies the rule (with the trait's parameter `param`, for the rules
    /// that have one).
    pub fn holds(&self, value: u64, param: Option<u64>) -> bool {
        self.values.holds(value, param)
    }

    /// The trait's doc comment.
    pub fn doc(&self) -> String {
        self.render(self.doc, "{value}", None)
    }

    /// The first line of the diagnostic for `value` (and the parameter's value `param`).
    pub fn message(&self, value: &str, param: Option<&str>) -> String {
        self.render(self.message, value, param)
    }

    /// The rule, as the trait's diagnostic shows it at the offending span.
    pub fn label(&self, value: &str, param: Option<&str>) -> String {
        self.render(self.label, value, param)
    }

    /// The trait diagnostic's note: the reason, then the fix.
    pub fn note(&self, value: &str, param: Option<&str>) -> String {
        self.join(&[self.reason, self.fix], value, param)
    }

    /// The note of a `model!` error: the rule, the reason, and the fix in the macro's terms.
    pub fn model_note(&self, value: &str, param: Option<&str>) -> String {
        let note = self.join(
            &[self.reason, self.model_fix.unwrap_or(self.fix)],
            value,
            param,
        );
        format!("{}; {note}", self.label(value, param))
    }

    /// The non-empty `parts`, rendered and joined with "; ".
    fn join(&self, parts: &[&str], value: &str, param: Option<&str>) -> String {
        parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| self.render(p, value, param))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// `template` with its placeholders filled (see the crate docs).
    ///
    /// # Panics
    ///
    /// On a placeholder the rule does not define, or `{value}` / the parameter without a value.
    pub fn render(&self, template: &str, value: &str, param: Option<&str>) -> String {
        let mut out = String::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let close = rest[open..]
                .find('}')
                .unwrap_or_else(|| panic!("rule `{}`: unclosed `{{` in {template:?}", self.name))
                + open;
            out.push_str(&self.placeholder(&rest[open + 1..close], value, param));
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        out
    }

    /// The text of one placeholder, `name` or `name|form`.
    fn placeholder(&self, spec: &str, value: &str, param: Option<&str>) -> String {
        let (name, form) = spec.split_once('|').unwrap_or((spec, ""));
        let unknown = || -> ! { panic!("rule `{}`: unknown placeholder `{{{spec}}}`", self.name) };
        if name == "value" {
            return value.to_string();
        }
        if Some(name) == self.param {
            return param.unwrap_or_else(|| unknown()).to_string();
        }
        match (name, self.values) {
            ("first", Values::Steps { first, .. }) => return first.to_string(),
            ("step", Values::Steps { step, .. }) => return step.to_string(),
            ("last", Values::Steps { last, .. }) => return last.to_string(),
            ("tiles", Values::PadsTo { narrow, wide, .. }) => return tiles(narrow, wide),
            _ => {}
        }
        let (_, values) = CONSTANTS
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| unknown());
        match form {
            "" => list(values, None),
            "or" => list(values, Some("or")),
            "and" => list(values, Some("and")),
            _ => unknown(),
        }
    }
}

/// `values` as "1, 2, 4" (no conjunction) or "1, 2 or 4" (conjunction `or`).
pub fn list(values: &[usize], conjunction: Option<&str>) -> String {
    let words: Vec<String> = values.iter().map(usize::to_string).collect();
    match (conjunction, words.split_last()) {
        (Some(and), Some((last, init))) if !init.is_empty() => {
            format!("{} {and} {last}", init.join(", "))
        }
        _ => words.join(", "),
    }
}

/// Which real head counts each tile takes: "tile 8 takes 1–8 real heads, 16 takes 9–16, …".
fn tiles(narrow: &[usize], wide: usize) -> String {
    let mut parts = Vec::new();
    let mut below = 0;
    for &tile in narrow {
        parts.push(format!("{tile} takes {}–{tile}", below + 1));
        below = tile;
    }
    parts.push(format!("{wide} takes 1–{wide}"));
    parts.push(format!(
        "a larger multiple of {wide} the {wide} counts up to it"
    ));
    let first = parts.remove(0);
    let mut out = format!("tile {first} real heads");
    for part in parts {
        out.push_str(", ");
        out.push_str(&part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_renders() {
        for rule in CATALOGUE {
            let param = rule.param.map(|_| "7");
            rule.doc();
            rule.message("3", param);
            rule.label("3", param);
            rule.note("3", param);
            rule.model_note("3", param);
        }
    }

    #[test]
    fn holds_agrees_with_the_table() {
        for rule in CATALOGUE {
            let members: std::collections::HashSet<_> = rule.values.members().into_iter().collect();
            for &(param, value) in &members {
                let param = param.map(|p| p as u64);
                assert!(
                    rule.holds(value as u64, param),
                    "{} {param:?} {value}",
                    rule.name
                );
            }
            let (params, values) = match rule.param {
                Some(_) => (
                    (0..=MAX_HEAD_TILE + 1).map(Some).collect(),
                    MAX_HEAD_TILE + 1,
                ),
                None => (vec![None], MAX_ROW_OFFSET + 1),
            };
            for param in params {
                for value in 0..=values {
                    let holds = rule.holds(value as u64, param.map(|p: usize| p as u64));
                    let listed = members.contains(&(param, value));
                    assert_eq!(holds, listed, "{} at {param:?}, {value}", rule.name);
                }
            }
        }
    }

    #[test]
    fn lists_and_tiles_read_as_sentences() {
        assert_eq!(list(&[1, 2, 4], Some("or")), "1, 2 or 4");
        assert_eq!(list(&[1, 2, 4], None), "1, 2, 4");
        assert_eq!(list(&[3], Some("and")), "3");
        assert_eq!(
            tiles(&[2, 4], 8),
            "tile 2 takes 1–2 real heads, 4 takes 3–4, 8 takes 1–8, a larger multiple of 8 the 8 counts up to it"
        );
    }
}
