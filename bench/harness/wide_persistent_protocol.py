#!/usr/bin/env python3
"""Model check of the barrier protocol of the 64-head kernel, kernels/sparse_mla_prefill.cu, on
its persistent grid: many work items a CTA (one item a CTA is bench/harness/wide_vt_protocol.py,
whose actors and checks this reuses).

What the persistent grid adds: a CTA runs several items (query row, head tile) one after the
other; K and V^T slots and their phases count blocks across them; the producer loads an item's Q
tile after its first step, once the consumers' last S of the item before is done (q_empty), and
arrives on q_full once an item (also for an item without a valid block, whose Q it does not
load); the consumers stage O in the V^T slots of the item's last pair and return those slots
(vt_empty): the threads that sent its rows in the next item, behind its first S (or at the start
of an item without a valid block), once their bulk copies have read them. A schedule fails on a deadlock, a phase error,
or a slot (K, V^T, P, Q, the staging) written while it is read or read holding another block.
Run it with no arguments; it exits non-zero when the protocol fails, or when a deliberately
broken variant passes.
"""
import sys

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_vt_protocol import (  # noqa: E402
    K_SLOTS,
    VT_SLOTS,
    Barrier,
    Ring,
    Slot,
    check,
    schedule,
    softmax,
    until,
)


def run(item_blocks, rng, broken=None):
    """One random schedule of one CTA over items of `item_blocks` blocks (each even)."""
    ring = Ring(broken)
    q_full, q_empty = Barrier(1), Barrier(2)
    p_tile = [Slot(f"P tile {v}") for v in range(2)]
    q_tile = Slot("Q tile")
    meets, exchanges = {}, {}

    def producer():
        gb, pending = 0, None
        for j, nb in enumerate(item_blocks):
            for st in range(max(nb, 1)):
                if st < nb:
                    yield from ring.gather(gb + st)
                if pending is not None:
                    yield from ring.build(pending)
                pending = gb + st if st < nb else None
                if st == 0:
                    if j > 0 and broken != "Q without q_empty":
                        yield until(q_empty, j)
                    q_tile.write(j)
                    q_full.arrive(j)
            gb += nb
        if pending is not None:
            yield from ring.build(pending)

    def consumer(wg):
        me = f"warpgroup {wg}"

        def meet(key):  # a barrier of both consumer warpgroups
            meets[key] = meets.get(key, 0) + 1
            yield lambda: meets[key] >= 2

        def release_q(j):
            q_tile.release((me, j))
            q_empty.arrive(j)

        gb = 0
        staging_out = []  # the blocks whose V^T slots this warpgroup's copies still hold

        def return_staging():
            # The storing threads wait for their copies' reads, then return the two slots.
            for blk in staging_out:
                if broken != "staging returned before the bulk stores' reads":
                    ring.vt_slot[blk % VT_SLOTS].release("bulk")
                ring.vt_empty[blk % VT_SLOTS].arrive(blk // VT_SLOTS)
            staging_out.clear()

        for j, nb in enumerate(item_blocks):
            pairs = nb // 2
            yield until(q_full, j + 1)
            q_tile.read((me, j), j)

            def s_block(b, release_pair):
                yield from ring.s_begin(me, b)
                if release_pair is None:  # an item's first S: behind it, the staging goes back
                    return_staging()
                else:  # P.V of the pair before is done
                    for c in range(2):
                        blk = gb + 2 * release_pair + c
                        ring.vt_release((me, blk), blk)
                    p_tile[release_pair % 2].release((me, j, release_pair))
                yield from ring.s_end(me, b)

            def pair_softmax(t):
                # whether pair t's vote moves the reference max: one draw, the same for both
                exchange = exchanges.setdefault((j, t), t == 0 or rng.random() < 0.3)
                yield from softmax(p_tile[t % 2], (j, t), t == 0, exchange,
                                   lambda name: meet((name, j, t)), broken)

            if pairs > 0:
                yield from s_block(gb + wg, None)
                if pairs == 1:
                    release_q(j)
                yield from pair_softmax(0)
            else:
                return_staging()
                release_q(j)
            for t in range(pairs):
                for kb in range(2):
                    yield from ring.pv_read(me, gb + 2 * t + kb)
                p_tile[t % 2].read((me, j, t), (j, t))
                if t + 1 < pairs:
                    yield from s_block(gb + 2 * (t + 1) + wg, t)
                    if t + 2 == pairs:
                        release_q(j)
                    yield from pair_softmax(t + 1)
            # Epilogue: the last P.V is done (waited for), then the statistics exchange.
            last = [gb + nb - 2, gb + nb - 1] if pairs > 0 else []
            for blk in last:
                ring.vt_slot[blk % VT_SLOTS].release((me, blk))
            if pairs > 0:
                p_tile[(pairs - 1) % 2].release((me, j, pairs - 1))
            yield from meet(("stats", j))
            if pairs > 0:
                for blk in last:  # this warpgroup's columns of the staged rows
                    ring.vt_slot[blk % VT_SLOTS].write(("staging", j))
                yield from meet(("staged", j))
                # Warpgroup 0's first 64 threads send every head row (bulk copies) and return
                # the slots in the next item, behind its first S, once their own copies have
                # read them (return_staging); every other thread returns them at once
                # (vt_empty counts all 256).
                if wg == 0:
                    for blk in last:
                        ring.vt_slot[blk % VT_SLOTS].read("bulk", ("staging", j))
                    staging_out.extend(last)
                else:
                    for blk in last:
                        ring.vt_empty[blk % VT_SLOTS].arrive(blk // VT_SLOTS)
            else:
                yield from meet(("zero", j))
            gb += nb

    schedule([producer(), consumer(0), consumer(1)], rng)


SCHEDULES = [[2], [8], [4, 4, 4], [2, 2, 2, 2], [0, 4, 0, 0, 6], [16, 2, 8], [6, 0, 2, 10, 4]]


def main():
    # cases: blocks of each of the CTA's items
    return check(f"persistent, {K_SLOTS} K / {VT_SLOTS} V^T slots", run, SCHEDULES, 300,
                 ("Q without q_empty", "staging returned before the bulk stores' reads",
                  "P rewritten without a barrier"))


if __name__ == "__main__":
    sys.exit(main())
