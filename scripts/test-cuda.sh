#!/usr/bin/env bash
# The second test command: the CUDA builds that need nvcc, checked without a GPU.
#
# - Lints of the candle CUDA interop, built with candle's CUDA backend: candle-kernels compiles
#   its kernels with nvcc (about 12 minutes on 2 cores, the bulk of this command), from the
#   pinned CUDA 13.0 wheels of scripts/cuda-toolkit.sh (about 500 MB in ./.cuda).
# - An nvcc build of the sparse MLA kernel harness (bench/harness), which the GPU bundle runs.
# - The prologue benchmark's host section over the null driver (scripts/null-driver): every
#   typed launch path of the benchmark runs end to end on the host (boundary, admissions,
#   parameter block, the driver calls), and the profiling tool stays in working order.
#
# Progress is printed every 30 seconds while nvcc works (cargo is silent then).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-toolkit.sh

step() { echo "== $(date +%T) $*"; }
start=$SECONDS
( while sleep 30; do
    nvcc_jobs=$(pgrep -c -f 'cicc|ptxas|nvcc' || true)
    echo "   … $((SECONDS - start)) s, $nvcc_jobs nvcc processes running"
done ) &
ticker=$!
trap 'kill $ticker 2>/dev/null' EXIT

step "clippy (gpu-tests, candle-cuda: the candle CUDA interop, nvcc builds candle's kernels)"
cargo clippy --workspace --all-targets --features gpu-tests,candle-cuda -- -D warnings
# The kernel harness (bench/harness, run on the GPU machine) must keep compiling against the
# kernels it includes; built here with the same toolkit, not run.
step "nvcc build of the kernel harness"
mkdir -p target/harness
rm -f target/harness/harness
if ! NVCC="$CUDA_HOME/bin/nvcc" HARNESS_LDFLAGS="-L$CUDA_HOME/lib" bench/harness/build.sh \
    >target/harness/build.log 2>&1; then
    grep -v C7517 target/harness/build.log
    exit 1
fi
step "the host path over the null driver (BENCH_HOST_ONLY=1 benches/prologue.rs)"
null_dir=$(scripts/null-driver/build.sh)
bench=$(cargo bench --features gpu-tests --no-run --bench prologue --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])')
(
    source scripts/nvrtc.sh >/dev/null
    LD_LIBRARY_PATH="$PWD/$null_dir:$LD_LIBRARY_PATH" SHAPEPROOF_CACHE_DIR="$PWD/$null_dir/kernels" \
        BENCH_HOST_ONLY=1 BENCH_JSON_DIR="$null_dir" "$bench"
)
step "done in $((SECONDS - start)) s"
