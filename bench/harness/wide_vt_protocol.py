#!/usr/bin/env python3
"""Model check of the barrier protocol of the 64-head kernel, kernels/sparse_mla_prefill.cu,
for a CTA that runs one work item (the persistent grid's many items a CTA, and what they add,
are bench/harness/wide_persistent_protocol.py, which reuses these actors and checks).

Its producer warpgroup and its two consumer warpgroups meet only on mbarriers (k_full, and
k_low_empty / k_empty for a K slot's low columns and the rest, per K slot; vt_full / vt_empty per
V^T slot) and, between the consumers, in the softmax's vote once a pair (and, when the vote
moves the reference max, in two barriers of the exchange). The two P tiles (by pair parity)
have no barrier of their own: both warpgroups write their half of pair t's tile before the vote
of pair t (or, rewritten, before the exchange's last barrier), read all of it in P.V of pair t,
and the vote of pair t + 1 keeps the rewrite by pair t + 2 behind both warpgroups' P.V. This
script models each of them as the sequence of arrivals and waits the kernel issues, in its
order (the steps on the K and V^T slots, which the persistent model shares, in `Ring`), runs
the model under many random schedules, and tracks which block each slot holds and who is
reading it. A schedule fails on:
- a deadlock (no actor can move);
- an arrival in another phase than the block it belongs to (a parity wait would then be
  ambiguous), or a parity wait that could see two phases completed;
- a slot written while a reader still uses it, or read when it holds another block.

It checks the protocol, not the code: a change to the kernel's order of waits and arrivals
belongs here too. Run it with no arguments. It exits non-zero when the protocol fails, or when
a deliberately broken variant of it passes, which shows that the checks can fail.

Model: a block's cp.async land as soon as they are issued; waits may be delayed arbitrarily. S
reads its K slot's low columns from s_begin until its low chunks are done, the rest until
s_finish; P.V of a pair reads its two V^T slots and its P tile
from its issue until the next pair's S releases them (the last pair's reads end with the
kernel); the softmax of a pair writes its P tile before the pair's vote.
"""
import random
import sys

K_SLOTS, VT_SLOTS = 2, 3  # the kernel's kKSlots, kVtSlots


class ProtocolError(Exception):
    pass


class Barrier:
    """An mbarrier: `expected` arrivals complete a phase."""

    def __init__(self, expected):
        self.expected = expected
        self.pending = expected
        self.done = 0  # completed phases

    def arrive(self, phase):
        if phase != self.done:
            raise ProtocolError(f"arrival for phase {phase} in phase {self.done}")
        self.pending -= 1
        if self.pending == 0:
            self.done += 1
            self.pending = self.expected


def until(bar, phases):
    """A parity wait for `phases` completed phases; it must never see one more."""

    def ready():
        if bar.done > phases:
            raise ProtocolError(f"a parity wait for phase {phases - 1} saw {bar.done} completed")
        return bar.done == phases

    return ready


class Slot:
    """A shared-memory slot: the block it holds and who reads it."""

    def __init__(self, name):
        self.name, self.block, self.readers = name, None, set()

    def write(self, block):
        if self.readers:
            raise ProtocolError(f"{self.name} written with block {block} while {self.readers} read it")
        self.block = block

    def read(self, who, block):
        if self.block != block:
            raise ProtocolError(f"{who} reads block {block} from {self.name}, which holds {self.block}")
        self.readers.add(who)

    def release(self, who):
        self.readers.discard(who)


def schedule(actors, rng):
    """Runs `actors` (generators yielding their waits: None or a readiness test) to the end,
    one ready actor at a time, picked by `rng`; a state where none can move is a deadlock."""
    waits = [None] * len(actors)
    alive = [True] * len(actors)
    while any(alive):
        ready = [i for i in range(len(actors)) if alive[i] and (waits[i] is None or waits[i]())]
        if not ready:
            raise ProtocolError("deadlock")
        i = rng.choice(ready)
        try:
            waits[i] = next(actors[i])
        except StopIteration:
            alive[i] = False


class Ring:
    """The K and V^T slots, their barriers, and the steps on them that both models share: a
    block's gathers, its V^T build, and S's reads of its K slot. Blocks are the CTA's, counted
    across its items; `broken` names a known-broken variant."""

    def __init__(self, broken=None):
        self.broken = broken
        self.k_full = [Barrier(2) for _ in range(K_SLOTS)]  # cp.async-tracked + plain arrivals
        self.k_empty = [Barrier(2) for _ in range(K_SLOTS)]  # the owner's S, the V^T build
        self.k_low_empty = [Barrier(2) for _ in range(K_SLOTS)]  # the same, for the low columns
        self.vt_full = [Barrier(1) for _ in range(VT_SLOTS)]
        self.vt_empty = [Barrier(2) for _ in range(VT_SLOTS)]  # P.V of both warpgroups
        self.k_high = [Slot(f"K slot {s}") for s in range(K_SLOTS)]  # its high columns
        self.k_low = [Slot(f"K slot {s}, low columns") for s in range(K_SLOTS)]
        self.vt_slot = [Slot(f"V^T slot {v}") for v in range(VT_SLOTS)]

    def gather(self, b):
        """The gathers of block b: its slot's low columns once they are free, then the rest."""
        s, use = b % K_SLOTS, b // K_SLOTS
        if b >= K_SLOTS:
            yield until(self.k_low_empty[s], use)
        self.k_low[s].write(b)
        if b >= K_SLOTS and self.broken != "gathers without k_empty":
            yield until(self.k_empty[s], use)
        self.k_high[s].write(b)
        self.k_full[s].arrive(use)
        self.k_full[s].arrive(use)

    def producer(self, num_blocks):
        """The producer warpgroup of one item: step st gathers block st, then builds V^T of
        block st - 1."""
        for st in range(num_blocks + 1):
            if st < num_blocks:
                yield from self.gather(st)
            if st >= 1:
                yield from self.build(st - 1)

    def build(self, b):
        """V^T of block b from its K slot, once the rows have landed and the V^T slot is free."""
        s, v = b % K_SLOTS, b % VT_SLOTS
        yield until(self.k_full[s], b // K_SLOTS + 1)
        if b >= VT_SLOTS and self.broken != "build without vt_empty":
            yield until(self.vt_empty[v], b // VT_SLOTS)
        self.k_low[s].read("build", b)
        self.k_high[s].read("build", b)
        self.vt_slot[v].write(b)
        self.k_low[s].release("build")
        self.k_high[s].release("build")
        self.vt_full[v].arrive(b // VT_SLOTS)
        self.k_low_empty[s].arrive(b // K_SLOTS)
        self.k_empty[s].arrive(b // K_SLOTS)

    def s_begin(self, me, b):
        """S of block b starts reading its K slot, once it has landed."""
        s = b % K_SLOTS
        yield until(self.k_full[s], b // K_SLOTS + 1)
        self.k_low[s].read(me, b)
        self.k_high[s].read(me, b)
        if self.broken == "low columns returned before S read them":
            self.k_low_empty[s].arrive(b // K_SLOTS)  # while S still reads them

    def s_end(self, me, b):
        """S's low chunks run and return the slot's low columns, then its high chunks the rest."""
        s = b % K_SLOTS
        yield None
        self.k_low[s].release(me)
        if self.broken != "low columns returned before S read them":
            self.k_low_empty[s].arrive(b // K_SLOTS)
        yield None
        self.k_high[s].release(me)
        self.k_empty[s].arrive(b // K_SLOTS)

    def pv_read(self, me, blk):
        """P.V reads V^T of block blk, once it is built."""
        v = blk % VT_SLOTS
        yield until(self.vt_full[v], blk // VT_SLOTS + 1)
        self.vt_slot[v].read((me, blk), blk)

    def vt_release(self, who, blk):
        """V^T of block blk is no longer read by `who`: its slot goes back to the producer."""
        self.vt_slot[blk % VT_SLOTS].release(who)
        self.vt_empty[blk % VT_SLOTS].arrive(blk // VT_SLOTS)


def softmax(tile, value, first, exchange, meet, broken=None):
    """One warpgroup's softmax of a pair, in the kernel's order. After an item's first pair: the
    weights against the current reference max into this warpgroup's half of the pair's P tile,
    then the vote. When the vote moves the reference max, and always on an item's first pair
    (which has no vote): the row maxima exchanged (a barrier), the half rewritten, and a barrier
    that keeps both rewrites ahead of either warpgroup's P.V, which reads the whole tile.
    `meet(name)` is a barrier of both consumer warpgroups for this pair; `exchange` must be
    the same in both."""
    if not first:
        tile.write(value)
        yield None
        yield from meet("vote")
    if exchange:
        yield from meet("maxima")
        tile.write(value)
        yield None
        if broken != "P rewritten without a barrier":
            yield from meet("rewritten")


def run(num_blocks, rng, broken=None):
    """One random schedule; `broken` names a known-broken variant."""
    p_tiles = 1 if broken == "one P tile" else 2
    ring = Ring(broken)
    p_tile = [Slot(f"P tile {v}") for v in range(p_tiles)]
    meets, exchanges = {}, {}

    def consumer(wg):
        me = f"warpgroup {wg}"

        def s_block(b, release_pair):
            yield from ring.s_begin(me, b)
            if release_pair is not None:  # P.V of the pair before is done, block by block
                for c in range(2):
                    blk = 2 * release_pair + c
                    ring.vt_release((me, blk), blk)
                p_tile[release_pair % p_tiles].release((me, release_pair))
            yield from ring.s_end(me, b)

        def pair_softmax(t):
            def meet(name):  # a barrier of both consumer warpgroups
                key = (t, name)
                meets[key] = meets.get(key, 0) + 1
                yield lambda: meets[key] >= 2

            # whether pair t's vote moves the reference max: one draw, the same for both
            exchange = exchanges.setdefault(t, t == 0 or rng.random() < 0.3)
            yield from softmax(p_tile[t % p_tiles], t, t == 0, exchange, meet, broken)

        pairs = num_blocks // 2
        if pairs > 0:
            yield from s_block(wg, None)
            yield from pair_softmax(0)
        for t in range(pairs):
            for kb in range(2):
                yield from ring.pv_read(me, 2 * t + kb)
            p_tile[t % p_tiles].read((me, t), t)
            if t + 1 < pairs:
                yield from s_block(2 * (t + 1) + wg, t)
                yield from pair_softmax(t + 1)

    schedule([ring.producer(num_blocks), consumer(0), consumer(1)], rng)


def check(name, run_one, cases, rounds, broken_variants):
    """Runs `run_one(case, rng, broken)` under `rounds` random schedules per case, then each
    deliberately broken variant, which must fail, or the check proves nothing. Prints a verdict
    line for each and returns the exit status (0: the protocol holds and every variant fails)."""

    def failures(broken):
        rng = random.Random(2026)
        bad, first = 0, None
        for _ in range(rounds):
            for case in cases:
                try:
                    run_one(case, rng, broken)
                except ProtocolError as e:
                    bad += 1
                    first = first or f"case {case}: {e}"
        return bad, first

    bad, first = failures(None)
    print(f"{name}: {'ok' if bad == 0 else f'{bad} failing schedules, e.g. {first}'}")
    ok = bad == 0
    for broken in broken_variants:
        bad, first = failures(broken)
        print(f"broken on purpose ({broken}): {'caught: ' + first if bad else 'NOT caught'}")
        ok &= bad > 0
    return 0 if ok else 1


def main():
    # cases: blocks of the CTA's one item
    return check(f"{K_SLOTS} K / {VT_SLOTS} V^T slots", run, (0, 2, 4, 6, 8, 16), 400,
                 ("gathers without k_empty", "build without vt_empty", "one P tile",
                  "low columns returned before S read them",
                  "P rewritten without a barrier"))


if __name__ == "__main__":
    sys.exit(main())
