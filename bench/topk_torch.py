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
import os

import torch

from torch_timing import rust_records, time_us, write_records

TOPK = 2048
RUNS, WARMUP = 51, 5  # timed calls, and calls before them
SHAPES = [(1, 65536), (4, 131072), (8, 65536), (32, 65536), (132, 65536), (1024, 16384)]


def topk(scores):
    return torch.topk(scores, TOPK, dim=-1, sorted=False).indices


def topk_by_column(scores):
    return torch.sort(torch.topk(scores, TOPK, dim=-1, sorted=False).indices, dim=-1).values


def main():
    default_json = os.path.join(os.environ.get("BENCH_JSON_DIR", "."), "topk.json")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=default_json, help="the Rust benchmark's topk.json")
    parser.add_argument("--out", help="also write the PyTorch figures to this JSON file")
    args = parser.parse_args()
    rust = rust_records(args.json)
    gen = torch.Generator(device="cuda").manual_seed(7)
    compiled = torch.compile(topk_by_column, dynamic=False)
    records = []
    print("| (rows, width, TOPK) | shapeproof µs | topk µs | topk + sort µs | compiled µs | "
          "topk / shapeproof | topk + sort / shapeproof | compiled / shapeproof |")
    print("|---|---|---|---|---|---|---|---|")
    for rows, width in SHAPES:
        scores = torch.randn(rows, width, device="cuda", generator=gen)
        plain = time_us(runs=RUNS, warmup=WARMUP, fn=lambda: topk(scores))
        eager = time_us(runs=RUNS, warmup=WARMUP, fn=lambda: topk_by_column(scores))
        comp = time_us(runs=RUNS, warmup=WARMUP, fn=lambda: compiled(scores))
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
        write_records(args.out, records, source=args.json)


if __name__ == "__main__":
    main()
