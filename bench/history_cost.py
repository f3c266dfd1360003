"""What memory history costs an alloc+free pair from Python (vramkit.empty + free): history
off, on without stacks, on with Python stacks (enabled="all" and "state").

Run: python bench/history_cost.py [--pairs N] [--depth D]. The pairs run at a Python stack
D frames deep (a training step's allocations sit a dozen frames down), each setting in
several rounds interleaved, and the best round counts: the figure is the cost, not the
noise of the machine. Prints microseconds per pair and the added cost over "off".
"""

import argparse
import os
import time

os.environ.setdefault("VRAMKIT_SOURCE", "sim")

import vramkit  # noqa: E402

SETTINGS = (
    ("off", None, None),
    ("all, no stacks", "all", None),
    ("state, python stacks", "state", "python"),
    ("all, python stacks", "all", "python"),
)


def pairs(n: int) -> float:
    empty = vramkit.empty
    t0 = time.perf_counter_ns()
    for _ in range(n):
        empty(1024).free()
    return (time.perf_counter_ns() - t0) / n / 1000.0


def at_depth(depth: int, fn, *args):
    # Recursion puts the loop under `depth` real Python frames for the capture to walk.
    if depth <= 1:
        return fn(*args)
    return at_depth(depth - 1, fn, *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=12)
    args = parser.parse_args()
    best = {name: float("inf") for name, _, _ in SETTINGS}
    for _ in range(args.rounds):
        for name, enabled, stacks in SETTINGS:
            vramkit.record_memory_history(enabled=enabled, stacks=stacks,
                                          max_entries=4 * args.pairs + 16)
            best[name] = min(best[name], at_depth(args.depth, pairs, args.pairs))
        vramkit.record_memory_history(enabled=None)
    print(f"vramkit.empty(1024) + free(), source {vramkit.source()}, stack depth "
          f"{args.depth}, best of {args.rounds} rounds of {args.pairs} pairs")
    for name, _, _ in SETTINGS:
        print(f"  {name:<22} {best[name]:7.3f} us/pair  (+{best[name] - best['off']:.3f})")


if __name__ == "__main__":
    main()
