#!/usr/bin/env bash
# Builds the GPU tests, benches and examples here (where Rust is) and bundles them with a
# runner into .gpu/, ready to copy to a machine with a CUDA 13 driver and toolkit (no Rust
# needed there). Then, on that machine:  .gpu/run.sh [tests|sanitize|bench|examples|harness|gather-rates|all]
# HARNESS_NARROW / HARNESS_WIDE: candidate kernel files for the harness (default: the committed).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
rm -rf "$out"
mkdir -p "$out/bin"
# The commit of the build (with "+dirty" when the tree has changes), for the benchmarks' JSON.
{ git rev-parse --short HEAD; git diff --quiet HEAD || echo "+dirty"; } | tr -d '\n' >"$out/commit"
log=$(mktemp)
{
    cargo test --release --features gpu-tests --no-run --message-format=json
    cargo bench --features gpu-tests --no-run --message-format=json
    cargo build --release --examples --message-format=json
} 2>/dev/null >"$log"
# The candle CUDA interop (test and example) links candle's CUDA backend, built with the
# pinned CUDA 13.0 wheels (scripts/cuda-toolkit.sh), in a target dir of its own.
(
    source scripts/cuda-toolkit.sh >&2
    export CARGO_TARGET_DIR=target/cuda-bundle
    cargo test --release --features gpu-tests,candle-cuda --no-run --test gpu_candle --message-format=json
    cargo build --release --features candle-cuda --example candle_layer --message-format=json
    cargo bench --features gpu-tests,candle-cuda --no-run --bench candle_launch --message-format=json
) 2>/dev/null >>"$log"
# The sparse MLA kernel harness (bench/harness), from the committed kernels or from the
# candidates named by HARNESS_NARROW / HARNESS_WIDE (paths to kernel-file copies).
(
    source scripts/cuda-toolkit.sh >/dev/null 2>&1
    NVCC="$CUDA_HOME/bin/nvcc" HARNESS_LDFLAGS="-L$CUDA_HOME/lib" \
        bench/harness/build.sh "${HARNESS_NARROW:-kernels/sparse_mla_narrow.cu}" \
        "${HARNESS_WIDE:-kernels/sparse_mla_prefill.cu}" >target/harness-build.log 2>&1
) || { echo "harness build failed: see target/harness-build.log" >&2; exit 1; }
cp target/harness/harness "$out/bin/harness"
cp target/harness/gather_rates "$out/bin/gather_rates"
echo "bundled harness, gather_rates"
python3 - "$log" "$out/bin" <<'PY'
import json, shutil, sys
log, dest = sys.argv[1], sys.argv[2]
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
    shutil.copy(exe, f"{dest}/{prefix}{name}")
    print(f"bundled {prefix}{name}")
PY
# Binaries that link candle's CUDA kernels carry ~40 MB of device code each: shipped
# compressed (run.sh unpacks them).
for exe in "$out"/bin/*; do
    if [ "$(stat -c %s "$exe")" -gt 16000000 ]; then
        xz -T2 -6 "$exe"
    fi
done
cp scripts/gpu-run.sh "$out/run.sh"
cp scripts/fp8_matmul_rate.py "$out/"
cp bench/prologue_torch.py bench/decode_torch.py bench/topk_torch.py bench/indexer_torch.py \
    bench/torch_timing.py "$out/"
chmod +x "$out/run.sh"
rm -f "$log"
echo "bundle ready in $out/ ($(du -sh "$out" | cut -f1))"
