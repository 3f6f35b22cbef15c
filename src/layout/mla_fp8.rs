//! The FP8 sparse MLA cache of DeepSeek V3.2 ("FP8 with scale", docs/kernels/mla_cache.md):
//! one row of bytes a token, pages of `PAGE` tokens, the store's and the gather's format, and
//! its host encoder and decoder (the definition both backends follow bit for bit).

use crate::backend::Backend;
use crate::dim::{Dim, PagedSlots};
use crate::dtype::{bf16, e4m3_from_f32, e4m3_to_f32};
use crate::error::{Error, Result};
use crate::rules::{MlaCachePage, MlaScaleGroup};
use crate::tensor::{FixedExtent, Owned, RowShape, Storage, StorageMut, Tensor};

/// Latent ("NoPE") channels of a row: quantized to e4m3 in scale groups.
pub const MLA_LATENT_DIM: usize = shapeproof_rules::MLA_D_V;
/// RoPE channels of a row: kept as bf16.
pub const MLA_ROPE_DIM: usize = shapeproof_rules::MLA_ROPE_DIMS[1];
/// Channels of the row the store takes and the gather gives back, `d_qk = 512 + 64`.
pub const MLA_CACHE_DIM: usize = MLA_LATENT_DIM + MLA_ROPE_DIM;
/// Smallest scale of a group, `2^-13`: the power of two at or above `1e-4`, the floor the format
/// applies to `amax / 448` (a group of zeros gets it).
pub const MLA_MIN_SCALE: f32 = 1.0 / 8192.0;

/// Bytes of one token's row with scale groups of `group` channels:
/// `512` e4m3 latent bytes, `4 · 512 / group` bytes of f32 scales, `2 · 64` bytes of bf16 RoPE
/// (656 for the format's groups of 128).
pub const fn mla_fp8_row_bytes(group: usize) -> usize {
    MLA_LATENT_DIM + 4 * (MLA_LATENT_DIM / group) + 2 * MLA_ROPE_DIM
}

/// Bytes of a row of the format (groups of 128): 656.
pub const MLA_FP8_ROW_BYTES: usize = mla_fp8_row_bytes(GROUP_128);

/// The format's scale group (the catalogue's `MLA_SCALE_GROUP`).
const GROUP_128: usize = shapeproof_rules::MLA_SCALE_GROUP;
/// Byte offset of the scales in a row (after the latent bytes).
const SCALES_AT: usize = MLA_LATENT_DIM;
/// Byte offset of the RoPE values in a row (after the four scales).
const ROPE_AT: usize = MLA_LATENT_DIM + 4 * (MLA_LATENT_DIM / GROUP_128);

/// One page of the cache: `PAGE` rows of `mla_fp8_row_bytes(GROUP)` bytes.
pub struct MlaFp8Page<const PAGE: usize, const GROUP: usize>;
impl<const PAGE: usize, const GROUP: usize> RowShape for MlaFp8Page<PAGE, GROUP> {
    const COLS: usize = PAGE * mla_fp8_row_bytes(GROUP);
}

/// The FP8 sparse MLA cache of one layer: `pages × PAGE` token slots, slot `s` the bytes
/// `[s · ROW_BYTES, (s + 1) · ROW_BYTES)` — e4m3 latent values, one f32 scale per `GROUP`
/// latent channels, bf16 RoPE values. The page size, the groups and the row size come from the
/// type (`PAGE = 64`, `GROUP = 128`: 656 bytes a token); another page size or grouping is a
/// compile error. Owned, or a view of an engine's pool (`S = ViewMut<'a>`).
///
/// The field is private: the slot count stays what the pages hold and addressable by an i32
/// index, as the kernels assume. Bytes written through [`bytes_mut`](Self::bytes_mut) are data:
/// any bytes decode (a NaN scale decodes to NaN values), none can move a kernel out of bounds.
pub struct MlaFp8KvCache<B: Backend, const PAGE: usize, const GROUP: usize, S: Storage<B> = Owned> {
    pages: Tensor<B, u8, MlaFp8Page<PAGE, GROUP>, S>, // [pages, PAGE, ROW_BYTES]
    slots: PagedSlots<PAGE>,
}

/// DeepSeek V3.2's cache (and GLM-5's): pages of 64 tokens, scale groups of 128 channels.
pub type DeepSeekV32KvCache<B, S = Owned> = MlaFp8KvCache<B, 64, 128, S>;

impl<B: Backend, const PAGE: usize, const GROUP: usize> MlaFp8KvCache<B, PAGE, GROUP> {
    /// A zeroed cache of `pages` pages (every slot decodes to zeros).
    pub fn zeros(backend: &B, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        Self::from_tensor(Tensor::zeros(backend, pages)?)
    }

    /// The cache over the caller's buffer of `pages × PAGE × ROW_BYTES` bytes.
    pub fn from_buffer(buf: B::Buffer<u8>, pages: usize) -> Result<Self>
    where
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        Self::from_tensor(Tensor::from_buffer("kv_cache", buf, pages)?)
    }
}

impl<B: Backend, const PAGE: usize, const GROUP: usize, S: Storage<B>>
    MlaFp8KvCache<B, PAGE, GROUP, S>
{
    /// Bytes of one token's row.
    pub const ROW_BYTES: usize = mla_fp8_row_bytes(GROUP);

    /// The cache over a tensor of pages (owned, or a view of an engine's pool); its slots,
    /// `pages × PAGE`, must be addressable by an i32 index.
    pub fn from_tensor(pages: Tensor<B, u8, MlaFp8Page<PAGE, GROUP>, S>) -> Result<Self>
    where
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        let slots = PagedSlots::<PAGE>::new(pages.rows());
        Error::check_i32_product("kv_cache pages", pages.rows(), PAGE)?;
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

    /// The pages, `[pages, PAGE, ROW_BYTES]` bytes.
    pub fn bytes(&self) -> &Tensor<B, u8, MlaFp8Page<PAGE, GROUP>, S> {
        &self.pages
    }

    /// The pages back.
    pub fn into_tensor(self) -> Tensor<B, u8, MlaFp8Page<PAGE, GROUP>, S> {
        self.pages
    }

    /// The bytes as a kernel reads them, `[slots, ROW_BYTES]`.
    pub(crate) fn slice(&self) -> B::Slice<'_, u8> {
        self.pages.as_slice()
    }
}

impl<B: Backend, const PAGE: usize, const GROUP: usize, S: StorageMut<B>>
    MlaFp8KvCache<B, PAGE, GROUP, S>
{
    /// The pages, writable in place (e.g. restored from a host copy); the page count is fixed.
    pub fn bytes_mut(&mut self) -> FixedExtent<'_, B, u8, MlaFp8Page<PAGE, GROUP>, S> {
        FixedExtent::new(&mut self.pages)
    }

    /// The bytes as a kernel writes them, `[slots, ROW_BYTES]`.
    pub(crate) fn slice_mut(&mut self) -> B::SliceMut<'_, u8> {
        self.pages.as_slice_mut()
    }
}

/// The scale of a group whose largest magnitude is `amax`: the smallest power of two at or
/// above `max(amax / 448, 2^-13)` (the quotient an IEEE f32 division), `+inf` when `amax` is.
/// Every finite value of the group then divides to at most 448 in magnitude, so the e4m3 cast
/// never saturates and the division by a power of two is exact.
pub fn mla_fp8_scale_for(amax: f32) -> f32 {
    crate::dtype::pow2_at_or_above((amax / crate::dtype::E4M3_MAX).max(MLA_MIN_SCALE))
}

/// Encodes one token: `row` is `[576]` bf16 (latent | RoPE), `out` its `[656]` bytes. Each
/// group of 128 latent values gets [`mla_fp8_scale_for`] of its largest magnitude (NaN values
/// ignored) and the e4m3 bytes of `x / scale` (round to nearest even, NaN to 0x7F); the scales
/// follow as little-endian f32, then the RoPE values as they are.
pub fn mla_fp8_encode_row(row: &[bf16; MLA_CACHE_DIM], out: &mut [u8; MLA_FP8_ROW_BYTES]) {
    for (g, group) in row[..MLA_LATENT_DIM].chunks_exact(GROUP_128).enumerate() {
        let x: [f32; GROUP_128] = std::array::from_fn(|i| group[i].to_f32());
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = mla_fp8_scale_for(amax);
        let inv = 1.0 / scale; // exact: a power of two in [2^-120, 2^13], or 0 for +inf
        for (i, v) in x.iter().enumerate() {
            let q = if scale.is_infinite() {
                v / scale
            } else {
                v * inv
            };
            out[g * GROUP_128 + i] = e4m3_from_f32(q).to_bits();
        }
        out[SCALES_AT + 4 * g..SCALES_AT + 4 * g + 4].copy_from_slice(&scale.to_le_bytes());
    }
    for (i, v) in row[MLA_LATENT_DIM..].iter().enumerate() {
        out[ROPE_AT + 2 * i..ROPE_AT + 2 * i + 2].copy_from_slice(&v.to_bits().to_le_bytes());
    }
}

/// Decodes one token's `[656]` bytes to its `[576]` values: `e4m3 · scale` per latent group
/// (exact in f32 unless it overflows), then the RoPE values widened from bf16.
pub fn mla_fp8_decode_row(bytes: &[u8; MLA_FP8_ROW_BYTES]) -> [f32; MLA_CACHE_DIM] {
    let scale = |g: usize| {
        let at = SCALES_AT + 4 * g;
        f32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
    };
    std::array::from_fn(|c| {
        if c < MLA_LATENT_DIM {
            e4m3_to_f32(float8::F8E4M3::from_bits(bytes[c])) * scale(c / GROUP_128)
        } else {
            let at = ROPE_AT + 2 * (c - MLA_LATENT_DIM);
            bf16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
        }
    })
}
