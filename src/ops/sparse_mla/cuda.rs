//! CUDA launch of the sparse MLA prefill (`kernels/sparse_mla_prefill.cu`).

use std::marker::PhantomData;

use super::Options;
use super::launch::{SparseMlaCall, SparseMlaLaunch};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, LaunchShape};
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

impl SparseMlaLaunch for Cuda {
    unsafe fn sparse_mla<
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
        let SparseMlaCall {
            s_q,
            s_kv,
            q,
            q_scale,
            indices,
            topk_length,
            sink,
            sm_scale,
            kv,
            kv_scale,
            mut out,
            mut max_logits,
            mut lse,
        } = call;
        let mut args = DeviceArgs::new(self);
        let params = SparseMlaParams {
            q: args.read("q", &q)?,
            kv: args.read("kv", &kv)?,
            indices: args.read("indices", &indices)?,
            topk_length: args.read_opt("topk_length", topk_length.as_ref())?,
            attn_sink: args.read_opt("attn_sink", sink.as_ref())?,
            q_scale: args.read("q_scale", &q_scale)?,
            kv_scale: args.read("kv_scale", &kv_scale)?,
            out: args.write("out", &mut out)?,
            max_logits: args.write("max_logits", &mut max_logits)?,
            lse: args.write("lse", &mut lse)?,
            sm_scale,
            s_q: s_q as i32,
            s_kv: s_kv as i32,
            h_q: HEADS as i32,
            head_tiles: head_tiles as i32,
            topk: TOPK as i32,
        };
        let shape = LaunchShape {
            grid: ((head_tiles * s_q) as u32, 1, 1),
            block: (THREADS, 1, 1),
            smem_bytes: sparse_mla_smem_bytes(D_QK),
        };
        // SAFETY: q, indices, outputs were tied to s_q and the kv rows to s_kv at the typed
        // boundary; the kernel never reads an index outside [0, s_kv).
        let launched = unsafe { self.launch::<SparseMlaKernel<D_QK, O>>(shape, &params) };
        drop(args); // records the launch's reads and writes (when the context tracks events)
        launched
    }
}
