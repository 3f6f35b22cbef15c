//! CUDA launch of the prologue (`kernels/inkling_prologue.cu`).

use std::marker::PhantomData;

use super::call::{KvTarget, PrologueCall, PrologueLaunchEntry, QTarget, VariantArgs};
use super::{ConvSpec, Prologue, PrologueStatics, QkvrLayout, Store, Variant};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, LaunchShape};
use crate::error::Result;

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

/// A prologue kernel type: its static facts and its CUDA instantiations.
pub trait PrologueKernel: CudaKernel<Params = PrologueParams> {
    /// The static facts as values.
    const STATICS: PrologueStatics;
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
    const STATICS: PrologueStatics = Prologue::<V, S, HD, DQ, DKV, L, C>::STATICS;
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
#[derive(Clone, Copy, Debug)]
pub struct PrologueLaunch {
    /// Grid, block and shared memory of the main kernel.
    pub shape: LaunchShape,
    /// The main kernel's parameter block.
    pub params: PrologueParams,
    /// The trailing update, when the call has one.
    pub update: Option<(LaunchShape, ConvStateUpdateParams)>,
}

impl PrologueLaunchEntry for Cuda {
    unsafe fn prologue<K: PrologueKernel>(&self, mut call: PrologueCall<'_, Cuda>) -> Result<()> {
        if call.tokens == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let launch = fill_params::<K>(&mut args, &mut call)?;
        // SAFETY: every buffer's extent was tied to the batch by the typed `run` (rows × the
        // row shape of its type), and the kernel guards every index it reads from the device.
        unsafe { args.launch::<K>(launch.shape, &launch.params) }?;
        if let Some((shape, params)) = launch.update {
            // SAFETY: as above; the update reads the same tied buffers.
            unsafe { args.launch::<K::Update>(shape, &params) }?;
        }
        Ok(()) // dropping `args` records the launches' reads and writes
    }
}

/// The parameter blocks and shapes of one checked call, for a caller's raw launches.
pub(crate) fn prologue_launch<K: PrologueKernel>(
    cuda: &Cuda,
    mut call: PrologueCall<'_, Cuda>,
) -> Result<PrologueLaunch> {
    let mut args = DeviceArgs::new(cuda)?;
    fill_params::<K>(&mut args, &mut call)
}

/// Admits every buffer of `call` and fills the parameter blocks.
fn fill_params<'a, K: PrologueKernel>(
    args: &mut DeviceArgs<'a>,
    call: &'a mut PrologueCall<'_, Cuda>,
) -> Result<PrologueLaunch> {
    let st = K::STATICS;
    let PrologueCall {
        tokens,
        seqs,
        qkvr,
        q_gamma,
        k_gamma,
        k_weight,
        v_weight,
        eps,
        k_cache,
        v_cache,
        conv_slots,
        cache_indices,
        cache_mask,
        tau,
        loc,
        q,
        k_out,
        v_out,
        kv,
        variant,
        bad_index_count,
    } = call;
    let mut p = PrologueParams {
        qkvr: args.read_vectors("qkvr", qkvr)?,
        qkvr_row_stride: st.row as i64,
        num_tokens: *tokens as i32,
        num_seqs: *seqs as i32,
        k_cache: args.write_vectors("k_cache", k_cache)?,
        v_cache: args.write_vectors("v_cache", v_cache)?,
        conv_slots: *conv_slots as i32,
        cache_indices: args.read("cache_indices", cache_indices)?,
        cache_mask: args.read("cache_mask", cache_mask)?,
        k_weight: args.read_vectors("k_weight", k_weight)?,
        v_weight: args.read_vectors("v_weight", v_weight)?,
        q_gamma: args.read_vectors("q_gamma", q_gamma)?,
        k_gamma: args.read_vectors("k_gamma", k_gamma)?,
        eps: *eps,
        tau: args.read_opt("log_scaling_tau", tau.as_ref())?,
        k_out: args.write_vectors("k_out", k_out)?,
        v_out: args.write_vectors("v_out", v_out)?,
        loc: args.read("loc", loc)?,
        bad_index_count: args.write_opt("bad_index_count", bad_index_count.as_mut())?,
        ..Default::default()
    };
    match q {
        QTarget::Bf16(q) => p.q_out = args.write_vectors("q_out", q)?,
        QTarget::Mxfp8 { data, scales } => {
            p.q_out = args.write_vectors("q_out", data)?;
            p.q_scale = args.write("q_scale", scales)?;
        }
    }
    match kv {
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
    let mut update = None;
    match variant {
        VariantArgs::Verify {
            draft_tokens,
            k_inter,
            v_inter,
            capacity,
        } => {
            p.draft_tokens = *draft_tokens as i32;
            p.k_inter = args.write_vectors("k_inter", k_inter)?;
            p.v_inter = args.write_vectors("v_inter", v_inter)?;
            p.inter_capacity = *capacity as i32;
        }
        VariantArgs::Extend {
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
                update = Some(u);
            }
        }
        VariantArgs::Decode { track } => {
            if let Some(t) = track {
                p.track_mask = args.read("track_mask", &t.mask)?;
                p.track_indices = args.read("track_indices", &t.indices)?;
            }
        }
    }
    Ok(PrologueLaunch {
        shape: prologue_launch_shape(&st, *tokens),
        params: p,
        update: update
            .filter(|_| *seqs > 0)
            .map(|u| (update_launch_shape(&st, *seqs), u)),
    })
}
