#!/usr/bin/env python3
"""Sums an ncu source page by SASS opcode, so two builds' profiles compare at a glance.

`ncu -i REP.ncu-rep --page source --csv --print-source sass > REP.csv` gives one row an
instruction (columns `Address`, `Source`, `Warp Stall Sampling (All Samples)`, `Instructions
Executed`, shared-memory wavefronts, and one `stall_<reason>` column of samples a stall
reason). This adds up those numeric columns by opcode and prints the opcodes with the most
stall samples first, each with its three largest stall reasons; given two pages (two builds of
one kernel), it prints them side by side with the change in samples, largest first. The bundle
carries it (scripts/gpu-bundle.sh), so it runs on the GPU machine beside the profile:

    python3 ncu_by_opcode.py REP.csv [TOP]
    python3 ncu_by_opcode.py BEFORE.csv AFTER.csv [TOP]
"""
import csv
import re
import sys

SAMPLES = 'Warp Stall Sampling (All Samples)'
EXECUTED = 'Instructions Executed'


def number(cell):
    try:
        return float(cell.replace(',', '')) if cell else 0.0
    except ValueError:
        return 0.0


def by_opcode(path):
    """{opcode: {column: sum}} and the totals, over the numeric columns of one source page."""
    rows = list(csv.reader(open(path, newline='', errors='replace')))
    # the header row is the first that names a Source column
    h = next(i for i, r in enumerate(rows) if any(c.strip() == 'Source' for c in r))
    head = [c.strip() for c in rows[h]]
    src = head.index('Source')
    cols = [i for i, c in enumerate(head)
            if i != src and (c.startswith('stall_') or any(k in c for k in ('Sampling', EXECUTED, 'Wavefronts')))]
    agg, total = {}, {head[i]: 0.0 for i in cols}
    for r in rows[h + 1:]:
        if len(r) <= src:
            continue
        m = re.match(r'\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)', r[src])
        if not m:
            continue
        v = agg.setdefault(m.group(2), {head[i]: 0.0 for i in cols})
        for i in cols:
            x = number(r[i]) if i < len(r) else 0.0
            v[head[i]] += x
            total[head[i]] += x
    return agg, total


def reasons(v, n=3):
    """The n stall reasons with the most samples, as `reason share%`."""
    stalls = sorted(((x, c[len('stall_'):]) for c, x in v.items() if c.startswith('stall_') and x > 0), reverse=True)
    all_samples = v.get(SAMPLES, 0.0) or sum(x for x, _ in stalls) or 1.0
    return ', '.join(f'{name} {100 * x / all_samples:.0f}%' for x, name in stalls[:n])


def one(path, top):
    agg, total = by_opcode(path)
    print(f'{path}: {total.get(SAMPLES, 0):.0f} stall samples, {total.get(EXECUTED, 0):.0f} warp instructions')
    print('top stall reasons:', reasons(total, 8))
    print(f'{"opcode":14s} {"samples":>9s} {"executed":>12s}  reasons')
    for op, v in sorted(agg.items(), key=lambda kv: -kv[1].get(SAMPLES, 0))[:top]:
        print(f'{op:14s} {v.get(SAMPLES, 0):9.0f} {v.get(EXECUTED, 0):12.0f}  {reasons(v)}')


def two(before_path, after_path, top):
    before, tb = by_opcode(before_path)
    after, ta = by_opcode(after_path)
    print(f'before {before_path}: {tb.get(SAMPLES, 0):.0f} samples, {tb.get(EXECUTED, 0):.0f} instructions')
    print(f'after  {after_path}: {ta.get(SAMPLES, 0):.0f} samples, {ta.get(EXECUTED, 0):.0f} instructions')
    print('stall reasons, samples before -> after:')
    names = sorted({c for c in list(tb) + list(ta) if c.startswith('stall_')},
                   key=lambda c: -abs(ta.get(c, 0) - tb.get(c, 0)))
    for c in names[:10]:
        print(f'  {c[len("stall_"):]:24s} {tb.get(c, 0):9.0f} -> {ta.get(c, 0):9.0f}')
    print(f'{"opcode":14s} {"samples":>19s} {"executed":>25s}  reasons after')
    ops = sorted(set(before) | set(after),
                 key=lambda o: -abs(after.get(o, {}).get(SAMPLES, 0) - before.get(o, {}).get(SAMPLES, 0)))
    for op in ops[:top]:
        b, a = before.get(op, {}), after.get(op, {})
        print(f'{op:14s} {b.get(SAMPLES, 0):9.0f} -> {a.get(SAMPLES, 0):6.0f} '
              f'{b.get(EXECUTED, 0):12.0f} -> {a.get(EXECUTED, 0):9.0f}  {reasons(a) if a else ""}')


if __name__ == '__main__':
    files = [a for a in sys.argv[1:] if not a.isdigit()]
    top = int(next((a for a in sys.argv[1:] if a.isdigit()), 30))
    if len(files) == 1:
        one(files[0], top)
    elif len(files) == 2:
        two(files[0], files[1], top)
    else:
        sys.exit(__doc__)
