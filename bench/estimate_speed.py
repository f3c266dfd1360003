"""estimate_speed.py - how long the estimator's own work takes in one process: a first
estimate (imports and caches warming), then plain estimates and what-if tables of one
step, each timed, with the figures they print so that two trees can be compared for both
speed and sameness. Issue 38's targets (a plain estimate in at most 2 s, the GPT-2 what-if
table in at most 10 s) are read on these figures: the interpreter's start and the imports
of PyTorch and transformers are outside them.

    python3 bench/estimate_speed.py [--label L] [--model gpt2] [--batch 8] [--seq 1024]
                                    [--precision bf16-amp] [--plain 4] [--what-if 2]
                                    [--emulate] [--profile FILE]
                                    [--cold-what-if] [--processes N]

--emulate records on the CPU stand-in even where a GPU is present (to tell the card's
fake-CUDA path from the host's own speed); --profile writes a cProfile of the last
what-if table to FILE. --cold-what-if times a what-if table first, before any other
estimate in the process, as `vramkit estimate --what-if` computes it: with its caches
cold and (on a GPU host) CUDA not yet initialized, where the rows can be computed in
forked processes; --processes N is advise()'s (1: the rows in this process alone).

Runs on a machine without a GPU too (the CPU stand-in), slower than on a GPU host.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", default="bf16-amp")
    ap.add_argument("--plain", type=int, default=4, help="plain estimates to time")
    ap.add_argument("--what-if", type=int, default=2, help="what-if tables to time")
    ap.add_argument("--emulate", action="store_true", help="the CPU stand-in on a GPU host")
    ap.add_argument("--profile", default=None, help="cProfile of the last table to FILE")
    ap.add_argument("--cold-what-if", action="store_true",
                    help="time a what-if table before anything else")
    ap.add_argument("--processes", type=int, default=None, help="advise()'s processes")
    args = ap.parse_args()

    import vramkit.estimator as est
    from vramkit.plan.estimator import models

    def work(n):
        return models.workload(args.model, n, args.seq, args.precision)

    first = work(args.batch)
    how = {"emulate": True} if args.emulate else {}

    def table():
        return est.advise(first.step, build=first.build, batch=args.batch,
                          make_batch=lambda n: work(n).build(), processes=args.processes,
                          **how)

    advice = None
    if args.cold_what_if:
        started = time.perf_counter()
        advice = table()
        print(f"{args.label}: cold what-if {time.perf_counter() - started:.2f} s, "
              f"{len(advice.rows)} rows", flush=True)
    started = time.perf_counter()
    e = est.estimate(first.step, build=first.build, **how)
    print(f"{args.label}: first estimate {time.perf_counter() - started:.2f} s", flush=True)
    times = []
    for _ in range(args.plain):
        started = time.perf_counter()
        e = est.estimate(first.step, build=first.build, **how)
        times.append(time.perf_counter() - started)
    print(f"{args.label}: plain estimates {', '.join(f'{t:.2f}' for t in times)} s; "
          f"allocated {e.peak_allocated}, reserved {e.peak_reserved} (vramkit), "
          f"{e.torch_peak_reserved} (PyTorch)", flush=True)
    for i in range(args.what_if):
        profile = None
        if args.profile and i == args.what_if - 1:
            import cProfile
            profile = cProfile.Profile()
            profile.enable()
        started = time.perf_counter()
        advice = table()
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        print(f"{args.label}: what-if {time.perf_counter() - started:.2f} s, "
              f"{len(advice.rows)} rows", flush=True)
    if advice is not None:
        print(first.name)
        print(advice)


if __name__ == "__main__":
    main()
