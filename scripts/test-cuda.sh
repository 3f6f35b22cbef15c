#!/usr/bin/env bash
# The second test command: the CUDA builds that need nvcc, checked without a GPU.
#
# - Lints of the candle CUDA interop, built with candle's CUDA backend: candle-kernels compiles
#   its kernels with nvcc (about 12 minutes on 2 cores, the bulk of this command), from the
#   pinned CUDA 13.0 wheels of scripts/cuda-toolkit.sh (about 500 MB in ./.cuda).
# - An nvcc build of the sparse MLA kernel harness (bench/harness), which the GPU bundle runs.
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
step "done in $((SECONDS - start)) s"
