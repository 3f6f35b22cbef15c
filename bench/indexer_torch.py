#!/usr/bin/env python3
"""The lightning indexer in PyTorch, timed beside the shapeproof kernel of the same run.

Same shapes and inputs as `benches/indexer.rs`: e4m3 queries `[T, H, 128]` and keys `[S, 128]`
with one f32 scale a key, f32 head weights `[T, H]`; query token t's candidates are keys
`[0, history + t + 1)` (the prefill chunk, causal over its history and itself); the paged form
reads keys from pages of 64 rows through a block table, token j of a sequence of `seq_len`
positions and `next_n` query tokens seeing positions `< seq_len - next_n + j + 1`. The step is
written as an engine would write it in PyTorch:

    logits[t, s] = k_scale[s] * sum_h w[t, h] * relu(q[t, h] . k[s])

in bf16 matmuls (e4m3 values are exact in bf16; the matmul rounds each score q . k to bf16, so
a selection can differ from the exact one at near-ties: this is a timing reference, not a
correctness one) with f32 weights and sums, masked to the valid keys, then `torch.topk` of 2048
and a sort of the selected positions (shapeproof's rows are sorted), padded with -1. Chunked over query tokens (prefill; each chunk reads only the keys its
last token can see) or sequences (paged) so that the `[tokens, H, keys]` scores fit in memory.
GPU time per call: median of CUDA-event timings, eager and `torch.compile`.

Reads the Rust benchmark's `indexer.json` of the same run (`--json`, default
$BENCH_JSON_DIR/indexer.json) and prints each shape with the ratio PyTorch / shapeproof; with
`--out` it writes the figures in the benchmarks' JSON format (records named after the Rust
ones: `indexer_t{T}_hist{history}_h{H}_topk{TOPK}`, `indexer_paged_b{B}_n{next_n}_len{len}_h{H}
_topk{TOPK}`).
"""

import argparse
import os

import torch

from torch_timing import rust_records, time_us, write_records

TOPK = 2048
D = 128
PAGE = 64
RUNS, WARMUP = 3, 1  # timed calls, and calls before them (a call takes milliseconds to seconds)
PREFILL = [(4096, 65536, 64), (32768, 0, 32), (4096, 8192, 64)]  # (tokens, history, heads)
PAGED = [(128, 2, 65536), (8, 2, 65536), (1, 2, 65536), (1, 1, 65536), (128, 1, 8192)]
PAGED_HEADS = 64
CHUNK_SCORES = 1 << 30  # bf16 scores a chunk may hold: [tokens, H, keys] elements


def e4m3(shape, gen, device):
    """Random e4m3 values, no NaN pattern (as the Rust benchmark draws them)."""
    bits = torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.int32)
    bits = torch.where(bits & 0x7F == 0x7F, bits ^ 1, bits).to(torch.uint8)
    return bits.view(torch.float8_e4m3fn)


def select(logits, valid):
    """The TOPK valid positions with the largest logits of each row, ascending, -1 padded."""
    logits = logits.masked_fill(~valid, float("-inf"))
    top = torch.topk(logits, min(TOPK, logits.shape[-1]), dim=-1, sorted=False)
    idx = torch.where(torch.isfinite(top.values), top.indices, torch.full_like(top.indices, -1))
    idx = torch.sort(torch.where(idx < 0, torch.iinfo(torch.int64).max, idx), dim=-1).values
    idx = torch.where(idx == torch.iinfo(torch.int64).max, -1, idx)
    if idx.shape[-1] < TOPK:
        idx = torch.nn.functional.pad(idx, (0, TOPK - idx.shape[-1]), value=-1)
    return idx.to(torch.int32)


def logits_of(q, w, k, k_scale):
    """`[rows, keys]` f32 logits of bf16 queries `[rows, H, D]`, weights `[rows, H]` and bf16
    keys `[keys, D]` (or `[rows, keys, D]`, a row's own keys) with their scales."""
    if k.dim() == 2:
        s = torch.matmul(q, k.t())  # [rows, H, keys]
    else:
        s = torch.matmul(q, k.transpose(1, 2))
    s = torch.relu(s).float()
    out = torch.matmul(w.unsqueeze(1), s).squeeze(1)  # [rows, keys]
    return out * k_scale


def prefill_chunk(q, w, k, k_scale, ends):
    """One chunk of query rows against the keys they can see (`k` already cut to them)."""
    logits = logits_of(q.to(torch.bfloat16), w, k, k_scale)
    pos = torch.arange(k.shape[0], device=k.device)
    return select(logits, pos.unsqueeze(0) < ends.unsqueeze(1))


def prefill(fn, q, w, k, k_scale, ends, out):
    """The whole chunk: rows in chunks whose scores fit, each reading the keys it can see."""
    tokens, heads = w.shape
    k16 = k.to(torch.bfloat16)
    rows = max(1, CHUNK_SCORES // (heads * k.shape[0]))
    for a in range(0, tokens, rows):
        b = min(tokens, a + rows)
        seen = int(ends[b - 1])  # ends grow with t: the last row sees the most keys
        out[a:b] = fn(q[a:b], w[a:b], k16[:seen], k_scale[:seen], ends[a:b])
    return out


def paged_chunk(q, w, pages, scales, table, seq_len, next_n):
    """Sequences `[b, next_n]` of query rows over their pages: gather, dequantize-free bf16
    matmuls, select, and positions turned into cache slots."""
    seqs = table.shape[0]
    k = pages[table].reshape(seqs, -1, D)[:, :seq_len].to(torch.bfloat16)  # [seqs, len, D]
    ks = scales[table].reshape(seqs, -1)[:, :seq_len]                      # [seqs, len]
    qb = q.to(torch.bfloat16).reshape(seqs, next_n * q.shape[1], D)        # [seqs, n·H, D]
    s = torch.relu(torch.matmul(qb, k.transpose(1, 2))).float()            # [seqs, n·H, len]
    s = s.reshape(seqs * next_n, -1, seq_len)
    logits = torch.matmul(w.unsqueeze(1), s).squeeze(1)                    # [seqs·n, len]
    logits = logits * ks.repeat_interleave(next_n, dim=0)
    j = torch.arange(next_n, device=q.device).repeat(seqs)
    pos = torch.arange(seq_len, device=q.device)
    valid = pos.unsqueeze(0) < (seq_len - next_n + j + 1).unsqueeze(1)
    idx = select(logits, valid)
    page_of = table.repeat_interleave(next_n, dim=0).gather(1, (idx.clamp(min=0) // PAGE).long())
    slots = page_of * PAGE + idx.clamp(min=0) % PAGE
    return torch.where(idx < 0, -1, slots).to(torch.int32)


def paged(fn, q, w, pages, scales, table, seq_len, next_n, out):
    """The decode step: sequences in chunks whose scores fit."""
    batch = table.shape[0]
    heads = w.shape[1]
    per = max(1, CHUNK_SCORES // (next_n * heads * seq_len))
    for a in range(0, batch, per):
        b = min(batch, a + per)
        rows = slice(a * next_n, b * next_n)
        out[rows] = fn(q[rows], w[rows], pages, scales, table[a:b], seq_len, next_n)
    return out


def main():
    default_json = os.path.join(os.environ.get("BENCH_JSON_DIR", "."), "indexer.json")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=default_json, help="the Rust benchmark's indexer.json")
    parser.add_argument("--out", help="also write the PyTorch figures to this JSON file")
    args = parser.parse_args()
    rust = rust_records(args.json)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(11)
    compiled_prefill = torch.compile(prefill_chunk, dynamic=True)
    compiled_paged = torch.compile(paged_chunk, dynamic=True)
    records = []

    def ratio(t, ours):
        return t / ours if ours else None

    def show(x, digits=2):
        return "—" if x is None else f"{x:.{digits}f}"

    def report(name, shape, unit, digits, eager, comp):
        """One table row and record: PyTorch's times (`unit`) beside the Rust record `name`."""
        ours = rust.get(name, {}).get(unit)
        print(f"| {shape} | {show(ours, digits)} | {eager:.1f} | {comp:.1f} | "
              f"{show(ratio(eager, ours), 1)}x | {show(ratio(comp, ours), 1)}x |")
        records.append({"name": name, f"shapeproof_{unit}": ours, f"eager_{unit}": eager,
                        f"compiled_{unit}": comp})

    print("| (T, S_kv, H_IDX, TOPK) | shapeproof ms | eager ms | compiled ms | "
          "eager / shapeproof | compiled / shapeproof |")
    print("|---|---|---|---|---|---|")
    for tokens, history, heads in PREFILL:
        s_kv = history + tokens
        q = e4m3((tokens, heads, D), gen, dev)
        k = e4m3((s_kv, D), gen, dev)
        w = (torch.rand(tokens, heads, generator=gen, device=dev) - 0.5) * 0.5
        k_scale = 0.005 + torch.rand(s_kv, generator=gen, device=dev) * 0.015
        ends = history + 1 + torch.arange(tokens, device=dev)
        out = torch.empty(tokens, TOPK, dtype=torch.int32, device=dev)
        eager = time_us(runs=RUNS, warmup=WARMUP,
                        fn=lambda: prefill(prefill_chunk, q, w, k, k_scale, ends, out)) / 1e3
        comp = time_us(runs=RUNS, warmup=WARMUP,
                       fn=lambda: prefill(compiled_prefill, q, w, k, k_scale, ends, out)) / 1e3
        report(f"indexer_t{tokens}_hist{history}_h{heads}_topk{TOPK}",
               f"({tokens}, {history} + chunk causal, {heads}, {TOPK})", "ms", 3, eager, comp)
        del q, k, w, k_scale, out
        torch.cuda.empty_cache()

    print()
    print("| paged (B, next_n, seq_len, H_IDX, TOPK) | shapeproof µs | eager µs | compiled µs | "
          "eager / shapeproof | compiled / shapeproof |")
    print("|---|---|---|---|---|---|")
    for batch, next_n, seq_len in PAGED:
        per_seq = -(-seq_len // PAGE)
        n_pages = batch * per_seq
        pages = e4m3((n_pages, PAGE, D), gen, dev)
        scales = 0.005 + torch.rand(n_pages, PAGE, generator=gen, device=dev) * 0.015
        table = torch.randperm(n_pages, generator=gen, device=dev).reshape(batch, per_seq)
        rows = batch * next_n
        q = e4m3((rows, PAGED_HEADS, D), gen, dev)
        w = (torch.rand(rows, PAGED_HEADS, generator=gen, device=dev) - 0.5) * 0.5
        out = torch.empty(rows, TOPK, dtype=torch.int32, device=dev)
        eager = time_us(runs=RUNS, warmup=WARMUP, fn=lambda: paged(
            paged_chunk, q, w, pages, scales, table, seq_len, next_n, out))
        comp = time_us(runs=RUNS, warmup=WARMUP, fn=lambda: paged(
            compiled_paged, q, w, pages, scales, table, seq_len, next_n, out))
        report(f"indexer_paged_b{batch}_n{next_n}_len{seq_len}_h{PAGED_HEADS}_topk{TOPK}",
               f"({batch}, {next_n}, {seq_len}, {PAGED_HEADS}, {TOPK})", "us", 1, eager, comp)
        del pages, scales, table, q, w, out
        torch.cuda.empty_cache()
    if args.out:
        write_records(args.out, records, source=args.json)


if __name__ == "__main__":
    main()
