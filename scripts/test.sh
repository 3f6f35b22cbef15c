#!/usr/bin/env bash
# The project's test command: formatting, lints, every test that runs without a GPU (the
# candle CPU interop, the compile-fail suite and the NVRTC compilation of every kernel
# instantiation the crate uses included), the candle example on the CPU, and model checks of
# the barrier protocols of the 64-head kernel, the indexer's prefill and the top-k's cluster.
# No GPU needed.
#
# NVRTC comes from a CUDA 13 toolkit when one is found (CUDA_HOME, /usr/local/cuda); otherwise
# the pinned CUDA 13.0 NVRTC wheel (nvidia-cuda-nvrtc, a 90 MB download) is installed into
# ./.cuda/venv, the environment scripts/cuda-toolkit.sh completes for scripts/test-cuda.sh.
# The CUDA builds that need nvcc (candle's CUDA backend, the kernel harness) are the second
# command, scripts/test-cuda.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/nvrtc.sh
# What keeps the run inside its disk budget on a fresh machine: no incremental caches (a
# one-shot build never reuses them) and no debug info (a failing test still names its file
# and line: panic locations do not need it). Set here, not in Cargo.toml, so a developer's
# builds keep theirs; trybuild's nested builds inherit them.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=false
export CARGO_PROFILE_TEST_DEBUG=false

step() { echo "== $(date +%T) $*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "clippy (nvrtc-tests, candle)"
cargo clippy --workspace --all-targets --features nvrtc-tests,candle -- -D warnings
step "clippy (gpu-tests: the GPU tests and benchmarks, compiled, not run)"
cargo clippy --workspace --all-targets --features gpu-tests -- -D warnings
step "cargo test (CPU tests, compile-fail suite, NVRTC compilation of every kernel, no wgmma serialised)"
cargo test --workspace --features nvrtc-tests,candle
# The candle example runs end to end on the CPU (candle CPU + the CPU backend) and checks itself.
step "candle example on the CPU"
cargo run --quiet --profile test --example candle_layer --features candle
# The 64-head kernel's barrier protocol, model-checked under random schedules (no GPU): one
# item a CTA, and many items a CTA on its persistent grid.
step "barrier protocol models"
python3 bench/harness/wide_vt_protocol.py
python3 bench/harness/wide_persistent_protocol.py
# A proposed ping-pong of the two consumer warpgroups (not built): its protocol, the slot counts
# free of deadlock, and what fits in shared memory.
python3 bench/harness/pingpong_protocol.py
# The lightning indexer's prefill CTA: its key ring and its warpgroups' cut votes.
python3 bench/harness/indexer_protocol.py
# The top-k's cluster: histogram copies and counts read across CTAs (racecheck does not see
# another CTA's shared memory).
python3 bench/harness/topk_cluster_protocol.py
# The paged prefill's e4m3 rescale without conversions, against the encoder, every byte and scale.
python3 bench/harness/e4m3_rescale_model.py
# The indexer's selection (loose and exact cuts, the bitmap row) against the exact top-k.
python3 bench/harness/indexer_selection_model.py
# bench/RESULTS.md's tables are what bench/render.py makes of the committed run of record.
step "bench/RESULTS.md matches bench/results/"
python3 bench/render.py --check
step "done"
