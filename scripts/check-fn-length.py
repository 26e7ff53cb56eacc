#!/usr/bin/env python3
"""Fails when a function outside tests is longer than the house allows.

A long function is a long read: the house cuts them into named steps a
reader can follow (issue 54). Counted from the `fn` line to the closing
brace at the same indentation; test code (files under a `tests/` folder,
`tests.rs`, `*_tests.rs`, and everything after a file's `#[cfg(test)]`) is
not counted, nor `fuzz/` and `target/`.

Usage: scripts/check-fn-length.py [--root PATH] [--max N] [--list N]
Exit status: 0 all within the limit, 1 some are over it.
"""

import argparse
import os
import re
import sys

FN = re.compile(r'^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern "C"\s+)?fn\s+(\w+)')


def is_test_path(path):
    parts = path.split(os.sep)
    name = parts[-1]
    return "tests" in parts[:-1] or name == "tests.rs" or name.endswith("_tests.rs")


def lengths(root):
    """(lines, path, name, first line) of every function outside tests."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git", "fuzz", "node_modules")]
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root)
            if is_test_path(rel):
                continue
            lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
            end = next((i for i, l in enumerate(lines) if re.match(r"\s*#\[cfg\(test\)\]", l)), len(lines))
            for i in range(end):
                m = FN.match(lines[i])
                if not m:
                    continue
                indent, j = m.group(1), i
                while j < end and not lines[j].rstrip().endswith(("{", ";")):
                    j += 1
                if j >= end or lines[j].rstrip().endswith(";"):
                    continue  # a declaration without a body
                k = j + 1
                while k < end and lines[k] != indent + "}":
                    k += 1
                out.append((k - i + 1, rel, m.group(8), i + 1))
    return out


def main():
    root_default = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=root_default)
    ap.add_argument("--max", type=int, default=120, help="most lines a function may have (default: %(default)s)")
    ap.add_argument("--list", type=int, metavar="N", help="also list every function over N lines")
    args = ap.parse_args()
    found = sorted(lengths(args.root), reverse=True)
    if args.list is not None:
        for n, path, name, line in found:
            if n > args.list:
                print(f"{n:5} {path}:{line} {name}")
    over = [f for f in found if f[0] > args.max]
    if over:
        print(f"functions over {args.max} lines outside tests (cut them into named steps):", file=sys.stderr)
        for n, path, name, line in over:
            print(f"  {path}:{line} {name}: {n} lines", file=sys.stderr)
        return 1
    print(f"no function over {args.max} lines outside tests ({len(found)} functions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
