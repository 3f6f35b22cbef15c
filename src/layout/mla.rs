//! The latent KV of sparse MLA: one e4m3 row of `D_QK` channels per token and a scalar scale.

use crate::backend::Backend;
use crate::dim::Dim;
use crate::dtype::F8E4M3;
use crate::error::{Error, Result};
use crate::rules::MlaHeadDim;
use crate::tensor::{Cols, FixedExtent, Owned, Scalar, Storage, StorageMut, Tensor};

/// `[s_kv, D_QK]` e4m3 rows (key = the whole row, value = its first 512 channels) and the f32
/// dequantization scale, kept on the device so a launch needs no host value. Owned, or views of
/// an engine's cache (`S = View<'a>`).
///
/// The fields are private: the scale stays one value and `s_kv` stays addressable by an i32
/// index, as the kernel assumes.
pub struct MlaLatentKv<B: Backend, const D_QK: usize, S: Storage<B> = Owned> {
    data: Tensor<B, F8E4M3, Cols<D_QK>, S>, // [s_kv, D_QK]
    scale: Tensor<B, f32, Scalar, S>,       // [1]
}

impl<B: Backend, const D_QK: usize> MlaLatentKv<B, D_QK> {
    /// The latent KV over the caller's rows (`s_kv × D_QK` elements) and scale.
    pub fn new(backend: &B, rows: B::Buffer<F8E4M3>, s_kv: usize, scale: f32) -> Result<Self>
    where
        Dim<D_QK>: MlaHeadDim,
    {
        Self::from_tensors(
            Tensor::from_buffer("kv", rows, s_kv)?,
            Tensor::from_host(backend, "kv_scale", &[scale], 1)?,
        )
    }
}

impl<B: Backend, const D_QK: usize, S: Storage<B>> MlaLatentKv<B, D_QK, S> {
    /// The latent KV over tensors already on the backend (owned, or views): `[s_kv, D_QK]`
    /// rows and a one-value scale.
    pub fn from_tensors(
        data: Tensor<B, F8E4M3, Cols<D_QK>, S>,
        scale: Tensor<B, f32, Scalar, S>,
    ) -> Result<Self>
    where
        Dim<D_QK>: MlaHeadDim,
    {
        Error::to_i32("s_kv", data.rows())?;
        scale.expect_rows("kv_scale", "values", 1)?;
        Ok(Self { data, scale })
    }

    /// Number of rows, `s_kv`.
    pub fn len(&self) -> usize {
        self.data.rows()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.data.rows() == 0
    }

    /// The rows, `[s_kv, D_QK]` e4m3.
    pub fn data(&self) -> &Tensor<B, F8E4M3, Cols<D_QK>, S> {
        &self.data
    }

    /// The dequantization scale, `[1]`.
    pub fn scale(&self) -> &Tensor<B, f32, Scalar, S> {
        &self.scale
    }

    /// The rows, writable in place (e.g. new tokens appended by the caller's own kernel).
    pub fn data_mut(&mut self) -> FixedExtent<'_, B, F8E4M3, Cols<D_QK>, S> {
        FixedExtent::new(&mut self.data)
    }

    /// The rows and the scale back.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(self) -> (Tensor<B, F8E4M3, Cols<D_QK>, S>, Tensor<B, f32, Scalar, S>) {
        (self.data, self.scale)
    }
}

impl<B: Backend, const D_QK: usize, S: StorageMut<B>> MlaLatentKv<B, D_QK, S> {
    /// Replaces the dequantization scale.
    pub fn set_scale(&mut self, backend: &B, scale: f32) -> Result<()> {
        self.scale.write(backend, &[scale])
    }

    /// The rows and the scale as a kernel writes them, `[s_kv, D_QK]` and `[1]`.
    pub(crate) fn slices_mut(&mut self) -> (B::SliceMut<'_, F8E4M3>, B::SliceMut<'_, f32>) {
        (self.data.as_slice_mut(), self.scale.as_slice_mut())
    }
}
