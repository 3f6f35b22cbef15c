//! Generates the number tables behind the shape rules (`src/rules.rs`).
//!
//! Stable Rust cannot compute `N % 128 == 0` in a trait bound, so each rule is a marker trait
//! implemented for exactly the `Dim<N>` values that satisfy it. The tables are written here once,
//! from the ranges in `TABLES`, into `$OUT_DIR/rule_tables.rs`; `tests/dims.rs` proves that every
//! value the library claims resolves and that the neighbours outside the tables do not.

use std::fmt::Write as _;
use std::path::Path;

/// Largest head width (`DQ`, `DKV`) a rule table covers: Inkling at TP1 needs 8192.
const MAX_WIDTH: usize = 16384;
/// Largest element offset inside a packed projection row.
const MAX_ROW_OFFSET: usize = 32768;
/// Largest KV page size.
const MAX_PAGE: usize = 4096;
/// Largest top-k width of the sparse MLA prefill.
const MAX_TOPK: usize = 8192;
/// Largest padded query-head count of the sparse MLA prefill (one 64-head tile at a time).
const MAX_HEAD_TILE: usize = 1024;
/// Head tiles of the narrow sparse MLA kernel (fewer than 64 heads per rank, not padded to 64).
const NARROW_HEAD_TILES: [usize; 3] = [8, 16, 32];
/// Conv widths the prologue is instantiated for.
const CONV_WIDTHS: std::ops::RangeInclusive<usize> = 2..=8;
/// Head dims the bf16-store prologue supports.
const PROLOGUE_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Largest attention-head count the tensor-parallel tables cover.
const MAX_HEADS: usize = 256;
/// Tensor-parallel degrees the tables cover.
const TP_DEGREES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

fn main() {
    let mut out = String::new();
    let hide = "#[diagnostic::do_not_recommend]";

    // MXFP8 widths: multiples of 128 (one 128-channel scale atom per head).
    for k in 1..=MAX_WIDTH / 128 {
        let n = k * 128;
        writeln!(
            out,
            "{hide} impl Mxfp8Width for Dim<{n}> {{ const HEADS: usize = {k}; const SCALE_BYTES: usize = {}; type Heads = typenum::U<{k}>; }}",
            n / 32
        )
        .unwrap();
    }
    // Whole heads of each supported head dim.
    for hd in PROLOGUE_HEAD_DIMS {
        writeln!(out, "impl PrologueHeadDim for Dim<{hd}> {{}}").unwrap();
        for k in 1..=MAX_WIDTH / hd {
            writeln!(
                out,
                "{hide} impl WholeHeads<{hd}> for Dim<{}> {{ const HEADS: usize = {k}; }}",
                k * hd
            )
            .unwrap();
        }
    }
    for w in CONV_WIDTHS {
        writeln!(
            out,
            "{hide} impl ConvWidth for Dim<{w}> {{ const HISTORY: usize = {}; }}",
            w - 1
        )
        .unwrap();
    }
    for k in 0..=MAX_ROW_OFFSET / 8 {
        writeln!(out, "{hide} impl RowOffset for Dim<{}> {{}}", k * 8).unwrap();
    }
    for k in 1..=MAX_PAGE / 32 {
        let p = k * 32;
        writeln!(
            out,
            "{hide} impl PageSize for Dim<{p}> {{ const SCALE_CHUNKS: usize = {k}; }}"
        )
        .unwrap();
        if p % 128 == 0 {
            writeln!(out, "{hide} impl Mxfp8PageSize for Dim<{p}> {{}}").unwrap();
        }
    }
    for k in 1..=MAX_TOPK / 128 {
        writeln!(
            out,
            "{hide} impl TopkWidth for Dim<{}> {{ const BLOCK_PAIRS: usize = {k}; }}",
            k * 128
        )
        .unwrap();
    }
    // Head tiles: the narrow kernel's 8, 16 and 32, and the multiples of 64 (run in the narrow
    // kernel's 64-head tiles or the 64-head kernel's, `HeadTiling`).
    // A real count pads to a tile that holds it with no smaller tile beside it: a narrow tile
    // takes the counts above the next smaller narrow tile (12 -> 16, 20 -> 32), the 64-head tile
    // every count up to 64 (the padded wide path stays available), 64k the counts above 64(k-1).
    for tile in NARROW_HEAD_TILES {
        writeln!(
            out,
            "{hide} impl HeadTile for Dim<{tile}> {{ const WIDTH: usize = {tile}; const TILES: usize = 1; }}"
        )
        .unwrap();
    }
    for k in 1..=MAX_HEAD_TILE / 64 {
        writeln!(
            out,
            "{hide} impl HeadTile for Dim<{}> {{ const WIDTH: usize = 64; const TILES: usize = {k}; }}",
            k * 64
        )
        .unwrap();
    }
    let mut below = 0;
    for tile in NARROW_HEAD_TILES {
        for heads in below + 1..=tile {
            writeln!(out, "{hide} impl PadsTo<{tile}> for Dim<{heads}> {{}}").unwrap();
        }
        below = tile;
    }
    for k in 1..=MAX_HEAD_TILE / 64 {
        for heads in (k - 1) * 64 + 1..=k * 64 {
            writeln!(out, "{hide} impl PadsTo<{}> for Dim<{heads}> {{}}", k * 64).unwrap();
            if heads % 64 != 0 && !NARROW_HEAD_TILES.contains(&heads) {
                // A count trivially "pads" to itself, so an unpadded count reports only the
                // head-tile rule, not a second error.
                writeln!(out, "{hide} impl PadsTo<{heads}> for Dim<{heads}> {{}}").unwrap();
            }
        }
    }
    for tp in TP_DEGREES {
        for heads in 1..=MAX_HEADS {
            if heads % tp == 0 {
                writeln!(
                    out,
                    "{hide} impl ShardsHeads<{heads}> for Dim<{tp}> {{ const PER_RANK: usize = {}; }}",
                    heads / tp
                )
                .unwrap();
            }
            if heads % tp == 0 || tp % heads == 0 {
                writeln!(
                    out,
                    "{hide} impl ShardsKvHeads<{heads}> for Dim<{tp}> {{ const PER_RANK: usize = {}; }}",
                    (heads / tp).max(1)
                )
                .unwrap();
            }
        }
    }

    // The claimed ranges, for the docs and for the test that proves them.
    writeln!(
        out,
        "/// Largest width the MXFP8 and whole-head tables cover.\npub const MAX_WIDTH: usize = {MAX_WIDTH};\n\
         /// Largest packed-row offset the alignment table covers.\npub const MAX_ROW_OFFSET: usize = {MAX_ROW_OFFSET};\n\
         /// Largest page size the page tables cover.\npub const MAX_PAGE: usize = {MAX_PAGE};\n\
         /// Largest top-k width the top-k table covers.\npub const MAX_TOPK: usize = {MAX_TOPK};\n\
         /// Largest padded query-head count the head-tile table covers.\npub const MAX_HEAD_TILE: usize = {MAX_HEAD_TILE};\n\
         /// Largest head count the tensor-parallel tables cover.\npub const MAX_HEADS: usize = {MAX_HEADS};"
    )
    .unwrap();

    let out_dir = std::env::var("OUT_DIR").unwrap();
    std::fs::write(Path::new(&out_dir).join("rule_tables.rs"), out).unwrap();
    std::fs::write(Path::new(&out_dir).join("rule_claims.rs"), claims()).unwrap();
    println!("cargo::rerun-if-changed=build.rs");
}

/// The values the library claims each rule accepts, as calls for `tests/dims.rs`, enumerated
/// from the documented ranges (not from the tables above) so that a gap in a table fails.
fn claims() -> String {
    let mut c = String::from("fn claimed_values_resolve() {\n");
    for n in (128..=MAX_WIDTH).step_by(128) {
        writeln!(c, "    mxfp8_width::<{n}>();").unwrap();
        writeln!(c, "    whole_heads::<128, {n}>();").unwrap();
    }
    for hd in PROLOGUE_HEAD_DIMS {
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
    for h in [8, 16, 32] {
        writeln!(c, "    head_tile::<{h}>();").unwrap();
    }
    for h in (64..=MAX_HEAD_TILE).step_by(64) {
        writeln!(c, "    head_tile::<{h}>();").unwrap();
    }
    for o in (0..=MAX_ROW_OFFSET).step_by(8) {
        writeln!(c, "    row_offset::<{o}>();").unwrap();
    }
    for w in CONV_WIDTHS {
        writeln!(c, "    conv_width::<{w}>();").unwrap();
    }
    c.push_str("}\n");
    c
}
