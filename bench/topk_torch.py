#!/usr/bin/env python3
"""The top-k alone in PyTorch, timed beside the shapeproof kernel of the same run.

Same shapes and score distribution as `benches/topk.rs`: rows of N(0, 1) f32 scores, every
column a candidate, top-2048. PyTorch's op is `torch.topk(scores, 2048, dim=-1)` (values and
indices, in no particular order: `sorted=False`); shapeproof's row is also sorted by column,
so `torch.topk` then `torch.sort` of the indices is timed too. GPU time per call: median of
CUDA-event timings of back-to-back calls, eager and `torch.compile`.

Reads the Rust benchmark's `topk.json` of the same run (`--json`, default
$BENCH_JSON_DIR/topk.json) and prints each row with the ratio PyTorch / shapeproof; with
`--out` it writes the figures in the benchmarks' JSON format (records named after the Rust
ones, `topk_r{rows}_w{width}_k{TOPK}`).
"""

import argparse
import datetime
import json
import os
import statistics

import torch

TOPK = 2048
SHAPES = [(1, 65536), (4, 131072), (8, 65536), (132, 65536), (1024, 16384)]


def topk(scores):
    return torch.topk(scores, TOPK, dim=-1, sorted=False).indices


def topk_by_column(scores):
    return torch.sort(torch.topk(scores, TOPK, dim=-1, sorted=False).indices, dim=-1).values


def time_us(fn, runs=51, warmup=5):
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


def main():
    default_json = os.path.join(os.environ.get("BENCH_JSON_DIR", "."), "topk.json")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=default_json, help="the Rust benchmark's topk.json")
    parser.add_argument("--out", help="also write the PyTorch figures to this JSON file")
    args = parser.parse_args()
    rust = {}
    if os.path.exists(args.json):
        with open(args.json) as f:
            rust = {r["name"]: r for r in json.load(f)["records"]}
    gen = torch.Generator(device="cuda").manual_seed(7)
    compiled = torch.compile(topk_by_column, dynamic=False)
    records = []
    print("| (rows, width, TOPK) | shapeproof µs | topk µs | topk + sort µs | compiled µs | "
          "topk / shapeproof | topk + sort / shapeproof | compiled / shapeproof |")
    print("|---|---|---|---|---|---|---|---|")
    for rows, width in SHAPES:
        scores = torch.randn(rows, width, device="cuda", generator=gen)
        plain = time_us(lambda: topk(scores))
        eager = time_us(lambda: topk_by_column(scores))
        comp = time_us(lambda: compiled(scores))
        name = f"topk_r{rows}_w{width}_k{TOPK}"
        ours = rust.get(name, {}).get("us")

        def ratio(t):
            return t / ours if ours else None

        def show(x):
            return f"{x:.1f}x" if x is not None else "n/a"

        print(f"| ({rows}, {width}, {TOPK}) | {ours if ours else float('nan'):.1f} | {plain:.1f} | "
              f"{eager:.1f} | {comp:.1f} | {show(ratio(plain))} | {show(ratio(eager))} | "
              f"{show(ratio(comp))} |")
        records.append({"name": name, "topk_us": plain, "eager_us": eager, "compiled_us": comp,
                        "shapeproof_us": ours, "topk_over_shapeproof": ratio(plain),
                        "eager_over_shapeproof": ratio(eager),
                        "compiled_over_shapeproof": ratio(comp)})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"commit": os.environ.get("SHAPEPROOF_COMMIT", "unknown"),
                       "gpu": torch.cuda.get_device_name(0),
                       "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                       "torch": torch.__version__, "records": records}, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
