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
cutting a buffer that an admission left above CAP - 2 * 64. Both forms also run with
their sample (every 8th block first, a token cut to its sample rank when the sample ends, a
threshold with a tie position, a second pass in ascending order for a token the sample misled):
streams whose peaks sit on the sample's blocks take that second pass.

Run it with no arguments; it exits non-zero when a row differs, a buffer overflows or a cut that
drops keys would lower the threshold, or when a deliberately broken variant of the algorithm
passes. `--stats`: the cuts and admissions a random row costs in order and with the sample.
"""
import math
import random
import sys

BLOCK = 64
# How often each kind of cut ran (a check that never cut loosely, or never fell back to an exact
# cut while keys arrive, would prove little): "loose", "exact in the loop", "last".
CUTS = {"loose": 0, "exact in the loop": 0, "last": 0, "sample": 0, "ties kept whole": 0, "second pass": 0}
ADMITTED = [0]  # keys admitted, over every row selected
STRIDE = 8  # the prefill's sample: every 8th block first (RowKeys::kSampleStride)


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


def cut(buf, topk, cap, loose, broken, rank=None, keep_ties_within=0):
    """cut_to_topk at `rank` (TOPK unless given): the kept (key, position) pairs and the admission
    threshold after them, (key, tie): a later key k at position s is admitted when k > key, or
    k == key and s < tie."""
    rank = topk if rank is None else rank
    slack = min((cap - 2 * BLOCK - topk) // 4, rank // 8)
    if broken == "loose cut without a slack bound":
        slack = 1 << 30
    keys = [k for k, _ in buf]
    tau, at = kth_largest(keys, rank, len(buf), rank + slack if loose else 0)
    if loose and at <= rank + slack:
        CUTS["loose"] += 1
        if broken == "loose cut keeps only keys above the prefix":
            return [(k, p) for k, p in buf if k > tau], (tau, 0)
        return [(k, p) for k, p in buf if k >= tau], (max(tau - 1, 0), 0)
    greater = sum(1 for k in keys if k > tau)
    ties = [p for k, p in buf if k == tau]
    if greater + len(ties) <= keep_ties_within:  # a sample's last cut keeps a tie class whole
        CUTS["ties kept whole"] += 1
        return [(k, p) for k, p in buf if k >= tau], (max(tau - 1, 0), 0)
    CUTS["exact in the loop" if loose else "last"] += 1
    need = rank - greater
    tie_cut = 0  # keep a tie when ~position >= tie_cut: the `need` lowest positions
    if len(ties) > need:
        inverted = [~p & 0xFFFFFFFF for p in ties]
        if broken == "ties to the higher position":
            inverted = ties
        tie_cut, _ = kth_largest(inverted, need, len(ties))
    key_of_tie = (lambda p: p) if broken == "ties to the higher position" else (lambda p: ~p & 0xFFFFFFFF)
    kept = [(k, p) for k, p in buf if k > tau or (k == tau and key_of_tie(p) >= tie_cut)]
    tie = (~tie_cut & 0xFFFFFFFF) if len(ties) > need else 0x7FFFFFFF
    if broken == "ties admitted by key alone":
        tie = 0
    return kept, (tau, tie)


def beats(key, s, threshold):
    return key > threshold[0] or (key == threshold[0] and s < threshold[1])


def higher(a, b):
    """Whether threshold a admits less than b."""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


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


def order(blocks, stride):
    """The block numbers' blocks (kernel: block_at) and the sample's length (`sampled`)."""
    if stride == 1:
        return list(range(blocks)), 0
    strided = (blocks + stride - 1) // stride
    rest = [b for b in range(blocks) if b % stride]
    return [b * stride for b in range(strided)] + rest, min(blocks, (strided + 1) & ~1)


def sample_rank(lo, lo_t, hi_t, topk, cap, blocks_in_order, sampled):
    """The kernel's sample_rank: 0, or the rank a token keeps while the sample arrives."""
    n = hi_t - lo_t
    if n <= cap - 2 * BLOCK:
        return 0
    m = sum(max(0, min(hi_t, lo + (b + 1) * BLOCK) - max(lo_t, lo + b * BLOCK)) for b in blocks_in_order[:sampled])
    r0 = topk * m // n
    rank = r0 + 4 * math.isqrt(r0) + 8
    return min(rank, topk) if 2 * rank <= m else 0


def stream(keys, lo, hi, lo_t, hi_t, topk, blocks_in_order, sampled, rank, broken):
    """One pass: the token's buffer and count after every block in `blocks_in_order`."""
    cap = cap_for(topk)
    buf, threshold, pending = [], (0, 0), False
    last = len(blocks_in_order) - 1
    for i, blk in enumerate(blocks_in_order):
        for s in range(lo + blk * BLOCK, min(lo + (blk + 1) * BLOCK, hi)):
            if lo_t <= s < hi_t and beats(keys[s], s, threshold):
                ADMITTED[0] += 1
                buf.append((keys[s], s))
                if len(buf) > cap:
                    raise AssertionError(f"buffer overflow at block {blk}")
                pending |= len(buf) > cap - 2 * BLOCK
        vote = i % 2 == 1 or i == last
        if not vote:
            continue
        sample_end = i == sampled - 1
        if sample_end and i % 2 == 0 and i != last:
            raise AssertionError("the sample ends on a block that does not vote")
        in_sample = i < sampled and rank > 0
        r = rank if in_sample else topk
        due = pending and len(buf) > cap - 2 * BLOCK
        due = due or (sample_end and rank > 0 and len(buf) > rank)
        pending = False
        if due:
            if sample_end and rank > 0:
                CUTS["sample"] += 1
            keep_ties = cap - 2 * BLOCK if sample_end and rank > 0 else 0
            before = len(buf)
            buf, after = cut(buf, topk, cap, True, broken, r, keep_ties)
            if len(buf) < before and higher(threshold, after):
                raise AssertionError(f"a cut that dropped keys lowered the threshold at block {blk}")
            if higher(after, threshold):  # the threshold never falls
                threshold = after
    return buf


def select(keys, lo, hi, lo_t, hi_t, topk, broken=None, stride=1):
    """One token's row: keys[s] for positions s, the CTA's range [lo, hi), the token's
    [lo_t, hi_t); with `stride` > 1 the prefill's sample."""
    cap = cap_for(topk)
    blocks = (hi - lo + BLOCK - 1) // BLOCK
    blocks_in_order, sampled = order(blocks, stride)
    rank = sample_rank(lo, lo_t, hi_t, topk, cap, blocks_in_order, sampled) if stride > 1 else 0
    buf = stream(keys, lo, hi, lo_t, hi_t, topk, blocks_in_order, sampled, rank, broken)
    if rank > 0 and len(buf) < topk and broken != "no second pass":
        CUTS["second pass"] += 1
        buf = stream(keys, lo, hi, lo_t, hi_t, topk, list(range(blocks)), 0, 0, broken)
    if len(buf) > topk:
        buf, _ = cut(buf, topk, cap, False, broken)
    return write_row([p for _, p in buf], lo, hi, topk, cap, broken)


def exact(keys, lo_t, hi_t, topk):
    best = sorted(range(lo_t, hi_t), key=lambda s: (-keys[s], s))[:topk]
    return sorted(best) + [-1] * (topk - len(best))


def streams(rng, topk):
    """(name, keys after `lo` padding positions, lo) cases for one TOPK."""
    cap = cap_for(topk)
    lengths = [0, 1, 100, topk, 3 * topk + 17, 4000, 6 * topk + 200]
    for length in lengths:
        lo = rng.randrange(0, 70)
        yield "random", [rng.getrandbits(32) or 1 for _ in range(length)], lo
        yield "few values", [rng.randrange(1, 5) for _ in range(length)], lo
        yield "all equal", [7] * length, lo
        yield "rising", sorted(rng.getrandbits(20) + 0x800000 for _ in range(length)), lo
        yield "near ties", [0x80000000 + rng.randrange(300) for _ in range(length)], lo
        # The best keys on every 8th block from the CTA's start: the sample's blocks, so that
        # the sample ranks far too high and the token takes the second pass.
        yield "peaks on the sample", [
            (0xF0000000 if (i // BLOCK) % STRIDE == 0 else 0x10000000) + rng.getrandbits(20)
            for i in range(length)
        ], 0
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
                for stride in (1, STRIDE):
                    try:
                        got = select(keys, lo, hi, lo_t, hi_t, topk, broken, stride)
                    except AssertionError as e:
                        return f"{case}, stride {stride}: {e}"
                    if got != exact(keys, lo_t, hi_t, topk):
                        return f"{case}, stride {stride}: the row differs from the exact top-k"
    return None


def stats(lengths=(32768, 69632), topk=2048, rows=3):
    """Cuts and admissions a row of random keys costs in order and with the sample (what the
    sample saves; `--stats`)."""
    rng = random.Random(7)
    for n in lengths:
        for stride in (1, STRIDE):
            for kind in CUTS:
                CUTS[kind] = 0
            ADMITTED[0] = 0
            for _ in range(rows):
                keys = [rng.getrandbits(32) or 1 for _ in range(n)]
                select(keys, 0, n, 0, n, topk, None, stride)
            cuts = sum(CUTS[k] for k in ("loose", "exact in the loop", "ties kept whole")) / rows
            print(f"{n} positions, TOPK {topk}, {'sample' if stride > 1 else 'in order'}: "
                  f"{cuts:.1f} cuts and {ADMITTED[0] / rows:.0f} admissions a row "
                  f"(second passes: {CUTS['second pass']} of {rows})")


def main():
    if sys.argv[1:] == ["--stats"]:
        stats()
        return 0
    status = 0
    failure = check()
    cuts = ", ".join(f"{n} {kind}" for kind, n in CUTS.items())
    print(f"indexer selection: {'ok' if failure is None else failure} ({cuts} cuts)")
    status |= failure is not None or min(CUTS.values()) == 0
    for broken in ("loose cut keeps only keys above the prefix", "loose cut without a slack bound",
                   "ties to the higher position", "window one position short", "no second pass",
                   "ties admitted by key alone"):
        failure = check(broken)
        print(f"broken on purpose ({broken}): {'caught: ' + failure if failure else 'NOT caught'}")
        status |= failure is None
    return status


if __name__ == "__main__":
    sys.exit(main())
