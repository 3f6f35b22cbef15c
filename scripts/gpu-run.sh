#!/usr/bin/env bash
# Runs a bundle made by scripts/gpu-bundle.sh on a machine with an sm_90 GPU and CUDA 13:
#   run.sh tests      GPU tests (they fail, never skip, without a GPU), a bundle's candidate
#                     builds' (cand/<commit>/, --candidate) after bin/'s
#   run.sh sanitize   GPU tests under compute-sanitizer memcheck, racecheck and synccheck (the
#                     candidates' too)
#   run.sh check SECONDS BINARY TEST...
#                     every build's tests, then racecheck, memcheck and synccheck of the named
#                     tests of BINARY (e.g. gpu_indexer) in every build, all stopped when
#                     SECONDS have passed; one line a run (logs in $CHECK_LOGS)
#   TEST_JOBS=N       (tests, check) up to N test binaries at once
#   SAN_JOBS=N        (check) up to N sanitizer runs at once (default 4)
#   SKIP_TESTS=1      (check) the sanitizers alone (a second check of another binary)
#   run.sh bench      benchmarks (tables on stdout, JSON in $BENCH_JSON_DIR or ./), then the
#                     prologue, top-k, decode and indexer in PyTorch beside the benchmarks'
#                     figures (needs torch; each script runs when its benchmark did)
#   run.sh compare    each benchmark of base/ (a bundle's --baseline build) and of bin/,
#                     alternately base, new, base, on one machine: the new JSON in
#                     $BENCH_JSON_DIR (or ./), the baseline's in its base/ subfolder; a
#                     bundle's candidates run after new, their JSON in cand-<commit>/ (with
#                     the FP8 matmul rate, as every round); without a baseline build, new runs
#                     before and after the candidates (the second run's JSON in new-2/);
#                     each run stopped after COMPARE_LIMIT seconds (default 600)
#   BENCH_PACK=FILE   (bench, compare) every file of $BENCH_JSON_DIR packed into FILE at the end
#   PACK_AT=SECONDS   (with BENCH_PACK) also pack what is there after SECONDS, in the background:
#                     a call stopped at its time limit still returns the JSON written so far
#   run.sh examples   the example model ports
#   run.sh harness …  the sparse MLA kernel harness (bench/harness): `run.sh harness check base`,
#                     `run.sh harness time`, … (built into the bundle from the committed kernels,
#                     or from candidates: HARNESS_NARROW / HARNESS_WIDE when bundling)
#   run.sh gather-rates  the row gather alone, by copy path (bench/harness/gather_rates.cu)
#   run.sh all        all of the above but the harness and the gather rates
# Arguments after the mode go to every test binary (e.g. a test-name filter).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/gpu-common.sh"  # setup_bundle, start_run, report_run, bench_rounds, run_round
setup_bundle "$here"  # binaries unpacked, kernel cache, CUDA libraries, commit
mode=${1:-tests}
shift || true
status=0

# The GPU tests of bin/ and of every candidate build (cand/<commit>/, a bundle's --candidate).
# TEST_JOBS=N runs up to N test binaries at once (each still one test at a time): their CPU
# references then overlap on the machine's cores while the GPU interleaves their kernels; the
# logs are printed whole, in order, as each binary's turn comes.
run_tests() {
    local t jobs=${TEST_JOBS:-1}
    if [ "$jobs" -le 1 ]; then
        for t in "$here"/bin/gpu_* "$here"/cand/*/gpu_*; do
            [ -x "$t" ] || continue
            echo "== ${t#"$here"/}"
            "$t" --test-threads=1 "$@" || status=1
        done
        return
    fi
    local logs names=() i=0 running
    logs=$(mktemp -d)
    for t in "$here"/bin/gpu_* "$here"/cand/*/gpu_*; do
        [ -x "$t" ] || continue
        while running=$(jobs -rp | wc -l) && [ "$running" -ge "$jobs" ]; do
            wait -n || true
        done
        ("$t" --test-threads=1 "$@" >"$logs/$i.log" 2>&1; echo $? >"$logs/$i.rc") &
        names+=("${t#"$here"/}")
        i=$((i + 1))
    done
    wait
    for ((i = 0; i < ${#names[@]}; i++)); do
        echo "== ${names[$i]}"
        cat "$logs/$i.log"
        [ "$(cat "$logs/$i.rc" 2>/dev/null || echo 1)" = 0 ] || status=1
    done
    rm -rf "$logs"
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

# Within a time budget (a machine lent for a limited time): every build's GPU tests, TEST_JOBS
# binaries at once, then racecheck, memcheck and synccheck of the named tests of BINARY (e.g.
# gpu_indexer) in every build, new first, SAN_JOBS runs at once (default 4). Every run is
# stopped when the budget is spent and reported as such; what did not start is listed as
# skipped, never as passed. One line a run on stdout, and the last lines of every failing log;
# the logs themselves stay in $CHECK_LOGS (default: a fresh folder), so a caller that keeps
# them (e.g. packs them into one file) keeps everything.
check() {
    local budget=${1:?usage: run.sh check SECONDS BINARY TEST [TEST ...]} binary=${2:?a test binary name, e.g. gpu_indexer}
    shift 2
    local start=$SECONDS san="$cuda/bin/compute-sanitizer" logs=${CHECK_LOGS:-$(mktemp -d)}
    local t name tool log i=0 runs=() jobs=${TEST_JOBS:-1}
    mkdir -p "$logs"
    left() { echo $((budget - (SECONDS - start))); }
    # A run in the background, at most $2 at once: $1 names its log, the rest is the command.
    queue() {
        local tag=$1 most=$2 running
        shift 2
        while running=$(jobs -rp | wc -l) && [ "$running" -ge "$most" ]; do
            wait -n || true
        done
        start_run "$logs" "$tag" "$(left)" "$@"
    }
    for t in "$here"/bin/gpu_* "$here"/cand/*/gpu_*; do
        [ -x "$t" ] && [ -z "${SKIP_TESTS:-}" ] || continue
        name=${t#"$here"/}
        runs+=("test ${name//\//-}")
        queue "test ${name//\//-}" "$jobs" "$t" --test-threads=1
    done
    wait
    echo "== tests done at $((SECONDS - start)) s"
    for t in "$here/bin/$binary" "$here"/cand/*/"$binary"; do
        [ -x "$t" ] || continue
        for name in "$@"; do
            for tool in racecheck memcheck synccheck; do
                log="$tool ${t#"$here"/} $name"
                log=${log//\//-}
                runs+=("$log")
                queue "$log" "${SAN_JOBS:-4}" "$san" --tool "$tool" --error-exitcode 99 --print-limit 5 \
                    "$t" --test-threads=1 --exact "$name"
            done
        done
    done
    wait
    for log in "${runs[@]}"; do
        report_run "$logs" "$log"
    done
    echo "== check done at $((SECONDS - start)) s; logs in $logs"
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
    local b name round rounds
    for b in "$here"/bin/bench_*; do
        name=$(basename "$b")
        mapfile -t rounds < <(bench_rounds "$here" "$name")
        if [ ${#rounds[@]} -eq 0 ]; then
            echo "== $name: no baseline build in base/ and no candidate build" >&2
            status=1
            continue
        fi
        for round in "${rounds[@]}"; do
            echo "== $name ($round)"
            run_round "$here" "$round" "$name" "${COMPARE_LIMIT:-600}" || status=1
        done
    done
}

examples() {
    for e in "$here"/bin/example_*; do
        echo "== $(basename "$e")"
        "$e" || status=1
    done
}

# BENCH_PACK=FILE: after bench or compare, every file under $BENCH_JSON_DIR packed into FILE
# (one .tgz to carry back, however many JSON files the runs wrote).
pack() {
    [ -n "${BENCH_PACK:-}" ] || return 0
    tar czf "$BENCH_PACK" -C "$BENCH_JSON_DIR" . && echo "== packed $BENCH_JSON_DIR into $BENCH_PACK"
}

# PACK_AT=SECONDS: the same packing after that many seconds, whatever the mode is doing then.
if [ -n "${BENCH_PACK:-}" ] && [ -n "${PACK_AT:-}" ]; then
    export BENCH_JSON_DIR=${BENCH_JSON_DIR:-$PWD}
    mkdir -p "$BENCH_JSON_DIR"
    ( sleep "$PACK_AT" && pack ) &
    packer=$!
    trap 'kill "$packer" 2>/dev/null' EXIT  # done before then: the end's packing is the one
fi

case "$mode" in
    tests) run_tests "$@" ;;
    sanitize) sanitize "$@" ;;
    check) check "$@" ;;
    bench) bench; pack ;;
    compare) compare; pack ;;
    examples) examples ;;
    harness) "$here/bin/harness" "$@" || status=1 ;;
    gather-rates) "$here/bin/gather_rates" || status=1 ;;
    all) run_tests "$@"; sanitize "$@"; bench; examples ;;
    *) echo "usage: run.sh [tests|sanitize|check|bench|compare|examples|harness|gather-rates|all] [args]" >&2; exit 2 ;;
esac
exit $status
