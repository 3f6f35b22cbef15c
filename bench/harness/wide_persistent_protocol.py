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
from wide_vt_protocol import Barrier, Slot, check, schedule, softmax, until  # noqa: E402

K_SLOTS, VT_SLOTS = 2, 3  # the kernel's kKSlots, kVtSlots


def run(item_blocks, rng, broken=None):
    """One random schedule of one CTA over items of `item_blocks` blocks (each even)."""
    k_full = [Barrier(2) for _ in range(K_SLOTS)]
    k_empty = [Barrier(2) for _ in range(K_SLOTS)]
    k_low_empty = [Barrier(2) for _ in range(K_SLOTS)]
    vt_full = [Barrier(1) for _ in range(VT_SLOTS)]
    vt_empty = [Barrier(2) for _ in range(VT_SLOTS)]
    q_full, q_empty = Barrier(1), Barrier(2)
    k_slot = [Slot(f"K slot {s}") for s in range(K_SLOTS)]  # its high columns
    k_low = [Slot(f"K slot {s}, low columns") for s in range(K_SLOTS)]
    vt_slot = [Slot(f"V^T slot {v}") for v in range(VT_SLOTS)]
    p_tile = [Slot(f"P tile {v}") for v in range(2)]
    q_tile = Slot("Q tile")
    meets, exchanges = {}, {}

    def producer():
        gb, pending = 0, None
        for j, nb in enumerate(item_blocks):
            for st in range(max(nb, 1)):
                if st < nb:
                    b = gb + st
                    if b >= K_SLOTS:
                        yield until(k_low_empty[b % K_SLOTS], b // K_SLOTS)
                    k_low[b % K_SLOTS].write(b)
                    if b >= K_SLOTS:
                        yield until(k_empty[b % K_SLOTS], b // K_SLOTS)
                    k_slot[b % K_SLOTS].write(b)
                    k_full[b % K_SLOTS].arrive(b // K_SLOTS)
                    k_full[b % K_SLOTS].arrive(b // K_SLOTS)
                if pending is not None:
                    yield from build(pending)
                pending = gb + st if st < nb else None
                if st == 0:
                    if j > 0 and broken != "Q without q_empty":
                        yield until(q_empty, j)
                    q_tile.write(j)
                    q_full.arrive(j)
            gb += nb
        if pending is not None:
            yield from build(pending)

    def build(b):
        s, v = b % K_SLOTS, b % VT_SLOTS
        yield until(k_full[s], b // K_SLOTS + 1)
        if b >= VT_SLOTS:
            yield until(vt_empty[v], b // VT_SLOTS)
        k_low[s].read("build", b)
        k_slot[s].read("build", b)
        vt_slot[v].write(b)
        k_low[s].release("build")
        k_slot[s].release("build")
        vt_full[v].arrive(b // VT_SLOTS)
        k_low_empty[s].arrive(b // K_SLOTS)
        k_empty[s].arrive(b // K_SLOTS)

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
                    vt_slot[blk % VT_SLOTS].release("bulk")
                vt_empty[blk % VT_SLOTS].arrive(blk // VT_SLOTS)
            staging_out.clear()

        for j, nb in enumerate(item_blocks):
            pairs = nb // 2
            yield until(q_full, j + 1)
            q_tile.read((me, j), j)

            def s_block(b, release_pair):
                s = b % K_SLOTS
                yield until(k_full[s], b // K_SLOTS + 1)
                k_low[s].read(me, b)
                k_slot[s].read(me, b)
                if release_pair is None:  # an item's first S: behind it, the staging goes back
                    return_staging()
                if release_pair is not None:  # P.V of the pair before is done
                    for c in range(2):
                        blk = gb + 2 * release_pair + c
                        vt_slot[blk % VT_SLOTS].release((me, blk))
                        vt_empty[blk % VT_SLOTS].arrive(blk // VT_SLOTS)
                    p_tile[release_pair % 2].release((me, j, release_pair))
                yield None  # S's low chunks run
                k_low[s].release(me)
                k_low_empty[s].arrive(b // K_SLOTS)
                yield None  # its high chunks run
                k_slot[s].release(me)
                k_empty[s].arrive(b // K_SLOTS)

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
                    blk = gb + 2 * t + kb
                    yield until(vt_full[blk % VT_SLOTS], blk // VT_SLOTS + 1)
                    vt_slot[blk % VT_SLOTS].read((me, blk), blk)
                p_tile[t % 2].read((me, j, t), (j, t))
                if t + 1 < pairs:
                    yield from s_block(gb + 2 * (t + 1) + wg, t)
                    if t + 2 == pairs:
                        release_q(j)
                    yield from pair_softmax(t + 1)
            # Epilogue: the last P.V is done (waited for), then the statistics exchange.
            last = [gb + nb - 2, gb + nb - 1] if pairs > 0 else []
            for blk in last:
                vt_slot[blk % VT_SLOTS].release((me, blk))
            if pairs > 0:
                p_tile[(pairs - 1) % 2].release((me, j, pairs - 1))
            yield from meet(("stats", j))
            if pairs > 0:
                for blk in last:  # this warpgroup's columns of the staged rows
                    vt_slot[blk % VT_SLOTS].write(("staging", j))
                yield from meet(("staged", j))
                # Warpgroup 0's first 64 threads send every head row (bulk copies) and return
                # the slots in the next item, behind its first S, once their own copies have
                # read them (return_staging); every other thread returns them at once
                # (vt_empty counts all 256).
                if wg == 0:
                    for blk in last:
                        vt_slot[blk % VT_SLOTS].read("bulk", ("staging", j))
                    staging_out.extend(last)
                else:
                    for blk in last:
                        vt_empty[blk % VT_SLOTS].arrive(blk // VT_SLOTS)
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
