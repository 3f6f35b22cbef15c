#!/usr/bin/env bash
# Finds NVRTC of CUDA 13 (for the `nvrtc-tests` kernel compilation; no GPU needed) and puts it
# on LD_LIBRARY_PATH:   source scripts/nvrtc.sh
#
# A CUDA 13 toolkit is used when one is found (CUDA_HOME, /usr/local/cuda); otherwise the
# pinned wheel nvidia-cuda-nvrtc==13.0.88 is installed into ./.cuda/venv, the same environment
# scripts/cuda-toolkit.sh uses for the rest of the toolkit (one download for both).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

find_nvrtc() {
    for dir in "${CUDA_HOME:-}/lib64" "${CUDA_HOME:-}/lib" /usr/local/cuda/lib64 \
        "$root/.cuda/venv/lib/python3"*/site-packages/nvidia/cu13/lib; do
        if [ -e "$dir/libnvrtc.so.13" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

if ! nvrtc_dir=$(find_nvrtc); then
    echo "no CUDA 13 NVRTC found: installing the pinned wheel into .cuda/venv (90 MB download)"
    [ -x "$root/.cuda/venv/bin/python" ] || python3 -m venv "$root/.cuda/venv"
    "$root/.cuda/venv/bin/pip" install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88
    nvrtc_dir=$(find_nvrtc)
fi
export LD_LIBRARY_PATH="$nvrtc_dir:${LD_LIBRARY_PATH:-}"
echo "NVRTC: $nvrtc_dir"
