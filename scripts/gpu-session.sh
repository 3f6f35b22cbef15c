#!/usr/bin/env bash
# One device call's worth of work on a bundle with candidate builds (scripts/gpu-bundle.sh
# --candidate ...; the bundle holds this script as session.sh), within a time budget, for a
# machine lent for a few minutes at a time:
#
#   .gpu/session.sh SECONDS BINARY:TEST [BINARY:TEST ...]
#
#   1. Correctness, all at once: every build's GPU tests (bin/'s and each candidate's, main's
#      being the control on this machine), and each named test (e.g.
#      gpu_indexer:heads_32_topk_2048) under memcheck, synccheck and racecheck in each candidate
#      build that has its binary; all stopped after CHECK_SECONDS (default: 40% of SECONDS).
#   2. Every benchmark that has a candidate build, timed main, each candidate, main again
#      (`run.sh compare`'s rounds, one run at a time), and each candidate's time a record over
#      the mean of main's two (bench/compare.py, in compare.md).
#   3. On an H200 (or with RECORDS=1), the benchmarks without a candidate build: the figures
#      of record.
#
# Every run is stopped when SECONDS have passed since the start; what did not start is listed
# as skipped. Logs and JSON go to $OUT/session (or ./session without $OUT) and are packed into
# session.tgz beside it after every step, so a call stopped at its limit still returns what
# ran. A one-line summary a run is printed at the end of each step.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/gpu-common.sh"  # setup_bundle, start_run, report_run
budget=${1:?usage: session.sh SECONDS BINARY:TEST [BINARY:TEST ...]}
shift
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
top=${OUT:-$PWD}
work=$top/session
mkdir -p "$work"
pack() { tar czf "$top/session.tgz" -C "$work" . 2>/dev/null; }
status=0

# The machine, and the bundle set up.
{ nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv; } \
    >"$work/gpu.txt" 2>&1
cat "$work/gpu.txt"
setup_bundle "$here"
main_commit=$SHAPEPROOF_COMMIT
cands=()
for c in "$here"/cand/*/; do
    [ -d "$c" ] && cands+=("$(basename "$c")")
done
echo "main $main_commit, candidates: ${cands[*]:-none}; kernels in the cache: $(ls "$SHAPEPROOF_CACHE_DIR" | wc -l)"

# 1. Correctness.
check_limit=${CHECK_SECONDS:-$((budget * 2 / 5))}
runs=()
for t in "$here"/bin/gpu_* "$here"/cand/*/gpu_*; do
    [ -x "$t" ] || continue
    tag="test ${t#"$here"/}"
    tag=${tag//\//-}
    runs+=("$tag")
    start_run "$work" "$tag" "$check_limit" "$t" --test-threads=1
done
for c in "${cands[@]}"; do
    for pair in "$@"; do
        binary=${pair%%:*} name=${pair#*:}
        [ -x "$here/cand/$c/$binary" ] || continue
        for tool in memcheck synccheck racecheck; do
            tag="$tool cand-$c $name"
            runs+=("$tag")
            start_run "$work" "$tag" "$check_limit" "$cuda/bin/compute-sanitizer" --tool "$tool" --error-exitcode 99 \
                --print-limit 5 "$here/cand/$c/$binary" --test-threads=1 --exact "$name"
        done
    done
done
wait
for tag in "${runs[@]}"; do report_run "$work" "$tag"; done >"$work/check.txt"  # (sets status)
cat "$work/check.txt"
pack
echo "== correctness done at $((SECONDS - start)) s"

# 2. The benchmarks with a candidate build: main, each candidate, main again.
export BENCH_JSON_DIR=$work/bench
mkdir -p "$BENCH_JSON_DIR"
timed() {  # $1: log name, $2: JSON folder, $3: commit, the rest: the command
    local log=$1 dir=$2 commit=$3
    shift 3
    mkdir -p "$dir"
    if [ "$(left)" -le 10 ]; then
        echo "== $log: skipped (time)"
        return
    fi
    local rc=0
    SHAPEPROOF_COMMIT=$commit BENCH_JSON_DIR=$dir timeout "$(left)" "$@" >"$work/$log.log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        status=1
        echo "== $log: FAILED or stopped at the budget's end (rc $rc); its last lines:"
        tail -n 5 "$work/$log.log"
    fi
    grep -h '^|' "$work/$log.log" | grep -v -- '---'
    pack
}
for b in "$here"/bin/bench_*; do
    name=$(basename "$b")
    with=()
    for c in "${cands[@]}"; do
        [ -x "$here/cand/$c/$name" ] && with+=("$c")
    done
    [ ${#with[@]} -gt 0 ] || continue
    echo "== $name: main, ${with[*]}, main"
    timed "$name-main" "$BENCH_JSON_DIR" "$main_commit" "$b"
    for c in "${with[@]}"; do
        timed "$name-cand-$c" "$BENCH_JSON_DIR/cand-$c" "$c" "$here/cand/$c/$name"
    done
    timed "$name-main-2" "$BENCH_JSON_DIR/new-2" "$main_commit" "$b"
done
echo "== candidates timed at $((SECONDS - start)) s"
# Each candidate beside the mean of main's two runs, record by record (bench/compare.py).
python3 "$here/compare.py" "$BENCH_JSON_DIR" | tee "$work/compare.md"
pack

# 3. The figures of record, on an H200.
if grep -q 'H200' "$work/gpu.txt" || [ -n "${RECORDS:-}" ]; then
    for b in "$here"/bin/bench_*; do
        name=$(basename "$b")
        compgen -G "$here/cand/*/$name" >/dev/null && continue
        echo "== $name (record)"
        timed "$name" "$BENCH_JSON_DIR" "$main_commit" "$b"
    done
fi
echo "== session done at $((SECONDS - start)) s"
pack
exit $status
