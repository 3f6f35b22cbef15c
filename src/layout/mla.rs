//! The latent KV of sparse MLA: one e4m3 row of `D_QK` channels per token and a scalar scale.

use crate::backend::Backend;
use crate::dim::Dim;
use crate::dtype::F8E4M3;
use crate::error::Result;
use crate::rules::MlaHeadDim;
use crate::tensor::{Cols, Scalar, Tensor};

/// `[s_kv, D_QK]` e4m3 rows (key = the whole row, value = its first 512 channels) and the f32
/// dequantization scale, kept on the device so a launch needs no host value.
pub struct MlaLatentKv<B: Backend, const D_QK: usize> {
    /// The rows, `[s_kv, D_QK]`.
    pub rows: Tensor<B, F8E4M3, Cols<D_QK>>,
    /// The dequantization scale, `[1]`.
    pub scale: Tensor<B, f32, Scalar>,
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
            rows: Tensor::from_buffer("kv", rows, s_kv)?,
            scale: Tensor::from_host(backend, "kv_scale", &[scale], 1)?,
        })
    }

    /// Number of rows, `s_kv`.
    pub fn len(&self) -> usize {
        self.rows.rows()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.rows.rows() == 0
    }
}
