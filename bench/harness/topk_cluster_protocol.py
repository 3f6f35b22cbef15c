#!/usr/bin/env python3
"""Model check of the cluster protocol of the top-k kernel, `topk_kernel` in kernels/topk.cu.

A row goes to a cluster of CTAs. Per radix pass, each CTA zeroes its copy of the next pass's
cluster histogram (`total[buf ^ 1]`), adds its own counts into every CTA's copy of this pass's
(`total[buf]`, remote reductions in distributed shared memory), and after the cluster barrier
reads its own copy to find the pass's bin. At the end of a row each CTA publishes its kept
counts (`cta_counts`), and after a barrier the later CTAs read the earlier ones' counts
remotely; a split barrier (arrive after the reads, wait at the end of the row) keeps a CTA from
exiting while another still reads its counts (the next row's pass barriers already keep it from
rewriting them). compute-sanitizer's racecheck
does not see accesses to another CTA's shared memory, so this is where they are checked.

A schedule fails on a deadlock, a barrier phase error, an add into a histogram copy that is not
the zeroed copy of that pass (or is being read), a read of a copy that lacks a CTA's counts,
counts rewritten while another CTA reads them, counts read before they were written for the
row, or a CTA exiting while another reads its counts. Run it with no arguments; it exits non-zero when the protocol fails, or when a
deliberately broken variant of it passes.

Model: a CTA is one actor (its threads are ordered by its own barriers); remote adds land when
issued; waits may be delayed arbitrarily. Every CTA of a cluster sees the same rows, the same
number of passes a row (a pass that keeps its whole bin ends the row's passes early, for all
CTAs alike) and the same short rows (no more candidates than TOPK: no pass, no barrier).
"""
import sys

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_vt_protocol import ProtocolError, check, schedule  # noqa: E402


class ClusterBarrier:
    """`barrier.cluster.arrive` / `wait`: phase k completes when every CTA arrived k + 1 times."""

    def __init__(self, ctas):
        self.ctas = ctas
        self.arrivals = [0] * ctas

    def arrive(self, cta, waited):
        if self.arrivals[cta] != waited:
            raise ProtocolError(f"CTA {cta} arrives twice without a wait")
        self.arrivals[cta] += 1

    def done(self, phase):
        return min(self.arrivals) > phase


def run(case, rng, broken=None):
    """One random schedule of one cluster of `ctas` CTAs over rows of `passes` passes each
    (0: a short row)."""
    ctas, passes_of_rows = case
    bar = ClusterBarrier(ctas)
    buffers = 1 if broken == "one histogram copy" else 2
    # total[c][i]: the pass its zeroed copy is for, the CTAs whose counts it holds, its readers
    zeroed_for = [[None] * buffers for _ in range(ctas)]
    added = [[set() for _ in range(buffers)] for _ in range(ctas)]
    readers = [[set() for _ in range(buffers)] for _ in range(ctas)]
    counts_row = [None] * ctas  # the row each CTA's published counts are of
    counts_readers = [set() for _ in range(ctas)]
    exited = [False] * ctas  # a CTA's shared memory is gone once it exits

    def cta(c):
        phase = 0  # barrier phases this CTA has waited for

        def sync():
            nonlocal phase
            bar.arrive(c, phase)
            yield lambda: bar.done(phase)
            phase += 1

        def zero(i, q):
            if readers[c][i]:
                raise ProtocolError(f"CTA {c} zeroes copy {i} while {readers[c][i]} read it")
            if broken != "no zeroing":
                zeroed_for[c][i] = q
                added[c][i] = set()

        buf, q = 0, 0  # the copy this pass counts into; passes so far, over every row
        zero(0, 0)
        yield from sync()
        for row, passes in enumerate(passes_of_rows):
            if passes == 0:
                continue  # every candidate kept: no pass, no barrier (uniform over the cluster)
            for _ in range(passes):
                late = broken == "next copy zeroed after the barrier"
                if not late:
                    zero(buf ^ 1 if buffers == 2 else buf, q + 1)
                yield None
                for d in range(ctas):  # this CTA's counts into every copy of this pass
                    if zeroed_for[d][buf] != q or readers[d][buf]:
                        raise ProtocolError(
                            f"CTA {c} adds pass {q} into CTA {d}'s copy {buf}, zeroed for pass "
                            f"{zeroed_for[d][buf]}, read by {sorted(readers[d][buf])}")
                    added[d][buf].add(c)
                    yield None
                yield from sync()
                if late:
                    zero(buf ^ 1, q + 1)  # a faster CTA may already have added pass q + 1
                if len(added[c][buf]) != ctas:
                    raise ProtocolError(f"CTA {c} reads pass {q} missing counts of "
                                        f"{sorted(set(range(ctas)) - added[c][buf])}")
                readers[c][buf].add(c)
                yield None
                readers[c][buf].discard(c)
                buf = buf ^ 1 if buffers == 2 else buf
                q += 1
            # The kept counts, published, read by the later CTAs, released.
            if counts_readers[c]:
                raise ProtocolError(f"CTA {c} rewrites its counts while {sorted(counts_readers[c])} "
                                    "read them")
            counts_row[c] = row
            yield from sync()
            for d in range(c):
                if exited[d]:
                    raise ProtocolError(f"CTA {c} reads the counts of CTA {d}, which has exited")
                if counts_row[d] != row:
                    raise ProtocolError(f"CTA {c} reads CTA {d}'s counts of row {counts_row[d]} "
                                        f"in row {row}")
                counts_readers[d].add(c)
                yield None
                counts_readers[d].discard(c)
            if broken == "counts without the split barrier":
                continue
            bar.arrive(c, phase)  # done reading ...
            yield None  # ... the row's output written ...
            yield lambda: bar.done(phase)  # ... and every CTA done reading before the next row
            phase += 1
        if counts_readers[c]:
            raise ProtocolError(f"CTA {c} exits while {sorted(counts_readers[c])} read its counts")
        exited[c] = True

    schedule([cta(c) for c in range(ctas)], rng)


def main():
    cases = [(2, [1]), (2, [3, 0, 2]), (4, [2, 3]), (4, [1, 0, 3, 1]), (8, [3, 2]), (16, [1, 3])]
    return check("top-k cluster", run, cases, 200,
                 ("one histogram copy", "no zeroing", "next copy zeroed after the barrier",
                  "counts without the split barrier"))


if __name__ == "__main__":
    sys.exit(main())
