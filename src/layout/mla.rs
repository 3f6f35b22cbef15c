//! The latent KV of sparse MLA: one e4m3 row of `D_QK` channels per token and a scalar scale.

use crate::backend::Backend;
use crate::dim::Dim;
use crate::dtype::F8E4M3;
use crate::error::Result;
use crate::rules::MlaHeadDim;
use crate::tensor::{Cols, FixedExtent, Scalar, Tensor};

/// `[s_kv, D_QK]` e4m3 rows (key = the whole row, value = its first 512 channels) and the f32
/// dequantization scale, kept on the device so a launch needs no host value.
///
/// The fields are private: the scale stays one value and `s_kv` stays addressable by an i32
/// index, as the kernel assumes.
pub struct MlaLatentKv<B: Backend, const D_QK: usize> {
    data: Tensor<B, F8E4M3, Cols<D_QK>>, // [s_kv, D_QK]
    scale: Tensor<B, f32, Scalar>,       // [1]
}

impl<B: Backend, const D_QK: usize> MlaLatentKv<B, D_QK> {
    /// The latent KV over the caller's rows (`s_kv × D_QK` elements) and scale.
    pub fn new(backend: &B, rows: B::Buffer<F8E4M3>, s_kv: usize, scale: f32) -> Result<Self>
    where
        Dim<D_QK>: MlaHeadDim,
    {
        if s_kv > i32::MAX as usize {
            return Err(crate::Error::Value {
                param: "s_kv",
                value: s_kv as i64,
                range: format!("0 ..= {}", i32::MAX),
            });
        }
        Ok(Self {
            data: Tensor::from_buffer("kv", rows, s_kv)?,
            scale: Tensor::from_host(backend, "kv_scale", &[scale], 1)?,
        })
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
    pub fn data(&self) -> &Tensor<B, F8E4M3, Cols<D_QK>> {
        &self.data
    }

    /// The dequantization scale, `[1]`.
    pub fn scale(&self) -> &Tensor<B, f32, Scalar> {
        &self.scale
    }

    /// The rows, writable in place (e.g. new tokens appended by the caller's own kernel).
    pub fn data_mut(&mut self) -> FixedExtent<'_, B, F8E4M3, Cols<D_QK>> {
        FixedExtent::new(&mut self.data)
    }

    /// Replaces the dequantization scale.
    pub fn set_scale(&mut self, backend: &B, scale: f32) -> Result<()> {
        self.scale.write(backend, &[scale])
    }

    /// The rows and the scale back.
    pub fn into_parts(self) -> (Tensor<B, F8E4M3, Cols<D_QK>>, Tensor<B, f32, Scalar>) {
        (self.data, self.scale)
    }
}
