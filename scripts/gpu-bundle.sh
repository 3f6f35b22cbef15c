#!/usr/bin/env bash
# Builds the GPU tests, benches and examples here (where Rust is) and bundles them with a
# runner into .gpu/, ready to copy to a machine with a CUDA 13 driver and toolkit (no Rust
# needed there). Then, on that machine:  .gpu/run.sh [tests|sanitize|bench|compare|examples|harness|gather-rates|all]
# or, a device call's worth with candidates:  .gpu/session.sh SECONDS BINARY:TEST... (scripts/gpu-session.sh)
#
#   scripts/gpu-bundle.sh                      everything
#   scripts/gpu-bundle.sh --only gpu_indexer,bench_indexer
#                                              only the named binaries (the names run.sh sees:
#                                              gpu_<test>, bench_<bench>, example_<example>,
#                                              harness, gather_rates): minutes less to build and
#                                              to carry when one kernel changed
#   scripts/gpu-bundle.sh --only bench_topk --baseline HEAD~1
#                                              also the same binaries built at another commit,
#                                              in .gpu/base/ (a worktree under target/), for
#                                              `run.sh compare`: old and new timed in one run
#   scripts/gpu-bundle.sh --only gpu_indexer,bench_indexer --baseline main \
#       --candidate some-branch --candidate other-branch
#                                              and at candidate commits (repeatable), in
#                                              .gpu/cand/<commit>/: `run.sh tests` runs their
#                                              tests too, `run.sh compare` times them between
#                                              the baseline's rounds (one device call for all)
#   scripts/gpu-bundle.sh --only gpu_indexer,gpu_engine,bench_indexer --candidate-only gpu_indexer,bench_indexer \
#       --candidate some-branch
#                                              candidates build only the names given (a subset
#                                              of --only: what their change touches)
#   scripts/gpu-bundle.sh --only gpu_indexer,bench_indexer,gpu_mla_decode,bench_mla_decode \
#       --candidate a-branch:gpu_indexer,bench_indexer --candidate b-branch:gpu_mla_decode,bench_mla_decode
#                                              a candidate's own names after a colon (instead of
#                                              --candidate-only for all): each builds, and so
#                                              is tested and timed, for what it touches only
#   scripts/gpu-bundle.sh ... --precompile lightning_indexer,topk
#                                              and, at every build (new, baseline, candidates),
#                                              the kernels of the named tests/kernels_compile.rs
#                                              tests compiled here by NVRTC into .gpu/kernels/
#                                              (packed; the kernel cache run.sh unpacks and
#                                              points the binaries at):
#                                              the GPU machine loads them instead of spending its
#                                              time compiling them (a build whose kernels_compile
#                                              predates the hook compiles there as before)
#
# HARNESS_NARROW / HARNESS_WIDE: candidate kernel files for the harness (default: the committed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

only=""
baseline=""
candidates=()
candidate_only=""
precompile=""
while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=${2:?--only needs a comma-separated list of names}; shift 2 ;;
        --baseline) baseline=$(git rev-parse --verify "${2:?--baseline needs a commit}^{commit}"); shift 2 ;;
        --precompile) precompile=${2:?--precompile needs a comma-separated list of kernels_compile tests}; shift 2 ;;
        --candidate-only) candidate_only=${2:?--candidate-only needs a comma-separated list of names}; shift 2 ;;
        --candidate)
            # REV or REV:names (the names this candidate builds, instead of --candidate-only's)
            spec=${2:?--candidate needs a commit}
            names=""
            case "$spec" in *:*) names=${spec#*:}; spec=${spec%%:*} ;; esac
            candidates+=("$(git rev-parse --verify "$spec^{commit}")|$names")
            shift 2
            ;;
        *) echo "usage: gpu-bundle.sh [--only name,name,...] [--baseline REV] [--candidate-only name,...] [--candidate REV[:name,...]]... [--precompile test,...]" >&2; exit 2 ;;
    esac
done

# Whether bundle name $1 is wanted (every name when --only is not given).
wanted() {
    [ -z "$only" ] && return 0
    case ",$only," in *",$1,"*) return 0 ;; esac
    return 1
}
# The cargo builds of the selection in source tree $1, target dir $2, as cargo's JSON messages
# on stdout. The candle CUDA interop (test, example, bench) links candle's CUDA backend, built
# with the pinned CUDA 13.0 wheels (scripts/cuda-toolkit.sh), in a target dir of its own.
cargo_builds() {
    local src=$1 target=$2
    (
        cd "$src"
        export CARGO_TARGET_DIR=$target
        if [ -z "$only" ]; then
            cargo test --release --features gpu-tests --no-run --message-format=json
            cargo bench --features gpu-tests --no-run --message-format=json
            cargo build --release --examples --message-format=json
        else
            local name
            for name in ${only//,/ }; do
                case "$name" in
                    gpu_candle | bench_candle_launch | example_candle_layer | harness | gather_rates) ;;
                    gpu_*) cargo test --release --features gpu-tests --no-run --test "$name" --message-format=json ;;
                    bench_*) cargo bench --features gpu-tests --no-run --bench "${name#bench_}" --message-format=json ;;
                    example_*) cargo build --release --example "${name#example_}" --message-format=json ;;
                    *) echo "unknown bundle name: $name" >&2; exit 2 ;;
                esac
            done
        fi
    ) 2>/dev/null
    if wanted gpu_candle || wanted example_candle_layer || wanted bench_candle_launch; then
        (
            source "$root/scripts/cuda-toolkit.sh" >&2
            cd "$src"
            export CARGO_TARGET_DIR=$target/cuda-bundle
            if wanted gpu_candle; then
                cargo test --release --features gpu-tests,candle-cuda --no-run --test gpu_candle --message-format=json
            fi
            if wanted example_candle_layer; then
                cargo build --release --features candle-cuda --example candle_layer --message-format=json
            fi
            if wanted bench_candle_launch; then
                cargo bench --features gpu-tests,candle-cuda --no-run --bench candle_launch --message-format=json
            fi
        ) 2>/dev/null
    fi
}

# With --precompile: the kernels of the named kernels_compile tests at source tree $1 (target
# dir $2), compiled into the bundle's kernel cache (tests/kernels_compile.rs stores each kernel
# as the library compiles it when SHAPEPROOF_PRECOMPILE_DIR is set; keys are the kernels' full
# text, so every build shares the one folder).
precompile_kernels() {
    [ -n "$precompile" ] || return 0
    local src=$1 target=$2
    (
        source "$root/scripts/nvrtc.sh" >/dev/null
        cd "$src"
        # shellcheck disable=SC2086
        SHAPEPROOF_PRECOMPILE_DIR="$root/.gpu/kernels" CARGO_TARGET_DIR=$target \
            cargo test --release --quiet --features nvrtc-tests --test kernels_compile -- \
            ${precompile//,/ } >/dev/null 2>&1
    ) || echo "precompile at $(git -C "$src" rev-parse --short HEAD) failed: its kernels compile on the GPU machine" >&2
}

# Copies the executables that cargo's JSON messages in file $1 name into folder $2 (GPU tests,
# benches and examples, under the names run.sh uses), those of the selection only.
copy_built() {
    python3 - "$1" "$2" "$only" <<'PY'
import json, shutil, sys
log, dest, only = sys.argv[1], sys.argv[2], sys.argv[3]
wanted = set(only.split(",")) if only else None
for line in open(log):
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    exe = msg.get("executable")
    if msg.get("reason") != "compiler-artifact" or not exe:
        continue
    kinds, name = msg["target"]["kind"], msg["target"]["name"]
    if "test" in kinds and not name.startswith("gpu_"):
        continue
    if "lib" in kinds or "proc-macro" in kinds:
        continue
    prefix = "bench_" if "bench" in kinds else ("example_" if "example" in kinds else "")
    if wanted is not None and prefix + name not in wanted:
        continue
    shutil.copy(exe, f"{dest}/{prefix}{name}")
    print(f"bundled {dest}/{prefix}{name}")
PY
}

# Every binary travels xz-compressed (run.sh unpacks them): a full bundle is about 70 MB raw,
# most of it the binaries that link candle's CUDA kernels (~40 MB of device code each), and
# about 29 MB compressed.
compress_binaries() {
    local exe
    for exe in "$1"/*; do
        if [ -f "$exe" ] && [ -x "$exe" ] && [ "${exe%.xz}" = "$exe" ]; then
            xz -T2 -6 "$exe"
        fi
    done
}

out=.gpu
rm -rf "$out"
mkdir -p "$out/bin"
# The commit of the build (with "+dirty" when the tree has changes), for the benchmarks' JSON.
{ git rev-parse --short HEAD; git diff --quiet HEAD || echo "+dirty"; } | tr -d '\n' >"$out/commit"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo_builds "$root" "$root/target" >"$log"
copy_built "$log" "$out/bin"
precompile_kernels "$root" "$root/target"

# The sparse MLA kernel harness (bench/harness), from the committed kernels or from the
# candidates named by HARNESS_NARROW / HARNESS_WIDE (paths to kernel-file copies).
if wanted harness || wanted gather_rates; then
    (
        source scripts/cuda-toolkit.sh >/dev/null 2>&1
        NVCC="$CUDA_HOME/bin/nvcc" HARNESS_LDFLAGS="-L$CUDA_HOME/lib" \
            bench/harness/build.sh "${HARNESS_NARROW:-kernels/sparse_mla_narrow.cu}" \
            "${HARNESS_WIDE:-kernels/sparse_mla_prefill.cu}" >target/harness-build.log 2>&1
    ) || { echo "harness build failed: see target/harness-build.log" >&2; exit 1; }
    cp target/harness/harness "$out/bin/harness"
    cp target/harness/gather_rates "$out/bin/gather_rates"
    echo "bundled harness, gather_rates"
fi
compress_binaries "$out/bin"

# The same binaries at the baseline commit, from a worktree of their own (incremental builds
# in target/baseline from one use to the next).
if [ -n "$baseline" ]; then
    src=$root/target/baseline-src
    if [ -d "$src" ]; then
        git -C "$src" checkout --quiet --detach "$baseline"
    else
        git worktree add --quiet --detach "$src" "$baseline"
    fi
    mkdir -p "$out/base"
    git -C "$src" rev-parse --short HEAD | tr -d '\n' >"$out/base/commit"
    cargo_builds "$src" "$root/target/baseline" >"$log"
    copy_built "$log" "$out/base"
    precompile_kernels "$src" "$root/target/baseline"
    compress_binaries "$out/base"
fi

# The same binaries at each candidate commit, one worktree and target dir for all of them
# (only those of its own names after a colon, else of --candidate-only, when given).
[ -n "$candidate_only" ] && only=$candidate_only
all_candidates_only=$only
for spec in "${candidates[@]}"; do
    cand=${spec%%|*}
    only=${spec#*|}
    [ -n "$only" ] || only=$all_candidates_only
    src=$root/target/candidate-src
    if [ -d "$src" ]; then
        git -C "$src" checkout --quiet --detach "$cand"
    else
        git worktree add --quiet --detach "$src" "$cand"
    fi
    # Every build of the crate again: cargo keys its artifacts by paths inside the package, so
    # files older than the last build (from another checkout or worktree) could pass as fresh.
    touch "$src/src/lib.rs"
    short=$(git -C "$src" rev-parse --short HEAD)
    mkdir -p "$out/cand/$short"
    printf %s "$short" >"$out/cand/$short/commit"
    cargo_builds "$src" "$root/target/candidate" >"$log"
    copy_built "$log" "$out/cand/$short"
    precompile_kernels "$src" "$root/target/candidate"
    compress_binaries "$out/cand/$short"
done

cp scripts/gpu-run.sh "$out/run.sh"
cp scripts/gpu-session.sh "$out/session.sh"
cp scripts/gpu-common.sh "$out/gpu-common.sh"
cp scripts/fp8_matmul_rate.py bench/compare.py bench/harness/ncu_by_opcode.py "$out/"
cp bench/prologue_torch.py bench/decode_torch.py bench/topk_torch.py bench/indexer_torch.py \
    bench/torch_timing.py "$out/"
chmod +x "$out/run.sh" "$out/session.sh"
# The precompiled kernels travel as one xz tarball (each entry holds its full source text:
# 20 MB of entries pack into under 1 MB); run.sh unpacks it.
if [ -d "$out/kernels" ]; then
    echo "precompiled kernels: $(ls "$out/kernels" | wc -l), packed into $out/kernels.tar.xz"
    tar -C "$out" -cf - kernels | xz -T2 -6 >"$out/kernels.tar.xz"
    rm -rf "$out/kernels"
fi
echo "bundle ready in $out/ ($(du -sh "$out" | cut -f1))"
