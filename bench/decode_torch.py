#!/usr/bin/env python3
"""The sparse MLA decode step in PyTorch, timed beside the shapeproof kernel of the same run.

Same shapes and inputs as `benches/mla_decode.rs`: a cache of 8192 pages of 64 tokens in
DeepSeek V3.2's FP8 format (656 bytes a token: 512 e4m3 latent values, four f32 scales, 64 bf16
RoPE values; random e4m3 bytes that are never NaN, scales 1/64), random slots, bf16 queries.
The step in plain ops (docs/kernels/mla_cache.md §8.5): gather the rows, dequantize them to
bf16 (e4m3 times the group scale, RoPE as is), S = q . K^T (bmm, bf16 in, f32 out), scale,
softmax in f32, out = P . V (bmm, bf16). GPU time per call: median of CUDA-event timings of
back-to-back calls, eager and `torch.compile`.

Reads the Rust benchmark's `mla_decode.json` of the same run (`--json`, default
$BENCH_JSON_DIR/mla_decode.json) and prints each row with the ratio PyTorch / shapeproof; with
`--out` it writes the figures in the benchmarks' JSON format (records named after the Rust
ones, `decode_b{B}_sq{s_q}_h{h}_topk{TOPK}`, with eager_us, compiled_us, shapeproof_us and the
ratios).
"""

import argparse
import os

import torch

from torch_timing import rust_records, time_us, write_records

PAGES, PAGE, TOPK, D, DV = 8192, 64, 2048, 576, 512
RUNS, WARMUP = 15, 3  # timed calls, and calls before them
SHAPES = [(128, 2, 128), (128, 2, 16), (128, 2, 8), (1, 1, 16), (1, 2, 16), (8, 1, 16),
          (8, 2, 16), (32, 1, 16), (32, 2, 16)]


def make_cache(gen):
    slots = PAGES * PAGE
    cache = torch.randint(0, 256, (slots, 656), dtype=torch.uint8, device="cuda", generator=gen)
    cache &= 0xF7  # never an e4m3 NaN
    scales = torch.full((slots, 4), 1.0 / 64.0, dtype=torch.float32, device="cuda")
    cache[:, 512:528] = scales.view(torch.uint8)
    rope = ((torch.arange(64, device="cuda", dtype=torch.float32) - 32.0) / 64.0).to(torch.bfloat16)
    cache[:, 528:656] = rope.view(torch.uint8).repeat(slots, 1)
    return cache


def step(cache, q, indices, sm_scale):
    rows, heads, _ = q.shape
    raw = cache[indices.view(-1)].view(rows, TOPK, 656)
    latent = raw[..., :512].view(torch.float8_e4m3fn).to(torch.float32)
    scale = raw[..., 512:528].contiguous().view(torch.float32)  # [rows, TOPK, 4]
    latent = (latent.view(rows, TOPK, 4, 128) * scale.unsqueeze(-1)).view(rows, TOPK, 512)
    rope = raw[..., 528:656].contiguous().view(torch.bfloat16)
    k = torch.cat([latent.to(torch.bfloat16), rope], dim=-1)  # [rows, TOPK, 576]
    s = torch.bmm(q, k.transpose(1, 2)).float() * sm_scale  # [rows, heads, TOPK]
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).to(torch.bfloat16)
    out = torch.bmm(p, k[..., :DV])
    return out, lse


def main():
    default_json = os.path.join(os.environ.get("BENCH_JSON_DIR", "."), "mla_decode.json")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=default_json, help="the Rust benchmark's mla_decode.json")
    parser.add_argument("--out", help="also write the PyTorch figures to this JSON file")
    args = parser.parse_args()
    rust = rust_records(args.json)
    gen = torch.Generator(device="cuda").manual_seed(7)
    cache = make_cache(gen)
    compiled = torch.compile(step, dynamic=True)
    records = []
    print("| (B, s_q, h_q, TOPK) | shapeproof µs | eager µs | compile µs | eager / shapeproof | compile / shapeproof |")
    print("|---|---|---|---|---|---|")
    for b, sq, h in SHAPES:
        rows = b * sq
        q = torch.empty(rows, h, D, device="cuda").uniform_(-1, 1, generator=gen).to(torch.bfloat16)
        idx = torch.randint(0, PAGES * PAGE, (rows, TOPK), device="cuda", generator=gen)
        eager = time_us(runs=RUNS, warmup=WARMUP, fn=lambda: step(cache, q, idx, 0.0417))
        comp = time_us(runs=RUNS, warmup=WARMUP, fn=lambda: compiled(cache, q, idx, 0.0417))
        name = f"decode_b{b}_sq{sq}_h{h}_topk{TOPK}"
        ours = rust.get(name, {}).get("us")
        ratio = (lambda t: t / ours if ours else None)
        print(f"| ({b}, {sq}, {h}, {TOPK}) | {ours if ours else float('nan'):.1f} | {eager:.1f} | "
              f"{comp:.1f} | {ratio(eager) or float('nan'):.1f}x | {ratio(comp) or float('nan'):.1f}x |")
        records.append({"name": name, "eager_us": eager, "compiled_us": comp,
                        "shapeproof_us": ours, "eager_over_shapeproof": ratio(eager),
                        "compiled_over_shapeproof": ratio(comp)})
    if args.out:
        write_records(args.out, records, source=args.json)


if __name__ == "__main__":
    main()
