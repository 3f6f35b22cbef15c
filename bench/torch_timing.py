"""What the PyTorch comparison scripts (`bench/*_torch.py`) share: GPU time of a call, the Rust
benchmark's records of the same run, and the JSON file of the figures."""

import datetime
import json
import os
import statistics

import torch


def time_us(fn, runs, warmup):
    """Median GPU time of `fn()` in microseconds: CUDA events around each of `runs` calls,
    after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
    return statistics.median(samples)


def rust_records(path):
    """The records of a Rust benchmark's JSON file by name (none when the file is missing)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["name"]: r for r in json.load(f)["records"]}


def write_records(path, records, source=None):
    """`records` in the benchmarks' JSON format (commit, GPU, date, PyTorch version). The
    commit is `$SHAPEPROOF_COMMIT`, else that of `source` (the benchmark JSON whose timings the
    shapeproof column holds: the same run)."""
    commit = os.environ.get("SHAPEPROOF_COMMIT")
    if not commit and source and os.path.exists(source):
        with open(source) as f:
            commit = json.load(f).get("commit")
    with open(path, "w") as f:
        json.dump({"commit": commit or "unknown",
                   "gpu": torch.cuda.get_device_name(0),
                   "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                   "torch": torch.__version__, "records": records}, f, indent=2)
    print(f"wrote {path}")
