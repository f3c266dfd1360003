"""trace_diff.py - where two traces of one step allocate in another order: the estimator's
trace of a step beside the real step's, or two recordings. Each trace is read as the
sequence of its allocations and frees by size (block ids differ between traces and are
left out); the two sequences are aligned (difflib's longest matching runs) and every
place where they part is a difference: blocks one trace makes and the other does not, or
makes elsewhere. Prints the count, each trace's length, and the first differences with a
few ops of context on each side.

    python3 bench/trace_diff.py REAL.trace.gz ESTIMATED.trace.gz [--show 10] [--json]

Differences are what a replay's fragmentation can hang on: two traces with the same
blocks in another order can leave an allocator holding different amounts.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def tokens(path: str) -> list[str]:
    """The trace's ops as "a SIZE" and "f SIZE" (a free by the size of its block), read by
    the library's trace reader, as `vramkit replay` reads it."""
    from host_model_table import read_ops

    sizes, out = {}, []
    for op in read_ops(path):
        if op[0] == "a":
            sizes[op[1]] = op[2]
            out.append(f"a {op[2]}")
        else:
            out.append(f"f {sizes.get(op[1], 0)}")
    return out


def differences(first: list[str], second: list[str]) -> list[tuple]:
    """Where the sequences part: (kind, start in first, end, start in second, end), kind
    one of difflib's "replace", "delete" (only in first) and "insert" (only in second)."""
    matcher = difflib.SequenceMatcher(None, first, second, autojunk=False)
    return [op for op in matcher.get_opcodes() if op[0] != "equal"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--show", type=int, default=10, help="differences to print")
    ap.add_argument("--json", action="store_true", help="one JSON object: the counts")
    args = ap.parse_args(argv)
    first, second = tokens(args.first), tokens(args.second)
    found = differences(first, second)
    if args.json:
        print(json.dumps({"differences": len(found), "ops_first": len(first),
                          "ops_second": len(second)}))
        return 0
    print(f"{len(found)} differences; {len(first)} ops in {args.first}, "
          f"{len(second)} in {args.second}")
    for kind, i1, i2, j1, j2 in found[:args.show]:
        print(f"{kind} at op {i1} / {j1}:")
        print(f"   first : {' | '.join(first[max(i1 - 3, 0):i2 + 2])}")
        print(f"   second: {' | '.join(second[max(j1 - 3, 0):j2 + 2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
