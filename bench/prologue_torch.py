#!/usr/bin/env python3
"""The Inkling prologue step in PyTorch, timed beside the shapeproof kernel of the same run.

Same geometry, shapes and stores as `benches/prologue.rs` (TP8: HQ 8, HKV 1, head dim 128, conv
width 4, no activation, residual, tau on, pages of 128): the verify step (q = 4 draft tokens)
and the extend step (sequences of 1024 tokens with cached history, conv state updated after),
each with the bf16 and the MXFP8 KV store. The math follows docs/kernels/prologue.md §1.5-§1.8
op by op: per-head RMSNorm of q, tau fold, depthwise causal conv of k and v over the cached history,
k RMSNorm, KV scatter at `loc` (MXFP8: e4m3 bytes plus E8M0 scales in the interleaved plane),
saved windows (verify) or the conv-state update (extend). Written for timing, in plain tensor
ops; it is not bit-exact with the kernel (reductions round in another order).

Each figure is GPU time per call of back-to-back calls (median of repeats), rotating over input
sets larger than L2 for the long batches, as the Rust benchmark does:
  eager          unfused PyTorch, calls queued on one stream
  compile        torch.compile (Inductor) of the same function, on one stream
  compile graph  the compiled calls captured in one CUDA graph and replayed (the method the
                 Rust benchmark uses for every shapeproof figure)

Reads the Rust benchmark's `prologue.json` of the same run and prints each row with the ratio
PyTorch time / shapeproof time. Usage: prologue_torch.py [--json PATH] [--out PATH] (--json
defaults to $BENCH_JSON_DIR/prologue.json, else ./prologue.json). With --out it also writes its
figures in the benchmarks' JSON format (`bench/results/README.md`): the commit from
$SHAPEPROOF_COMMIT, the GPU's name, the UTC date, and one record per row, named after the Rust
record it is compared with (`graph_B{B}_{store}` for the small batch, `{step}_T{T}_{store}`),
with the PyTorch times (eager_us, compiled_us, compiled_graph_us), shapeproof_us and the ratios
(null where a figure is missing).
"""

import argparse
import datetime
import json
import math
import os
import statistics
import sys

import torch

HQ, HKV, HD = 8, 1, 128
DQ, DKV = HQ * HD, HKV * HD
ROW = 1408  # packed qkvr row: q | k | v | r
K_OFF, V_OFF = DQ, DQ + DKV
W = 4
K = W - 1  # history taps
Q_DRAFT = 4
EXTEND_SEQ_LEN = 1024
PAGE = 128
EPS = 1e-6
E4M3_MAX = 448.0
LONG_TOKENS = (4096, 16384, 65536)
SMALL_SEQS = (32,)
CALLS = 20
BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn


# ---------------------------------------------------------------------------------------------
# The step (docs/kernels/prologue.md §1.5 - §1.8)
# ---------------------------------------------------------------------------------------------

def head_rms_norm(x, gamma):
    """Per-head RMSNorm in f32, rounded to bf16: x [..., HD] bf16, gamma [HD] bf16."""
    xf = x.float()
    inv = torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS)
    return (xf * inv * gamma.float()).to(BF16)


def mxfp8_encode(x):
    """OCP MX block encoding (docs/kernels/prologue.md §1.7): x [N, C] bf16 -> (e4m3 [N, C],
    E8M0 bytes [N, C/32])."""
    n, c = x.shape
    blocks = x.float().view(n, c // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    exponent = (torch.ceil(torch.log2(amax / E4M3_MAX)) + 127.0).clamp(0.0, 254.0)
    data = (blocks / torch.exp2(exponent - 127.0)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return data.view(n, c), exponent.to(torch.uint8).view(n, c // 32)


def interleaved_scale_offsets(slots):
    """Byte offsets of blocks 0..3 of head 0..HKV-1 for each KV slot in the [S/P, HKV, 32, P/32, 4]
    scale plane (docs/kernels/prologue.md §1.8): [T, HKV * 4]."""
    pc = PAGE // 32
    page, po = slots // PAGE, slots % PAGE
    head = torch.arange(HKV, device=slots.device)
    base = (page[:, None] * HKV + head[None, :]) * (32 * pc * 4) + ((po % 32) * (pc * 4) + (po // 32) * 4)[:, None]
    return (base[:, :, None] + torch.arange(4, device=slots.device)).reshape(slots.shape[0], HKV * 4)


def conv_taps(x, cache, slot, gate, bos, t):
    """The K history inputs of every token (docs/kernels/prologue.md §1.5): from qkvr where the
    input time lies in the token's sequence, else from the conv cache of its slot (zero where the
    history gate is off)."""
    pos = t - bos
    taps = []
    for i in range(K):
        u = t - K + i
        from_x = (u >= bos)[:, None]
        x_row = x[u.clamp(min=0)]
        cached = cache[slot, (pos + i).clamp(max=K - 1)] * gate[:, None]
        taps.append(torch.where(from_x, x_row, cached))
    return taps


def conv(x, taps, weight):
    """Depthwise causal conv plus residual, f32: x [T, DKV] bf16, weight [DKV, W]."""
    wf = weight.float()
    acc = x.float() * wf[:, K]
    for i in range(K):
        acc = acc + taps[i].float() * wf[:, i]
    return acc + x.float()


def prologue_step(a, o, step, store):
    """One prologue call: reads the inputs `a`, writes the outputs and caches of `o` in place."""
    qkvr, t = a["qkvr"], a["token"]
    seq = a["seq_of_token"]
    bos = a["cu_seqlens"][seq]
    slot = a["cache_indices"][seq]
    gate = a["cache_mask"][seq].to(BF16)
    tokens = qkvr.shape[0]

    # q: RMSNorm, then the tau fold (rounded after each).
    q = head_rms_norm(qkvr[:, :DQ].view(tokens, HQ, HD), a["q_gamma"])
    q = (q.float() * a["tau"][:, None, None]).to(BF16).view(tokens, DQ)

    # k, v: conv over the history, k RMSNorm.
    outs = {}
    for role, off in (("k", K_OFF), ("v", V_OFF)):
        x = qkvr[:, off:off + DKV]
        cache = o[role + "_cache"]
        taps = conv_taps(x, cache, slot, gate, bos, t)
        y = conv(x, taps, a[role + "_weight"]).to(BF16)
        outs[role] = head_rms_norm(y.view(tokens, HKV, HD), a["k_gamma"]).view(tokens, DKV) if role == "k" else y
        if step == "verify":
            # Saved windows: the conv state after each draft token, raw (ungated) inputs.
            pos = t - bos
            rows = []
            for w in range(K):
                p = pos + 1 + w
                from_cache = (p < K)[:, None]
                rows.append(torch.where(from_cache, cache[slot, p.clamp(max=K - 1)], x[(bos + p - K).clamp(min=0, max=tokens - 1)]))
            o[role + "_inter"].view(tokens, K, DKV).copy_(torch.stack(rows, 1))
        o[role + "_out"].copy_(outs[role])

    # KV scatter at loc; a negative slot goes to the pool's spare last row instead of nowhere.
    spare = o["k_buf"].shape[0] - 1
    loc = torch.where(a["loc"] >= 0, a["loc"], spare)
    if store == "bf16":
        o["q_out"].copy_(q)
        o["k_buf"].index_copy_(0, loc, outs["k"])
        o["v_buf"].index_copy_(0, loc, outs["v"])
    else:
        # e4m3 tensors are written through uint8 views (byte copies).
        q_data, q_scale = mxfp8_encode(q)
        o["q_out"].copy_(q_data.view(torch.uint8))
        o["q_scale"].copy_(q_scale.view(tokens, HQ * 4))
        offsets = interleaved_scale_offsets(loc).reshape(-1)
        for role in ("k", "v"):
            data, scale = mxfp8_encode(outs[role])
            o[role + "_buf"].index_copy_(0, loc, data.view(torch.uint8))
            o["sf" + role].index_copy_(0, offsets, scale.reshape(-1))

    if step == "extend":
        # Conv-state update from each sequence's tail, old rows read before the write.
        cu = a["cu_seqlens"]
        qlen = cu[1:] - cu[:-1]
        seq_slot = a["cache_indices"]
        has_init = a["has_initial_state"].to(BF16)
        for role, off in (("k", K_OFF), ("v", V_OFF)):
            x = qkvr[:, off:off + DKV]
            cache = o[role + "_cache"]
            old = cache[seq_slot]  # [B, K, DKV]
            seq_index = torch.arange(old.shape[0], device=old.device)
            rows = []
            for w in range(K):
                from_x = (qlen >= K - w)[:, None]
                tail = x[(cu[1:] - K + w).clamp(min=0, max=tokens - 1)]
                kept = old[seq_index, (w + qlen).clamp(max=K - 1)] * has_init[:, None]
                rows.append(torch.where(from_x, tail, kept))
            cache.index_copy_(0, seq_slot, torch.stack(rows, 1))


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def make_inputs(step, tokens, dev, weights):
    if step == "verify":
        seqs = tokens // Q_DRAFT
        cu = torch.arange(seqs + 1, device=dev, dtype=torch.int64) * Q_DRAFT
    else:
        seqs = -(-tokens // EXTEND_SEQ_LEN)
        cu = (torch.arange(seqs + 1, device=dev, dtype=torch.int64) * EXTEND_SEQ_LEN).clamp(max=tokens)
    token = torch.arange(tokens, device=dev, dtype=torch.int64)
    a = dict(weights)
    a.update(
        qkvr=(torch.rand(tokens, ROW, device=dev) * 2 - 1).to(BF16),
        token=token,
        cu_seqlens=cu,
        seq_of_token=torch.searchsorted(cu, token, right=True) - 1,
        cache_indices=torch.arange(seqs, device=dev, dtype=torch.int64),
        cache_mask=torch.ones(seqs, device=dev, dtype=torch.bool),
        has_initial_state=torch.ones(seqs, device=dev, dtype=torch.bool),
        loc=token.clone(),
        tau=1.0 + torch.rand(tokens, device=dev) * 0.2,
    )
    return a, seqs


def make_outputs(step, store, tokens, seqs, dev):
    slots = -(-tokens // PAGE) * PAGE
    pages = slots // PAGE
    kv_dtype = BF16 if store == "bf16" else torch.uint8  # MXFP8: e4m3 bytes
    o = dict(
        q_out=torch.empty(tokens, DQ, device=dev, dtype=kv_dtype),
        k_out=torch.empty(tokens, DKV, device=dev, dtype=BF16),
        v_out=torch.empty(tokens, DKV, device=dev, dtype=BF16),
        k_buf=torch.zeros(slots + 1, DKV, device=dev, dtype=kv_dtype),
        v_buf=torch.zeros(slots + 1, DKV, device=dev, dtype=kv_dtype),
        k_cache=(torch.rand(seqs, K, DKV, device=dev) - 0.5).to(BF16),
        v_cache=(torch.rand(seqs, K, DKV, device=dev) - 0.5).to(BF16),
    )
    if store == "mxfp8":
        o["q_scale"] = torch.empty(tokens, HQ * 4, device=dev, dtype=torch.uint8)
        o["sfk"] = torch.zeros((pages + 1) * HKV * 32 * (PAGE // 32) * 4, device=dev, dtype=torch.uint8)
        o["sfv"] = torch.zeros_like(o["sfk"])
    if step == "verify":
        o["k_inter"] = torch.empty(seqs, Q_DRAFT, K, DKV, device=dev, dtype=BF16)
        o["v_inter"] = torch.empty_like(o["k_inter"])
    return o


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def per_call_us(fn, sets, calls=CALLS, reps=7):
    """Median GPU time per call of `calls` back-to-back calls on the current stream."""
    for i in range(3):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start.record()
        for i in range(calls):
            fn(*sets[i % len(sets)])
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def graph_per_call_us(fn, sets, calls=CALLS, reps=7):
    """Median GPU time per call of `calls` calls captured in one CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(*sets[i % len(sets)])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(samples)


def rotating_sets(tokens):
    """As the Rust benchmark: at least 400 MB of qkvr in all for long batches, 2 to 8 sets."""
    if tokens < 4096:
        return 1
    return max(2, min(8, 400_000_000 // (tokens * ROW * 2)))


def shapeproof_us(records, step, tokens, store):
    if step == "verify" and tokens < 4096:
        rec = records.get(f"graph_B{tokens // Q_DRAFT}")
        return None if rec is None else rec[f"{store}_us"]
    rec = records.get(f"{step}_T{tokens}_{store}")
    return None if rec is None else rec["us"]


def record_name(step, tokens, store):
    """The name of the Rust record a PyTorch row is compared with (`shapeproof_us` above)."""
    if step == "verify" and tokens < 4096:
        return f"graph_B{tokens // Q_DRAFT}_{store}"
    return f"{step}_T{tokens}_{store}"


def json_number(x):
    """A number as JSON can hold it: None for a missing or non-finite figure."""
    return None if x is None or not math.isfinite(x) else float(x)


def write_records(path, gpu, rust_commit, rows):
    """The rows in the benchmarks' JSON format (benches/common/mod.rs, write_json)."""
    head = {
        "commit": os.environ.get("SHAPEPROOF_COMMIT", "unknown"),
        "gpu": gpu,
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "torch": torch.__version__,
        "shapeproof_commit": rust_commit,
    }
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append('  "records": [')
    body = [f"    {json.dumps(r, allow_nan=False)}" for r in rows]
    lines.append(",\n".join(body))
    lines += ["  ]", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_json = os.path.join(os.environ.get("BENCH_JSON_DIR", "."), "prologue.json")
    parser.add_argument("--json", default=default_json, help="the Rust benchmark's prologue.json")
    parser.add_argument("--out", help="also write the PyTorch figures to this JSON file")
    args = parser.parse_args()
    records = {}
    rust_commit = None
    if os.path.exists(args.json):
        with open(args.json) as f:
            data = json.load(f)
        records = {r["name"]: r for r in data["records"]}
        rust_commit = data.get("commit")
    else:
        print(f"note: {args.json} not found; printing PyTorch times only", file=sys.stderr)

    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"# prologue in PyTorch {torch.__version__} on {torch.cuda.get_device_name(dev)}")
    if "copy" in records:
        print(f"device copy bandwidth of the Rust benchmark's run: {records['copy']['gbs']:.0f} GB/s")
    weights = dict(
        q_gamma=(torch.rand(HD, device=dev) + 0.5).to(BF16),
        k_gamma=(torch.rand(HD, device=dev) + 0.5).to(BF16),
        k_weight=(torch.rand(DKV, W, device=dev) - 0.5).to(BF16),
        v_weight=(torch.rand(DKV, W, device=dev) - 0.5).to(BF16),
    )
    compiled = torch.compile(prologue_step, dynamic=True)

    shapes = [("verify", s * Q_DRAFT) for s in SMALL_SEQS]
    shapes += [(step, t) for step in ("verify", "extend") for t in LONG_TOKENS]
    print(f"\nGPU time per call (µs) of {CALLS} back-to-back calls; ratio = PyTorch / shapeproof.")
    print("\n| step | T | store | shapeproof | eager | compile | compile graph | eager / sp | compile / sp | compile graph / sp |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    out_rows = []
    for step, tokens in shapes:
        for store in ("bf16", "mxfp8"):
            sets = []
            for _ in range(rotating_sets(tokens)):
                a, seqs = make_inputs(step, tokens, dev, weights)
                sets.append((a, make_outputs(step, store, tokens, seqs, dev), step, store))
            eager = per_call_us(prologue_step, sets)
            comp = per_call_us(compiled, sets)
            try:
                comp_graph = graph_per_call_us(compiled, sets)
            except Exception as e:  # capture can fail on a PyTorch build; report it, keep going
                print(f"note: graph capture of the compiled step failed: {e}", file=sys.stderr)
                comp_graph = math.nan
            sp = shapeproof_us(records, step, tokens, store)
            ratio = (lambda x: f"{x / sp:.1f}x") if sp else (lambda x: "n/a")
            sp_text = f"{sp:.2f}" if sp else "n/a"
            print(f"| {step} | {tokens} | {store} | {sp_text} | {eager:.1f} | {comp:.1f} | {comp_graph:.1f} | "
                  f"{ratio(eager)} | {ratio(comp)} | {ratio(comp_graph)} |", flush=True)
            per = (lambda x: json_number(x / sp)) if sp else (lambda x: None)
            out_rows.append({
                "name": record_name(step, tokens, store),
                "tokens": tokens,
                "shapeproof_us": json_number(sp) if sp else None,
                "eager_us": json_number(eager),
                "compiled_us": json_number(comp),
                "compiled_graph_us": json_number(comp_graph),
                "eager_ratio": per(eager),
                "compiled_ratio": per(comp),
                "compiled_graph_ratio": per(comp_graph),
            })
            del sets
            torch.cuda.empty_cache()
    if args.out:
        write_records(args.out, torch.cuda.get_device_name(dev), rust_commit, out_rows)


if __name__ == "__main__":
    main()
