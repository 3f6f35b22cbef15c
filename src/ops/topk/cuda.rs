//! CUDA launch of [`TopK`] (`kernels/topk.cu`), and its CUDA-only entry [`TopK::record`].

use std::marker::PhantomData;

use super::launch::{TopkCall, TopkEntry};
use super::{RunTopk, TopK, TopkScores};
use crate::backend::Cuda;
use crate::backend::cuda::{CudaKernel, DeviceArgs, GraphRecorder, IsCuda, LaunchShape};
use crate::dim::Dim;
use crate::error::Result;
use crate::tensor::{Cols, Storage, StorageMut, Tensor};

/// Threads per block of the top-k kernel (`topk::kThreads`).
const THREADS: u32 = 1024;
/// Order keys a CTA keeps in shared memory: a row whose slices (`ceil(width / cluster)`
/// columns) fit is read from global memory once; a wider row's slices are read every pass.
const CACHED_KEYS: usize = 32 * 1024;
/// Most clusters one launch makes (each walks rows `c, c + clusters, …`): the grid's blocks
/// stay far below the driver's 2^31 − 1 whatever the row count (`pub` for the GPU test that
/// gives a cluster more than one row).
pub const MAX_CLUSTERS: usize = 1 << 16;

/// CTAs a row: 8 (a cluster) while the rows leave SMs idle, halved until `rows × cluster`
/// CTAs fit one wave at one CTA an SM, down to one CTA a row for batches that fill the GPU;
/// 16 (a non-portable cluster) while the device holds all `rows` such clusters at once
/// (`clusters_of_16`: on an H100, a GPC holds one, and not every GPC has 16 SMs).
fn cluster_size(rows: usize, sm_count: usize, clusters_of_16: usize) -> usize {
    if rows <= clusters_of_16 && rows * 16 <= sm_count {
        return 16;
    }
    [8, 4, 2]
        .into_iter()
        .find(|&c| rows * c <= sm_count)
        .unwrap_or(1)
}

/// Dynamic shared memory of a launch over rows `width` wide with `cluster` CTAs a row: the
/// order keys of a CTA's slice when they fit [`CACHED_KEYS`], else none. The kernel caches a
/// row only when its slice fits what the launch gave (`%dynamic_smem_size`), so this is a
/// speed choice alone.
fn cache_bytes(width: usize, cluster: usize) -> u32 {
    let slice = width.div_ceil(cluster);
    if slice > CACHED_KEYS {
        return 0;
    }
    (slice * std::mem::size_of::<u32>()) as u32
}

crate::param_block! {
    /// The kernel's parameter block (`struct TopkParams`).
    pub struct TopkParams {
        scores: u64,
        starts: u64,
        ends: u64,
        indices: u64,
        width: i64,
        rows: i32,
    }
}

/// `topk_kernel<TOPK, CLUSTER>`: a row to a cluster of `CLUSTER` CTAs (1, 2, 4, 8 or 16).
pub struct TopkKernel<const TOPK: usize, const CLUSTER: usize>(PhantomData<Dim<TOPK>>);

impl<const TOPK: usize, const CLUSTER: usize> CudaKernel for TopkKernel<TOPK, CLUSTER> {
    const SOURCE: &'static str = include_str!("../../../kernels/topk.cu");
    const DYNAMIC_SMEM_BYTES: u32 = (CACHED_KEYS * std::mem::size_of::<u32>()) as u32;
    const NON_PORTABLE_CLUSTER: bool = CLUSTER > 8;
    type Params = TopkParams;
    fn instantiation() -> String {
        format!("topk_kernel<{TOPK}, {CLUSTER}>")
    }
}

/// Queues `TopkKernel<TOPK, CLUSTER>` over `rows` rows of `width` columns.
///
/// # Safety
/// `params` comes from `args` and ties `rows × width` scores, `rows` starts and ends and
/// `rows × TOPK` indices (the checked call).
unsafe fn launch<const TOPK: usize, const CLUSTER: usize>(
    args: &DeviceArgs<'_>,
    params: &TopkParams,
    rows: usize,
    width: usize,
) -> Result<()> {
    let clusters = rows.min(MAX_CLUSTERS); // rows <= i32::MAX (`TopkScores::new`)
    let shape = LaunchShape {
        grid: ((clusters * CLUSTER) as u32, 1, 1),
        block: (THREADS, 1, 1),
        smem_bytes: cache_bytes(width, CLUSTER),
    };
    // SAFETY: forwarded; the kernel clamps every range to [0, width] before it reads, caches
    // a slice only where the shared memory given holds it, and writes below TOPK only.
    unsafe { args.launch::<TopkKernel<TOPK, CLUSTER>>(shape, params) }
}

/// The CUDA launch runs the op.
impl RunTopk for Cuda {}

impl TopkEntry for Cuda {
    unsafe fn topk<const TOPK: usize>(&self, call: TopkCall<'_, Cuda>) -> Result<()> {
        let TopkCall {
            rows,
            scores,
            mut indices,
        } = call;
        if rows == 0 {
            return Ok(());
        }
        let width = scores.width;
        let mut args = DeviceArgs::new(self)?;
        let params = TopkParams {
            scores: args.read("scores", &scores.scores)?,
            starts: args.read("starts", &scores.starts)?,
            ends: args.read("ends", &scores.ends)?,
            indices: args.write("indices", &mut indices)?,
            width: width as i64,
            rows: rows as i32,
        };
        // SAFETY: `scores` holds rows × width values, `starts` and `ends` rows values and
        // `indices` rows × TOPK (tied by `TopK::run`), all admitted into `params`.
        unsafe {
            let clusters_of_16 = if rows * 16 <= self.sm_count() as usize {
                self.max_active_clusters::<TopkKernel<TOPK, 16>>(16, THREADS)? as usize
            } else {
                0
            };
            match cluster_size(rows, self.sm_count() as usize, clusters_of_16) {
                16 => launch::<TOPK, 16>(&args, &params, rows, width),
                8 => launch::<TOPK, 8>(&args, &params, rows, width),
                4 => launch::<TOPK, 4>(&args, &params, rows, width),
                2 => launch::<TOPK, 2>(&args, &params, rows, width),
                _ => launch::<TOPK, 1>(&args, &params, rows, width),
            }
        }
    }
}

impl<const TOPK: usize> TopK<TOPK> {
    /// Records the same call as [`run`](Self::run) into a CUDA graph (after the same checks):
    /// the graph borrows the scores and `indices` until it is dropped, so neither can be freed
    /// or swapped while it can replay.
    pub fn record<'g, B: RunTopk + IsCuda, SS: Storage<B>, SO: StorageMut<B>>(
        &self,
        graph: &mut GraphRecorder<'g>,
        scores: &'g TopkScores<B, SS>,
        indices: &'g mut Tensor<B, i32, Cols<TOPK>, SO>,
    ) -> Result<()> {
        graph.record(|cuda: &B| self.run(cuda, scores, indices))
    }
}

#[cfg(test)]
mod tests {
    use super::cluster_size;

    #[test]
    fn clusters_of_16_only_while_the_device_holds_them_all() {
        // 132 SMs, 7 clusters of 16 at once (an H100 SXM's answer may differ).
        assert_eq!(cluster_size(1, 132, 7), 16);
        assert_eq!(cluster_size(7, 132, 7), 16);
        assert_eq!(cluster_size(8, 132, 7), 8);
        assert_eq!(cluster_size(8, 132, 8), 16); // 8 × 16 = 128 <= 132
        assert_eq!(cluster_size(9, 132, 9), 8); // 9 × 16 > 132
        assert_eq!(cluster_size(1, 132, 0), 8); // no cluster of 16 fits
        assert_eq!(cluster_size(20, 132, 7), 4);
        assert_eq!(cluster_size(40, 132, 7), 2);
        assert_eq!(cluster_size(100, 132, 7), 1);
    }
}
