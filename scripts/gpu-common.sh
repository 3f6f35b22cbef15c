# Helpers that scripts/gpu-run.sh and scripts/gpu-session.sh share (sourced; gpu-bundle.sh copies
# this file into the bundle beside them): the bundle's setup, a run in the background under a
# time limit, logged under a folder, and the one-line report of a finished run.

# setup_bundle DIR: what every run on a bundle (gpu-bundle.sh's .gpu/ at DIR) needs first, for
# this shell and the programs it starts: the binaries unpacked, the kernel cache, the CUDA
# libraries, the commit for the benchmarks' JSON. Sets `cuda` (the toolkit's folder).
setup_bundle() {
    local here=$1 packed
    cuda=${CUDA_HOME:-/usr/local/cuda}
    export LD_LIBRARY_PATH="$cuda/lib64:${LD_LIBRARY_PATH:-}"
    # The kernel cache: the bundle's precompiled kernels (gpu-bundle.sh --precompile, unpacked
    # once) when it has them, else a fresh folder (every kernel compiled here on first use).
    if [ -e "$here/kernels.tar.xz" ] && [ ! -d "$here/kernels" ]; then
        python3 -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' \
            "$here/kernels.tar.xz" "$here"
    fi
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
    # A candidate's benchmarks look for the FP8 matmul script beside their folder (cand/).
    if [ -e "$here/fp8_matmul_rate.py" ] && [ -d "$here/cand" ]; then
        cp "$here/fp8_matmul_rate.py" "$here/cand/"
    fi
}

# start_run LOGS TAG LIMIT COMMAND...: COMMAND in the background, stopped after LIMIT seconds,
# its output in LOGS/TAG.log and its exit status in LOGS/TAG.rc; with 5 seconds or less left it
# does not start and is marked skipped.
start_run() {
    local logs=$1 tag=$2 limit=$3
    shift 3
    if [ "$limit" -le 5 ]; then
        echo skipped >"$logs/$tag.rc"
        return
    fi
    (timeout "$limit" "$@" >"$logs/$tag.log" 2>&1; echo $? >"$logs/$tag.rc") &
}

# report_run LOGS TAG: the line of a finished run (and its log's end when it failed); a failure,
# a stop at the limit or a test name that matched nothing sets status=1.
report_run() {
    local logs=$1 tag=$2 rc
    rc=$(cat "$logs/$tag.rc" 2>/dev/null || echo missing)
    # A test name that matches nothing runs zero tests and exits 0: that is a failure here.
    if [ "$rc" = 0 ] && grep -q '^running 0 tests' "$logs/$tag.log"; then
        rc="no test of that name"
    fi
    case "$rc" in
        0) echo "== $tag: ok, $(grep -hE 'test result|ERROR SUMMARY|RACECHECK SUMMARY' "$logs/$tag.log" | tr '\n' ' ')" ;;
        skipped) echo "== $tag: skipped (time)" ;;
        124 | 137) status=1; echo "== $tag: stopped at the budget's end (rc $rc); its last lines:"; tail -n 15 "$logs/$tag.log" ;;
        *) status=1; echo "== $tag: FAILED (rc $rc); its last lines:"; tail -n 30 "$logs/$tag.log" ;;
    esac
}

# bench_rounds DIR NAME: the rounds benchmark NAME is timed in on the bundle at DIR, in order, one
# a line: `base new CANDS... base` with a baseline build (base/), `new CANDS... new-2` without
# one (main brackets its candidates, cand/<commit>/), nothing with neither.
bench_rounds() {
    local here=$1 name=$2 cands=() c
    for c in "$here"/cand/*/; do
        [ -x "$c$name" ] && cands+=("$(basename "$c")")
    done
    if [ -x "$here/base/$name" ]; then
        printf '%s\n' base new "${cands[@]}" base
    elif [ ${#cands[@]} -gt 0 ]; then
        printf '%s\n' new "${cands[@]}" new-2
    fi
}

# run_round DIR ROUND NAME LIMIT: one round of benchmark NAME (a round of bench_rounds) under LIMIT
# seconds, with that build's commit; its JSON goes to $BENCH_JSON_DIR (new), or to base/, new-2/
# or cand-<commit>/ inside it.
run_round() {
    local here=$1 round=$2 name=$3 limit=$4 binary commit dir
    case "$round" in
        base) binary=$here/base/$name commit=$(cat "$here/base/commit" 2>/dev/null || echo unknown) dir=base ;;
        new) binary=$here/bin/$name commit=$SHAPEPROOF_COMMIT dir=. ;;
        new-2) binary=$here/bin/$name commit=$SHAPEPROOF_COMMIT dir=new-2 ;;
        *) binary=$here/cand/$round/$name commit=$round dir=cand-$round ;;
    esac
    mkdir -p "$BENCH_JSON_DIR/$dir"
    SHAPEPROOF_COMMIT=$commit BENCH_JSON_DIR="$BENCH_JSON_DIR/$dir" timeout "$limit" "$binary"
}
