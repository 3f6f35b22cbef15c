//! Every kernel instantiation the crate, its tests and its examples use compiles with NVRTC
//! for sm_90a. Needs libnvrtc.so.13 (no GPU); compiled only with `--features nvrtc-tests`, and
//! fails, never skips, when NVRTC cannot be loaded.
#![cfg(feature = "nvrtc-tests")]

use shapeproof::backend::cuda::{
    Arch, CudaKernel, KernelCache, check_params, compile_kernel_reported, layout_asserts,
};
use shapeproof::ops::index_cache::{IndexKeyGatherKernel, IndexKeyStoreKernel};
use shapeproof::ops::indexer::{
    LightningIndexerKernel, PagedIndexerMergeKernel, PagedLightningIndexerKernel,
    indexer_merge_smem_bytes, indexer_smem_bytes, prefill_indexer_smem_bytes,
};
use shapeproof::ops::mla_cache::{MlaCacheGatherKernel, MlaCacheStoreKernel};
use shapeproof::ops::sparse_mla_decode::{
    DECODE_SMEM_BYTES, SparseMlaDecodeCombineKernel, SparseMlaDecodeKernel,
    SparseMlaDecodePrepareKernel,
};

/// `compiles::<$kernel<H>>()` for every decode head count.
macro_rules! for_each_head_count {
    ($kernel:ident) => {
        compiles::<$kernel<8>>();
        compiles::<$kernel<16>>();
        compiles::<$kernel<32>>();
        compiles::<$kernel<64>>();
        compiles::<$kernel<128>>();
    };
}
use shapeproof::ops::mxfp8_quantize::Mxfp8QuantizeKernel;
use shapeproof::ops::prologue::*;
use shapeproof::ops::sparse_mla::{
    Plain, SPARSE_MLA_PAGED_SMEM_BYTES, SparseMlaNarrowKernel, SparseMlaPagedKernel,
    SparseMlaWideKernel, WithLength, WithLengthAndSink, sparse_mla_narrow_smem_bytes,
    sparse_mla_wide_smem_bytes,
};
use shapeproof::ops::topk::TopkKernel;

/// ptxas's warnings that a kernel's `wgmma` products were serialised (C7510-C7515: each
/// waited for before the next is issued), which leave it correct and several times slower.
const WGMMA_SERIALISED: [&str; 6] = ["C7510", "C7511", "C7512", "C7513", "C7514", "C7515"];

/// Compiles `K` with the layout of its Rust parameter block asserted against the CUDA struct
/// (`layout_asserts`): the instantiation compiles, its mirror is exact, and ptxas did not
/// serialise its tensor-core pipeline.
fn compiles<K: CudaKernel>() {
    compiles_with::<K>("");
}

/// [`compiles`] with `extra` C++ appended to the source (static assertions that a Rust mirror
/// of a kernel constant is exact).
fn compiles_with<K: CudaKernel>(extra: &str) -> String {
    let source = format!("{}{}\n{extra}", K::SOURCE, layout_asserts::<K::Params>());
    let report = compiles_source(&source, &K::instantiation());
    // `scripts/gpu-bundle.sh --precompile`: the kernel as the library compiles it (its own
    // source, no checks appended), stored in the kernel cache at that folder, so that a GPU
    // machine running the bundle loads it instead of compiling it there.
    if let Some(dir) = std::env::var_os("SHAPEPROOF_PRECOMPILE_DIR") {
        KernelCache::with_dir(Some(dir.into()))
            .get_or_compile(K::SOURCE, &K::instantiation(), Arch::Sm90a)
            .unwrap_or_else(|e| panic!("{}: {e}", K::instantiation()));
    }
    report
}

/// The checks of [`compiles`] on instantiation `name` of `source`; ptxas's report.
fn compiles_source(source: &str, name: &str) -> String {
    let (compiled, report) = compile_kernel_reported(source, name, Arch::Sm90a)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // `scripts/sass-diff.sh` compares the machine code of two commits from these files.
    if let Some(dir) = std::env::var_os("SHAPEPROOF_CUBIN_DIR") {
        let file: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let dir = std::path::Path::new(&dir);
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(format!("{file}.cubin")), &compiled.cubin).unwrap();
    }
    for code in WGMMA_SERIALISED {
        assert!(
            !report.contains(code),
            "{name}: ptxas serialised its wgmma ({code}):\n{report}"
        );
    }
    // Registers spilled to local memory (ptxas: "N bytes spill stores, M bytes spill loads"):
    // no more than the instantiation's budget.
    for line in report.lines().filter(|l| l.contains("bytes spill stores")) {
        let (stores, loads) = spill_bytes(line);
        let (max_stores, max_loads) = spill_budget(name);
        assert!(
            stores <= max_stores && loads <= max_loads,
            "{name}: ptxas spilled {stores} bytes (stores) / {loads} (loads) of registers, its \
             budget is {max_stores} / {max_loads}:\n{report}"
        );
    }
    assert!(!compiled.cubin.is_empty(), "{name}: empty cubin");
    assert!(
        compiled.cubin.starts_with(b"\x7fELF"),
        "{name}: not an ELF cubin"
    );
    report
}

/// The registers a thread that ptxas reports for the kernel ("Used N registers"): for a kernel
/// whose warpgroups move registers with `setmaxnreg`, the pool they share at launch. A smaller
/// pool than the kernel's counts add up to would make `setmaxnreg.inc` wait forever.
fn registers_used(name: &str, report: &str) -> u32 {
    let line = report
        .lines()
        .find(|l| l.contains("Used ") && l.contains(" registers"))
        .unwrap_or_else(|| panic!("{name}: no register count in ptxas's report:\n{report}"));
    let after = &line[line.find("Used ").unwrap() + 5..];
    after
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}: unreadable register count in {line:?}"))
}

/// The spill bytes (stores, loads) of a ptxas report line
/// `… N bytes stack frame, S bytes spill stores, L bytes spill loads`.
fn spill_bytes(line: &str) -> (u32, u32) {
    let before = |what: &str| -> u32 {
        let head = &line[..line
            .find(what)
            .unwrap_or_else(|| panic!("no {what:?} in {line:?}"))];
        let number = head.trim_end().rsplit(' ').next().unwrap_or("");
        number
            .parse()
            .unwrap_or_else(|_| panic!("no count before {what:?} in {line:?}"))
    };
    (before("bytes spill stores"), before("bytes spill loads"))
}

/// The register spills (bytes of stores, of loads) an instantiation may have: none, but for
/// the few of measured kernels that ptxas has always spilled a little (as of 1636c66: the
/// prologue's decode variant at page 2, the narrow sparse MLA tile at 32 heads and a handful of
/// words at 8 and 16). A change that spills more, or spills in a kernel not listed, fails here:
/// spills in a hot loop cost more than the instructions they save. (These are NVRTC's figures;
/// nvcc's ptxas, with its own options, can spill where NVRTC's does not.)
fn spill_budget(name: &str) -> (u32, u32) {
    const BUDGETS: [(&str, u32, u32); 14] = [
        (
            "inkling_prologue_kernel<1, 128, 16, 2, 4, false, true, 2, 128, 0, 2048, 2304>",
            32,
            32,
        ),
        (
            "inkling_prologue_kernel<1, 128, 8, 1, 4, false, true, 2, 128, 0, 1024, 1152>",
            32,
            32,
        ),
        (
            "inkling_prologue_kernel<1, 128, 8, 2, 4, false, true, 2, 128, 0, 1024, 1280>",
            32,
            32,
        ),
        // Three consumer warpgroups at 160 registers (TOPK 2048: the widest cuts): five words
        // around the final cuts and the Q tile's address reloaded where each pass's stream
        // starts (none in the block loop).
        ("lightning_indexer_kernel<32, 2048>", 84, 100),
        ("sparse_mla_narrow_kernel<512, 32, false, false>", 40, 48),
        ("sparse_mla_narrow_kernel<512, 32, true, false>", 48, 56),
        ("sparse_mla_narrow_kernel<512, 32, true, true>", 36, 36),
        ("sparse_mla_narrow_kernel<512, 8, false, false>", 4, 4),
        ("sparse_mla_narrow_kernel<576, 16, false, false>", 4, 4),
        ("sparse_mla_narrow_kernel<576, 16, true, false>", 4, 4),
        ("sparse_mla_narrow_kernel<576, 16, true, true>", 4, 4),
        ("sparse_mla_narrow_kernel<576, 32, false, false>", 28, 36),
        ("sparse_mla_narrow_kernel<576, 32, true, false>", 28, 36),
        ("sparse_mla_narrow_kernel<576, 32, true, true>", 16, 16),
    ];
    BUDGETS
        .iter()
        .find(|(kernel, ..)| *kernel == name)
        .map_or((0, 0), |&(_, stores, loads)| (stores, loads))
}

/// Every prologue variant of one geometry, with its trailing update.
fn prologue_variants<
    S: Store,
    const HD: usize,
    const DQ: usize,
    const DKV: usize,
    L: QkvrLayout<DQ, DKV>,
>() {
    compiles::<Prologue<Verify, S, HD, DQ, DKV, L, InklingConv>>();
    compiles::<Prologue<Extend, S, HD, DQ, DKV, L, InklingConv>>();
    compiles::<Prologue<Decode, S, HD, DQ, DKV, L, InklingConv>>();
    compiles::<ConvStateUpdateKernel<HD, DQ, DKV, L, InklingConv>>();
}

/// `static_assert(EXPR == VALUE)` for a kernel constant `EXPR` and its Rust mirror's `VALUE`.
fn mirror(expr: &str, value: u32) -> String {
    format!("static_assert({expr} == {value}, \"{expr} and its Rust mirror differ\");\n")
}

#[test]
fn lightning_indexer() {
    // Both head counts at the top-k widths the tests, the benchmark and the examples use, each
    // with the launch's shared memory (the Rust formula) equal to the kernel's.
    fn prefill<const H: usize, const K: usize>() {
        let report = compiles_with::<LightningIndexerKernel<H, K>>(&mirror(
            &format!("indexer::prefill_smem_bytes({H}, {K})"),
            prefill_indexer_smem_bytes(H, K),
        ));
        // setmaxnreg moves 224 · 256 + 56 · 128 registers at 64 heads (the pool of 384 threads
        // at 168), 160 · 384 + 32 · 128 at 32 (three consumer warpgroups: 512 threads at 128).
        let name = LightningIndexerKernel::<H, K>::instantiation();
        assert_eq!(
            registers_used(&name, &report),
            if H == 32 { 128 } else { 168 },
            "{name}: registers at launch"
        );
    }
    fn paged<const H: usize, const K: usize>() {
        let report = compiles_with::<PagedLightningIndexerKernel<H, K>>(&mirror(
            &format!("indexer::smem_bytes({H}, {K})"),
            indexer_smem_bytes(H, K),
        ));
        // setmaxnreg moves 200 · 128 + 56 · 128 registers: the pool of 256 threads at 128.
        let name = PagedLightningIndexerKernel::<H, K>::instantiation();
        assert_eq!(
            registers_used(&name, &report),
            128,
            "{name}: registers at launch"
        );
    }
    fn merge<const K: usize>() {
        compiles_with::<PagedIndexerMergeKernel<K>>(&mirror(
            &format!("indexer::merge_smem_bytes({K})"),
            indexer_merge_smem_bytes(K),
        ));
    }
    prefill::<64, 2048>();
    prefill::<64, 256>();
    prefill::<64, 128>();
    prefill::<32, 2048>();
    prefill::<32, 512>();
    prefill::<32, 128>();
    paged::<64, 2048>();
    paged::<64, 1536>();
    paged::<64, 256>();
    paged::<32, 2048>();
    paged::<32, 512>();
    paged::<32, 128>();
    merge::<2048>();
    merge::<1536>();
    merge::<512>();
    merge::<256>();
    merge::<128>();
    // The logits-alone form the indexer benchmark times beside the fused kernel (the same
    // source and parameter block).
    type Prefill = LightningIndexerKernel<64, 2048>;
    let source = format!(
        "{}{}",
        Prefill::SOURCE,
        layout_asserts::<<Prefill as CudaKernel>::Params>()
    );
    compiles_source(&source, "lightning_indexer_kernel<64, 2048, true>");
    compiles_source(&source, "lightning_indexer_kernel<32, 2048, true>");
}

#[test]
fn topk() {
    // The widths the tests and the benchmark use.
    compiles::<TopkKernel<2048, 16>>();
    compiles::<TopkKernel<2048, 8>>();
    compiles::<TopkKernel<2048, 4>>();
    compiles::<TopkKernel<2048, 2>>();
    compiles::<TopkKernel<2048, 1>>();
    compiles::<TopkKernel<512, 8>>();
    compiles::<TopkKernel<128, 1>>();
}

#[test]
fn index_cache() {
    compiles::<IndexKeyStoreKernel<64>>();
    compiles::<IndexKeyGatherKernel<64>>();
}

#[test]
fn sparse_mla_decode() {
    // Every head count at the top-k widths the tests and the benchmark use.
    compiles::<SparseMlaDecodeKernel<8, 2048>>();
    compiles::<SparseMlaDecodeKernel<16, 2048>>();
    compiles::<SparseMlaDecodeKernel<32, 2048>>();
    compiles::<SparseMlaDecodeKernel<64, 2048>>();
    compiles::<SparseMlaDecodeKernel<128, 2048>>();
    compiles::<SparseMlaDecodeKernel<16, 128>>();
    compiles::<SparseMlaDecodeKernel<8, 256>>();
    for_each_head_count!(SparseMlaDecodeCombineKernel);
    // The step through the prefill: the head counts and widths of its tests and benchmark.
    compiles::<SparseMlaDecodePrepareKernel<8, 2048>>();
    compiles::<SparseMlaDecodePrepareKernel<16, 128>>();
    compiles::<SparseMlaDecodePrepareKernel<32, 2048>>();
    compiles::<SparseMlaDecodePrepareKernel<64, 2048>>();
    compiles::<SparseMlaDecodePrepareKernel<128, 2048>>();
    compiles_with::<SparseMlaDecodeKernel<16, 2048>>(&mirror(
        "decode::kSmemBytes",
        DECODE_SMEM_BYTES,
    ));
    // Its prefill: the 64-head kernel's paged variant.
    compiles_with::<SparseMlaPagedKernel>(&mirror(
        "sparse_mla::Smem<576, true>::kBytes",
        SPARSE_MLA_PAGED_SMEM_BYTES,
    ));
}

#[test]
fn mla_cache() {
    // One row a warp for short calls, four for long ones.
    compiles::<MlaCacheStoreKernel<128, 1>>();
    compiles::<MlaCacheStoreKernel<128, 4>>();
    compiles::<MlaCacheGatherKernel<128, 1>>();
    compiles::<MlaCacheGatherKernel<128, 4>>();
}

#[test]
fn mxfp8_quantize() {
    compiles::<Mxfp8QuantizeKernel<128>>();
    compiles::<Mxfp8QuantizeKernel<256>>();
    compiles::<Mxfp8QuantizeKernel<1024>>();
}

#[test]
fn prologue() {
    // Inkling TP8 global and SWA, TP4, TP2, TP1 (beyond sglang's per-block limit).
    prologue_variants::<Mxfp8Store<128>, 128, 1024, 128, PackedRow<1024, 128, 128>>();
    prologue_variants::<Mxfp8Store<128>, 128, 1024, 256, PackedRow<1024, 256, 128>>();
    prologue_variants::<Mxfp8Store<128>, 128, 2048, 256, PackedRow<2048, 256, 256>>();
    prologue_variants::<Mxfp8Store<128>, 128, 4096, 512, PackedRow<4096, 512, 512>>();
    prologue_variants::<Mxfp8Store<128>, 128, 8192, 1024, PackedRow<8192, 1024, 1024>>();
    prologue_variants::<Bf16Store<128>, 128, 1024, 128, PackedRow<1024, 128, 128>>();
    prologue_variants::<Bf16Store<128>, 128, 1024, 256, PackedRow<1024, 256, 128>>();
    prologue_variants::<NoStore, 128, 1024, 128, PackedRow<1024, 128, 128>>();
    // Head dims 64 and 256 (bf16 store).
    prologue_variants::<Bf16Store<32>, 64, 512, 64, PackedRow<512, 64, 0>>();
    prologue_variants::<Bf16Store<128>, 256, 2048, 256, PackedRow<2048, 256, 0>>();
    // SiLU conv.
    compiles::<
        Prologue<
            Verify,
            Bf16Store<128>,
            128,
            1024,
            128,
            PackedRow<1024, 128, 128>,
            Conv<4, true, true>,
        >,
    >();
}

/// Compiles one sparse MLA kernel type for every option and both head dims:
/// `every_sparse_mla_variant!(Kernel, smem_mirror)` or, with a trailing head tile,
/// `every_sparse_mla_variant!(Kernel, smem_mirror, TILE)`.
macro_rules! every_sparse_mla_variant {
    ($kernel:ident, $smem:ident $(, $tile:literal)?) => {
        for_each_option!($kernel, $smem, 512 $(, $tile)?);
        for_each_option!($kernel, $smem, 576 $(, $tile)?);
    };
}
/// Every option of one head dim; the plain one also asserts that the launch's shared memory
/// (the Rust formula, `$smem`) is the kernel's layout.
macro_rules! for_each_option {
    ($kernel:ident, $smem:ident, $d:literal $(, $tile:literal)?) => {
        compiles_with::<$kernel<$d, Plain $(, $tile)?>>(&$smem::<$d $(, $tile)?>());
        compiles::<$kernel<$d, WithLength $(, $tile)?>>();
        compiles::<$kernel<$d, WithLengthAndSink $(, $tile)?>>();
    };
}

/// The 64-head kernel's launch shared memory against its layout (`sparse_mla::Smem`).
fn wide_smem<const D: usize>() -> String {
    mirror(
        &format!("sparse_mla::Smem<{D}>::kBytes"),
        sparse_mla_wide_smem_bytes(D),
    )
}

/// The narrow kernel's launch shared memory against its layout, at head tile `TILE`.
fn narrow_smem<const D: usize, const TILE: usize>() -> String {
    mirror(
        &format!(
            "sparse_mla_narrow::kSmemBytesWith<{D}, {TILE}, sparse_mla_narrow::kQBuffersFor<{D}, {TILE}>>"
        ),
        sparse_mla_narrow_smem_bytes(D, TILE),
    )
}

#[test]
fn sparse_mla() {
    every_sparse_mla_variant!(SparseMlaWideKernel, wide_smem);
}

/// The narrow-tile kernel (8, 16 and 32 heads).
#[test]
fn sparse_mla_narrow() {
    every_sparse_mla_variant!(SparseMlaNarrowKernel, narrow_smem, 8);
    every_sparse_mla_variant!(SparseMlaNarrowKernel, narrow_smem, 16);
    every_sparse_mla_variant!(SparseMlaNarrowKernel, narrow_smem, 32);
}

/// The narrow kernel's 64-head tile (two 32-head consumer warpgroups).
#[test]
fn sparse_mla_narrow_64() {
    every_sparse_mla_variant!(SparseMlaNarrowKernel, narrow_smem, 64);
}

/// The user kernel of the examples keeps its mirror too.
#[test]
fn user_kernel_example() {
    check_params::<head_rmsnorm::HeadRmsNorm<8, 128>>(Arch::Sm90a).unwrap();
}
#[path = "../examples/kernels/head_rmsnorm.rs"]
#[allow(dead_code)]
mod head_rmsnorm;

/// A mirror that drifted from its CUDA struct fails the check, naming the struct and the field:
/// `rows` narrowed to an `i32` (same struct size, after padding), and a field inserted.
#[test]
fn a_drifted_mirror_fails_its_check() {
    mod narrowed {
        shapeproof::param_block! {
            pub struct Mxfp8QuantizeParams { input: u64, data: u64, scales: u64, rows: i32 }
        }
    }
    mod inserted {
        shapeproof::param_block! {
            pub struct Mxfp8QuantizeParams { input: u64, data: u64, scales: u64, flags: u32, rows: i64 }
        }
    }
    /// The quantize kernel with mirror `P`.
    struct Drifted<P>(std::marker::PhantomData<P>);
    impl<P: shapeproof::backend::cuda::ParamBlock> CudaKernel for Drifted<P> {
        const SOURCE: &'static str = <Mxfp8QuantizeKernel<128> as CudaKernel>::SOURCE;
        type Params = P;
        fn instantiation() -> String {
            Mxfp8QuantizeKernel::<128>::instantiation()
        }
    }
    fn log_of<P: shapeproof::backend::cuda::ParamBlock>() -> String {
        match check_params::<Drifted<P>>(Arch::Sm90a) {
            Err(shapeproof::Error::Compile { log, .. }) => log,
            other => panic!("a drifted mirror passed its check: {other:?}"),
        }
    }
    check_params::<Mxfp8QuantizeKernel<128>>(Arch::Sm90a).unwrap();
    let log = log_of::<narrowed::Mxfp8QuantizeParams>();
    assert!(
        log.contains("Mxfp8QuantizeParams.rows: the Rust mirror's field is 4 bytes"),
        "{log}"
    );
    let log = log_of::<inserted::Mxfp8QuantizeParams>();
    assert!(
        log.contains("Mxfp8QuantizeParams: the Rust mirror is 40 bytes"),
        "{log}"
    );
    assert!(log.contains("\"Mxfp8QuantizeParams.flags"), "{log}");
    assert!(
        log.contains("Mxfp8QuantizeParams.rows: the Rust mirror has it at byte 32"),
        "{log}"
    );
}
