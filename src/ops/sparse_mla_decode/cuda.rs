//! CUDA launch of [`SparseMlaDecode`](super::SparseMlaDecode) (`kernels/sparse_mla_decode.cu`):
//! the decode kernel over (row, 16-head group, split) CTAs and, when a row's top-k is split,
//! the combine kernel; and the preparation of a step for the prefill (`DecodeThroughPrefill`).

use std::marker::PhantomData;

use super::launch::{DecodeCall, DecodeEntry, DecodePagedPrefillCall, DecodePrepareCall};
use super::{DecodeQueries, DecodeWorkspace, RunDecode, SparseMlaDecode};
use crate::backend::Cuda;
use crate::backend::cuda::{
    CudaKernel, DeviceArgs, GraphRead, GraphRecorder, IsCuda, LaunchShape, read_ref,
};
use crate::dim::Dim;
use crate::error::Result;
use crate::layout::{MLA_CACHE_DIM, MlaFp8KvCache};
use crate::ops::sparse_mla::OutRow;
use crate::ops::sparse_mla::cuda::{
    SPARSE_MLA_PAGED_SMEM_BYTES, SparseMlaPagedKernel, SparseMlaParams,
};
use crate::rules::{MlaCachePage, MlaScaleGroup};
use crate::tensor::{Cols, Storage, StorageMut, Tensor};

/// Threads of a CTA of either kernel (`decode::kThreads`).
const THREADS: u32 = 128;
/// Heads a CTA takes (`decode::kHeads`).
const HEAD_GROUP: usize = 16;
/// Top-k positions a step of the kernel takes (`decode::kBlock`).
const BLOCK: usize = 64;
/// CTAs a call aims at: one a SM of an H200 or H100 (132). Fewer, and the top-k is split; more
/// splits would fill both CTA slots of an SM, but every split writes and the combine reads a
/// `[16, 512]` f32 partial, which cost more than the second slot gave (B 8, s_q 1, h 16: 36 µs
/// against 55 µs at 264; B 1 is split 32 ways either way).
const TARGET_CTAS: usize = 132;
/// Threads of a CTA of the prepare kernel of `DecodeThroughPrefill`.
const PREPARE_THREADS: u32 = 256;
/// The most CTAs an SM the prepare kernel's grid takes (its loops stride over the step).
const PREPARE_CTAS_PER_SM: u32 = 8;
/// Dynamic shared memory of a decode CTA (`decode::kSmemBytes`): Q of 16 heads (rows of 576
/// two-byte values, each head's scale and padding), two buffers of 64 cache rows, the 16 × 64
/// scores (padded) and two blocks' slots — 108032 bytes, so two CTAs share an SM.
pub const DECODE_SMEM_BYTES: u32 =
    (16 * (576 * 2 + 32) + 2 * 64 * 656 + 16 * 72 * 4 + 2 * 64 * 4) as u32;

crate::param_block! {
    /// The kernels' parameter block (`struct DecodeParams`), field for field.
    pub struct DecodeParams {
        q: u64,
        indices: u64,
        lengths: u64,
        cache: u64,
        out: u64,
        lse: u64,
        part_o: u64,
        part_lse: u64,
        sm_scale: f32,
        rows: i32,
        slots: i32,
        splits: i32,
        blocks_per_split: i32,
    }
}

crate::param_block! {
    /// The preparation kernel's parameter block (`struct DecodePrepareParams`), field for field.
    pub struct DecodePrepareParams {
        q: u64,
        indices: u64,
        lengths: u64,
        q8: u64,
        slots_out: u64,
        rows: i32,
        slots: i32,
    }
}

/// `sparse_mla_decode_prepare_kernel<H_Q, TOPK>`: a step's q cast to e4m3 and its masked
/// slots written, for the paged prefill.
pub struct SparseMlaDecodePrepareKernel<const H_Q: usize, const TOPK: usize>(
    PhantomData<(Dim<H_Q>, Dim<TOPK>)>,
);

impl<const H_Q: usize, const TOPK: usize> CudaKernel for SparseMlaDecodePrepareKernel<H_Q, TOPK> {
    const SOURCE: &'static str = concat!(
        include_str!("../../../kernels/sparse_mla_common.cuh"),
        "\n",
        include_str!("../../../kernels/sparse_mla_decode.cu")
    );
    type Params = DecodePrepareParams;
    fn instantiation() -> String {
        format!("sparse_mla_decode_prepare_kernel<{H_Q}, {TOPK}>")
    }
}

/// `sparse_mla_decode_kernel<H_Q, TOPK>`.
pub struct SparseMlaDecodeKernel<const H_Q: usize, const TOPK: usize>(
    PhantomData<(Dim<H_Q>, Dim<TOPK>)>,
);

impl<const H_Q: usize, const TOPK: usize> CudaKernel for SparseMlaDecodeKernel<H_Q, TOPK> {
    const SOURCE: &'static str = concat!(
        include_str!("../../../kernels/sparse_mla_common.cuh"),
        "\n",
        include_str!("../../../kernels/sparse_mla_decode.cu")
    );
    const DYNAMIC_SMEM_BYTES: u32 = DECODE_SMEM_BYTES;
    type Params = DecodeParams;
    fn instantiation() -> String {
        format!("sparse_mla_decode_kernel<{H_Q}, {TOPK}>")
    }
}

/// `sparse_mla_decode_combine_kernel<H_Q>`.
pub struct SparseMlaDecodeCombineKernel<const H_Q: usize>(PhantomData<Dim<H_Q>>);

impl<const H_Q: usize> CudaKernel for SparseMlaDecodeCombineKernel<H_Q> {
    const SOURCE: &'static str = concat!(
        include_str!("../../../kernels/sparse_mla_common.cuh"),
        "\n",
        include_str!("../../../kernels/sparse_mla_decode.cu")
    );
    type Params = DecodeParams;
    fn instantiation() -> String {
        format!("sparse_mla_decode_combine_kernel<{H_Q}>")
    }
}

/// The most splits of a row: the combine merges at most 32 (`kMaxSplits`, one a lane of its
/// first warp), so a top-k wider than 2048 takes several blocks a split.
const MAX_SPLITS: usize = 32;

/// How a call's top-k is split: `(splits, blocks_per_split)` for `rows` query rows of `heads`
/// heads, so that about 132 CTAs (`TARGET_CTAS`) run (a batch that fills the GPU is not split),
/// at most `MAX_SPLITS` a row.
pub fn decode_splits(rows: usize, heads: usize, topk: usize) -> (usize, usize) {
    let ctas = rows.saturating_mul(heads.div_ceil(HEAD_GROUP));
    let blocks = topk / BLOCK;
    let wanted = TARGET_CTAS
        .div_ceil(ctas.max(1))
        .clamp(1, blocks.min(MAX_SPLITS));
    let per_split = blocks.div_ceil(wanted);
    (blocks.div_ceil(per_split), per_split)
}

/// The CUDA launch runs the op.
impl RunDecode for Cuda {}

impl DecodeEntry for Cuda {
    fn decode_splits(&self, rows: usize, heads: usize, topk: usize) -> (usize, usize) {
        decode_splits(rows, heads, topk)
    }

    unsafe fn sparse_mla_decode<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodeCall<'_, Cuda>,
    ) -> Result<()> {
        let DecodeCall {
            rows,
            slots,
            queries,
            cache,
            mut out,
            mut lse,
            splits,
            blocks_per_split: per_split,
            mut part_o,
            mut part_lse,
        } = call;
        if rows == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = DecodeParams {
            q: args.read_vectors("q", &queries.q)?,
            indices: args.read("indices", &queries.indices)?,
            lengths: args.read_opt("lengths", queries.lengths.as_ref())?,
            cache: args.read_vectors("kv_cache", &cache)?,
            out: args.write_vectors("out", &mut out)?,
            lse: args.write("lse", &mut lse)?,
            part_o: args.write_vectors("decode partial out", &mut part_o)?,
            part_lse: args.write("decode partial lse", &mut part_lse)?,
            sm_scale: queries.sm_scale,
            rows: rows as i32,
            slots: slots as i32,
            splits: splits as i32,
            blocks_per_split: per_split as i32,
        };
        let shape = LaunchShape {
            // Rows on x (up to 2^31 - 1 blocks; y and z stop at 65535).
            grid: (rows as u32, H_Q.div_ceil(HEAD_GROUP) as u32, splits as u32),
            block: (THREADS, 1, 1),
            smem_bytes: DECODE_SMEM_BYTES,
        };
        // SAFETY: q holds rows × H_Q × 576 values, indices rows × TOPK, lengths rows, the cache
        // slots × 656 bytes, out rows × H_Q × 512, lse rows × H_Q (tied by `run`), the partial
        // buffers rows × H_Q × splits (× 512) when split; the kernel reads a cache row only for
        // a slot in [0, slots), and its grid covers exactly rows × head groups × splits.
        unsafe { args.launch::<SparseMlaDecodeKernel<H_Q, TOPK>>(shape, &params)? };
        if splits > 1 {
            let combine = LaunchShape {
                grid: ((rows * H_Q) as u32, 1, 1),
                block: (THREADS, 1, 1),
                smem_bytes: 0,
            };
            // SAFETY: as above; one CTA a (row, head), 4 dims a thread. The combine waits
            // (`griddepcontrol.wait`) for the splits' kernel, launched just before, before its
            // first global access, so it may start during that kernel's tail.
            unsafe {
                args.launch_dependent::<SparseMlaDecodeCombineKernel<H_Q>>(combine, &params)?
            };
        }
        Ok(())
    }

    unsafe fn sparse_mla_decode_prepare<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodePrepareCall<'_, Cuda>,
    ) -> Result<()> {
        let DecodePrepareCall {
            rows,
            slots,
            queries,
            mut q8,
            mut slots_out,
        } = call;
        if rows == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let params = DecodePrepareParams {
            q: args.read_vectors("q", &queries.q)?,
            indices: args.read("indices", &queries.indices)?,
            lengths: args.read_opt("lengths", queries.lengths.as_ref())?,
            q8: args.write_vectors("prefill workspace q", &mut q8)?,
            slots_out: args.write("prefill workspace slots", &mut slots_out)?,
            rows: rows as i32,
            slots: slots as i32,
        };
        // Grid-stride loops: enough CTAs for four 16-byte words of q or four positions a
        // thread, at most PREPARE_CTAS_PER_SM an SM (the loads of a few CTAs an SM saturate the
        // memory).
        let words = (rows * H_Q * (MLA_CACHE_DIM / 8)).max(rows * TOPK);
        let ctas = words
            .div_ceil(PREPARE_THREADS as usize * 4)
            .clamp(1, (self.sm_count() * PREPARE_CTAS_PER_SM) as usize);
        let shape = LaunchShape {
            grid: (ctas as u32, 1, 1),
            block: (PREPARE_THREADS, 1, 1),
            smem_bytes: 0,
        };
        // SAFETY: q holds rows × H_Q × 576 values and q8 as many bytes, indices and slots_out
        // rows × TOPK, lengths rows (tied by `run`); the kernel guards every access by those
        // extents (grid-stride loops), whatever the grid, and reads no cache row.
        unsafe { args.launch::<SparseMlaDecodePrepareKernel<H_Q, TOPK>>(shape, &params) }
    }

    unsafe fn sparse_mla_decode_paged_prefill<const H_Q: usize, const TOPK: usize>(
        &self,
        call: DecodePagedPrefillCall<'_, Cuda>,
    ) -> Result<()> {
        let DecodePagedPrefillCall {
            rows,
            slots,
            q8,
            unit_scale,
            slots_in,
            cache,
            sm_scale,
            mut out,
            mut max_logits,
            mut lse,
        } = call;
        if rows == 0 {
            return Ok(());
        }
        let head_tiles = H_Q.div_ceil(64);
        let mut args = DeviceArgs::new(self)?;
        let params = SparseMlaParams {
            q: args.read_vectors("prefill workspace q", &q8)?,
            kv: args.read_vectors("kv_cache", &cache)?,
            indices: args.read("prefill workspace slots", &slots_in)?,
            topk_length: 0,
            attn_sink: 0,
            q_scale: args.read("prefill workspace scale", &unit_scale)?,
            kv_scale: args.read("prefill workspace scale", &unit_scale)?,
            out: args.write_vectors("out", &mut out)?,
            max_logits: args.write("prefill workspace max_logits", &mut max_logits)?,
            lse: args.write("lse", &mut lse)?,
            sm_scale,
            s_q: rows as i32,
            s_kv: slots as i32,
            h_q: H_Q as i32,
            head_tiles: head_tiles as i32,
            topk: TOPK as i32,
        };
        let shape = self.wide_shape((rows * head_tiles) as u32, SPARSE_MLA_PAGED_SMEM_BYTES);
        // SAFETY: q8 holds rows × H_Q × 576 bytes, slots_in rows × TOPK, the outputs rows ×
        // H_Q (× 512), the cache `slots` rows of 656 bytes (tied by `run`, rows · TOPK ≤
        // i32::MAX); the kernel reads no row of a slot outside `0 .. slots` (its gathers and
        // its RoPE loads alike) and writes only the rows × H_Q real heads.
        unsafe { args.launch::<SparseMlaPagedKernel>(shape, &params) }
    }
}

impl<const H_Q: usize, const TOPK: usize> SparseMlaDecode<H_Q, TOPK> {
    /// Records the same step as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the queries, the cache, the workspace and both outputs until it is
    /// dropped, so none can be freed or swapped while it can replay. A decode step that an
    /// engine replays every token: refill the queries' tensors in place, replay.
    pub fn record<'g, B, SQ, const PAGE: usize, const GROUP: usize, SC, SO>(
        &self,
        graph: &mut GraphRecorder<'g>,
        queries: &'g DecodeQueries<B, H_Q, TOPK, SQ>,
        cache: impl Into<GraphRead<'g, MlaFp8KvCache<B, PAGE, GROUP, SC>>>,
        workspace: &'g mut DecodeWorkspace<B, H_Q, TOPK>,
        out: &'g mut Tensor<B, crate::dtype::bf16, OutRow<H_Q>, SO>,
        lse: &'g mut Tensor<B, f32, Cols<H_Q>, SO>,
    ) -> Result<()>
    where
        B: RunDecode + IsCuda,
        SQ: Storage<B>,
        SC: Storage<B> + 'g,
        SO: StorageMut<B>,
        Dim<PAGE>: MlaCachePage,
        Dim<GROUP>: MlaScaleGroup,
    {
        let cache = read_ref(cache);
        graph.record(|cuda: &B| self.run(cuda, queries, cache, workspace, out, lse))
    }
}
