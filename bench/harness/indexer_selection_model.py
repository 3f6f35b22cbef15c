#!/usr/bin/env python3
"""Model check of the lightning indexer's selection (kernels/indexer_common.cuh): a token's
candidates admitted block by block against a rising threshold, cut loosely while keys arrive
and exactly at the end, and the row written from a bitmap in windows. The model follows the
kernels' arithmetic on the order keys (u32) and positions, one token at a time, and compares
every row with the exact top-k (largest keys, ties to the lower position, ascending positions,
-1 after them) on streams that stress it: random keys, a handful of distinct values (many
ties), all keys equal, keys that rise with the position (a cut every few blocks), ranges longer
than one bitmap window, empty ranges.

Both forms run one CTA (kernels/indexer_ws.cuh): a vote every second block and at the last,
cutting a buffer that an admission left above CAP - 2 * 64.

Run it with no arguments; it exits non-zero when a row differs, a buffer overflows or the
threshold falls, or when a deliberately broken variant of the algorithm passes.
"""
import random
import sys

BLOCK = 64
# How often each kind of cut ran (a check that never cut loosely, or never fell back to an exact
# cut while keys arrive, would prove little): "loose", "exact in the loop", "last".
CUTS = {"loose": 0, "exact in the loop": 0, "last": 0}


def cap_for(topk):
    return topk + max(topk // 2, 128)


def kth_largest(values, rank, at, stop_at=0):
    """The largest x with at least `rank` of `values` >= x, by bit descent from below the bits
    the smallest and largest value share; with `stop_at`, stops at a prefix of it once at most
    `stop_at` values reach it. Returns (x or the prefix, how many values reach it)."""
    most, least = max(values), min(values)
    if most == least:
        return most, at
    top = (least ^ most).bit_length() - 1
    prefix = most & ~((2 << top) - 1) & 0xFFFFFFFF
    for bit in range(top, -1, -1):
        if at <= stop_at:
            break
        cand = prefix | (1 << bit)
        reach = sum(1 for v in values if v >= cand)
        if reach >= rank:
            prefix, at = cand, reach
    return prefix, at


def cut(buf, topk, cap, loose, broken):
    """cut_to_topk: the kept (key, position) pairs and the admission threshold after them."""
    slack = (cap - 2 * BLOCK - topk) // 4
    if broken == "loose cut without a slack bound":
        slack = 1 << 30
    keys = [k for k, _ in buf]
    tau, at = kth_largest(keys, topk, len(buf), topk + slack if loose else 0)
    if loose and at <= topk + slack:
        CUTS["loose"] += 1
        if broken == "loose cut keeps only keys above the prefix":
            return [(k, p) for k, p in buf if k > tau], tau
        return [(k, p) for k, p in buf if k >= tau], max(tau - 1, 0)
    CUTS["exact in the loop" if loose else "last"] += 1
    greater = sum(1 for k in keys if k > tau)
    ties = [p for k, p in buf if k == tau]
    need = topk - greater
    tie_cut = 0  # keep a tie when ~position >= tie_cut: the `need` lowest positions
    if len(ties) > need:
        inverted = [~p & 0xFFFFFFFF for p in ties]
        if broken == "ties to the higher position":
            inverted = ties
        tie_cut, _ = kth_largest(inverted, need, len(ties))
    key_of_tie = (lambda p: p) if broken == "ties to the higher position" else (lambda p: ~p & 0xFFFFFFFF)
    kept = [(k, p) for k, p in buf if k > tau or (k == tau and key_of_tie(p) >= tie_cut)]
    return kept, tau


def write_row(positions, lo, hi, topk, cap, broken):
    """write_sorted_row: the positions in ascending order from a bitmap of 64 CAP positions a
    window over [lo, hi), then -1."""
    window = 64 * cap
    out = []
    if hi > lo and positions:
        for w0 in range(lo, hi, window):
            span = min(hi - w0, window)
            if broken == "window one position short":
                span -= 1
            out += sorted(p for p in positions if 0 <= p - w0 < span)
    return out + [-1] * (topk - len(out))


def select(keys, lo, hi, lo_t, hi_t, topk, broken=None):
    """One token's row: keys[s] for positions s, the CTA's range [lo, hi), the token's
    [lo_t, hi_t)."""
    cap = cap_for(topk)
    buf, threshold, pending = [], 0, False
    blocks = (hi - lo + BLOCK - 1) // BLOCK
    for b in range(blocks):
        for s in range(lo + b * BLOCK, min(lo + (b + 1) * BLOCK, hi)):
            if lo_t <= s < hi_t and keys[s] > threshold:
                buf.append((keys[s], s))
                if len(buf) > cap:
                    raise AssertionError(f"buffer overflow at block {b}")
                pending |= len(buf) > cap - 2 * BLOCK
        vote = b % 2 == 1 or b == blocks - 1
        due = vote and pending and len(buf) > cap - 2 * BLOCK
        pending = pending and not vote
        if due:
            buf, after = cut(buf, topk, cap, True, broken)
            if after < threshold:
                raise AssertionError(f"the threshold fell at block {b}")
            threshold = after
    if len(buf) > topk:
        buf, _ = cut(buf, topk, cap, False, broken)
    return write_row([p for _, p in buf], lo, hi, topk, cap, broken)


def exact(keys, lo_t, hi_t, topk):
    best = sorted(range(lo_t, hi_t), key=lambda s: (-keys[s], s))[:topk]
    return sorted(best) + [-1] * (topk - len(best))


def streams(rng, topk):
    """(name, keys after `lo` padding positions, lo) cases for one TOPK."""
    cap = cap_for(topk)
    lengths = [0, 1, 100, topk, 3 * topk + 17, 4000]
    for length in lengths:
        lo = rng.randrange(0, 70)
        yield "random", [rng.getrandbits(32) or 1 for _ in range(length)], lo
        yield "few values", [rng.randrange(1, 5) for _ in range(length)], lo
        yield "all equal", [7] * length, lo
        yield "rising", sorted(rng.getrandbits(20) + 0x800000 for _ in range(length)), lo
        yield "near ties", [0x80000000 + rng.randrange(300) for _ in range(length)], lo
    # Longer than one bitmap window (64 CAP positions), sparse in compute: only at small TOPK.
    if topk <= 256:
        yield "two windows", [rng.getrandbits(32) or 1 for _ in range(64 * cap + 300)], 5


def check(broken=None, rounds=3):
    """The first failure as a string, or None."""
    rng = random.Random(2026)
    for topk in (128, 256, 384, 2048) * rounds:
        for name, stream, lo in streams(rng, topk):
            keys = [0] * lo + stream
            hi = len(keys)
            for _ in range(2):
                lo_t = rng.randrange(lo, hi + 1)
                hi_t = rng.randrange(lo_t, hi + 1)
                if rng.random() < 0.5:
                    lo_t, hi_t = lo, hi
                case = f"TOPK {topk}, {name}, {len(stream)} keys, token [{lo_t}, {hi_t})"
                try:
                    got = select(keys, lo, hi, lo_t, hi_t, topk, broken)
                except AssertionError as e:
                    return f"{case}: {e}"
                if got != exact(keys, lo_t, hi_t, topk):
                    return f"{case}: the row differs from the exact top-k"
    return None


def main():
    status = 0
    failure = check()
    cuts = ", ".join(f"{n} {kind}" for kind, n in CUTS.items())
    print(f"indexer selection: {'ok' if failure is None else failure} ({cuts} cuts)")
    status |= failure is not None or min(CUTS.values()) == 0
    for broken in ("loose cut keeps only keys above the prefix", "loose cut without a slack bound",
                   "ties to the higher position", "window one position short"):
        failure = check(broken)
        print(f"broken on purpose ({broken}): {'caught: ' + failure if failure else 'NOT caught'}")
        status |= failure is None
    return status


if __name__ == "__main__":
    sys.exit(main())
