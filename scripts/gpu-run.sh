#!/usr/bin/env bash
# Runs a bundle made by scripts/gpu-bundle.sh on a machine with an sm_90 GPU and CUDA 13:
#   run.sh tests      GPU tests (they fail, never skip, without a GPU), a bundle's candidate
#                     builds' (cand/<commit>/, --candidate) after bin/'s
#   run.sh sanitize   GPU tests under compute-sanitizer memcheck, racecheck and synccheck (the
#                     candidates' too)
#   run.sh bench      benchmarks (tables on stdout, JSON in $BENCH_JSON_DIR or ./), then the
#                     prologue, top-k, decode and indexer in PyTorch beside the benchmarks'
#                     figures (needs torch; each script runs when its benchmark did)
#   run.sh compare    each benchmark of base/ (a bundle's --baseline build) and of bin/,
#                     alternately base, new, base, on one machine: the new JSON in
#                     $BENCH_JSON_DIR (or ./), the baseline's in its base/ subfolder; a
#                     bundle's candidates run after new, their JSON in cand-<commit>/
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
# The kernel cache: the bundle's precompiled kernels (gpu-bundle.sh --precompile) when it has
# them, else a fresh folder (every kernel compiled here on first use).
if [ -d "$here/kernels" ]; then
    export SHAPEPROOF_CACHE_DIR=${SHAPEPROOF_CACHE_DIR:-$here/kernels}
else
    export SHAPEPROOF_CACHE_DIR=${SHAPEPROOF_CACHE_DIR:-$(mktemp -d)}
fi
# The commit the bundle was built from, for the benchmarks' JSON.
export SHAPEPROOF_COMMIT=${SHAPEPROOF_COMMIT:-$(cat "$here/commit" 2>/dev/null || echo unknown)}
# Unpack the binaries the bundle compressed (xz, or Python's lzma where xz is missing).
for packed in "$here"/bin/*.xz "$here"/base/*.xz "$here"/cand/*/*.xz; do
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

# The GPU tests of bin/ and of every candidate build (cand/<commit>/, a bundle's --candidate).
run_tests() {
    local t
    for t in "$here"/bin/gpu_* "$here"/cand/*/gpu_*; do
        [ -x "$t" ] || continue
        echo "== ${t#"$here"/}"
        "$t" --test-threads=1 "$@" || status=1
    done
}

sanitize() {
    local san="$cuda/bin/compute-sanitizer"
    for tool in memcheck racecheck synccheck; do
        for t in "$here"/bin/gpu_* "$here"/cand/*/gpu_*; do
            [ -x "$t" ] || continue
            echo "== $tool ${t#"$here"/}"
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
    # script, the benchmark JSON it reads, the JSON it writes
    local torch
    for torch in "prologue_torch.py prologue.json prologue_torch.json" \
        "topk_torch.py topk.json topk_torch.json" \
        "decode_torch.py mla_decode.json decode_torch.json" \
        "indexer_torch.py indexer.json indexer_torch.json"; do
        set -- $torch
        [ -e "$BENCH_JSON_DIR/$2" ] || continue
        echo "== $1"
        python3 "$here/$1" --json "$BENCH_JSON_DIR/$2" --out "$BENCH_JSON_DIR/$3" || status=1
    done
}

compare() {
    export BENCH_JSON_DIR=${BENCH_JSON_DIR:-$PWD}
    mkdir -p "$BENCH_JSON_DIR/base"
    local base b old round
    base=$(cat "$here/base/commit" 2>/dev/null || echo unknown)
    for b in "$here"/bin/bench_*; do
        old="$here/base/$(basename "$b")"
        if [ ! -x "$old" ]; then
            echo "== $(basename "$b"): no baseline build in base/" >&2
            status=1
            continue
        fi
        # Candidates (cand/<commit>/) run between the new build and the last baseline round,
        # their JSON in cand-<commit>/.
        local rounds=(base new) cand
        for cand in "$here"/cand/*/; do
            [ -x "$cand$(basename "$b")" ] && rounds+=("$(basename "$cand")")
        done
        rounds+=(base)
        for round in "${rounds[@]}"; do
            echo "== $(basename "$b") ($round)"
            case "$round" in
                base) SHAPEPROOF_COMMIT=$base BENCH_JSON_DIR="$BENCH_JSON_DIR/base" "$old" || status=1 ;;
                new) "$b" || status=1 ;;
                *)
                    mkdir -p "$BENCH_JSON_DIR/cand-$round"
                    SHAPEPROOF_COMMIT=$round BENCH_JSON_DIR="$BENCH_JSON_DIR/cand-$round" \
                        "$here/cand/$round/$(basename "$b")" || status=1
                    ;;
            esac
        done
    done
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
    compare) compare ;;
    examples) examples ;;
    harness) "$here/bin/harness" "$@" || status=1 ;;
    gather-rates) "$here/bin/gather_rates" || status=1 ;;
    all) run_tests "$@"; sanitize "$@"; bench; examples ;;
    *) echo "usage: run.sh [tests|sanitize|bench|compare|examples|harness|gather-rates|all] [args]" >&2; exit 2 ;;
esac
exit $status
