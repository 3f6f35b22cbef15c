//! Memory layouts of the KV caches, as types.
//!
//! A cache type owns every buffer of its format and is built in one step, so the formats'
//! invariants (an MXFP8 cache has both scale planes, of the shape its page size and head count
//! fix, contiguous) hold by construction rather than by a check at each call.

mod mla;
mod mxfp8;
mod paged;
mod scale_plane;

pub use mla::MlaLatentKv;
pub use mxfp8::{Mxfp8KvCache, Mxfp8KvParts, ScalePlanePage};
pub use paged::PagedBf16Kv;
pub use scale_plane::{kv_data_offset, scale_plane_offset};
