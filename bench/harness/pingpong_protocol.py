#!/usr/bin/env python3
"""Model check of a proposed ping-pong protocol for the 64-head kernel,
kernels/sparse_mla_prefill.cu (not built: the design on paper of bench/NOTES.md, "Ping-pong
on paper", made checkable before any code).

Today the two consumer warpgroups run in step: warpgroup w computes S and the softmax of block
w of a pair, both vote on one reference maximum, and each then multiplies both blocks' P by its
half of V (bench/harness/wide_vt_protocol.py models that). The ping-pong drops the vote:
- each block's P is taken against its own warpgroup's reference (a whole power of two in the
  log2 units of the softmax, so every rescale between references is exact) and published in a
  P slot of its own block (p_full: one arrival, the writer's);
- each warpgroup keeps its own O frame for its 256 value columns and multiplies, in ascending
  block order, the other warpgroup's older block and then its own, rescaling O by a power of two
  before a product whose reference is higher (and, rarely, scaling O up and back down around a
  product whose reference is lower: exact while the difference is below 60, where |O| stays
  below 2^88; a block further below moves the output by less than 2^-36 of |V|'s range);
- a P slot and a V^T slot are free once both warpgroups' P.V have read them (p_empty and
  vt_empty: two arrivals).
So warpgroup 1 runs about half a block behind warpgroup 0 (its P.V of block 2t waits for
warpgroup 0's softmax of 2t), and one warpgroup's softmax can overlap the other's matmuls. The
price is slots: a V^T block is read by the two warpgroups at different times.

This script answers two questions. (1) Does the protocol hold: under many random schedules of
the producer (the gathers and V^T builds of wide_vt_protocol.Ring, unchanged) and the two
consumers, no deadlock, no phase error, no slot written while read or read holding another
block; and which K / V^T / P slot counts keep it free of deadlock. (2) Which of those fit in
shared memory at d_qk 576 and 512, with 64-token blocks or with 32-token blocks (half of every
slot; S as m64n32 and P.V with k = 32 a block). Run it with no arguments; it exits non-zero when
the protocol fails at the chosen counts, or when a deliberately broken variant passes.

Model: as wide_vt_protocol (copies land when issued, waits delayed arbitrarily); a warpgroup's
P.V reads its V^T and P slots from their issue until its next S begins (the kernel learns that
they are done at the wait that precedes that S's first chunk), its last reads at the end.
"""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wide_vt_protocol as ring_model  # noqa: E402
from wide_vt_protocol import Barrier, ProtocolError, Ring, Slot, check, schedule, until  # noqa: E402

SMEM_LIMIT = 232448  # bytes of dynamic shared memory a CTA may have on sm_90
HEADS = 64  # heads of a tile: the wgmma M of S and of P.V
DV = 512  # value columns


def slot_counts(k_slots, vt_slots):
    """Points the shared Ring (module globals of wide_vt_protocol) at these slot counts."""
    ring_model.K_SLOTS, ring_model.VT_SLOTS = k_slots, vt_slots


def run(num_blocks, rng, broken=None, p_slots=3):
    """One random schedule of one work item of `num_blocks` blocks (even)."""
    ring = Ring(broken)
    p_full = [Barrier(1) for _ in range(p_slots)]  # the owner's softmax wrote it
    p_empty = [Barrier(2) for _ in range(p_slots)]  # both warpgroups' P.V have read it
    p_slot = [Slot(f"P slot {s}") for s in range(p_slots)]

    def consumer(wg):
        me = f"warpgroup {wg}"
        in_flight = []  # blocks whose P.V reads this warpgroup has issued and not yet seen done

        def retire():
            # the wait before the next S's first chunk: the P.V issued before it are complete
            for blk in in_flight:
                ring.vt_release((me, blk), blk)
                p_slot[blk % p_slots].release((me, blk))
                if broken != "P slot returned when P.V is issued":
                    p_empty[blk % p_slots].arrive(blk // p_slots)
            in_flight.clear()

        def pv(blk):
            # P.V of block blk for this warpgroup's value columns
            ps = blk % p_slots
            if blk % 2 != wg and broken != "other's P read without p_full":
                yield until(p_full[ps], blk // p_slots + 1)  # the other warpgroup's softmax
            yield from ring.pv_read(me, blk)
            p_slot[ps].read((me, blk), blk)
            if broken == "P slot returned when P.V is issued":
                p_empty[ps].arrive(blk // p_slots)  # while the asynchronous P.V still reads it
            in_flight.append(blk)

        own = range(wg, num_blocks, 2)
        for b in own:
            yield from ring.s_begin(me, b)
            retire()
            yield from ring.s_end(me, b)
            # the softmax: P of block b against this warpgroup's reference, into its P slot
            ps = b % p_slots
            if b >= p_slots and broken != "P slot rewritten without p_empty":
                yield until(p_empty[ps], b // p_slots)
            p_slot[ps].write(b)
            yield None
            p_full[ps].arrive(b // p_slots)
            # P.V in ascending block order: the other warpgroup's older block, then this one
            if b >= 1:
                yield from pv(b - 1)
            yield from pv(b)
        # the other warpgroup's last block (when it comes after this one's last)
        if num_blocks > 0 and (num_blocks - 1) % 2 != wg:
            yield from pv(num_blocks - 1)
        yield None
        retire()

    schedule([ring.producer(num_blocks), consumer(0), consumer(1)], rng)


def holds(k_slots, vt_slots, p_slots, rounds=150, cases=(2, 4, 6, 8, 16)):
    """Whether every random schedule at these counts runs to the end without a protocol error."""
    slot_counts(k_slots, vt_slots)
    rng = random.Random(2026)
    try:
        for _ in range(rounds):
            for n in cases:
                run(n, rng, None, p_slots)
    except ProtocolError as e:
        return False, str(e)
    return True, ""


def smem_bytes(d_qk, block, k_slots, vt_slots, p_slots):
    """Shared memory of the ping-pong CTA: the Q tile, the K, V^T and P slots (V^T core-matrix
    groups of 8 value columns padded by 16 bytes, as the kernel's kVtGroupStride), the softmax
    statistics (three f32 arrays of two warpgroups' 64 rows), the K slots' masks and the
    mbarriers (Q full / empty, three a K slot, two a V^T slot, two a P slot)."""
    q = HEADS * d_qk
    k = block * d_qk
    vt = (DV // 8) * (8 * block + 16)
    p = HEADS * block
    stats = 3 * 2 * 64 * 4
    bars = (2 + 3 * k_slots + 2 * vt_slots + 2 * p_slots) * 8
    return q + k_slots * k + vt_slots * vt + p_slots * p + stats + k_slots * 8 + bars


def main():
    status = 0
    # (1) Which counts are free of deadlock (V^T slots counted in blocks: a 32-token block's slot
    # is half a 64-token block's).
    print("slot counts (K, V^T, P): deadlock-free under random schedules?")
    free = []
    for k in (2, 3, 4):
        for vt in range(2, 9):
            for p in (2, 3, 4):
                ok, why = holds(k, vt, p, rounds=40)
                if ok:
                    free.append((k, vt, p))
    for k in (2, 3, 4):
        least = [c for c in free if c[0] == k]
        if least:
            vt_min = min(c[1] for c in least)
            p_min = min(c[2] for c in least if c[1] == vt_min)
            print(f"  K {k}: at least {vt_min} V^T and {p_min} P slots")
        else:
            print(f"  K {k}: none up to 8 V^T slots")
    # Expected by reasoning, and checked: with two P slots the retire point (each warpgroup
    # learns at its next S that its P.V are done) closes a cycle at every K and V^T count (the
    # next writer of a slot waits for a read that waits for that writer's slot-mate); three P
    # slots break it, with no more V^T slots than today's three (a fourth is for overlap, the
    # producer building ahead while the later warpgroup still reads, which this check of
    # deadlocks and hazards does not measure).
    if any(c[2] == 2 for c in free):
        print("FAILED: expected every count with two P slots to deadlock")
        status = 1
    if (2, 3, 3) not in free:
        print("FAILED: expected 2 K / 3 V^T / 3 P slots to hold")
        status = 1

    # (2) What fits. The formula first reproduces the kernel's own (Smem in
    # sparse_mla_prefill.cu: 192 d_qk + 119424 bytes), whose two P tiles of a pair are four
    # block-sized P slots here and have no barriers of their own.
    today = smem_bytes(576, 64, 2, 3, 4) - 4 * 2 * 8
    if today != 192 * 576 + 119424:
        print(f"FAILED: the formula gives {today} bytes for today's kernel, not {192 * 576 + 119424}")
        status = 1
    print("shared memory (bytes; limit 232448):")
    designs = [
        ("64-token blocks, K 2 / V^T 3 / P 3 (today's K and V^T slots)", 64, 2, 3, 3),
        ("64-token blocks, K 2 / V^T 4 / P 3 (one V^T block more)", 64, 2, 4, 3),
        ("32-token blocks, K 4 / V^T 6 / P 3 (today's bytes in K and V^T)", 32, 4, 6, 3),
        ("32-token blocks, K 4 / V^T 7 / P 3 (half a 64-token V^T block more)", 32, 4, 7, 3),
    ]
    for name, block, k, vt, p in designs:
        ok, why = holds(k, vt, p, rounds=60)
        sizes = {d: smem_bytes(d, block, k, vt, p) for d in (576, 512)}
        fits = ", ".join(f"d_qk {d}: {b} {'fits' if b <= SMEM_LIMIT else 'does NOT fit'}" for d, b in sizes.items())
        print(f"  {name}: protocol {'holds' if ok else 'FAILS (' + why + ')'}; {fits}")
    # Today's slots with a P slot a block fit (P 3 x 4 KB against today's two 8 KB tiles); a
    # fourth 64-token V^T slot or a seventh 32-token one does not, at 576.
    if smem_bytes(576, 64, 2, 3, 3) > SMEM_LIMIT:
        print("FAILED: today's slots with three P slots were expected to fit at 576")
        status = 1
    if smem_bytes(576, 64, 2, 4, 3) <= SMEM_LIMIT or smem_bytes(576, 32, 4, 7, 3) <= SMEM_LIMIT:
        print("FAILED: a fourth 64-token (or a seventh 32-token) V^T slot was expected not to fit at 576")
        status = 1
    if not holds(4, 6, 3)[0] or smem_bytes(576, 32, 4, 6, 3) > SMEM_LIMIT:
        print("FAILED: the 32-token design (K 4, V^T 6, P 3) was expected to hold and to fit at 576")
        status = 1

    # (3) The chosen design under more schedules, with the broken variants that must fail.
    slot_counts(4, 6)
    status |= check(
        "ping-pong, 32-token blocks, 4 K / 6 V^T / 3 P slots",
        lambda n, rng, broken: run(n, rng, broken, 3),
        (0, 2, 4, 6, 8, 16),
        300,
        ("other's P read without p_full", "P slot rewritten without p_empty",
         "P slot returned when P.V is issued", "build without vt_empty", "gathers without k_empty"),
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
