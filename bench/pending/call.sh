#!/usr/bin/env bash
# The one device call for the waiting patches (README.md here: step 1 makes their branches,
# step 2 the bundle). Run from the repository root on the GPU machine, the bundle carried:
#
#   SESSION_SECONDS=380 bench/pending/call.sh
#
# 1. `.gpu/session.sh`: every build's GPU tests, the named tests under memcheck, synccheck and
#    racecheck in each candidate build, then each benchmark main / candidates / main
#    (compare.md), all within SESSION_SECONDS; packed into $OUT/session.tgz.
# 2. While the call's time allows (nothing starts after LAST_START seconds of it): ncu source
#    profiles of the indexer at 32 heads (32768 causal) in main, fused and logits alone, then
#    at the first shape in main and in the build before the sampled selection (the candidate
#    build of 6641b8f); each profile's details page, its source page as CSV and that page
#    summed by opcode with its stall reasons (bench/harness/ncu_by_opcode.py), and the pairs
#    side by side (logits alone -> fused; before -> after the sample), packed into
#    $OUT/prof.tgz after each.
set -uo pipefail
cd "$(dirname "$0")/../.."
CHECK_SECONDS=${CHECK_SECONDS:-150} .gpu/session.sh "${SESSION_SECONDS:-380}" \
    gpu_indexer:paged_splits_long_enough_to_sample \
    gpu_indexer:a_misleading_sample_takes_the_second_pass \
    gpu_mla_decode:the_paged_prefill_reads_the_gathers_values_at_the_stores_scales
echo "== session rc $? at $SECONDS s"

export SHAPEPROOF_CACHE_DIR=$PWD/.gpu/kernels
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
prof=${OUT:-.}/prof
mkdir -p "$prof"
before=$(git rev-parse --short 6641b8f 2>/dev/null || echo 6641b8f)
# BUILD|HEADS|LOGITS_ONLY|TAG|INDEXER_PROFILE: the build's folder in the bundle, the kernel's
# head count, 0 for the fused kernel or 1 for the logits alone, the name, and the one row the
# benchmark runs (main's bench_indexer; 6641b8f's has no INDEXER_PROFILE and runs every row).
for spec in "bin|32|0|main32|32768,0,32" "bin|32|1|logits32|32768,0,32" \
    "bin|64|0|main64|4096,65536,64" "cand/$before|64|0|before64|4096,65536,64"; do
    IFS='|' read -r build heads logits tag row <<<"$spec"
    if [ "$SECONDS" -ge "${LAST_START:-500}" ]; then
        echo "== ncu $tag skipped (time)"
        continue
    fi
    [ -x ".gpu/$build/bench_indexer" ] || { echo "== ncu $tag: no .gpu/$build/bench_indexer"; continue; }
    INDEXER_PROFILE=$row SHAPEPROOF_COMMIT=$tag BENCH_JSON_DIR=$prof timeout "${PROF_SECONDS:-80}" \
        ncu --clock-control none --kernel-name-base demangled \
        --kernel-name "regex:lightning_indexer_kernel<\\(int\\)$heads, .*\\(bool\\)$logits>" --launch-count 1 \
        --section SourceCounters --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        -o "$prof/$tag" ".gpu/$build/bench_indexer" >"$prof/$tag-run.txt" 2>&1
    echo "== ncu $tag rc $? at $SECONDS s"
    ncu -i "$prof/$tag.ncu-rep" --page details >"$prof/$tag-details.txt" 2>&1
    ncu -i "$prof/$tag.ncu-rep" --page source --csv --print-source sass >"$prof/$tag-sass.csv" 2>&1
    python3 bench/harness/ncu_by_opcode.py "$prof/$tag-sass.csv" 40 >"$prof/$tag-opcodes.txt" 2>&1
    head -n 25 "$prof/$tag-opcodes.txt"
    grep -E 'Duration|Warp Cycles Per Issued|Executed Instructions  |Issue Slots Busy|No Eligible' \
        "$prof/$tag-details.txt"
    # Side by side, opcode by opcode: what the selection adds at 32 heads (the logits alone
    # against the fused kernel), and where the stalls moved with the sampled selection.
    for pair in "logits32 main32" "before64 main64"; do
        read -r a b <<<"$pair"
        if [ "$tag" = "$b" ] || [ "$tag" = "$a" ]; then
            if [ -s "$prof/$a-sass.csv" ] && [ -s "$prof/$b-sass.csv" ]; then
                python3 bench/harness/ncu_by_opcode.py "$prof/$a-sass.csv" "$prof/$b-sass.csv" 40 \
                    >"$prof/$a-to-$b.txt" 2>&1
                head -n 30 "$prof/$a-to-$b.txt"
            fi
        fi
    done
    tar czf "${OUT:-.}/prof.tgz" -C "$prof" --exclude='*.ncu-rep' .
done
