#!/usr/bin/env bash
# Builds the null CUDA driver (null_cuda.c) as target/null-driver/libcuda.so{,.1}: with
# LD_LIBRARY_PATH=target/null-driver a program of this crate runs its host path (checks,
# admissions, parameter blocks, launch calls) on a machine without a GPU, for profiling the
# host cost of a launch (`BENCH_HOST_ONLY=1 cargo bench --bench prologue`, or the
# `candle_launch` bench, under perf or valgrind). Kernels are still compiled by the real NVRTC (scripts/nvrtc.sh); nothing runs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/null-driver
mkdir -p "$out"
cc -O2 -shared -fPIC -o "$out/libcuda.so.1" scripts/null-driver/null_cuda.c
ln -sf libcuda.so.1 "$out/libcuda.so"
# candle's CUDA build links cuBLAS and cuRAND: the same library under both names.
cc -O2 -shared -fPIC -o "$out/libnull_libs.so" scripts/null-driver/null_libs.c
ln -sf libnull_libs.so "$out/libcublas.so.13"
ln -sf libnull_libs.so "$out/libcurand.so.10"
echo "$out"
