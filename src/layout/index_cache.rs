//! The lightning indexer's paged key cache (docs/kernels/indexer.md §6): one e4m3 key of 128
//! channels and one f32 scale a token, in pages of `PAGE` tokens whose keys come first (one
//! contiguous `[PAGE, 128]` tile, the block the paged indexer multiplies) and their scales
//! after. Also the host encoder and decoder both backends follow bit for bit.

use crate::backend::Backend;
use crate::dim::{Dim, PagedSlots};
use crate::dtype::{bf16, e4m3_from_f32, e4m3_to_f32};
use crate::error::{Error, Result};
use crate::rules::IndexCachePage;
use crate::tensor::{FixedExtent, Owned, RowShape, Storage, StorageMut, Tensor};

/// Channels of an index key: the e4m3 bytes of its row.
pub const INDEX_KEY_DIM: usize = shapeproof_rules::INDEX_HEAD_DIM;

/// Bytes a token takes in the cache: its 128 e4m3 bytes and its f32 scale.
pub const INDEX_KEY_ROW_BYTES: usize = INDEX_KEY_DIM + 4;

/// The floor of a key's largest magnitude before it becomes a scale: a key of zeros (or of
/// tiny values) gets the scale of `1e-4`, as DeepSeek V3.2's reference quantizer floors it.
pub const INDEX_KEY_AMAX_FLOOR: f32 = 1e-4;

/// One page of the index-key cache: `PAGE` keys of 128 bytes, then their `PAGE` f32 scales
/// (`PAGE · 132` bytes).
pub struct IndexKeyPage<const PAGE: usize>;

impl<const PAGE: usize> RowShape for IndexKeyPage<PAGE> {
    const COLS: usize = PAGE * INDEX_KEY_ROW_BYTES;
}

/// Where slot `slot`'s bytes lie in a cache of `PAGE`-token pages: the byte offset of its 128
/// key bytes and of its 4 scale bytes (page `slot / PAGE`, the keys of a page first).
pub const fn index_key_offsets<const PAGE: usize>(slot: usize) -> (usize, usize) {
    let page = (slot / PAGE) * PAGE * INDEX_KEY_ROW_BYTES;
    let offset = slot % PAGE;
    (
        page + offset * INDEX_KEY_DIM,
        page + PAGE * INDEX_KEY_DIM + offset * 4,
    )
}

/// The index-key cache of one layer: `pages × PAGE` token slots (`page · PAGE + offset`, the
/// slots of the FP8 sparse MLA cache, so one block table serves both). The page size comes from
/// the type (`PAGE = 64`); another is a compile error. Owned, or a view of an engine's pool
/// (`S = ViewMut<'a>`).
///
/// The field is private: the slot count stays what the pages hold and addressable by an i32
/// index, as the kernels assume. Bytes written through [`bytes_mut`](Self::bytes_mut) are data:
/// any bytes decode, none can move a kernel out of bounds.
pub struct IndexKeyCache<B: Backend, const PAGE: usize, S: Storage<B> = Owned> {
    pages: Tensor<B, u8, IndexKeyPage<PAGE>, S>, // [pages, PAGE · 132]
    slots: PagedSlots<PAGE>,
}

/// DeepSeek V3.2's index-key cache (and GLM-5's): pages of 64 tokens.
pub type DeepSeekV32IndexCache<B, S = Owned> = IndexKeyCache<B, 64, S>;

impl<B: Backend, const PAGE: usize> IndexKeyCache<B, PAGE> {
    /// A zeroed cache of `pages` pages (every key decodes to zeros).
    pub fn zeros(backend: &B, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: IndexCachePage,
    {
        Self::from_tensor(Tensor::zeros(backend, pages)?)
    }

    /// The cache over the caller's buffer of `pages × PAGE × 132` bytes.
    pub fn from_buffer(buf: B::Buffer<u8>, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: IndexCachePage,
    {
        Self::from_tensor(Tensor::from_buffer("index_cache", buf, pages)?)
    }
}

impl<B: Backend, const PAGE: usize, S: Storage<B>> IndexKeyCache<B, PAGE, S> {
    /// The cache over a tensor of pages (owned, or a view of an engine's pool); its slots,
    /// `pages × PAGE`, must be addressable by an i32 index.
    pub fn from_tensor(pages: Tensor<B, u8, IndexKeyPage<PAGE>, S>) -> Result<Self>
    where
        Dim<PAGE>: IndexCachePage,
    {
        Error::check_i32_product("index_cache pages", pages.rows(), PAGE)?;
        let slots = PagedSlots::<PAGE>::new(pages.rows());
        Ok(Self { pages, slots })
    }

    /// Number of token slots, `pages × PAGE`.
    pub fn slots(&self) -> usize {
        self.slots.slots()
    }

    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.slots.pages()
    }

    /// The pages, `[pages, PAGE · 132]` bytes.
    pub fn bytes(&self) -> &Tensor<B, u8, IndexKeyPage<PAGE>, S> {
        &self.pages
    }

    /// The pages back.
    pub fn into_tensor(self) -> Tensor<B, u8, IndexKeyPage<PAGE>, S> {
        self.pages
    }

    /// The bytes as a kernel reads them, `[pages, PAGE · 132]`.
    pub(crate) fn slice(&self) -> B::Slice<'_, u8> {
        self.pages.as_slice()
    }
}

impl<B: Backend, const PAGE: usize, S: StorageMut<B>> IndexKeyCache<B, PAGE, S> {
    /// The pages, writable in place (e.g. restored from a host copy); the page count is fixed.
    pub fn bytes_mut(&mut self) -> FixedExtent<'_, B, u8, IndexKeyPage<PAGE>, S> {
        FixedExtent::new(&mut self.pages)
    }

    /// The bytes as a kernel writes them, `[pages, PAGE · 132]`.
    pub(crate) fn slice_mut(&mut self) -> B::SliceMut<'_, u8> {
        self.pages.as_slice_mut()
    }
}

/// The scale of a key whose largest magnitude is `amax`: the smallest power of two at or above
/// `max(amax, 1e-4) / 448` (the quotient an IEEE f32 division), `+inf` when `amax` is. Every
/// finite value of the key then divides to at most 448 in magnitude, so the e4m3 cast never
/// saturates and the division by a power of two is exact.
pub fn index_key_scale_for(amax: f32) -> f32 {
    crate::dtype::pow2_at_or_above(amax.max(INDEX_KEY_AMAX_FLOOR) / crate::dtype::E4M3_MAX)
}

/// Encodes one key: `key` is `[128]` bf16 (after the caller's norm, RoPE and rotation); the
/// result is its `[128]` e4m3 bytes (`x / scale`, round to nearest even, NaN to 0x7F) and its
/// scale, [`index_key_scale_for`] of its largest magnitude (NaN values ignored).
pub fn index_key_encode(key: &[bf16; INDEX_KEY_DIM]) -> ([u8; INDEX_KEY_DIM], f32) {
    let x: [f32; INDEX_KEY_DIM] = std::array::from_fn(|i| key[i].to_f32());
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = index_key_scale_for(amax);
    let inv = 1.0 / scale; // exact: a power of two, or 0 for +inf
    let bytes = std::array::from_fn(|i| {
        let q = if scale.is_infinite() {
            x[i] / scale
        } else {
            x[i] * inv
        };
        e4m3_from_f32(q).to_bits()
    });
    (bytes, scale)
}

/// Decodes one key's `[128]` e4m3 bytes to their values (the scale is kept apart: the indexer
/// applies it to the whole logit).
pub fn index_key_decode(bytes: &[u8; INDEX_KEY_DIM]) -> [f32; INDEX_KEY_DIM] {
    std::array::from_fn(|i| e4m3_to_f32(float8::F8E4M3::from_bits(bytes[i])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_is_the_power_of_two_at_or_above_the_floored_quotient() {
        assert_eq!(index_key_scale_for(448.0), 1.0);
        assert_eq!(index_key_scale_for(449.0), 2.0);
        assert_eq!(index_key_scale_for(0.0), 2f32.powi(-22)); // 1e-4 / 448 ≈ 2.23e-7
        assert_eq!(index_key_scale_for(f32::INFINITY), f32::INFINITY);
        for amax in [1e-3f32, 0.37, 1.0, 3.5, 1000.0, 6.0e4] {
            let s = index_key_scale_for(amax);
            assert_eq!(s.to_bits() & 0x007f_ffff, 0, "{amax}: a power of two");
            assert!(
                amax / s <= 448.0 && amax / (s / 2.0) > 448.0,
                "{amax}: smallest"
            );
        }
    }

    #[test]
    fn offsets_put_a_pages_keys_before_its_scales() {
        assert_eq!(index_key_offsets::<64>(0), (0, 8192));
        assert_eq!(index_key_offsets::<64>(63), (63 * 128, 8192 + 63 * 4));
        assert_eq!(index_key_offsets::<64>(64), (8448, 8448 + 8192));
    }
}
