# Helpers that scripts/gpu-run.sh and scripts/gpu-session.sh share (sourced; gpu-bundle.sh copies
# this file into the bundle beside them): a run in the background under a time limit, logged
# under a folder, and the one-line report of a finished run.

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
