#!/usr/bin/env python3
"""Model check of the barrier protocol of the 64-head kernel, kernels/sparse_mla_prefill.cu.

Its producer and consumer warpgroups meet only on mbarriers. This script models each of them
as a sequence of barrier arrivals and waits, in the order the kernel issues them, and runs the
model under many random schedules, for the kernel's slot counts (two K slots, three V^T slots)
and for three and two. It also models a variant that ran as a harness experiment and was not
kept (bench/NOTES.md): the two head tiles of a query row as a 2-CTA cluster that share their
gathers (each CTA gathers half of a block's rows and bulk-copies them into its peer's K slot).
Its two deliberately broken versions are what shows that the checks can fail.
Each schedule fails on one of:
- a deadlock (no actor can move);
- an arrival or transaction that lands in another phase than the block it belongs to (a
  parity wait would then be ambiguous);
- a copy into a peer's K slot that the peer still uses;
- a gather over a half that is still being copied out.

It checks the protocol, not the code: a change to the kernel's order of waits and arrivals
belongs here too. Run it with no arguments. It exits non-zero when the protocol fails, or when
a known-broken variant of it passes, which shows that the checks can fail.

Model: a block's cp.async land as soon as they are issued, and a bulk copy lands as soon as it
is issued; waits may be delayed arbitrarily. The two consumer warpgroups of a CTA meet once a
pair, in the softmax's vote.
"""
import random
import sys


class ProtocolError(Exception):
    pass


class Barrier:
    """An mbarrier: `expected` arrivals and a zero transaction count complete a phase."""

    def __init__(self, expected):
        self.expected = expected
        self.pending = expected
        self.tx = 0
        self.done = 0  # completed phases

    def arrive(self, phase, tx=0):
        if phase != self.done:
            raise ProtocolError(f"arrival for phase {phase} in phase {self.done}")
        self.pending -= 1
        self.tx += tx
        self._complete()

    def complete_tx(self, phase, tx):
        if phase != self.done:
            raise ProtocolError(f"transaction bytes for phase {phase} in phase {self.done}")
        self.tx -= tx
        self._complete()

    def _complete(self):
        if self.pending < 0:
            raise ProtocolError("more arrivals than the barrier expects")
        if self.pending == 0 and self.tx == 0:
            self.done += 1
            self.pending = self.expected


def until(bar, phases):
    """A parity wait for `phases` completed phases; it must never see one more."""

    def ready():
        if bar.done > phases:
            raise ProtocolError(f"a parity wait for phase {phases - 1} saw {bar.done} completed")
        return bar.done == phases

    return ready


def run(num_blocks, k_slots, vt_slots, share, copy_in_build=False, skip_peer_free=False, rng=random):
    """One random schedule. The two flags select known-broken variants."""
    lag = k_slots - 1  # the V^T build of block b runs in producer step b + lag
    ctas = []
    for _ in range(2 if share else 1):
        ctas.append({
            "k_full": [Barrier(3 if share else 2) for _ in range(k_slots)],
            "k_empty": [Barrier(2) for _ in range(k_slots)],  # owner's S, the V^T build
            "half_full": [Barrier(1) for _ in range(k_slots)],
            "peer_free": [Barrier(1) for _ in range(k_slots)],
            "vt_full": [Barrier(1) for _ in range(vt_slots)],
            "vt_empty": [Barrier(2) for _ in range(vt_slots)],  # P.V of both warpgroups
            "vote": {},
        })
    exited = [0]
    actors_per_cluster = 6

    def cluster_sync():
        exited[0] += 1
        yield lambda: exited[0] >= actors_per_cluster

    def producer(r):
        me, peer = ctas[r], ctas[1 - r] if share else None

        def copy(b):
            s = b % k_slots
            yield until(me["half_full"][s], b // k_slots + 1)
            if peer["k_empty"][s].done < b // k_slots:
                raise ProtocolError("a copy into a peer's K slot the peer still uses")
            peer["k_full"][s].complete_tx(b // k_slots, 1)

        for st in range(num_blocks + lag):
            if st < num_blocks:
                s, use = st % k_slots, st // k_slots
                if st >= k_slots:
                    yield until(me["k_empty"][s], use)
                if share:
                    if st >= k_slots:
                        peer["peer_free"][s].arrive(use - 1)
                        if not skip_peer_free:
                            yield until(me["peer_free"][s], use)
                    me["k_full"][s].arrive(use, tx=1)  # thread 0: the peer's copy to come
                    if st >= k_slots and peer["k_full"][s].done < use:
                        raise ProtocolError("a gather over a half still being copied out")
                    me["half_full"][s].arrive(use)
                me["k_full"][s].arrive(use)  # cp.async-tracked arrivals
                me["k_full"][s].arrive(use)  # plain arrivals
            if share and not copy_in_build and 1 <= st <= num_blocks:
                yield from copy(st - 1)
            b = st - lag
            if b >= 0:
                if share and copy_in_build:
                    yield from copy(b)
                s, v = b % k_slots, b % vt_slots
                yield until(me["k_full"][s], b // k_slots + 1)
                if b >= vt_slots:
                    yield until(me["vt_empty"][v], b // vt_slots)
                me["vt_full"][v].arrive(b // vt_slots)
                me["k_empty"][s].arrive(b // k_slots)
        if share:
            yield from cluster_sync()

    def consumer(r, wg):
        me = ctas[r]
        pairs = num_blocks // 2

        def s_begin(b, release_pair):
            yield until(me["k_full"][b % k_slots], b // k_slots + 1)
            if release_pair is not None:  # P.V of the pair before is done, block by block
                for c in range(2):
                    blk = 2 * release_pair + c
                    me["vt_empty"][blk % vt_slots].arrive(blk // vt_slots)

        def s_finish(b):
            me["k_empty"][b % k_slots].arrive(b // k_slots)

        def softmax(t):
            me["vote"][t] = me["vote"].get(t, 0) + 1
            yield lambda: me["vote"][t] >= 2

        if pairs > 0:
            yield from s_begin(wg, None)
            s_finish(wg)
            yield from softmax(0)
        for t in range(pairs):
            for kb in range(2):
                blk = 2 * t + kb
                yield until(me["vt_full"][blk % vt_slots], blk // vt_slots + 1)
            if t + 1 < pairs:
                b = 2 * (t + 1) + wg
                yield from s_begin(b, t)
                s_finish(b)
                yield from softmax(t + 1)
        if share:
            yield from cluster_sync()

    actors = []
    for r in range(len(ctas)):
        actors += [producer(r), consumer(r, 0), consumer(r, 1)]
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


def failures(schedules, **variant):
    """How many of `schedules` random schedules per case fail, and the first error."""
    rng = random.Random(2026)
    bad, first = 0, None
    for _ in range(schedules):
        for num_blocks in (0, 2, 4, 6, 8, 16):
            try:
                run(num_blocks, rng=rng, **variant)
            except ProtocolError as e:
                bad += 1
                first = first or f"{num_blocks} blocks: {e}"
    return bad, first


def main():
    ok = True
    layouts = ((2, 3), (3, 2))  # (K slots, V^T slots): the kernel's, and the one measured before
    for share in (False, True):
        for k_slots, vt_slots in layouts:
            bad, first = failures(200, k_slots=k_slots, vt_slots=vt_slots, share=share)
            name = f"{'shared gathers' if share else 'one CTA'}, {k_slots} K / {vt_slots} V^T slots"
            print(f"{name}: {'ok' if bad == 0 else f'{bad} failing schedules, e.g. {first}'}")
            ok &= bad == 0
    # Known-broken variants must fail, or the checks above prove nothing.
    for what, variant in (
        ("the copy inside the V^T build step", dict(copy_in_build=True)),
        ("no wait for the peer's free slot", dict(skip_peer_free=True)),
    ):
        bad, first = failures(200, k_slots=3, vt_slots=2, share=True, **variant)
        print(f"broken on purpose ({what}, 3 K / 2 V^T): "
              f"{'caught: ' + first if bad else 'NOT caught'}")
        ok &= bad > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
