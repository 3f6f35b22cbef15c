#!/usr/bin/env bash
# Builds the sparse MLA prefill harness (bench/harness/main.cu) for sm_90a:
#
#   bench/harness/build.sh [NARROW_CANDIDATE] [WIDE_CANDIDATE]
#
# NARROW_CANDIDATE: a copy of kernels/sparse_mla_narrow.cu to try (default: the committed file);
# WIDE_CANDIDATE: a copy of kernels/sparse_mla_prefill.cu (default: the committed file). The
# variants linked in: base (committed narrow kernel), cand (narrow candidate), grid7 (the narrow
# candidate on a 7-CTA persistent grid), wide (committed 64-head kernel), widecand (64-head
# candidate; HARNESS_WIDE_GRID=<n> caps a persistent 64-head candidate's grid at n CTAs, so that
# `check widecand` runs many items a CTA). Needs nvcc of CUDA 13 ($NVCC, else nvcc on PATH;
# $HARNESS_LDFLAGS for the link, e.g. -L<toolkit>/lib where the CUDA runtime libraries are not
# beside nvcc); writes
# $HARNESS_OUT (default target/harness/harness), and beside it gather_rates (the row gather
# alone, by copy path: bench/harness/gather_rates.cu). The binaries need only the CUDA runtime
# they link: copy them to the GPU machine and run e.g. `harness check cand`, `harness time`,
# `compute-sanitizer --tool racecheck harness small cand`, `gather_rates`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# Paths given by the caller are resolved against the caller's directory (and must exist).
narrow_cand=$(realpath -e "${1:-$root/kernels/sparse_mla_narrow.cu}")
wide_cand=$(realpath -e "${2:-$root/kernels/sparse_mla_prefill.cu}")
out=$(realpath -m "${HARNESS_OUT:-$root/target/harness/harness}")
nvcc=${NVCC:-nvcc}
cd "$root"
obj=$(dirname "$out")/obj
mkdir -p "$obj"
flags=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a)
compile() {  # name file wide [grid]
    local defs=(-DVARIANT_NAME="$1" "-DVARIANT_FILE=\"$2\"" -DVARIANT_WIDE="$3")
    [ -n "${4:-}" ] && defs+=(-DVARIANT_GRID="$4")
    "$nvcc" "${flags[@]}" "${defs[@]}" -c bench/harness/variant.cu -o "$obj/$1.o"
}
rm -f "$obj"/*.o "$out" "$(dirname "$out")/gather_rates"  # never link a stale object
# Two compiles at a time; `wait PID` returns each one's status, so a failed compile stops here.
compile base "$root/kernels/sparse_mla_narrow.cu" 0 &
first=$!
compile cand "$narrow_cand" 0
wait "$first"
compile grid7 "$narrow_cand" 0 7 &
first=$!
compile wide "$root/kernels/sparse_mla_prefill.cu" 1
wait "$first"
compile widecand "$wide_cand" 1 "${HARNESS_WIDE_GRID:-}"
"$nvcc" "${flags[@]}" -c bench/harness/main.cu -o "$obj/main.o"
# shellcheck disable=SC2086 # HARNESS_LDFLAGS is a list of flags
"$nvcc" "${flags[@]}" -o "$out" "$obj"/{main,base,cand,grid7,wide,widecand}.o ${HARNESS_LDFLAGS:-}
# shellcheck disable=SC2086
"$nvcc" "${flags[@]}" -o "$(dirname "$out")/gather_rates" bench/harness/gather_rates.cu ${HARNESS_LDFLAGS:-}
echo "harness: $out"
