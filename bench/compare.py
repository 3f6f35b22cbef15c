#!/usr/bin/env python3
"""Side by side: a benchmark's rounds of one device call, main against its candidates.

`scripts/gpu-session.sh` and `run.sh compare` leave, under one folder, main's JSON
(`NAME.json`), each candidate's (`cand-<commit>/NAME.json`), main's second run (`new-2/`) and,
with a baseline build, the baseline's (`base/`). This prints, for every record of every
benchmark, each round's time and each candidate's ratio to the mean of the bracketing rounds
(main and main again, or the baseline's), so a candidate is judged against the drift of the
same machine:

    python3 bench/compare.py FOLDER [NAME ...]

A record's time is the first of its keys in TIME_KEYS; records without one are skipped.
"""
import json
import sys
from pathlib import Path

# The time of a record, in the order a record is judged by (lower is better).
TIME_KEYS = ("graph_us", "us", "ms", "prefill_us", "shapeproof_us")


def load(path):
    """The records of one JSON file by name, each as (key, time), and the file's GPU."""
    data = json.loads(path.read_text())
    out = {}
    for record in data.get("records", []):
        key = next((k for k in TIME_KEYS if isinstance(record.get(k), (int, float))), None)
        if key is not None:
            out[record["name"]] = (key, float(record[key]))
    return out, data.get("gpu", "?")


def rounds_of(folder, name):
    """Every round's file for benchmark NAME under FOLDER, as (label, path), in run order."""
    rounds = []
    if (folder / "base" / name).exists():
        rounds.append(("base", folder / "base" / name))
    if (folder / name).exists():
        rounds.append(("main", folder / name))
    for cand in sorted(folder.glob("cand-*")):
        if (cand / name).exists():
            rounds.append((cand.name, cand / name))
    if (folder / "new-2" / name).exists():
        rounds.append(("main-2", folder / "new-2" / name))
    return rounds


def compare(folder, name):
    rounds = rounds_of(folder, name)
    cands = [label for label, _ in rounds if label.startswith("cand-")]
    if not cands:
        return
    loaded = {label: load(path) for label, path in rounds}
    gpus = sorted({gpu for _, gpu in loaded.values()})
    print(f"## {name} ({', '.join(gpus)})")
    labels = [label for label, _ in rounds]
    refs = [label for label in labels if label in ("main", "main-2", "base")]
    print("| record | " + " | ".join(labels) + " | " + " | ".join(f"{c} / ref" for c in cands) + " |")
    print("|---" * (1 + len(labels) + len(cands)) + "|")
    records = list(loaded[labels[0]][0])
    for record in records:
        cells, unit = [], ""
        for label in labels:
            entry = loaded[label][0].get(record)
            unit = entry[0] if entry else unit
            cells.append(f"{entry[1]:.4g}" if entry else "-")
        ref_times = [loaded[r][0][record][1] for r in refs if record in loaded[r][0]]
        ratios = []
        for cand in cands:
            entry = loaded[cand][0].get(record)
            if entry and ref_times:
                ratios.append(f"{entry[1] / (sum(ref_times) / len(ref_times)):.3f}")
            else:
                ratios.append("-")
        print(f"| {record} ({unit}) | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    print()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    folder = Path(sys.argv[1])
    names = [n if n.endswith(".json") else n + ".json" for n in sys.argv[2:]]
    if not names:
        names = sorted({p.name for p in folder.glob("*.json")} | {p.name for p in folder.glob("cand-*/*.json")})
    for name in names:
        compare(folder, name)


if __name__ == "__main__":
    main()
