#!/usr/bin/env bash
# Compares the machine code (SASS) of every kernel instantiation the NVRTC compile tests build
# at commit BASE with the working tree's, function by function: `identical`, or the change in
# instruction counts by opcode. A refactor that leaves a kernel's SASS byte-identical needs no
# GPU run to show it changed nothing. No GPU needed; BASE must be a commit whose
# tests/kernels_compile.rs writes its cubins (SHAPEPROOF_CUBIN_DIR).
#
#   scripts/sass-diff.sh HEAD~1            every instantiation
#   scripts/sass-diff.sh HEAD~1 indexer    only the instantiations whose name contains "indexer"
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# The commit, resolved here (inside the worktree, HEAD would name the worktree's own).
base=$(git rev-parse --verify "${1:?usage: sass-diff.sh BASE [name filter]}^{commit}")
filter=${2:-}

source scripts/nvrtc.sh >/dev/null
venv=$root/.cuda/venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
cuobjdump=$(ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump 2>/dev/null | head -1 || true)
nvdisasm=$(ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvdisasm 2>/dev/null | head -1 || true)
if [ -z "$cuobjdump" ] || [ -z "$nvdisasm" ]; then
    # The oldest cuobjdump and nvdisasm wheels published (they read the sm_90a cubins of the 13.0
    # compilers; cuobjdump runs nvdisasm), 5 MB.
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        nvidia-cuda-cuobjdump==13.2.86 nvidia-cuda-nvdisasm==13.2.86
    cuobjdump=$(ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump | head -1)
fi
export PATH="$(dirname "$cuobjdump"):$PATH"

out=$root/target/sass
rm -rf "$out"
mkdir -p "$out/base" "$out/new"

src=$root/target/baseline-src
if [ -d "$src" ]; then
    git -C "$src" checkout --quiet --detach "$base"
else
    git worktree add --quiet --detach "$src" "$base"
fi
echo "== cubins at $(git -C "$src" rev-parse --short HEAD)"
(cd "$src" && SHAPEPROOF_CUBIN_DIR=$out/base CARGO_TARGET_DIR=$root/target/baseline \
    cargo test --release --quiet --features nvrtc-tests --test kernels_compile >/dev/null)
echo "== cubins of the working tree"
SHAPEPROOF_CUBIN_DIR=$out/new cargo test --release --quiet --features nvrtc-tests \
    --test kernels_compile >/dev/null
if [ -z "$(ls "$out/base")" ]; then
    echo "$base's kernel tests wrote no cubins (SHAPEPROOF_CUBIN_DIR): pick a later commit" >&2
    exit 2
fi

python3 - "$cuobjdump" "$out" "$filter" <<'PY'
import collections, os, re, subprocess, sys

cuobjdump, out, name_filter = sys.argv[1:4]


def functions(cubin):
    """Function name -> its SASS lines (addresses and encodings stripped)."""
    text = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*(/\*.*)?$", line)
        if cur is not None and m:
            cur.append(m.group(1))
    return funcs


def opcode(line):
    words = line.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


names = sorted(set(os.listdir(f"{out}/base")) | set(os.listdir(f"{out}/new")))
names = [n for n in names if name_filter in n]
differ = 0
for name in names:
    old_path, new_path = f"{out}/base/{name}", f"{out}/new/{name}"
    if not os.path.exists(old_path) or not os.path.exists(new_path):
        print(f"{name[:-6]}: {'new' if os.path.exists(new_path) else 'removed'}")
        continue
    old, new = functions(old_path), functions(new_path)
    pairs = [(fn, old.get(fn, []), new.get(fn, [])) for fn in sorted(set(old) | set(new))]
    if len(old) == 1 and len(new) == 1:  # one kernel a cubin: compare it whatever its mangling
        pairs = [(next(iter(new)), next(iter(old.values())), next(iter(new.values())))]
    for fn, a, b in pairs:
        if a == b:
            print(f"identical  {name[:-6]}")
            continue
        differ += 1
        ca, cb = collections.Counter(map(opcode, a)), collections.Counter(map(opcode, b))
        delta = {k: cb[k] - ca[k] for k in set(ca) | set(cb) if cb[k] != ca[k]}
        top = ", ".join(f"{k} {v:+d}" for k, v in sorted(delta.items(), key=lambda kv: -abs(kv[1]))[:8])
        print(f"DIFFERENT  {name[:-6]}: {len(a)} -> {len(b)} instructions ({top or 'same counts'})")
print(f"{differ} of {len(names)} instantiations differ")
PY
