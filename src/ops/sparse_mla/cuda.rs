//! CUDA launch of the sparse MLA prefill, and its CUDA-only entry
//! [`SparseMlaPrefill::record`].
//!
//! Two kernels, one type each, named by their kernel: [`SparseMlaNarrowKernel`]
//! (`kernels/sparse_mla_narrow.cu`) in head tiles of 8, 16 or 32 (its 64-head tile of two
//! 32-head warpgroups, `SparseMlaNarrowKernel<_, _, 64>`, is one the default tiling no longer
//! picks), and [`SparseMlaWideKernel`], the 64-head kernel (`kernels/sparse_mla_prefill.cu`:
//! by default more than 32 heads, and every call with `HeadTiling::Tiles64`). Both are
//! compiled after `kernels/sparse_mla_common.cuh` (their parameter block and PTX helpers).

use std::marker::PhantomData;

use super::launch::{SparseMlaCall, SparseMlaEntry};
use super::{
    HeadTiling, Options, OutRow, RunSparseMla, SparseMlaInputs, SparseMlaPrefill, max_query_rows,
};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::dtype::bf16;
use crate::error::Result;
use crate::layout::MlaLatentKv;
use crate::tensor::{Cols, Storage, StorageMut, Tensor};

/// Threads per CTA of the 64-head (wide) kernel: two consumer warpgroups and a producer
/// warpgroup (`sparse_mla::kThreads`).
const WIDE_THREADS: u32 = 384;

crate::param_block! {
    /// The kernel's parameter block (`struct SparseMlaParams`), field for field.
    pub struct SparseMlaParams {
        pub(crate) q: u64,
        pub(crate) kv: u64,
        pub(crate) indices: u64,
        pub(crate) topk_length: u64,
        pub(crate) attn_sink: u64,
        pub(crate) q_scale: u64,
        pub(crate) kv_scale: u64,
        pub(crate) out: u64,
        pub(crate) max_logits: u64,
        pub(crate) lse: u64,
        pub(crate) sm_scale: f32,
        pub(crate) s_q: i32,
        pub(crate) s_kv: i32,
        pub(crate) h_q: i32,
        pub(crate) head_tiles: i32,
        pub(crate) topk: i32,
    }
}

/// The 64-head (wide) kernel, `sparse_mla_prefill_kernel<D_QK, HAVE_TOPK_LENGTH, HAVE_SINK>`
/// (`kernels/sparse_mla_prefill.cu`): tiles of 64 heads on a persistent grid, for more than 32
/// real heads by default and for any `H_Q` with `HeadTiling::Tiles64`.
pub struct SparseMlaWideKernel<const D_QK: usize, O>(PhantomData<O>);

/// The narrow kernel in head tiles of `TILE` heads,
/// `sparse_mla_narrow_kernel<D_QK, TILE, HAVE_TOPK_LENGTH, HAVE_SINK>`
/// (`kernels/sparse_mla_narrow.cu`). `TILE` = 8, 16 or 32 run up to 32 real heads by default;
/// `TILE = 64` (one CTA per SM whose two consumer warpgroups each run 32 of the heads over one
/// gathered K ring) is no longer picked by [`HeadTiling`] (the wide kernel, persistent too, is
/// faster at every top-k): it stays for engines that launch it themselves
/// ([`Cuda::launch`](crate::backend::Cuda::launch)) and as the kernel harness's comparison.
pub struct SparseMlaNarrowKernel<const D_QK: usize, O, const TILE: usize>(PhantomData<O>);

/// Dynamic shared memory of one CTA of the 64-head kernel, `192·D_QK + 119424` bytes (the kernel
/// asserts the same formula against its layout: Q tile and two K slots of `64·D_QK` bytes each,
/// three V^T slots of 33792, two P tiles of 8192, statistics and 14 barriers).
pub const fn sparse_mla_wide_smem_bytes(d_qk: usize) -> u32 {
    (192 * d_qk + 119424) as u32
}

/// The 64-head kernel's paged variant, `sparse_mla_prefill_kernel<576, false, false, true>`
/// (`kernels/sparse_mla_prefill.cu`, PAGED): its rows are read from the FP8 cache itself (656-byte
/// rows, latent bytes scaled in shared memory by their group's scale, RoPE values cast to e4m3
/// by the warpgroup that reads them), its indices are cache slots. It runs
/// [`DecodeThroughPrefill`](crate::ops::sparse_mla_decode::DecodeThroughPrefill), whose prepare
/// kernel casts q and writes those indices.
pub struct SparseMlaPagedKernel;

/// Dynamic shared memory of one CTA of the paged variant: the 64-head kernel's at d_qk 576 and
/// two more barriers and the two K slots' row scales (`192·576 + 119424 + 16 + 2048` = 232080
/// bytes, of the 232448 an SM grants; the kernel asserts the same formula).
pub const SPARSE_MLA_PAGED_SMEM_BYTES: u32 = sparse_mla_wide_smem_bytes(576) + 16 + 2048;

impl CudaKernel for SparseMlaPagedKernel {
    const SOURCE: &'static str = WIDE_SOURCE;
    const DYNAMIC_SMEM_BYTES: u32 = SPARSE_MLA_PAGED_SMEM_BYTES;
    type Params = SparseMlaParams;
    fn instantiation() -> String {
        "sparse_mla_prefill_kernel<576, false, false, true>".into()
    }
}

/// Gather warps per CTA of the narrow kernel: one warpgroup of four for every head tile
/// (`sparse_mla_narrow::kGatherWarps`; setmaxnreg moves registers only between whole
/// warpgroups).
pub const SPARSE_MLA_NARROW_GATHER_WARPS: usize = 4;

/// Stages (32 gathered rows each, half a block) of the narrow kernel's K ring: as many as the
/// shared memory of an SM holds for its CTAs (`sparse_mla_narrow::kStagesFor`).
pub const fn sparse_mla_narrow_stages(d_qk: usize, tile: usize) -> usize {
    match (tile, d_qk) {
        (64, 576) => 9,
        (64, _) => 11,
        (32, _) => 4,
        (_, 576) => 5,
        // Three CTAs per SM (`sparse_mla_narrow::kCtasPerSmFor`) leave room for four stages.
        (8, _) => 4,
        _ => 6,
    }
}

/// CTAs of the narrow kernel that one SM holds at once (`sparse_mla_narrow::kCtasPerSmFor`):
/// the persistent grid is this many per SM.
pub const fn sparse_mla_narrow_ctas_per_sm(d_qk: usize, tile: usize) -> u32 {
    match (tile, d_qk) {
        (64, _) => 1,
        (8, 512) => 3,
        _ => 2,
    }
}

/// Threads per CTA of the narrow kernel (`sparse_mla_narrow::kThreadsFor`): one consumer
/// warpgroup (two for the 64-head tile) and the gather warpgroup.
pub const fn sparse_mla_narrow_threads(tile: usize) -> u32 {
    let consumer_warpgroups = if tile == 64 { 2 } else { 1 };
    (128 * consumer_warpgroups + 32 * SPARSE_MLA_NARROW_GATHER_WARPS) as u32
}

/// Q tiles per CTA of the narrow kernel (`sparse_mla_narrow::kQBuffersFor`): two where they fit
/// beside the ring (the next row's Q loads while the current one is read), else one.
pub const fn sparse_mla_narrow_q_buffers(d_qk: usize, tile: usize) -> usize {
    match (tile, d_qk) {
        (8, _) | (16, 576) | (32, 512) => 2,
        _ => 1,
    }
}

/// Dynamic shared memory of one CTA of the narrow kernel,
/// `q_buffers·(tile·D_QK + 16) + stages·(32·D_QK + 536) + 112·tile` bytes (the kernel asserts
/// the same formula: Q tiles and their two barriers, K ring stages of 32 rows at a pitch of
/// D_QK + 16 bytes with their mask and barriers, P^T and the column statistics).
pub const fn sparse_mla_narrow_smem_bytes(d_qk: usize, tile: usize) -> u32 {
    let stages = sparse_mla_narrow_stages(d_qk, tile);
    let q_buffers = sparse_mla_narrow_q_buffers(d_qk, tile);
    (q_buffers * (tile * d_qk + 16) + stages * (32 * d_qk + 536) + 112 * tile) as u32
}

/// Source of the 64-head kernel, after the shared header.
const WIDE_SOURCE: &str = concat!(
    include_str!("../../../kernels/sparse_mla_common.cuh"),
    "\n",
    include_str!("../../../kernels/sparse_mla_prefill.cu")
);

/// Source of the narrow kernel (every tile of it), after the shared header.
const NARROW_SOURCE: &str = concat!(
    include_str!("../../../kernels/sparse_mla_common.cuh"),
    "\n",
    include_str!("../../../kernels/sparse_mla_narrow.cu")
);

impl<const D_QK: usize, O: Options> CudaKernel for SparseMlaWideKernel<D_QK, O> {
    const SOURCE: &'static str = WIDE_SOURCE;
    const DYNAMIC_SMEM_BYTES: u32 = sparse_mla_wide_smem_bytes(D_QK);
    type Params = SparseMlaParams;
    fn instantiation() -> String {
        format!(
            "sparse_mla_prefill_kernel<{D_QK}, {}, {}>",
            O::HAVE_LENGTH,
            O::HAVE_SINK
        )
    }
}

impl<const D_QK: usize, O: Options, const TILE: usize> CudaKernel
    for SparseMlaNarrowKernel<D_QK, O, TILE>
{
    const SOURCE: &'static str = NARROW_SOURCE;
    const DYNAMIC_SMEM_BYTES: u32 = sparse_mla_narrow_smem_bytes(D_QK, TILE);
    type Params = SparseMlaParams;
    fn instantiation() -> String {
        format!(
            "sparse_mla_narrow_kernel<{D_QK}, {TILE}, {}, {}>",
            O::HAVE_LENGTH,
            O::HAVE_SINK
        )
    }
}

/// Which kernel runs a head tile: the narrow kernel in tiles of 8, 16 or 32 heads, or the
/// 64-head kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TileKernel {
    Narrow8,
    Narrow16,
    Narrow32,
    Wide,
}

/// The CUDA launch runs the op.
impl super::RunSparseMla for Cuda {}

impl TileKernel {
    /// Heads a tile of this kernel holds.
    const fn tile(self) -> usize {
        match self {
            TileKernel::Narrow8 => 8,
            TileKernel::Narrow16 => 16,
            TileKernel::Narrow32 => 32,
            TileKernel::Wide => 64,
        }
    }
}

/// The kernel and the tiles per query row that run `heads` real heads under
/// `tiling`. By default the narrow kernel runs them in the narrowest of its tiles that holds them
/// (8, 16 or 32, whatever `H_Q` pads them to: 16 real heads of `H_Q = 64` launch exactly as with
/// `H_Q = 16`); more than 32 run in the 64-head kernel's tiles, at every top-k: on its persistent
/// grid it is 1.20-1.29× faster than the narrow kernel's 64-head tiles from top-k 128 to 2048
/// (H200, s_kv 32768, 64 and 128 heads, both head dims: `bench/RESULTS.md`). `Tiles64` runs the
/// 64-head kernel's tiles for every head count. Only tiles that hold a real head are launched.
fn head_tile_plan(tiling: HeadTiling, heads: usize) -> (TileKernel, usize) {
    let kernel = match tiling {
        HeadTiling::Fastest => match heads {
            0..=8 => TileKernel::Narrow8,
            9..=16 => TileKernel::Narrow16,
            17..=32 => TileKernel::Narrow32,
            _ => TileKernel::Wide,
        },
        HeadTiling::Tiles64 => TileKernel::Wide,
    };
    (kernel, heads.div_ceil(kernel.tile()))
}

impl SparseMlaEntry for Cuda {
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
        let (kernel, head_tiles) = head_tile_plan(call.tiling, HEADS);
        let SparseMlaCall {
            s_q,
            s_kv,
            queries: q,
            kv,
            outputs: mut o,
            ..
        } = call;
        let mut args = DeviceArgs::new(self)?;
        let params = SparseMlaParams {
            q: args.read_vectors("q", &q.q)?,
            kv: args.read_vectors("kv", &kv.data)?,
            indices: args.read("indices", &q.indices)?,
            topk_length: args.read_opt("topk_length", q.topk_length.as_ref())?,
            attn_sink: args.read_opt("attn_sink", q.sink.as_ref())?,
            q_scale: args.read("q_scale", &q.q_scale)?,
            kv_scale: args.read("kv_scale", &kv.scale)?,
            out: args.write_vectors("out", &mut o.out)?,
            max_logits: args.write("max_logits", &mut o.max_logits)?,
            lse: args.write("lse", &mut o.lse)?,
            sm_scale: q.sm_scale,
            s_q: s_q as i32,
            s_kv: s_kv as i32,
            h_q: HEADS as i32,
            head_tiles: head_tiles as i32,
            topk: TOPK as i32,
        };
        // Work items (query row, head tile): at most 2^30, as `max_query_rows` bounded s_q at
        // the typed boundary.
        debug_assert!(s_q <= max_query_rows(HEADS) && head_tiles * s_q <= 1 << 30);
        let rows = (head_tiles * s_q) as u32;
        // SAFETY (all arms): q, indices, outputs were tied to s_q and the kv rows to s_kv at the
        // typed boundary; the kernels never read an index outside [0, s_kv).
        let launched = match kernel {
            TileKernel::Narrow8 => unsafe {
                self.launch_narrow::<D_QK, 8, O>(&args, rows, &params)
            },
            TileKernel::Narrow16 => unsafe {
                self.launch_narrow::<D_QK, 16, O>(&args, rows, &params)
            },
            TileKernel::Narrow32 => unsafe {
                self.launch_narrow::<D_QK, 32, O>(&args, rows, &params)
            },
            TileKernel::Wide => {
                let shape = self.wide_shape(rows, sparse_mla_wide_smem_bytes(D_QK));
                unsafe { args.launch::<SparseMlaWideKernel<D_QK, O>>(shape, &params) }
            }
        };
        drop(args); // records the launch's reads and writes (when the context tracks events)
        launched
    }
}

impl Cuda {
    /// The launch shape of the 64-head kernel (and of its paged variant) over `items` work
    /// items: a persistent grid, one CTA an SM (fewer CTAs for fewer items), as the kernel's
    /// header describes.
    pub(crate) fn wide_shape(&self, items: u32, smem_bytes: u32) -> LaunchShape {
        LaunchShape {
            grid: (items.min(self.sm_count()), 1, 1),
            block: (WIDE_THREADS, 1, 1),
            smem_bytes,
        }
    }

    /// One launch of the narrow kernel (`D_QK`, head tile `TILE`) over `items` work items
    /// (query rows times head tiles): a persistent grid of as many CTAs as the SMs hold at once, each
    /// taking items `blockIdx.x`, `blockIdx.x + gridDim.x`, ... (fewer CTAs for fewer items).
    /// No CTA waits for another, so when other work shares the SMs the CTAs that do not fit
    /// only start later.
    ///
    /// # Safety
    /// As [`DeviceArgs::launch`]: the parameter block's pointers were admitted by `args` and
    /// its extents are valid for the kernel.
    unsafe fn launch_narrow<const D_QK: usize, const TILE: usize, O: Options>(
        &self,
        args: &DeviceArgs<'_>,
        items: u32,
        params: &SparseMlaParams,
    ) -> Result<()> {
        let resident = self.sm_count() * sparse_mla_narrow_ctas_per_sm(D_QK, TILE);
        let shape = LaunchShape {
            grid: (items.min(resident), 1, 1),
            block: (sparse_mla_narrow_threads(TILE), 1, 1),
            smem_bytes: SparseMlaNarrowKernel::<D_QK, O, TILE>::DYNAMIC_SMEM_BYTES,
        };
        // SAFETY: forwarded from the caller.
        unsafe { args.launch::<SparseMlaNarrowKernel<D_QK, O, TILE>>(shape, params) }
    }
}

impl<const D_QK: usize, const H_Q: usize, const TOPK: usize, O: Options, const HEADS: usize>
    SparseMlaPrefill<D_QK, H_Q, TOPK, O, HEADS>
{
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks): the graph borrows the
    /// inputs, the latent KV and the outputs until it is dropped, so none can be freed or
    /// swapped while it can replay.
    pub fn record<'g, B, SI: Storage<B>, SK: Storage<B>, SO: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        inputs: &'g SparseMlaInputs<B, D_QK, HEADS, TOPK, O, SI>,
        kv: &'g MlaLatentKv<B, D_QK, SK>,
        out: &'g mut Tensor<B, bf16, OutRow<HEADS>, SO>,
        max_logits: &'g mut Tensor<B, f32, Cols<HEADS>, SO>,
        lse: &'g mut Tensor<B, f32, Cols<HEADS>, SO>,
    ) -> Result<()>
    where
        B: RunSparseMla + IsCuda,
    {
        graph.record(|cuda: &B| self.run(cuda, inputs, kv, out, max_logits, lse))
    }
}

#[cfg(test)]
mod tiling_tests {
    use super::*;

    #[test]
    fn real_heads_run_in_the_narrowest_tiles_that_hold_them() {
        use HeadTiling::{Fastest, Tiles64};
        use TileKernel::{Narrow8, Narrow16, Narrow32, Wide};
        // (tiling, real heads) -> (kernel, tiles per row)
        let cases = [
            (Fastest, 1, (Narrow8, 1)),
            (Fastest, 5, (Narrow8, 1)),
            (Fastest, 8, (Narrow8, 1)),
            (Fastest, 12, (Narrow16, 1)),
            (Fastest, 16, (Narrow16, 1)),
            (Fastest, 20, (Narrow32, 1)),
            (Fastest, 32, (Narrow32, 1)),
            (Fastest, 33, (Wide, 1)),
            (Fastest, 40, (Wide, 1)),
            (Fastest, 64, (Wide, 1)),
            (Fastest, 80, (Wide, 2)),
            (Fastest, 100, (Wide, 2)),
            (Fastest, 128, (Wide, 2)),
            (Tiles64, 5, (Wide, 1)),
            (Tiles64, 16, (Wide, 1)),
            (Tiles64, 64, (Wide, 1)),
            (Tiles64, 80, (Wide, 2)),
            (Tiles64, 128, (Wide, 2)),
        ];
        for (tiling, heads, plan) in cases {
            assert_eq!(
                head_tile_plan(tiling, heads),
                plan,
                "{tiling:?}, {heads} heads"
            );
        }
        // The boundary's row bound keeps every plan's work items within 2^30 (the kernels step
        // through them in i32), and it is exact for whole 64-head tiles.
        assert_eq!(max_query_rows(128), 1 << 29);
        for heads in 1..=1024 {
            for tiling in [Fastest, Tiles64] {
                let (_, tiles) = head_tile_plan(tiling, heads);
                assert!(tiles * max_query_rows(heads) <= 1 << 30, "{heads} heads");
            }
        }
        // Every tile plan covers the heads, and its last tile holds at least one real head.
        for heads in 1..=1024 {
            for tiling in [Fastest, Tiles64] {
                let (kernel, tiles) = head_tile_plan(tiling, heads);
                let tile = kernel.tile();
                assert!(tile * tiles >= heads && tile * (tiles - 1) < heads);
            }
        }
    }
}

/// The launch-shape mirrors above against the kernels' own constants: a probe of
/// `static_assert`s appended to each kernel's source and compiled by NVRTC (no GPU needed), so a
/// mirror that drifts from its kernel fails here — a shared-memory size smaller than the kernel's
/// layout would let it address memory it was not given. Compiled only with `--features
/// nvrtc-tests`.
#[cfg(all(test, feature = "nvrtc-tests"))]
mod mirror_tests {
    use super::*;
    use crate::backend::cuda::{Arch, compile_kernel};

    fn assert_compiles(source: &str, probe: &str, instantiation: &str) {
        let source = format!("{source}\n// launch-shape probe\n{probe}");
        if let Err(e) = compile_kernel(&source, instantiation, Arch::Sm90a) {
            panic!("a launch-shape mirror differs from its kernel: {e}");
        }
    }

    #[test]
    fn narrow_kernel_launch_shape() {
        let mut probe = String::new();
        for d in [512usize, 576] {
            for tile in [8usize, 16, 32, 64] {
                let checks = [
                    (
                        "Smem",
                        format!("Smem<{d}, {tile}>::kBytes"),
                        sparse_mla_narrow_smem_bytes(d, tile),
                    ),
                    (
                        "stages",
                        format!("kStagesFor<{d}, {tile}>"),
                        sparse_mla_narrow_stages(d, tile) as u32,
                    ),
                    (
                        "Q buffers",
                        format!("kQBuffersFor<{d}, {tile}>"),
                        sparse_mla_narrow_q_buffers(d, tile) as u32,
                    ),
                    (
                        "CTAs per SM",
                        format!("kCtasPerSmFor<{d}, {tile}>"),
                        sparse_mla_narrow_ctas_per_sm(d, tile),
                    ),
                    (
                        "threads",
                        format!("kThreadsFor<{tile}>"),
                        sparse_mla_narrow_threads(tile),
                    ),
                ];
                for (what, expr, rust) in checks {
                    probe += &format!(
                        "static_assert(sparse_mla_narrow::{expr} == {rust}, \"{what}, d_qk {d}, tile {tile}\");\n"
                    );
                }
            }
        }
        let source = NARROW_SOURCE;
        assert_compiles(
            source,
            &probe,
            "sparse_mla_narrow_kernel<576, 16, false, false>",
        );
    }

    /// Every narrow tile at both head dims compiles under NVRTC, with the optional inputs on (the
    /// most code): NVRTC rejects some constructs nvcc accepts (host-only generic lambdas, for
    /// one), and a tile's `if constexpr` branches are only checked where it is instantiated.
    #[test]
    fn every_narrow_tile_compiles_under_nvrtc() {
        for d in [512usize, 576] {
            for tile in [8usize, 16, 32, 64] {
                let instantiation = format!("sparse_mla_narrow_kernel<{d}, {tile}, true, true>");
                if let Err(e) = compile_kernel(NARROW_SOURCE, &instantiation, Arch::Sm90a) {
                    panic!("{instantiation} does not compile: {e}");
                }
            }
        }
    }

    /// The 64-head kernel at both head dims and every option, under NVRTC (as the narrow tiles
    /// above).
    #[test]
    fn every_wide_instantiation_compiles_under_nvrtc() {
        for d in [512usize, 576] {
            for (length, sink) in [(false, false), (true, false), (true, true)] {
                let instantiation = format!("sparse_mla_prefill_kernel<{d}, {length}, {sink}>");
                if let Err(e) = compile_kernel(WIDE_SOURCE, &instantiation, Arch::Sm90a) {
                    panic!("{instantiation} does not compile: {e}");
                }
            }
        }
        let paged = SparseMlaPagedKernel::instantiation();
        if let Err(e) = compile_kernel(WIDE_SOURCE, &paged, Arch::Sm90a) {
            panic!("{paged} does not compile: {e}");
        }
    }

    #[test]
    fn wide_kernel_launch_shape() {
        let mut probe =
            format!("static_assert(sparse_mla::kThreads == {WIDE_THREADS}, \"threads\");\n");
        for d in [512usize, 576] {
            probe += &format!(
                "static_assert(sparse_mla::Smem<{d}>::kBytes == {}, \"Smem, d_qk {d}\");\n",
                sparse_mla_wide_smem_bytes(d)
            );
        }
        probe += &format!(
            "static_assert(sparse_mla::Smem<576, true>::kBytes == {SPARSE_MLA_PAGED_SMEM_BYTES}, \"Smem, paged\");\n"
        );
        let source = WIDE_SOURCE;
        assert_compiles(
            source,
            &probe,
            "sparse_mla_prefill_kernel<576, false, false>",
        );
    }
}
