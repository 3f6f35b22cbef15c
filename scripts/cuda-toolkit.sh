#!/usr/bin/env bash
# Sets up, without a GPU or a system CUDA install, what building the `candle-cuda` feature
# needs: candle-kernels compiles its kernels with nvcc at build time, and candle-core links
# the CUDA libraries (cudarc `dynamic-linking`).
#
#   source scripts/cuda-toolkit.sh      exports CUDA_HOME, PATH, CUDA_COMPUTE_CAP
#
# - nvcc, headers and the runtime come from the pinned CUDA 13.0 wheels (PyPI), installed into
#   ./.cuda/venv; the pins are those of TOOLCHAIN.md (an unpinned nvidia-nvvm breaks nvcc 13.0).
# - The driver, cuBLAS, cuBLASLt and cuRAND are only needed to *link* here; they are loaded on
#   the GPU machine from its own toolkit. For linking, this script generates stub libraries
#   (like the toolkit's own lib64/stubs) that define every function cudarc declares for them,
#   under the real libraries' sonames, so the binaries ask for the real ones at run time.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.cuda/venv"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-cccl==13.0.85
cu=$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)
stubs="$cu/lib/stubs"
mkdir -p "$stubs"

# The cudarc sources this build uses: its bindings list what each library must export.
cudarc_src=$(cd "$root" && cargo metadata --format-version 1 --features candle-cuda 2>/dev/null |
    "$venv/bin/python" -c '
import json, os, sys
meta = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in meta["packages"] if p["name"] == "cudarc"))')

# stub <cudarc module> <library name> <soname>
stub() {
    local module=$1 lib=$2 soname=$3
    local c="$stubs/$lib.c"
    grep -A1 'extern "C" {' "$cudarc_src/src/$module/sys/mod.rs" | grep -oP '^\s+fn \K\w+' | sort -u |
        sed 's/.*/void &(void) {}/' >"$c"
    cc -shared -fPIC -Wl,-soname,"$soname" -o "$stubs/$soname" "$c"
    ln -sf "$soname" "$stubs/$lib.so"
    rm -f "$c"
}
stub driver libcuda libcuda.so.1
stub cublas libcublas libcublas.so.13
stub cublaslt libcublasLt libcublasLt.so.13
stub curand libcurand libcurand.so.10
# The real runtime and NVRTC of the wheels, under the link-time names.
ln -sf ../libcudart.so.13 "$stubs/libcudart.so"
ln -sf ../libnvrtc.so.13 "$stubs/libnvrtc.so"

export CUDA_HOME="$cu"
export PATH="$cu/bin:$PATH"
# candle-kernels asks nvidia-smi for the compute capability unless it is given: sm_90 (H200).
export CUDA_COMPUTE_CAP=90
echo "CUDA toolkit for candle-cuda builds: $CUDA_HOME"
