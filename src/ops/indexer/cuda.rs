//! CUDA launch of [`LightningIndexer`] (`kernels/lightning_indexer_prefill.cu`; the paged form
//! and its merge `kernels/lightning_indexer.cu`; both after `kernels/indexer_common.cuh` and
//! `kernels/indexer_ws.cuh`, the CTA they share), and its CUDA-only entry
//! [`LightningIndexer::record`].

use std::marker::PhantomData;

use super::launch::{IndexerCall, IndexerEntry, PagedIndexerCall, PagedPlan};
use super::{
    IndexKeys, IndexerQueries, LightningIndexer, PagedIndexerQueries, PagedIndexerWorkspace,
    RunIndexer,
};
use crate::backend::Cuda;
use crate::backend::cuda::{
    CudaKernel, DeviceArgs, GraphRead, GraphRecorder, IsCuda, LaunchShape, TensorMap, read_ref,
};
use crate::dim::Dim;
use crate::error::Result;
use crate::layout::{INDEX_KEY_ROW_BYTES, IndexKeyCache};
use crate::rules::IndexCachePage;
use crate::tensor::{Cols, Storage, StorageMut, Tensor};

/// Threads per CTA of the paged kernel: a consumer warpgroup and a producer warpgroup.
const THREADS: u32 = 2 * 128;
/// Query tokens a CTA of the paged kernel takes (`indexer::kTokens`).
const TOKENS_PER_CTA: usize = 2;
/// Consumer warpgroups of a prefill CTA at `heads` index heads: two at 64, three at 32 (shared
/// memory holds a candidate buffer a token; `indexer::prefill_wgs`).
const fn prefill_warpgroups(heads: usize) -> usize {
    if heads == 32 { 3 } else { 2 }
}
/// Threads per CTA of the prefill kernel: its consumer warpgroups and a producer warpgroup
/// (`indexer::prefill_threads`).
const fn prefill_threads(heads: usize) -> u32 {
    ((prefill_warpgroups(heads) + 1) * 128) as u32
}
/// Query tokens a CTA of the prefill kernel takes, two a consumer warpgroup
/// (`indexer::prefill_tokens`).
const fn prefill_tokens_per_cta(heads: usize) -> usize {
    2 * prefill_warpgroups(heads)
}
/// Key blocks in flight in the prefill kernel's ring (`indexer::ws_stages`).
const PREFILL_STAGES: usize = 6;

crate::param_block! {
    /// The prefill kernel's parameter block (`struct IndexerParams`), field for field. Its
    /// fields are public for a raw launch of the same CTA (the benchmark's logits alone through
    /// `DeviceArgs`, whose `launch` is `unsafe`); the library fills it only from checked calls.
    pub struct IndexerParams {
        pub q: u64,
        pub weights: u64,
        pub key_start: u64,
        pub key_end: u64,
        pub k: u64,
        pub k_scale: u64,
        pub indices: u64,
        pub tokens: i32,
        pub s_kv: i32,
        pub k_map: TensorMap,
    }
}

crate::param_block! {
    /// The paged kernel's parameter block (`struct PagedIndexerParams`), field for field.
    pub struct PagedIndexerParams {
        q: u64,
        weights: u64,
        block_table: u64,
        seq_lens: u64,
        cache: u64,
        indices: u64,
        part_keys: u64,
        part_pos: u64,
        part_count: u64,
        batch: i32,
        next_n: i32,
        max_pages: i32,
        pages: i32,
        blocks_per_split: i32,
        cache_map: TensorMap,
    }
}

crate::param_block! {
    /// The merge kernel's parameter block (`struct IndexerMergeParams`), field for field.
    pub struct IndexerMergeParams {
        in_keys: u64,
        in_pos: u64,
        in_count: u64,
        out_keys: u64,
        out_pos: u64,
        out_count: u64,
        block_table: u64,
        indices: u64,
        rows: i32,
        lists: i32,
        next_n: i32,
        max_pages: i32,
        last: i32,
        list_cap: i32,
    }
}

/// Threads of a merge CTA (`indexer::kMergeThreads`).
const MERGE_THREADS: u32 = 512;
/// Candidates a merge CTA holds (`indexer::kMergeCandidates`).
const MERGE_CANDIDATES: usize = 16384;
/// Fewest pages a split takes: fewer, and the merge costs more than the split saves.
const MIN_BLOCKS_PER_SPLIT: usize = 4;

/// Lists of `topk` candidates one merge CTA merges (`FAN` in the kernel).
pub const fn merge_fan(topk: usize) -> usize {
    MERGE_CANDIDATES / topk
}

/// Lists a merge CTA takes at a level whose lists hold at most `list_cap` entries (a split's
/// list: at most its own positions; a merged list: `topk`): as many as its candidate buffer
/// holds, which is [`merge_fan`]`(topk)` lists of `topk` (`indexer::kMergeCandidates` rounded
/// down to a multiple of `topk`, the kernel's `C`), so at least `merge_fan(topk)`.
pub const fn merge_lists_a_cta(topk: usize, list_cap: usize) -> usize {
    merge_fan(topk) * topk / if list_cap == 0 { 1 } else { list_cap }
}

/// Dynamic shared memory of a merge CTA (`indexer::merge_smem_bytes`): `FAN · topk` candidates
/// of 8 bytes, the last level's kept positions (room for the power of two at or above `topk`, 4
/// bytes each), a 256-bin histogram and 16 words of scratch.
pub const fn indexer_merge_smem_bytes(topk: usize) -> u32 {
    (merge_fan(topk) * topk * 8 + topk.next_power_of_two() * 4 + 256 * 4 + 16 * 4) as u32
}

/// The split of a paged call over `pairs` query pairs and block tables of `max_pages` pages on
/// a GPU of `sms` SMs, as (splits, pages a split). A batch that fills the GPU's `2 · sms` CTA
/// slots (the kernel's occupancy) is not split. A smaller one takes the split count, at least
/// `MIN_BLOCKS_PER_SPLIT` pages a split, with the least modelled time: the waves of CTAs the
/// slots run times a CTA's pages and a fixed cost of `MIN_BLOCKS_PER_SPLIT` pages (its start,
/// last cut and list; ties to fewer splits: less to merge). Only filling the slots is not
/// enough: 128 pairs in 264 slots split in 3 run two waves (the second of 120 CTAs) of 342
/// pages, in 2 one wave of 512. The search stops at `slots` splits: past them the
/// wave-exact split counts come back with more waves, each paying the fixed cost again (the
/// unbounded search picks the same split on a grid of GPUs, batches and tables, a unit test),
/// so planning costs at most `2 · sms` steps whatever `max_pages` is (`sms`: the device's SM
/// count).
pub fn paged_indexer_split(sms: usize, pairs: usize, max_pages: usize) -> (usize, usize) {
    let slots = sms.saturating_mul(2).max(1);
    let pairs = pairs.max(1);
    if pairs >= slots {
        return (1, max_pages.max(1));
    }
    // Split counts that leave every split at least MIN_BLOCKS_PER_SPLIT pages.
    let most = (max_pages / MIN_BLOCKS_PER_SPLIT).clamp(1, slots);
    let time = |splits: usize| {
        pairs.saturating_mul(splits).div_ceil(slots).saturating_mul(
            max_pages
                .div_ceil(splits)
                .saturating_add(MIN_BLOCKS_PER_SPLIT),
        )
    };
    let wanted = (1..=most)
        .min_by_key(|&splits| (time(splits), splits))
        .unwrap_or(1);
    let per_split = max_pages.div_ceil(wanted).max(1);
    (max_pages.div_ceil(per_split).max(1), per_split)
}

/// Candidates a token holds in the kernel's shared memory (`indexer::cap_for`): `TOPK` and at
/// least half as many (and 128) more.
pub const fn indexer_candidates(topk: usize) -> usize {
    topk + if topk / 2 > 128 { topk / 2 } else { 128 }
}

/// Dynamic shared memory of one paged CTA, `2·heads·128 + 5·(8192 + 256) + 8·heads + 16·cap +
/// 80 + 128` bytes with `cap = indexer_candidates(topk)` (`indexer::smem_bytes`, which the
/// kernel asserts against its layout): the two tokens' Q rows, a ring of five 64-key blocks with
/// their scales, the head weights, a buffer of `cap` (key, position) pairs a token, the ring's
/// barriers, the counters and scratch. Two CTAs share an SM.
pub const fn indexer_smem_bytes(heads: usize, topk: usize) -> u32 {
    (TOKENS_PER_CTA * heads * 128
        + 5 * (64 * 128 + 64 * 4)
        + TOKENS_PER_CTA * heads * 4
        + TOKENS_PER_CTA * indexer_candidates(topk) * 8
        + 2 * 5 * 8
        + 128) as u32
}

/// Dynamic shared memory of one prefill CTA, `n·heads·128 + 6·(8192 + 256) + 4·n·heads +
/// 8·n·cap + 96 + scratch` bytes with `n` its tokens (4 at 64 heads, 6 at 32), `cap =
/// indexer_candidates(topk)` and 256 bytes of scratch
/// (`indexer::prefill_smem_bytes`, which the kernel asserts against its layout): the Q rows of
/// its tokens, a ring of six 64-key blocks with their scales, the head weights, a buffer of
/// `cap` (key, position) pairs a token, the ring's barriers, the counters and scratch.
pub const fn prefill_indexer_smem_bytes(heads: usize, topk: usize) -> u32 {
    let tokens = prefill_tokens_per_cta(heads);
    let scratch = 256;
    (tokens * heads * 128
        + PREFILL_STAGES * (64 * 128 + 64 * 4)
        + tokens * heads * 4
        + tokens * indexer_candidates(topk) * 8
        + 2 * PREFILL_STAGES * 8
        + scratch) as u32
}

/// Grid, block and shared memory of a prefill launch over `tokens` query tokens (four a CTA at
/// 64 heads, six at 32; at most `i32::MAX` tokens, so the grid fits): what the library
/// launches, and what a benchmark launching the same CTA raw must use.
pub fn prefill_indexer_launch_shape(tokens: usize, heads: usize, topk: usize) -> LaunchShape {
    LaunchShape {
        grid: (tokens.div_ceil(prefill_tokens_per_cta(heads)) as u32, 1, 1),
        block: (prefill_threads(heads), 1, 1),
        smem_bytes: prefill_indexer_smem_bytes(heads, topk),
    }
}

/// `lightning_indexer_kernel<H_IDX, TOPK>`: logits and top-k fused, four query tokens a CTA at
/// 64 heads, six at 32.
pub struct LightningIndexerKernel<const H_IDX: usize, const TOPK: usize>(
    PhantomData<(Dim<H_IDX>, Dim<TOPK>)>,
);

/// The source of the paged kernel and the merge (`kernels/lightning_indexer.cu`), after the
/// steps both indexer CTAs share.
const PAGED_SOURCE: &str = concat!(
    include_str!("../../../kernels/sparse_mla_common.cuh"),
    "\n",
    include_str!("../../../kernels/indexer_common.cuh"),
    "\n",
    include_str!("../../../kernels/indexer_ws.cuh"),
    "\n",
    include_str!("../../../kernels/lightning_indexer.cu")
);

impl<const H_IDX: usize, const TOPK: usize> CudaKernel for LightningIndexerKernel<H_IDX, TOPK> {
    const SOURCE: &'static str = concat!(
        include_str!("../../../kernels/sparse_mla_common.cuh"),
        "\n",
        include_str!("../../../kernels/indexer_common.cuh"),
        "\n",
        include_str!("../../../kernels/indexer_ws.cuh"),
        "\n",
        include_str!("../../../kernels/lightning_indexer_prefill.cu")
    );
    const DYNAMIC_SMEM_BYTES: u32 = prefill_indexer_smem_bytes(H_IDX, TOPK);
    type Params = IndexerParams;
    fn instantiation() -> String {
        format!("lightning_indexer_kernel<{H_IDX}, {TOPK}>")
    }
}

/// `paged_lightning_indexer_kernel<H_IDX, TOPK>`: a consumer warpgroup (two of a sequence's
/// `next_n` tokens) and a producer warpgroup over the sequence's pages, two CTAs an SM.
pub struct PagedLightningIndexerKernel<const H_IDX: usize, const TOPK: usize>(
    PhantomData<(Dim<H_IDX>, Dim<TOPK>)>,
);

impl<const H_IDX: usize, const TOPK: usize> CudaKernel
    for PagedLightningIndexerKernel<H_IDX, TOPK>
{
    const SOURCE: &'static str = PAGED_SOURCE;
    const DYNAMIC_SMEM_BYTES: u32 = indexer_smem_bytes(H_IDX, TOPK);
    type Params = PagedIndexerParams;
    fn instantiation() -> String {
        format!("paged_lightning_indexer_kernel<{H_IDX}, {TOPK}>")
    }
}

/// `paged_indexer_merge_kernel<TOPK>`: merges `FAN` split lists of a row into one list (or, at
/// the last level, into the row of slots).
pub struct PagedIndexerMergeKernel<const TOPK: usize>(PhantomData<Dim<TOPK>>);

impl<const TOPK: usize> CudaKernel for PagedIndexerMergeKernel<TOPK> {
    const SOURCE: &'static str = PAGED_SOURCE;
    const DYNAMIC_SMEM_BYTES: u32 = indexer_merge_smem_bytes(TOPK);
    type Params = IndexerMergeParams;
    fn instantiation() -> String {
        format!("paged_indexer_merge_kernel<{TOPK}>")
    }
}

/// The CUDA launch runs the op.
impl RunIndexer for Cuda {}

impl IndexerEntry for Cuda {
    unsafe fn lightning_indexer<const H_IDX: usize, const TOPK: usize>(
        &self,
        call: IndexerCall<'_, Cuda>,
    ) -> Result<()> {
        let IndexerCall {
            tokens,
            s_kv,
            queries,
            keys,
            mut indices,
        } = call;
        if tokens == 0 {
            return Ok(());
        }
        let mut args = DeviceArgs::new(self)?;
        let k = args.read_vectors("k", &keys.k)?;
        let params = IndexerParams {
            q: args.read_vectors("q", &queries.q)?,
            weights: args.read("weights", &queries.weights)?,
            key_start: args.read("key_start", &queries.key_start)?,
            key_end: args.read("key_end", &queries.key_end)?,
            k,
            k_scale: args.read("k_scale", &keys.k_scale)?,
            indices: args.write("indices", &mut indices)?,
            tokens: tokens as i32,
            s_kv: s_kv as i32,
            // The kernel's TMA copies of k: s_kv rows of 128 bytes (its admitted extent), in
            // boxes of one 64-key block; nothing past them is read.
            k_map: TensorMap::rows_of_128_bytes("k", k, s_kv, 64)?,
        };
        let shape = prefill_indexer_launch_shape(tokens, H_IDX, TOPK);
        // SAFETY: q holds tokens × H_IDX × 128 bytes, weights tokens × H_IDX, the ranges tokens,
        // k s_kv × 128 bytes (k_map's extent), k_scale s_kv and indices tokens × TOPK (tied by
        // the checked structs and `run`); the kernel clamps every range to [0, s_kv] and touches no row of
        // q, weights or indices at or past `tokens`.
        unsafe { args.launch::<LightningIndexerKernel<H_IDX, TOPK>>(shape, &params) }
    }

    unsafe fn paged_lightning_indexer<const H_IDX: usize, const TOPK: usize, const PAGE: usize>(
        &self,
        call: PagedIndexerCall<'_, Cuda>,
    ) -> Result<()> {
        let PagedIndexerCall {
            tokens,
            batch,
            pages,
            queries,
            cache,
            mut indices,
            workspace: mut ws,
        } = call;
        if tokens == 0 {
            return Ok(());
        }
        let splits = ws.splits;
        {
            let mut args = DeviceArgs::new(self)?;
            let cache_addr = args.read_vectors("index_cache", &cache)?;
            let params = PagedIndexerParams {
                q: args.read_vectors("q", &queries.q)?,
                weights: args.read("weights", &queries.weights)?,
                block_table: args.read("block_table", &queries.block_table)?,
                seq_lens: args.read("seq_lens", &queries.seq_lens)?,
                cache: cache_addr,
                indices: args.write("indices", &mut indices)?,
                part_keys: args.write("workspace", &mut ws.keys)?,
                part_pos: args.write("workspace", &mut ws.pos)?,
                part_count: args.write("workspace", &mut ws.count)?,
                batch: batch as i32,
                next_n: queries.next_n as i32,
                max_pages: queries.max_pages as i32,
                pages: pages as i32,
                blocks_per_split: ws.blocks_per_split as i32,
                // The kernel's TMA copies of a page's key tile: box (0, 0, page) of the pages'
                // tiles, each page's first 64 rows of 128 bytes (its scales follow, copied
                // separately); a page outside [0, pages) is never copied.
                cache_map: TensorMap::key_tiles_of_pages(
                    "index_cache",
                    cache_addr,
                    pages,
                    PAGE * INDEX_KEY_ROW_BYTES,
                    PAGE as u32,
                )?,
            };
            let per_sequence = queries.next_n.div_ceil(TOKENS_PER_CTA);
            let shape = LaunchShape {
                grid: ((batch * per_sequence) as u32, splits as u32, 1),
                block: (THREADS, 1, 1),
                smem_bytes: indexer_smem_bytes(H_IDX, TOPK),
            };
            // SAFETY: q holds B·next_n × H_IDX × 128 bytes, weights B·next_n × H_IDX, the block
            // table B × max_pages entries, seq_lens B, the cache pages × 8448 bytes and indices
            // B·next_n × TOPK (tied by the checked queries and `run_paged`), the workspace
            // B·next_n × splits lists of TOPK when split (planned for this shape, checked by
            // `run_paged`); the kernel clamps every range to its split's part of
            // [0, 64 · max_pages], reads a page only when its entry lies in [0, pages), and touches
            // no row at or past B · next_n.
            unsafe { args.launch::<PagedLightningIndexerKernel<H_IDX, TOPK>>(shape, &params)? };
        }
        if splits == 1 {
            return Ok(());
        }
        // Merge levels: as many lists into one as a CTA's MERGE_CANDIDATES hold, ping-ponging
        // between the two list buffers, until one CTA a row can write the row. A split's list
        // holds at most its own positions (a short split: far fewer than TOPK), a merged one
        // TOPK; at least `merge_fan(TOPK)` lists a CTA either way, so the merged buffer's
        // rows × ceil(splits / merge_fan) lists hold every level. (An input buffer is admitted
        // as written: the merge only reads it, but the stream protocol need not know.)
        let rows = tokens;
        let mut lists = splits;
        let mut list_cap = TOPK.min(ws.blocks_per_split * PAGE);
        let mut from_split_buffer = true;
        loop {
            let fan = merge_lists_a_cta(TOPK, list_cap);
            let last = lists <= fan;
            let groups = if last { 1 } else { lists.div_ceil(fan) };
            let mut args = DeviceArgs::new(self)?;
            let (in_keys, in_pos, in_count, out_keys, out_pos, out_count) = if from_split_buffer {
                (
                    args.write("workspace", &mut ws.keys)?,
                    args.write("workspace", &mut ws.pos)?,
                    args.write("workspace", &mut ws.count)?,
                    args.write("workspace", &mut ws.merged_keys)?,
                    args.write("workspace", &mut ws.merged_pos)?,
                    args.write("workspace", &mut ws.merged_count)?,
                )
            } else {
                (
                    args.write("workspace", &mut ws.merged_keys)?,
                    args.write("workspace", &mut ws.merged_pos)?,
                    args.write("workspace", &mut ws.merged_count)?,
                    args.write("workspace", &mut ws.keys)?,
                    args.write("workspace", &mut ws.pos)?,
                    args.write("workspace", &mut ws.count)?,
                )
            };
            let params = IndexerMergeParams {
                in_keys,
                in_pos,
                in_count,
                out_keys,
                out_pos,
                out_count,
                block_table: args.read("block_table", &queries.block_table)?,
                indices: args.write("indices", &mut indices)?,
                rows: rows as i32,
                lists: lists as i32,
                next_n: queries.next_n as i32,
                max_pages: queries.max_pages as i32,
                last: last as i32,
                list_cap: list_cap as i32,
            };
            let shape = LaunchShape {
                grid: (rows as u32, groups as u32, 1),
                block: (MERGE_THREADS, 1, 1),
                smem_bytes: indexer_merge_smem_bytes(TOPK),
            };
            // SAFETY: the input buffer holds rows × lists lists of TOPK (and their counts),
            // each written by the previous launch on this stream; the output holds rows ×
            // groups lists (the split buffer holds rows × splits ≥ any later level, the merged
            // one rows × ceil(splits / merge_fan(TOPK)) ≥ any later level, a level's fan being
            // at least merge_fan(TOPK)); the kernel reads at most min(list_cap, TOPK) entries of
            // a list whatever its count holds, and writes at most TOPK a list; the
            // last level reads the block table only at positions a split admitted (a page
            // inside [0, pages) of the row's sequence) and writes rows × TOPK indices. The merge
            // waits (`griddepcontrol.wait`) for the kernel before it before any global access,
            // so it is launched as a dependent: its launch and start hide behind that tail.
            unsafe { args.launch_dependent::<PagedIndexerMergeKernel<TOPK>>(shape, &params)? };
            if last {
                return Ok(());
            }
            lists = groups;
            list_cap = TOPK;
            from_split_buffer = !from_split_buffer;
        }
    }

    fn paged_indexer_plan(
        &self,
        batch: usize,
        next_n: usize,
        max_pages: usize,
        topk: usize,
    ) -> PagedPlan {
        // A CTA takes `TOKENS_PER_CTA` of a sequence's tokens: the CTAs before splitting.
        let ctas = batch * next_n.div_ceil(TOKENS_PER_CTA);
        let (splits, blocks_per_split) =
            paged_indexer_split(self.sm_count() as usize, ctas, max_pages);
        PagedPlan {
            splits,
            blocks_per_split,
            merged_lists: splits.div_ceil(merge_fan(topk)),
        }
    }
}

impl<const H_IDX: usize, const TOPK: usize> LightningIndexer<H_IDX, TOPK> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the queries, keys and `indices` until it is dropped, so none can be
    /// freed or swapped while it can replay.
    pub fn record<'g, B: RunIndexer + IsCuda, SQ: Storage<B>, SK: Storage<B>, SO: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        queries: &'g IndexerQueries<B, H_IDX, SQ>,
        keys: &'g IndexKeys<B, SK>,
        indices: &'g mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()> {
        graph.record(|cuda: &B| self.run(cuda, queries, keys, indices))
    }

    /// Records the same call as [`run_paged`](Self::run_paged) into a CUDA graph (after the same
    /// checks): the graph borrows the queries, the cache, the workspace and `indices` until it
    /// is dropped. The cache is a `&'g` borrow or the one an index-key store's `record` of the
    /// same step handed back.
    pub fn record_paged<
        'g,
        B: RunIndexer + IsCuda,
        const PAGE: usize,
        SQ: Storage<B>,
        SK: Storage<B> + 'g,
        SO: StorageMut<B>,
    >(
        &self,
        graph: &mut GraphRecorder<'g>,
        queries: &'g PagedIndexerQueries<B, H_IDX, SQ>,
        cache: impl Into<GraphRead<'g, IndexKeyCache<B, PAGE, SK>>>,
        workspace: &'g mut PagedIndexerWorkspace<B, TOPK>,
        indices: &'g mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()>
    where
        Dim<PAGE>: IndexCachePage,
    {
        let cache = read_ref(cache);
        graph.record(|cuda: &B| self.run_paged(cuda, queries, cache, workspace, indices))
    }
}
