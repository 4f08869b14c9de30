"""Assertion density of the Zig engine (issue 23, "assertions as the
contract"): `assert(` calls per function, per file and in all.

    python scripts/assert_density.py            # the working tree
    python scripts/assert_density.py REV        # a git revision (git show REV:src/...)

How it counts, on each src/*.zig but the build-time generators (gen_*.zig)
and the test-only file (store_test.zig):
- a function is a line declaring `fn NAME(` outside `test` blocks (nested
  helpers of a struct count; functions inside test bodies do not);
- a runtime assert is an `assert(` (std.debug.assert) outside `test` blocks
  and outside `comptime { ... }` blocks; comptime asserts (layout proofs) are
  reported apart;
- comment lines and string contents are ignored.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = re.compile(r"^(gen_.*|store_test)\.zig$")
FN = re.compile(r"^\s*(pub\s+)?(export\s+)?(inline\s+)?fn\s+\w+\s*\(")


def _code(line: str) -> str:
    """The line without its comment and with string contents blanked."""
    out, i, quote = [], 0, None
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
            i += 1
            continue
        if line.startswith("//", i):
            break
        if ch in "\"'":
            quote = ch
        out.append(ch)
        i += 1
    return "".join(out)


def count(text: str) -> tuple[int, int, int]:
    """(functions, runtime asserts, comptime asserts) of one file's text."""
    fns = runtime = comptime = 0
    skip_depth = None  # brace depth at which a test block opened
    comptime_depth = None
    depth = 0
    for raw in text.split("\n"):
        line = _code(raw)
        if skip_depth is None and re.match(r"^test\b", line):
            skip_depth = depth
        if skip_depth is None and comptime_depth is None and re.search(r"\bcomptime\s*\{", line):
            comptime_depth = depth
        if skip_depth is None:
            if FN.match(line):
                fns += 1
            n = len(re.findall(r"\bassert\(", line))
            if comptime_depth is None:
                runtime += n
            else:
                comptime += n
        depth += line.count("{") - line.count("}")
        if skip_depth is not None and depth <= skip_depth:
            skip_depth = None
        if comptime_depth is not None and depth <= comptime_depth:
            comptime_depth = None
    return fns, runtime, comptime


def sources(rev: str | None) -> dict[str, str]:
    if rev is None:
        return {os.path.basename(p): open(p, encoding="utf-8").read()
                for p in sorted(glob.glob(os.path.join(ROOT, "src", "*.zig")))}
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:src"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return {n: subprocess.run(["git", "show", f"{rev}:src/{n}"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
            for n in sorted(names) if n.endswith(".zig")}


def main(rev: str | None) -> None:
    total = [0, 0, 0]
    print(f"{'file':22} {'fns':>5} {'asserts':>8} {'per fn':>7} {'comptime':>9}")
    for name, text in sources(rev).items():
        if SKIP.match(name):
            continue
        fns, runtime, comptime = count(text)
        total = [t + v for t, v in zip(total, (fns, runtime, comptime))]
        print(f"{name:22} {fns:5} {runtime:8} {runtime / max(fns, 1):7.2f} {comptime:9}")
    fns, runtime, comptime = total
    print(f"{'all':22} {fns:5} {runtime:8} {runtime / max(fns, 1):7.2f} {comptime:9}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
