#!/usr/bin/env python3
"""Sums an ncu source page by SASS opcode, so two builds' profiles compare at a glance.

`ncu -i REP.ncu-rep --page source --csv --print-source sass > REP.csv` gives one row an
instruction; this adds up its numeric columns (stall samples, instructions executed, shared
wavefronts) by opcode and prints the opcodes with the most stall samples first. The bundle
carries it (scripts/gpu-bundle.sh), so it runs on the GPU machine beside the profile:

    python3 ncu_by_opcode.py REP.csv [TOP]
"""
import csv, re, sys
rows = list(csv.reader(open(sys.argv[1], newline='', errors='replace')))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
# the header row is the first that names a Source column
h = next(i for i, r in enumerate(rows) if any(c.strip() == 'Source' for c in r))
head = rows[h]
src = head.index('Source')
num_cols = [i for i, c in enumerate(head) if i != src and any(k in c for k in ('Sampling', 'Instructions Executed', 'Wavefronts'))]
print('columns:', [head[i] for i in num_cols])
agg, total = {}, [0.0] * len(num_cols)
for r in rows[h + 1:]:
    if len(r) <= src:
        continue
    m = re.match(r'\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)', r[src])
    if not m:
        continue
    op = m.group(2)
    v = agg.setdefault(op, [0.0] * len(num_cols))
    for k, i in enumerate(num_cols):
        try:
            x = float(r[i].replace(',', '')) if r[i] else 0.0
        except ValueError:
            x = 0.0
        v[k] += x
        total[k] += x
key = next((k for k, i in enumerate(num_cols) if 'Sampling (All' in head[i]), 0)
print('total', ' '.join(f'{t:.0f}' for t in total))
for op, v in sorted(agg.items(), key=lambda kv: -kv[1][key])[:top]:
    print(f'{op:14s}', ' '.join(f'{x:.0f}' for x in v))
