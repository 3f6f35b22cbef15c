//! Generates the shape rules (`src/rules.rs`) from the rule catalogue (`shapeproof-rules`).
//!
//! Stable Rust cannot compute `N % 128 == 0` in a trait bound, so each rule is a marker trait
//! implemented for exactly the `Dim<N>` values that satisfy it. The catalogue states each rule
//! once: its values and its wording. This script writes, into `$OUT_DIR/rule_tables.rs`, every
//! rule's trait (doc comment, `#[diagnostic::on_unimplemented]` with the catalogue's wording, the
//! associated items below) and its implementation table; `model!` words its errors from the same
//! catalogue. `tests/dims.rs` proves that every value the library claims resolves and that the
//! neighbours outside the tables do not.

use std::fmt::Write as _;
use std::path::Path;

use shapeproof_rules::{self as rules, CATALOGUE, Rule};

/// What a trait adds to its catalogue rule: associated items, computed for each implementation.
struct Table {
    /// The rule.
    rule: Rule,
    /// The trait's associated items: a doc comment and a declaration each.
    items: &'static [(&'static str, &'static str)],
    /// Whether an error lists the implementing values (worth it for a few); a large table hides
    /// its implementations with `#[diagnostic::do_not_recommend]`.
    list_values: bool,
    /// The associated items of the implementation for `(parameter, value)`.
    body: fn(Option<usize>, usize) -> String,
}

/// The tables, one for each rule of the catalogue.
fn tables() -> Vec<Table> {
    let none = |_: Option<usize>, _: usize| String::new();
    vec![
        Table {
            rule: rules::MXFP8_WIDTH,
            items: &[
                ("Heads of 128 channels in the width.", "const HEADS: usize;"),
                (
                    "E8M0 scale bytes per row (`width / 32`).",
                    "const SCALE_BYTES: usize;",
                ),
                (
                    "`HEADS` as a typenum type, usable as a `generic_array::GenericArray` length.",
                    "type Heads: generic_array::ArrayLength;",
                ),
            ],
            list_values: false,
            body: |_, n| {
                let k = n / rules::SCALE_ATOM;
                format!(
                    "const HEADS: usize = {k}; const SCALE_BYTES: usize = {}; type Heads = typenum::U<{k}>;",
                    n / 32
                )
            },
        },
        Table {
            rule: rules::PROLOGUE_HEAD_DIM,
            items: &[(
                "Whether the MXFP8 store takes the head dim (`typenum::B1`) or only the bf16 store\n\
                 (`typenum::B0`): lets a type choose the store (`ops::prologue::PreferMxfp8`).",
                "type Mxfp8: typenum::Bit;",
            )],
            list_values: true,
            body: |_, hd| format!("type Mxfp8 = {};", bit(hd == rules::MXFP8_HEAD_DIM)),
        },
        Table {
            rule: rules::WHOLE_HEADS,
            items: &[("Heads in the width.", "const HEADS: usize;")],
            list_values: false,
            body: |hd, n| format!("const HEADS: usize = {};", n / param(hd)),
        },
        Table {
            rule: rules::CONV_WIDTH,
            items: &[(
                "History rows in the conv-state cache, `W - 1`.",
                "const HISTORY: usize;",
            )],
            list_values: false,
            body: |_, w| format!("const HISTORY: usize = {};", w - 1),
        },
        Table {
            rule: rules::ROW_OFFSET,
            items: &[],
            list_values: false,
            body: none,
        },
        Table {
            rule: rules::PAGE_SIZE,
            items: &[
                (
                    "Scale chunks in a page, `PAGE / 32`.",
                    "const SCALE_CHUNKS: usize;",
                ),
                (
                    "Whether the page is also an [`Mxfp8PageSize`] (`typenum::B1`) or not (`typenum::B0`):\n\
                     lets a type choose the store (`ops::prologue::PreferMxfp8`).",
                    "type Mxfp8: typenum::Bit;",
                ),
            ],
            list_values: false,
            body: |_, p| {
                format!(
                    "const SCALE_CHUNKS: usize = {}; type Mxfp8 = {};",
                    p / rules::PAGE_CHUNK,
                    bit(rules::MXFP8_PAGE_SIZE.holds(p as u64, None))
                )
            },
        },
        Table {
            rule: rules::MXFP8_PAGE_SIZE,
            items: &[],
            list_values: false,
            body: none,
        },
        Table {
            rule: rules::MLA_HEAD_DIM,
            items: &[],
            list_values: true,
            body: none,
        },
        Table {
            rule: rules::HEAD_TILE,
            items: &[
                (
                    "Heads per unit of the rule: a narrow tile's own count, or the wide tile's (for a\nmultiple of it).",
                    "const WIDTH: usize;",
                ),
                ("Tiles per query row, `H_Q / WIDTH`.", "const TILES: usize;"),
            ],
            list_values: false,
            body: |_, h| {
                let width = if rules::NARROW_HEAD_TILES.contains(&h) {
                    h
                } else {
                    rules::WIDE_HEAD_TILE
                };
                format!(
                    "const WIDTH: usize = {width}; const TILES: usize = {};",
                    h / width
                )
            },
        },
        Table {
            rule: rules::PADS_TO,
            items: &[],
            list_values: false,
            body: none,
        },
        Table {
            rule: rules::TOPK_WIDTH,
            items: &[(
                "128-wide block pairs, `TOPK / 128`.",
                "const BLOCK_PAIRS: usize;",
            )],
            list_values: false,
            body: |_, k| format!("const BLOCK_PAIRS: usize = {};", k / rules::TOPK_STEP),
        },
        Table {
            rule: rules::SHARDS_HEADS,
            items: &[("Heads on each rank.", "const PER_RANK: usize;")],
            list_values: false,
            body: |heads, tp| format!("const PER_RANK: usize = {};", param(heads) / tp),
        },
        Table {
            rule: rules::SHARDS_KV_HEADS,
            items: &[(
                "KV heads on each rank, `max(1, HEADS / TP)`.",
                "const PER_RANK: usize;",
            )],
            list_values: false,
            body: |heads, tp| format!("const PER_RANK: usize = {};", (param(heads) / tp).max(1)),
        },
        Table {
            rule: rules::INDEXER_HEADS,
            items: &[],
            list_values: true,
            body: none,
        },
        Table {
            rule: rules::INDEXER_TOPK,
            items: &[],
            list_values: false,
            body: none,
        },
        Table {
            rule: rules::DECODE_HEADS,
            items: &[],
            list_values: true,
            body: none,
        },
        Table {
            rule: rules::MLA_CACHE_PAGE_SIZE,
            items: &[],
            list_values: true,
            body: none,
        },
        Table {
            rule: rules::MLA_SCALE_GROUP_WIDTH,
            items: &[],
            list_values: true,
            body: none,
        },
        Table {
            rule: rules::INDEX_CACHE_PAGE_SIZE,
            items: &[],
            list_values: true,
            body: none,
        },
    ]
}

/// The parameter of a rule that has one.
fn param(p: Option<usize>) -> usize {
    p.expect("the rule has a parameter")
}

/// The typenum bit for `b`.
fn bit(b: bool) -> &'static str {
    if b { "typenum::B1" } else { "typenum::B0" }
}

/// `text` as doc-comment lines, indented by `indent`.
fn doc(out: &mut String, indent: &str, text: &str) {
    for line in text.lines() {
        writeln!(out, "{indent}/// {line}").unwrap();
    }
}

/// The trait of one table and its implementations.
fn write_table(out: &mut String, table: &Table) {
    let rule = &table.rule;
    // The trait's diagnostic: rustc fills `{Self}` and the parameter itself.
    let param = rule.param.map(|p| format!("{{{p}}}"));
    let param = param.as_deref();
    let note = rule.note("{Self}", param);
    assert!(!note.is_empty(), "rule `{}` has no note", rule.name);
    doc(out, "", &rule.doc());
    writeln!(
        out,
        "#[diagnostic::on_unimplemented(\n    message = {:?},\n    label = {:?},\n    note = {note:?}\n)]",
        rule.message("{Self}", param),
        rule.label("{Self}", param),
    )
    .unwrap();
    let generics = rule
        .param
        .map(|p| format!("<const {p}: usize>"))
        .unwrap_or_default();
    writeln!(out, "pub trait {}{generics} {{", rule.name).unwrap();
    for (text, item) in table.items {
        doc(out, "    ", text);
        writeln!(out, "    {item}").unwrap();
    }
    writeln!(out, "}}").unwrap();

    let hide = if table.list_values {
        ""
    } else {
        "#[diagnostic::do_not_recommend] "
    };
    for (param, value) in rule.values.members() {
        let args = param.map(|p| format!("<{p}>")).unwrap_or_default();
        let body = (table.body)(param, value);
        let body = if body.is_empty() {
            "{}".to_string()
        } else {
            format!("{{ {body} }}")
        };
        writeln!(
            out,
            "{hide}impl {}{args} for Dim<{value}> {body}",
            rule.name
        )
        .unwrap();
    }
}

fn main() {
    let tables = tables();
    let names = |names: Vec<&str>| names.join(", ");
    assert_eq!(
        names(tables.iter().map(|t| t.rule.name).collect()),
        names(CATALOGUE.iter().map(|r| r.name).collect()),
        "build.rs needs one table for each rule of the catalogue, in its order"
    );
    let mut out = String::new();
    for table in &tables {
        write_table(&mut out, table);
    }

    // The claimed ranges, for the docs and for the test that proves them.
    for (name, what, value) in [
        (
            "MAX_WIDTH",
            "width the MXFP8 and whole-head tables cover",
            rules::MAX_WIDTH,
        ),
        (
            "MAX_ROW_OFFSET",
            "packed-row offset the alignment table covers",
            rules::MAX_ROW_OFFSET,
        ),
        (
            "MAX_PAGE",
            "page size the page tables cover",
            rules::MAX_PAGE,
        ),
        (
            "MAX_TOPK",
            "top-k width the top-k table covers",
            rules::MAX_TOPK,
        ),
        (
            "MAX_HEAD_TILE",
            "padded query-head count the head-tile table covers",
            rules::MAX_HEAD_TILE,
        ),
        (
            "MAX_HEADS",
            "head count the tensor-parallel tables cover",
            rules::MAX_HEADS,
        ),
    ] {
        writeln!(
            out,
            "/// Largest {what}.\npub const {name}: usize = {value};"
        )
        .unwrap();
    }

    let out_dir = std::env::var("OUT_DIR").unwrap();
    std::fs::write(Path::new(&out_dir).join("rule_tables.rs"), out).unwrap();
    std::fs::write(Path::new(&out_dir).join("rule_claims.rs"), claims()).unwrap();
    println!("cargo::rerun-if-changed=build.rs");
}

/// The values the library claims each rule accepts, as calls for `tests/dims.rs`, enumerated
/// from the documented ranges (not from the catalogue's tables) so that a gap in a table fails.
fn claims() -> String {
    use rules::{MAX_HEAD_TILE, MAX_PAGE, MAX_ROW_OFFSET, MAX_TOPK, MAX_WIDTH};
    let mut c = String::from("fn claimed_values_resolve() {\n");
    for n in (128..=MAX_WIDTH).step_by(128) {
        writeln!(c, "    mxfp8_width::<{n}>();").unwrap();
        writeln!(c, "    whole_heads::<128, {n}>();").unwrap();
    }
    for hd in rules::PROLOGUE_HEAD_DIMS {
        for n in (hd..=MAX_WIDTH).step_by(hd) {
            writeln!(c, "    whole_heads::<{hd}, {n}>();").unwrap();
        }
    }
    for p in (32..=MAX_PAGE).step_by(32) {
        writeln!(c, "    page_size::<{p}>();").unwrap();
    }
    for p in (128..=MAX_PAGE).step_by(128) {
        writeln!(c, "    mxfp8_page_size::<{p}>();").unwrap();
    }
    for k in (128..=MAX_TOPK).step_by(128) {
        writeln!(c, "    topk_width::<{k}>();").unwrap();
    }
    for k in (128..=rules::MAX_INDEX_TOPK).step_by(128) {
        writeln!(c, "    indexer_topk::<{k}>();").unwrap();
    }
    for h in rules::INDEX_HEADS {
        writeln!(c, "    indexer_heads::<{h}>();").unwrap();
    }
    for h in rules::MLA_DECODE_HEADS {
        writeln!(c, "    decode_heads::<{h}>();").unwrap();
    }
    writeln!(c, "    mla_cache_page::<{}>();", rules::MLA_CACHE_PAGE).unwrap();
    writeln!(c, "    mla_scale_group::<{}>();", rules::MLA_SCALE_GROUP).unwrap();
    writeln!(c, "    index_cache_page::<{}>();", rules::INDEX_CACHE_PAGE).unwrap();
    for h in rules::NARROW_HEAD_TILES {
        writeln!(c, "    head_tile::<{h}>();").unwrap();
    }
    for h in (64..=MAX_HEAD_TILE).step_by(64) {
        writeln!(c, "    head_tile::<{h}>();").unwrap();
    }
    for o in (0..=MAX_ROW_OFFSET).step_by(8) {
        writeln!(c, "    row_offset::<{o}>();").unwrap();
    }
    for w in rules::MIN_CONV_WIDTH..=rules::MAX_CONV_WIDTH {
        writeln!(c, "    conv_width::<{w}>();").unwrap();
    }
    c.push_str("}\n");
    c
}
