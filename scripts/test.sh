#!/usr/bin/env bash
# The project's test command: formatting, lints, every test that runs without a GPU (the
# candle interop included), the candle example, the NVRTC compilation of every kernel
# instantiation the crate uses (no GPU needed), lints of the candle CUDA interop (built with
# candle's CUDA backend, whose kernels nvcc compiles from the pinned CUDA 13.0 wheels), and an
# nvcc build of the kernel harness (bench/harness) with the same wheels, and model checks of
# the 64-head kernel's barrier protocol.
#
# NVRTC comes from a CUDA 13 toolkit when one is found (CUDA_HOME, /usr/local/cuda); otherwise
# the pinned CUDA 13.0 NVRTC wheel is installed into ./.venv (about 90 MB) and used from there.
set -euo pipefail
cd "$(dirname "$0")/.."

find_nvrtc() {
    for dir in "${CUDA_HOME:-}/lib64" /usr/local/cuda/lib64 "$PWD/.venv/lib/python3"*/site-packages/nvidia/cu13/lib; do
        if [ -e "$dir/libnvrtc.so.13" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

if ! nvrtc_dir=$(find_nvrtc); then
    echo "no CUDA 13 NVRTC found: installing the pinned wheel into .venv"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88
    nvrtc_dir=$(find_nvrtc)
fi
export LD_LIBRARY_PATH="$nvrtc_dir:${LD_LIBRARY_PATH:-}"
echo "NVRTC: $nvrtc_dir"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --features nvrtc-tests,candle -- -D warnings
cargo clippy --workspace --all-targets --features gpu-tests -- -D warnings
cargo test --workspace --features nvrtc-tests,candle
# The candle example runs end to end on the CPU (candle CPU + the CPU backend) and checks itself.
cargo run --quiet --example candle_layer --features candle
# The CUDA half of the candle interop compiles only with candle's CUDA backend, whose build runs
# nvcc: checked here (not run: no GPU) with the pinned CUDA 13.0 wheels of scripts/cuda-toolkit.sh.
(
    source scripts/cuda-toolkit.sh
    CARGO_TARGET_DIR=target/cuda-bundle cargo clippy --workspace --all-targets \
        --features gpu-tests,candle-cuda -- -D warnings
    # The kernel harness (bench/harness, run on the GPU machine) must keep compiling against the
    # kernels it includes; built here with the same toolkit, not run.
    mkdir -p target/harness
    rm -f target/harness/harness
    if ! NVCC="$CUDA_HOME/bin/nvcc" HARNESS_LDFLAGS="-L$CUDA_HOME/lib" bench/harness/build.sh \
        >target/harness/build.log 2>&1; then
        grep -v C7517 target/harness/build.log
        exit 1
    fi
)
# The 64-head kernel's barrier protocol, model-checked under random schedules (no GPU): one
# item a CTA, and many items a CTA on its persistent grid.
python3 bench/harness/wide_vt_protocol.py
python3 bench/harness/wide_persistent_protocol.py
