"""driver/kmdf's line coverage and the callbacks it registers (its `extern "C" fn`s) that
no scenario invoked, from `llvm-cov export -format=text` on stdin. Argument: the
repository's root. Used by .ci/kmdf-coverage."""

import glob
import json
import os
import re
import subprocess
import sys

root = sys.argv[1]


def mine(path):
    return os.path.normpath(path).startswith(root + "/driver/kmdf/")


data = json.load(sys.stdin)["data"]
covered, count = 0, 0
files = sorted((f for d in data for f in d["files"] if mine(f["filename"])), key=lambda f: f["filename"])
for f in files:
    lines = f["summary"]["lines"]
    covered += lines["covered"]
    count += lines["count"]
    name = os.path.relpath(os.path.normpath(f["filename"]), root)
    print(f"  {name:32} {lines['covered']:5} of {lines['count']:5} lines  {lines['percent']:5.1f} %")
print(f"  {'driver/kmdf':32} {covered:5} of {count:5} lines  {100 * covered / max(count, 1):5.1f} %")

callbacks = set()
for path in glob.glob(root + "/driver/kmdf/*.rs"):
    with open(path) as source:
        callbacks |= set(re.findall(r'extern "C" fn ([a-z_0-9]+)', source.read()))
functions = [f for d in data for f in d["functions"] if any(mine(n) for n in f["filenames"])]
names = subprocess.run(
    ["c++filt"], input="\n".join(f["name"] for f in functions), capture_output=True, text=True
).stdout.split("\n")
invoked = {}
for f, name in zip(functions, names):
    # A const-generic callback (the verbs hook's thunks, one per slot) demangles with
    # its arguments last: `create_spl_qp::<0: usize>`.
    last = re.sub(r"::<[^<>]*>$", "", name).split("::")[-1]
    if last in callbacks:
        invoked[last] = invoked.get(last, 0) + f["count"]
never = sorted(c for c in callbacks if invoked.get(c, 0) == 0)
print(f"  callbacks: {len(callbacks) - len(never)} of {len(callbacks)} invoked; never: {', '.join(never) or 'none'}")
