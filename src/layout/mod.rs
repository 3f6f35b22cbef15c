//! Memory layouts of the KV caches, as types.
//!
//! A cache type owns every buffer of its format and is built in one step, so the formats'
//! invariants (an MXFP8 cache has both scale planes, of the shape its page size and head count
//! fix, contiguous) hold by construction rather than by a check at each call.

mod index_cache;
mod mla;
mod mla_fp8;
mod mxfp8;
mod paged;
mod scale_plane;

pub use index_cache::{
    DeepSeekV32IndexCache, INDEX_KEY_AMAX_FLOOR, INDEX_KEY_DIM, INDEX_KEY_ROW_BYTES, IndexKeyCache,
    IndexKeyPage, index_key_decode, index_key_encode, index_key_offsets, index_key_scale_for,
};
pub use mla::MlaLatentKv;
pub use mla_fp8::{
    DeepSeekV32KvCache, MLA_CACHE_DIM, MLA_FP8_ROW_BYTES, MLA_LATENT_DIM, MLA_MIN_SCALE,
    MLA_ROPE_DIM, MlaFp8KvCache, MlaFp8Page, mla_fp8_decode_row, mla_fp8_encode_row,
    mla_fp8_row_bytes, mla_fp8_scale_for,
};
pub use mxfp8::{Mxfp8KvCache, Mxfp8KvParts, ScalePlanePage};
pub use paged::PagedBf16Kv;
pub use scale_plane::{kv_data_offset, scale_plane_offset};
