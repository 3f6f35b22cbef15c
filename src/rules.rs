//! The shape rules of the kernels, one named trait each.
//!
//! A rule holds for a value when its trait is implemented for `Dim<value>`; the implementations
//! are generated tables (see `build.rs`) over the values the domain needs, so a value that breaks
//! a rule — or lies outside the table — has no implementation and the compiler reports the
//! trait's diagnostic: the message names the value, the label states the rule, the note gives the
//! reason and the fix. Every rule has a compile-fail case in `tests/ui/fail/`.
//!
//! Rules are bounds on constructors (one clean `E0277` at the call), never on structs.

use crate::dim::Dim;

/// A width (`DQ` or `DKV`) that the MXFP8 store can quantize: whole 128-channel heads, each one
/// scale atom of four 32-element blocks.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a multiple of 128: MXFP8 fused prologue requires head_dim-aligned Q/K/V",
    label = "MXFP8 needs a width that is a multiple of 128 (128 ..= 16384)",
    note = "MXFP8 quantizes 32-element blocks inside 128-channel scale atoms, one atom per head; use head dims that are multiples of 128, or a bf16 KV store (`Bf16Store`), which also takes head dims 64 and 256"
)]
pub trait Mxfp8Width {
    /// Heads of 128 channels in the width.
    const HEADS: usize;
    /// E8M0 scale bytes per row (`width / 32`).
    const SCALE_BYTES: usize;
    /// `HEADS` as a typenum type, usable as a `generic_array::GenericArray` length.
    type Heads: generic_array::ArrayLength;
}

/// A head dim the bf16-store prologue is instantiated for.
#[diagnostic::on_unimplemented(
    message = "head dim `{Self}` is not supported by the fused prologue",
    label = "the fused prologue takes head dims 64, 128 or 256",
    note = "one head is normalized by one aligned group of 8-channel lanes; 64, 128 and 256 are instantiated (MXFP8 needs 128)"
)]
pub trait PrologueHeadDim {}

/// A width that is a whole number of `HD`-wide heads.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a whole number of {HD}-wide heads",
    label = "the prologue needs widths that are multiples of the head dim {HD} (up to 16384)",
    note = "RMSNorm runs per head, so DQ = heads × head_dim and DKV = kv_heads × head_dim; check the per-rank head counts"
)]
pub trait WholeHeads<const HD: usize> {
    /// Heads in the width.
    const HEADS: usize;
}

/// A causal-conv width the prologue can run: at least one history tap.
#[diagnostic::on_unimplemented(
    message = "conv width `{Self}` is not supported",
    label = "the short convolution needs a width W with 2 <= W <= 8",
    note = "W - 1 history rows live in the conv-state cache; W = 1 would have no history (use no conv), and widths above 8 are not instantiated"
)]
pub trait ConvWidth {
    /// History rows in the conv-state cache, `W - 1`.
    const HISTORY: usize;
}

/// An element offset inside a packed projection row that starts a 16-byte vector.
#[diagnostic::on_unimplemented(
    message = "packed-row offset `{Self}` is not a multiple of 8",
    label = "offsets inside a bf16 qkvr row must be multiples of 8 elements (16 bytes), up to 32768",
    note = "each lane loads 8 channels as one 16-byte vector; move the slice so that it starts on a multiple of 8"
)]
pub trait RowOffset {}

/// A KV page size: a positive multiple of 32 tokens.
#[diagnostic::on_unimplemented(
    message = "page size `{Self}` is not a positive multiple of 32",
    label = "KV page sizes must be positive multiples of 32 tokens (up to 4096)",
    note = "pages are tiled in 32-token scale chunks; use 32, 64, 128, …"
)]
pub trait PageSize {
    /// 32-token chunks in a page, `PAGE / 32`.
    const SCALE_CHUNKS: usize;
}

/// A page size the MXFP8 interleaved scale planes support.
#[diagnostic::on_unimplemented(
    message = "page size `{Self}` is not a multiple of 128, as the MXFP8 interleaved scale planes require",
    label = "MXFP8 KV pages must be multiples of 128 tokens",
    note = "the scale planes are [pages, HKV, 32, PAGE/32, 4]: whole 128-row scale tiles per page, which block-scaled attention reads; use PAGE = 128"
)]
pub trait Mxfp8PageSize {}

/// A head dim the sparse MLA prefill supports.
#[diagnostic::on_unimplemented(
    message = "sparse MLA d_qk `{Self}` is not supported",
    label = "the sparse MLA prefill supports d_qk = 512 or 576",
    note = "d_qk = 512 latent channels + 0 or 64 RoPE channels (DeepSeek V3.2: 576; GLM-5.3-Flash, DeepSeek V4: 512)"
)]
pub trait MlaHeadDim {}
impl MlaHeadDim for Dim<512> {}
impl MlaHeadDim for Dim<576> {}

/// A query-head count the sparse MLA prefill runs as whole head tiles: one narrow tile of 8, 16
/// or 32 heads (`kernels/sparse_mla_narrow.cu`), or a multiple of 64, which the CUDA backend runs
/// in 64-head tiles of `kernels/sparse_mla_prefill.cu` (`HeadTiling`); only tiles holding a real
/// head are launched.
#[diagnostic::on_unimplemented(
    message = "query-head count `{Self}` is not a sparse MLA head tile",
    label = "the sparse MLA prefill runs head tiles of 8, 16 or 32 heads, or multiples of 64: H_Q must be 8, 16, 32, 64, 128, … (up to 1024)",
    note = "name the tile and the real count: `SparseMlaPrefill<D_QK, 16, TOPK, Plain, 12>` runs 12 real heads in one 16-head tile (the kernel pads; the caller passes the real heads)"
)]
pub trait HeadTile {
    /// Heads per unit of the rule: 8, 16 or 32 (one narrow tile), or 64 (a multiple of 64).
    const WIDTH: usize;
    /// Tiles per query row, `H_Q / WIDTH`.
    const TILES: usize;
}

/// A real query-head count (`Self`) that the padded head count `H_Q` holds: `HEADS <= H_Q` with
/// no smaller tile that holds it, except that the 64-head tile takes every count up to 64.
#[diagnostic::on_unimplemented(
    message = "real query-head count `{Self}` does not pad to {H_Q} heads",
    label = "tile 8 takes 1–8 real heads, 16 takes 9–16, 32 takes 17–32, 64 takes 1–64, a larger multiple of 64 the 64 counts up to it",
    note = "pad to the smallest tile that holds the real heads (12 -> 16, 20 -> 32, 40 -> 64, 128 -> 128)"
)]
pub trait PadsTo<const H_Q: usize> {}

/// A top-k width the sparse MLA prefill can loop over: a positive multiple of 128.
#[diagnostic::on_unimplemented(
    message = "top-k width `{Self}` is not a positive multiple of 128",
    label = "the sparse MLA prefill needs TOPK = 128, 256, … (up to 8192)",
    note = "each loop iteration consumes two 64-token blocks; pad the index rows with -1 up to the next multiple of 128"
)]
pub trait TopkWidth {
    /// 128-wide block pairs, `TOPK / 128`.
    const BLOCK_PAIRS: usize;
}

/// A tensor-parallel degree (`Self`) that splits `HEADS` attention heads evenly.
#[diagnostic::on_unimplemented(
    message = "tensor-parallel degree `{Self}` does not divide {HEADS} attention heads",
    label = "every rank must get the same number of query heads",
    note = "choose a tensor-parallel degree that divides the head count (powers of two up to 64 are supported)"
)]
pub trait ShardsHeads<const HEADS: usize> {
    /// Heads on each rank.
    const PER_RANK: usize;
}

/// A tensor-parallel degree (`Self`) that splits `HEADS` KV heads evenly, or replicates them
/// when it exceeds them.
#[diagnostic::on_unimplemented(
    message = "tensor-parallel degree `{Self}` neither divides nor is a multiple of {HEADS} KV heads",
    label = "KV heads are split evenly, or replicated when the degree exceeds them",
    note = "with TP > kv_heads each KV head is replicated on TP / kv_heads ranks, which needs kv_heads to divide TP"
)]
pub trait ShardsKvHeads<const HEADS: usize> {
    /// KV heads on each rank, `max(1, HEADS / TP)`.
    const PER_RANK: usize;
}

include!(concat!(env!("OUT_DIR"), "/rule_tables.rs"));
