#!/usr/bin/env bash
# Runs a bundle made by scripts/gpu-bundle.sh on a machine with an sm_90 GPU and CUDA 13:
#   run.sh tests      GPU tests (they fail, never skip, without a GPU)
#   run.sh sanitize   GPU tests under compute-sanitizer memcheck, racecheck and synccheck
#   run.sh bench      benchmarks (tables on stdout, JSON in $BENCH_JSON_DIR or ./), then the
#                     prologue, top-k, decode and indexer in PyTorch beside the benchmarks'
#                     figures (needs torch)
#   run.sh examples   the example model ports
#   run.sh harness …  the sparse MLA kernel harness (bench/harness): `run.sh harness check base`,
#                     `run.sh harness time`, … (built into the bundle from the committed kernels,
#                     or from candidates: HARNESS_NARROW / HARNESS_WIDE when bundling)
#   run.sh gather-rates  the row gather alone, by copy path (bench/harness/gather_rates.cu)
#   run.sh all        all of the above but the harness and the gather rates
# Arguments after the mode go to every test binary (e.g. a test-name filter).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH="$cuda/lib64:${LD_LIBRARY_PATH:-}"
export SHAPEPROOF_CACHE_DIR=${SHAPEPROOF_CACHE_DIR:-$(mktemp -d)}
# The commit the bundle was built from, for the benchmarks' JSON.
export SHAPEPROOF_COMMIT=${SHAPEPROOF_COMMIT:-$(cat "$here/commit" 2>/dev/null || echo unknown)}
# Unpack the binaries the bundle compressed (xz, or Python's lzma where xz is missing).
for packed in "$here"/bin/*.xz; do
    [ -e "$packed" ] || continue
    if command -v xz >/dev/null; then
        xz -d -f "$packed"
    else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], "wb"))' "$packed" && rm "$packed"
    fi
    chmod +x "${packed%.xz}"
done
mode=${1:-tests}
shift || true
status=0

run_tests() {
    for t in "$here"/bin/gpu_*; do
        echo "== $(basename "$t")"
        "$t" --test-threads=1 "$@" || status=1
    done
}

sanitize() {
    local san="$cuda/bin/compute-sanitizer"
    for tool in memcheck racecheck synccheck; do
        for t in "$here"/bin/gpu_*; do
            echo "== $tool $(basename "$t")"
            "$san" --tool "$tool" --error-exitcode 99 --print-limit 20 "$t" --test-threads=1 "$@" || status=1
        done
    done
}

bench() {
    export BENCH_JSON_DIR=${BENCH_JSON_DIR:-$PWD}
    for b in "$here"/bin/bench_*; do
        echo "== $(basename "$b")"
        "$b" || status=1
    done
    echo "== prologue_torch.py"
    python3 "$here/prologue_torch.py" --json "$BENCH_JSON_DIR/prologue.json" \
        --out "$BENCH_JSON_DIR/prologue_torch.json" || status=1
    echo "== topk_torch.py"
    python3 "$here/topk_torch.py" --json "$BENCH_JSON_DIR/topk.json" \
        --out "$BENCH_JSON_DIR/topk_torch.json" || status=1
    echo "== decode_torch.py"
    python3 "$here/decode_torch.py" --json "$BENCH_JSON_DIR/mla_decode.json" \
        --out "$BENCH_JSON_DIR/decode_torch.json" || status=1
    echo "== indexer_torch.py"
    python3 "$here/indexer_torch.py" --json "$BENCH_JSON_DIR/indexer.json" \
        --out "$BENCH_JSON_DIR/indexer_torch.json" || status=1
}

examples() {
    for e in "$here"/bin/example_*; do
        echo "== $(basename "$e")"
        "$e" || status=1
    done
}

case "$mode" in
    tests) run_tests "$@" ;;
    sanitize) sanitize "$@" ;;
    bench) bench ;;
    examples) examples ;;
    harness) "$here/bin/harness" "$@" || status=1 ;;
    gather-rates) "$here/bin/gather_rates" || status=1 ;;
    all) run_tests "$@"; sanitize "$@"; bench; examples ;;
    *) echo "usage: run.sh [tests|sanitize|bench|examples|harness|gather-rates|all] [args]" >&2; exit 2 ;;
esac
exit $status
