#!/usr/bin/env python3
"""Model check of the barrier protocol of the lightning indexer's warp-specialised CTA,
`indexer_ws_body` in kernels/indexer_ws.cuh, with two consumer warpgroups (the prefill), three
(the prefill at 32 heads) and one (the paged form).

A producer warp fills a ring of key stages (each completing on its `full` mbarrier); the
consumer warpgroups (two or one) of four warps each take every block: a warp issues its part of the
warpgroup's product of block b (a wgmma reads the stage), waits for the product before (the
product of a block completes once all four warps of the warpgroup issued it), then runs
`consume`: it reads the block's scales from the stage, arrives on the stage's `empty` mbarrier
(every consumer warp), and admits candidates (which raises its tokens' counts). Every second block (and
the last) the warpgroup votes on a cut (`bar.red.or`, a barrier of its four warps); when any
warp asks, every warp reads the counts to decide which token to cut, the cuts themselves run
behind barriers, and a last barrier keeps every warp's reads ahead of the next admissions.

A schedule fails on a deadlock, an arrival in the wrong phase, a stage written while a warp still
reads it (or read holding another block), or a count raised by one warp's admission while
another warp of its warpgroup is still deciding from it (the warps would disagree on the cut,
and a warp that cuts alone deadlocks the kernel). Run it with no arguments; it exits non-zero
when the protocol fails, or when a deliberately broken variant of it passes.

With a sample (the prefill's `kSampleStride` > 1) the first pass ends on a barrier of every
consumer warp, a `bar.red.or` whose predicate is whether a warpgroup's sample misled a token;
the CTA's first thread then writes the OR to a flag and arrives on the `decided` mbarrier,
which the producer warp waits on before it reads the flag. When the OR is set, the producer
streams every block again as block numbers `blocks .. 2 blocks - 1` (the ring's phases go on)
and every consumer warpgroup takes them all. The model checks that both sides agree on the
second pass for every choice of the warpgroups, and that its stages keep their phases.

Model: copies land as soon as they are issued; waits may be delayed arbitrarily; a product
completes as soon as the fourth warp has issued it.
"""
import sys

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_vt_protocol import Barrier, ProtocolError, Slot, check, schedule, until  # noqa: E402

STAGES = 6  # indexer::ws_stages(WGS): 6 with two consumer warpgroups, 5 with one
WARPS = 4  # warps of a consumer warpgroup
WGS = 2  # consumer warpgroups: 2 (the prefill), 3 (the prefill at 32 heads), 1 (the paged form)


SAMPLE = False  # whether the CTA samples (the prefill): the end-of-pass barrier and a second pass


def run(blocks, rng, broken=None):
    """One random schedule of one CTA over `blocks` key blocks (with a sample, a second pass
    when a warpgroup, chosen at random, finds a token misled)."""
    full = [Barrier(1) for _ in range(STAGES)]  # the producer's copies (its lanes as one)
    empty = [Barrier(WGS * WARPS) for _ in range(STAGES)]
    stage = [Slot(f"stage {s}") for s in range(STAGES)]
    issued = [dict() for _ in range(WGS)]  # warpgroup -> block -> warps that issued its product
    meets = {}  # (warpgroup, name) -> warps arrived
    votes = {}  # (warpgroup, block) -> whether the warpgroup cuts
    deciding = [set() for _ in range(WGS)]  # warps still reading counts after a cutting vote
    misled = [SAMPLE and rng.random() < 0.3 for _ in range(WGS)]  # a warpgroup's tokens misled
    end = {"arrived": 0, "any": False}  # the end-of-pass barrier (bar.red.or) of every consumer warp
    decided = Barrier(1)  # arrived on by the CTA's first thread once the flag is written
    flag = {"second pass": None}  # written by that thread before its arrival

    def meet_end(pred):  # the barrier's OR of every arrival's `pred`, once all have arrived
        end["arrived"] += 1
        end["any"] |= pred
        yield lambda: end["arrived"] >= WGS * WARPS
        return end["any"]

    def producer():
        total, b = blocks, 0
        while True:
            if SAMPLE and b == blocks:
                if broken != "producer reads the flag without waiting":
                    yield until(decided, 1)
                again = flag["second pass"]
                if again is None:
                    raise ProtocolError("the producer reads the decision before it is written")
                if again:
                    total = 2 * blocks
            if b >= total:
                return
            s = b % STAGES
            if b >= STAGES and broken != "stage refilled without empty":
                yield until(empty[s], b // STAGES)
            stage[s].write(b)
            full[s].arrive(b // STAGES)
            b += 1

    def consumer(wg, warp):
        me = (wg, warp)

        def meet(name):  # a named barrier of the warpgroup's four warps
            key = (wg, name)
            meets[key] = meets.get(key, 0) + 1
            yield lambda: meets[key] >= WARPS

        def done(b):  # the warpgroup's product of block b is complete
            return lambda: len(issued[wg].get(b, ())) == WARPS

        def issue(b):
            s = b % STAGES
            yield until(full[s], b // STAGES + 1)
            stage[s].read(me, b)
            issued[wg].setdefault(b, set()).add(warp)

        def consume(b, vote):
            s = b % STAGES
            stage[s].read(me, b)  # the scales
            stage[s].release(me)
            empty[s].arrive(b // STAGES)
            yield None
            if deciding[wg]:  # an admission raises a count
                raise ProtocolError(
                    f"warp {me} admits block {b} while warps {sorted(deciding[wg])} of its "
                    "warpgroup still decide from the counts")
            yield None
            if not vote:
                return
            yield from meet(("vote", b))
            cut = votes.setdefault((wg, b), rng.random() < 0.4)
            if not cut:
                return
            deciding[wg].add(warp)
            for token in range(2):
                yield None  # this warp reads the token's count
                if votes.setdefault((wg, b, token), rng.random() < 0.5):
                    yield from meet(("cut", b, token))  # the cut's barriers
                    yield from meet(("cut done", b, token))
            yield None  # and the thresholds
            deciding[wg].discard(warp)
            if broken != "no barrier after the cuts":
                yield from meet(("after cuts", b))

        # The kernel's loop (`stream`) over block numbers [b0, b1): the product of block b + 1
        # under block b's consume; nothing in flight across the back-edge; the last one or two
        # blocks after the loop.
        def stream(b0, b1):
            if b1 > b0:
                yield from issue(b0)
            b = b0
            while b + 2 < b1:
                yield from issue(b + 1)
                yield done(b)
                yield from consume(b, False)
                yield from issue(b + 2)
                yield done(b + 1)
                yield from consume(b + 1, True)
                yield done(b + 2)
                b += 2
            if b + 1 < b1:
                yield from issue(b + 1)
                yield done(b)
                yield from consume(b, False)
                yield done(b + 1)
                yield from consume(b + 1, True)
            elif b < b1:
                yield done(b)
                yield from consume(b, True)

        yield from stream(0, blocks)
        if not SAMPLE:
            return
        # The tokens the sample did not mislead are finished (the warpgroup's own barriers);
        # then the CTA meets, each warpgroup's first thread saying whether one was misled.
        yield from meet(("finish",))
        again = yield from meet_end(misled[wg] and warp == 0)
        if wg == 0 and warp == 0:  # the CTA's first thread hands the decision to the producer
            flag["second pass"] = again
            decided.arrive(0)
        if broken == "each warpgroup decides by its own tokens":
            again = misled[wg]
        if again:
            first = 0 if broken == "second pass numbered from 0" else blocks
            yield from meet(("reset",))
            yield from stream(first, first + blocks)

    actors = [producer()] + [consumer(wg, w) for wg in range(WGS) for w in range(WARPS)]
    schedule(actors, rng)


def main():
    global STAGES, WGS, SAMPLE
    status = 0
    for WGS, STAGES, SAMPLE, form in ((2, 6, True, "prefill"), (3, 6, True, "prefill at 32 heads"),
                                      (1, 5, True, "paged"),
                                      (2, 6, False, "logits alone, ascending")):
        broken = ["stage refilled without empty", "no barrier after the cuts"]
        if SAMPLE:
            broken += ["producer reads the flag without waiting", "second pass numbered from 0"]
        if SAMPLE and WGS > 1:  # (with one warpgroup its own tokens are the CTA's)
            broken += ["each warpgroup decides by its own tokens"]
        status |= check(f"indexer {form} ({WGS} consumer warpgroups), {STAGES} stages", run,
                        (0, 1, 2, 3, 5, 8, 13, 20), 300, tuple(broken))
    return status


if __name__ == "__main__":
    sys.exit(main())
