//! CUDA launch of the sparse MLA prefill (`kernels/sparse_mla_prefill.cu`).

use std::marker::PhantomData;

use super::{Options, RunSparseMla, SparseMlaCall};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, LaunchShape};
use crate::error::Result;

/// Threads per CTA: two consumer warpgroups and a producer warpgroup (`sparse_mla::kThreads`).
const THREADS: u32 = 384;

/// The kernel's parameter block (`struct SparseMlaParams`), field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SparseMlaParams {
    q: u64,
    kv: u64,
    indices: u64,
    topk_length: u64,
    attn_sink: u64,
    q_scale: u64,
    kv_scale: u64,
    out: u64,
    max_logits: u64,
    lse: u64,
    sm_scale: f32,
    s_q: i32,
    s_kv: i32,
    h_q: i32,
    head_tiles: i32,
    topk: i32,
}

/// `sparse_mla_prefill_kernel<D_QK, HAVE_TOPK_LENGTH, HAVE_SINK>`.
pub struct SparseMlaKernel<const D_QK: usize, O>(PhantomData<O>);

/// Dynamic shared memory of one CTA, `320·D_QK + 18304` bytes (the kernel asserts the same
/// formula against its layout: Q tile, four K slots, two P^T buffers, barriers and statistics).
pub const fn sparse_mla_smem_bytes(d_qk: usize) -> u32 {
    (320 * d_qk + 18304) as u32
}

impl<const D_QK: usize, O: Options> CudaKernel for SparseMlaKernel<D_QK, O> {
    const SOURCE: &'static str = include_str!("../../../kernels/sparse_mla_prefill.cu");
    const DYNAMIC_SMEM_BYTES: u32 = sparse_mla_smem_bytes(D_QK);
    type Params = SparseMlaParams;
    fn instantiation() -> String {
        format!(
            "sparse_mla_prefill_kernel<{D_QK}, {}, {}>",
            O::HAVE_LENGTH,
            O::HAVE_SINK
        )
    }
}

impl RunSparseMla for Cuda {
    fn sparse_mla<
        const D_QK: usize,
        const H_Q: usize,
        const TOPK: usize,
        O: Options,
        const HEADS: usize,
    >(
        &self,
        call: SparseMlaCall<'_, Cuda>,
    ) -> Result<()> {
        if call.s_q == 0 {
            return Ok(());
        }
        let head_tiles = H_Q / 64;
        let params = SparseMlaParams {
            q: self.ptr(call.q),
            kv: self.ptr(call.kv),
            indices: self.ptr(call.indices),
            topk_length: call.topk_length.map_or(0, |t| self.ptr(t)),
            attn_sink: call.sink.map_or(0, |s| self.ptr(s)),
            q_scale: self.ptr(call.q_scale),
            kv_scale: self.ptr(call.kv_scale),
            out: self.ptr(call.out),
            max_logits: self.ptr(call.max_logits),
            lse: self.ptr(call.lse),
            sm_scale: call.sm_scale,
            s_q: call.s_q as i32,
            s_kv: call.s_kv as i32,
            h_q: HEADS as i32,
            head_tiles: head_tiles as i32,
            topk: TOPK as i32,
        };
        let shape = LaunchShape {
            grid: ((head_tiles * call.s_q) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: sparse_mla_smem_bytes(D_QK),
        };
        // SAFETY: q, indices, outputs were tied to s_q and the kv rows to s_kv at the typed
        // boundary; the kernel never reads an index outside [0, s_kv).
        unsafe { self.launch::<SparseMlaKernel<D_QK, O>>(shape, &params) }
    }
}
