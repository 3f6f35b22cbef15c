//! CUDA launch of the prologue (`kernels/inkling_prologue.cu`), and the prologue's CUDA-only
//! entries: [`Prologue::record`] (into a CUDA graph) and [`Prologue::launch_plan`] (the
//! parameter blocks, for raw launches).

use std::marker::PhantomData;

use super::launch::{
    BatchSlices, ConvSlices, KvTarget, PrologueCall, PrologueEntry, QTarget, TargetSlices,
    VariantSlices,
};
use super::{
    ConvSpec, ConvState, Prologue, PrologueBatch, PrologueSpec, PrologueStatics, PrologueTargets,
    PrologueWeights, QkvrLayout, RunPrologue, Store, Variant,
};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::error::Result;
use crate::tensor::{Storage, StorageMut};

const SOURCE: &str = include_str!("../../../kernels/inkling_prologue.cu");

crate::param_block! {
    /// The main kernel's parameter block (`struct PrologueParams`), field for field.
    pub struct PrologueParams {
        qkvr: u64,
        qkvr_row_stride: i64,
        num_tokens: i32,
        num_seqs: i32,
        k_cache: u64,
        v_cache: u64,
        conv_slots: i32,
        draft_tokens: i32,
        cache_indices: u64,
        cache_mask: u64,
        k_weight: u64,
        v_weight: u64,
        q_gamma: u64,
        k_gamma: u64,
        eps: f32,
        tau: u64,
        q_out: u64,
        q_scale: u64,
        k_out: u64,
        v_out: u64,
        loc: u64,
        kv_slots: i64,
        k_buf: u64,
        v_buf: u64,
        sfk: u64,
        sfv: u64,
        k_inter: u64,
        v_inter: u64,
        inter_capacity: i32,
        cu_seqlens: u64,
        seq_of_token: u64,
        track_mask: u64,
        track_indices: u64,
        bad_index_count: u64,
    }
}

crate::param_block! {
    /// The trailing conv-state update's parameter block (`struct ConvStateUpdateParams`).
    pub struct ConvStateUpdateParams {
        qkvr: u64,
        qkvr_row_stride: i64,
        num_seqs: i32,
        num_tokens: i32,
        k_cache: u64,
        v_cache: u64,
        conv_slots: i32,
        do_cache_update: i32,
        cache_indices: u64,
        has_initial_state: u64,
        cu_seqlens: u64,
        track_mask: u64,
        track_rows: u64,
        track_dst: u64,
        bad_index_count: u64,
    }
}

/// A prologue kernel type as CUDA sees it: its spec, its instantiation, and the extend
/// variant's trailing update (for callers that launch [`PrologueLaunchPlan`]s themselves).
pub trait PrologueKernel: PrologueSpec + CudaKernel<Params = PrologueParams> {
    /// The extend variant's trailing conv-state update kernel.
    type Update: CudaKernel<Params = ConvStateUpdateParams>;
}

impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C> CudaKernel
    for Prologue<V, S, HD, DQ, DKV, L, C>
where
    V: Variant,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
{
    const SOURCE: &'static str = SOURCE;
    type Params = PrologueParams;
    fn instantiation() -> String {
        let s = Self::STATICS;
        format!(
            "inkling_prologue_kernel<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            s.variant,
            s.hd,
            s.hq,
            s.hkv,
            s.w,
            s.silu,
            s.residual,
            s.store,
            s.page,
            s.q_off,
            s.k_off,
            s.v_off
        )
    }
}

impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C> PrologueKernel
    for Prologue<V, S, HD, DQ, DKV, L, C>
where
    V: Variant,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
{
    type Update = ConvStateUpdateKernel<HD, DQ, DKV, L, C>;
}

/// `inkling_conv_state_update_kernel<HD, HKV, W, K_OFF, V_OFF>`.
pub struct ConvStateUpdateKernel<const HD: usize, const DQ: usize, const DKV: usize, L, C>(
    PhantomData<(L, C)>,
);

impl<const HD: usize, const DQ: usize, const DKV: usize, L: QkvrLayout<DQ, DKV>, C: ConvSpec>
    CudaKernel for ConvStateUpdateKernel<HD, DQ, DKV, L, C>
{
    const SOURCE: &'static str = SOURCE;
    type Params = ConvStateUpdateParams;
    fn instantiation() -> String {
        format!(
            "inkling_conv_state_update_kernel<{}, {}, {}, {}, {}>",
            HD,
            DKV / HD,
            C::W,
            L::K_OFF,
            L::V_OFF
        )
    }
}

/// Threads per block of the main kernel (`kPrologueThreads`).
const PROLOGUE_THREADS: usize = 128;
/// Threads per block of the trailing update (`kConvUpdateThreads`).
const UPDATE_THREADS: usize = 256;

/// Threads one token occupies (`TokenLayout::TOKEN_THREADS` of the kernel): the q vectors
/// spread `QV` per thread, the k and v vectors one per thread, each role padded to whole warps.
pub const fn token_threads(st: &PrologueStatics) -> usize {
    let q_vecs = st.hq * st.hd / 8;
    let kv_vecs = st.hkv * st.hd / 8;
    let fits4 = st.hq.is_multiple_of(4) && (q_vecs / 4).is_multiple_of(32);
    let fits2 = st.hq.is_multiple_of(2) && (q_vecs / 2).is_multiple_of(32);
    let qv = if fits4 {
        4
    } else if fits2 {
        2
    } else if st.hq.is_multiple_of(4) {
        4
    } else if st.hq.is_multiple_of(2) {
        2
    } else {
        1
    };
    (q_vecs / qv).next_multiple_of(32) + (2 * kv_vecs).next_multiple_of(32)
}

/// Launch shape of the main kernel: tokens laid out flat, `token_threads` each, in 128-thread
/// blocks (mirrors the formulas at the top of the kernel source).
pub fn prologue_launch_shape(st: &PrologueStatics, tokens: usize) -> LaunchShape {
    let blocks = (tokens * token_threads(st)).div_ceil(PROLOGUE_THREADS);
    LaunchShape {
        grid: (blocks as u32, 1, 1),
        block: (PROLOGUE_THREADS as u32, 1, 1),
        smem_bytes: 0,
    }
}

/// Launch shape of the trailing update: one thread per (sequence, k/v, 8-channel vector).
pub fn update_launch_shape(st: &PrologueStatics, seqs: usize) -> LaunchShape {
    let items = seqs * 2 * st.dkv() / 8;
    LaunchShape {
        grid: (items.div_ceil(UPDATE_THREADS) as u32, 1, 1),
        block: (UPDATE_THREADS as u32, 1, 1),
        smem_bytes: 0,
    }
}

/// The launches one prologue call makes: the main kernel, and the extend variant's trailing
/// conv-state update. Built without touching the device, so a caller can replay the parameter
/// blocks with raw driver launches (the typed launch's benchmark baseline) or in its own graph.
///
/// Making a plan is safe; launching its blocks is not, and is outside the crate's guarantee.
///
/// # Safety (of launching the blocks)
/// The blocks hold the raw device addresses of the buffers [`Prologue::launch_plan`] borrowed.
/// A caller that launches them (`cuLaunchKernel`, or a graph captured from such launches) must
/// keep every one of those buffers alive and at the same allocation and size until the last
/// launch has run, order every other use of them against the launches on the stream they run
/// on, and launch the kernels [`Prologue::launch_plan`] was made for with these shapes.
#[derive(Clone, Copy, Debug)]
pub struct PrologueLaunchPlan {
    /// Grid, block and shared memory of the main kernel.
    pub shape: LaunchShape,
    /// The main kernel's parameter block.
    pub params: PrologueParams,
    /// The trailing update, when the call has one.
    pub update: Option<(LaunchShape, ConvStateUpdateParams)>,
}

/// The CUDA launch runs the op.
impl super::RunPrologue for Cuda {}

impl PrologueEntry for Cuda {
    #[inline(always)]
    unsafe fn prologue<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C>(
        &self,
        mut call: PrologueCall<'_, Cuda>,
    ) -> Result<()>
    where
        V: Variant,
        S: Store,
        L: QkvrLayout<DQ, DKV>,
        C: ConvSpec,
    {
        if call.batch.tokens == 0 {
            return Ok(());
        }
        let statics = Prologue::<V, S, HD, DQ, DKV, L, C>::STATICS;
        let mut args = DeviceArgs::new(self)?;
        let plan = plan(&statics, &mut args, &mut call)?;
        // SAFETY: every buffer's extent was tied to the batch by the typed `run` (rows × the
        // row shape of its type), and the kernel guards every index it reads from the device.
        unsafe { args.launch::<Prologue<V, S, HD, DQ, DKV, L, C>>(plan.shape, &plan.params) }?;
        if let Some((shape, params)) = plan.update {
            // SAFETY: as above; the update reads the same tied buffers.
            unsafe { args.launch::<ConvStateUpdateKernel<HD, DQ, DKV, L, C>>(shape, &params) }?;
        }
        Ok(()) // dropping `args` records the launches' reads and writes
    }
}

/// Admits every buffer of `call` and fills the parameter blocks: the batch and weights, the
/// conv state, the targets, then the variant's own fields (and the extend update's block).
fn plan<'a>(
    st: &PrologueStatics,
    args: &mut DeviceArgs<'a>,
    call: &'a mut PrologueCall<'_, Cuda>,
) -> Result<PrologueLaunchPlan> {
    let PrologueCall {
        batch,
        variant,
        weights,
        conv,
        targets,
    } = call;
    let mut p = PrologueParams {
        qkvr_row_stride: st.row as i64,
        eps: weights.eps,
        ..Default::default()
    };
    fill_batch(args, &mut p, batch)?;
    p.q_gamma = args.read_vectors("q_gamma", &weights.q_gamma)?;
    p.k_gamma = args.read_vectors("k_gamma", &weights.k_gamma)?;
    p.k_weight = args.read_vectors("k_weight", &weights.k_weight)?;
    p.v_weight = args.read_vectors("v_weight", &weights.v_weight)?;
    fill_conv(args, &mut p, conv)?;
    fill_targets(args, &mut p, targets)?;
    let update = fill_variant(args, &mut p, variant)?;
    Ok(PrologueLaunchPlan {
        shape: prologue_launch_shape(st, batch.tokens),
        params: p,
        update: update
            .filter(|_| batch.seqs > 0)
            .map(|u| (update_launch_shape(st, batch.seqs), u)),
    })
}

/// The batch's extents and per-token / per-sequence arrays.
fn fill_batch<'a>(
    args: &mut DeviceArgs<'a>,
    p: &mut PrologueParams,
    batch: &'a BatchSlices<'_, Cuda>,
) -> Result<()> {
    p.qkvr = args.read_vectors("qkvr", &batch.qkvr)?;
    p.num_tokens = batch.tokens as i32;
    p.num_seqs = batch.seqs as i32;
    p.cache_indices = args.read("cache_indices", &batch.cache_indices)?;
    p.cache_mask = args.read("cache_mask", &batch.cache_mask)?;
    p.tau = args.read_opt("log_scaling_tau", batch.tau.as_ref())?;
    p.loc = args.read("loc", &batch.loc)?;
    Ok(())
}

/// The conv-state caches and their slot count.
fn fill_conv<'a>(
    args: &mut DeviceArgs<'a>,
    p: &mut PrologueParams,
    conv: &'a mut ConvSlices<'_, Cuda>,
) -> Result<()> {
    p.k_cache = args.write_vectors("k_cache", &mut conv.cache.k)?;
    p.v_cache = args.write_vectors("v_cache", &mut conv.cache.v)?;
    p.conv_slots = conv.slots as i32;
    Ok(())
}

/// q, k and v out, the KV store and the skipped-index counter.
fn fill_targets<'a>(
    args: &mut DeviceArgs<'a>,
    p: &mut PrologueParams,
    targets: &'a mut TargetSlices<'_, Cuda>,
) -> Result<()> {
    p.k_out = args.write_vectors("k_out", &mut targets.k)?;
    p.v_out = args.write_vectors("v_out", &mut targets.v)?;
    p.bad_index_count = args.write_opt("bad_index_count", targets.bad_index_count.as_mut())?;
    match &mut targets.q {
        QTarget::Bf16(q) => p.q_out = args.write_vectors("q_out", q)?,
        QTarget::Mxfp8 { data, scales } => {
            p.q_out = args.write_vectors("q_out", data)?;
            p.q_scale = args.write("q_scale", scales)?;
        }
    }
    match &mut targets.kv {
        KvTarget::None => {}
        KvTarget::Bf16 { k, v, slots } => {
            p.k_buf = args.write_vectors("k_buf", k)?;
            p.v_buf = args.write_vectors("v_buf", v)?;
            p.kv_slots = *slots as i64;
        }
        KvTarget::Mxfp8 {
            k,
            v,
            k_scales,
            v_scales,
            slots,
        } => {
            p.k_buf = args.write_vectors("k_buf", k)?;
            p.v_buf = args.write_vectors("v_buf", v)?;
            p.sfk = args.write("sfk", k_scales)?;
            p.sfv = args.write("sfv", v_scales)?;
            p.kv_slots = *slots as i64;
        }
    }
    Ok(())
}

/// The variant's own fields; for extend with an update or tracking, the trailing update's
/// block (which shares the main block's buffers).
fn fill_variant<'a>(
    args: &mut DeviceArgs<'a>,
    p: &mut PrologueParams,
    variant: &'a mut VariantSlices<'_, Cuda>,
) -> Result<Option<ConvStateUpdateParams>> {
    match variant {
        VariantSlices::Verify {
            draft_tokens,
            windows,
            capacity,
        } => {
            p.draft_tokens = *draft_tokens as i32;
            p.k_inter = args.write_vectors("k_inter", &mut windows.k)?;
            p.v_inter = args.write_vectors("v_inter", &mut windows.v)?;
            p.inter_capacity = *capacity as i32;
        }
        VariantSlices::Extend {
            cu_seqlens,
            seq_of_token,
            has_initial_state,
            track,
            update_conv_state,
        } => {
            p.cu_seqlens = args.read("cu_seqlens", cu_seqlens)?;
            p.seq_of_token = args.read("seq_of_token", seq_of_token)?;
            if *update_conv_state || track.is_some() {
                let mut u = ConvStateUpdateParams {
                    qkvr: p.qkvr,
                    qkvr_row_stride: p.qkvr_row_stride,
                    num_seqs: p.num_seqs,
                    num_tokens: p.num_tokens,
                    k_cache: p.k_cache,
                    v_cache: p.v_cache,
                    conv_slots: p.conv_slots,
                    do_cache_update: *update_conv_state as i32,
                    cache_indices: p.cache_indices,
                    has_initial_state: args.read("has_initial_state", has_initial_state)?,
                    cu_seqlens: p.cu_seqlens,
                    bad_index_count: p.bad_index_count,
                    ..Default::default()
                };
                if let Some(t) = track {
                    u.track_rows = args.read("track_rows", &t.rows)?;
                    u.track_mask = args.read("track_mask", &t.mask)?;
                    u.track_dst = args.read("track_dst", &t.dst)?;
                }
                return Ok(Some(u));
            }
        }
        VariantSlices::Decode { track } => {
            if let Some(t) = track {
                p.track_mask = args.read("track_mask", &t.mask)?;
                p.track_indices = args.read("track_indices", &t.indices)?;
            }
        }
    }
    Ok(None)
}

impl<V, S, const HD: usize, const DQ: usize, const DKV: usize, L, C>
    Prologue<V, S, HD, DQ, DKV, L, C>
where
    V: Variant,
    S: Store,
    L: QkvrLayout<DQ, DKV>,
    C: ConvSpec,
{
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows every argument until it is dropped, so no tensor can be freed or
    /// swapped while it can replay.
    pub fn record<'g, B, A, SW, SC, SO, SK>(
        &self,
        graph: &mut GraphRecorder<'g>,
        weights: &'g PrologueWeights<B, HD, DKV, C, SW>,
        conv: &'g mut ConvState<B, DKV, C, SC>,
        batch: A,
        targets: PrologueTargets<'g, B, S::Outputs<B, DQ, DKV, SO>, S::Cache<B, DKV, SK>>,
    ) -> Result<()>
    where
        B: RunPrologue + IsCuda,
        A: PrologueBatch<'g, B, V, L, DKV, C>,
        SW: Storage<B>,
        SC: StorageMut<B>,
        SO: StorageMut<B>,
        SK: StorageMut<B>,
    {
        graph.record(|cuda: &B| self.run(cuda, weights, conv, batch, targets))
    }

    /// The launches [`run`](Self::run) would queue on `cuda`, as parameter blocks and shapes,
    /// after the same checks; nothing is queued. For replaying the call with raw driver
    /// launches (a benchmark's baseline, an engine's own graph), which is `unsafe` on the
    /// caller's side: the blocks hold raw device addresses of the buffers borrowed here (the
    /// contract is on [`PrologueLaunchPlan`]).
    pub fn launch_plan<'a, A, SW, SC, SO, SK>(
        &self,
        cuda: &Cuda,
        weights: &'a PrologueWeights<Cuda, HD, DKV, C, SW>,
        conv: &'a mut ConvState<Cuda, DKV, C, SC>,
        batch: A,
        targets: PrologueTargets<'a, Cuda, S::Outputs<Cuda, DQ, DKV, SO>, S::Cache<Cuda, DKV, SK>>,
    ) -> Result<PrologueLaunchPlan>
    where
        A: PrologueBatch<'a, Cuda, V, L, DKV, C>,
        SW: Storage<Cuda>,
        SC: StorageMut<Cuda>,
        SO: StorageMut<Cuda>,
        SK: StorageMut<Cuda>,
    {
        Self::call(weights, conv, batch, targets, |mut call| {
            let mut args = DeviceArgs::new(cuda)?;
            plan(&Self::STATICS, &mut args, &mut call)
        })
    }
}
