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
source "$here/gpu-common.sh"  # setup_bundle, start_run, report_run, bench_rounds, run_round
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
cands=()
for c in "$here"/cand/*/; do
    [ -d "$c" ] && cands+=("$(basename "$c")")
done
echo "main $SHAPEPROOF_COMMIT, candidates: ${cands[*]:-none}; kernels in the cache: $(ls "$SHAPEPROOF_CACHE_DIR" | wc -l)"

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
# timed LOG ROUND NAME: one round of benchmark NAME (gpu-common.sh's run_round) within what is
# left of the budget, its log in LOG.log and its table lines printed.
timed() {
    local log=$1 round=$2 name=$3 rc=0
    if [ "$(left)" -le 10 ]; then
        echo "== $log: skipped (time)"
        return
    fi
    run_round "$here" "$round" "$name" "$(left)" >"$work/$log.log" 2>&1 || rc=$?
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
    mapfile -t rounds < <(bench_rounds "$here" "$name")
    [ ${#rounds[@]} -gt 0 ] || continue
    echo "== $name: ${rounds[*]}"
    for round in "${rounds[@]}"; do
        timed "$name-$round" "$round" "$name"
    done
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
        timed "$name" new "$name"
    done
fi
echo "== session done at $((SECONDS - start)) s"
pack
exit $status
