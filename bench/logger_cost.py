"""What vramkit.MemoryLogger.step() costs a training loop: per call when it does not write
(every > 1: the statistics are still read, for the running peaks) and per call that writes a
record (JSON lines, CSV, a callback), on the pools of this machine's source.

    VRAMKIT_SOURCE=sim python bench/logger_cost.py            # or cuda on a GPU machine
    python bench/logger_cost.py --calls 200000 --rounds 7

Each figure is the best of interleaved rounds (the least disturbed by other work on the
machine), in microseconds per call, next to a bare loop for the floor. The pool holds a few
live blocks, as a training loop's does. Writing figures are the step path only: the logger's
thread samples NVML and flushes the file every logger.SAMPLE_PERIOD (0.1 s), so neither the
NVML query nor the flush is in them (the thread's share of the CPU is, as it runs meanwhile).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import vramkit


def per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    keep = [vramkit.empty((i + 1) << 20) for i in range(16)]  # a pool that holds something
    folder = tempfile.mkdtemp(prefix="vramkit-logger-cost-")
    jsonl = vramkit.MemoryLogger(os.path.join(folder, "a.jsonl"), every=1, summary=False)
    csv_log = vramkit.MemoryLogger(os.path.join(folder, "a.csv"), every=1, summary=False)
    callback = vramkit.MemoryLogger(lambda record: None, every=1, summary=False)
    quiet = vramkit.MemoryLogger(lambda record: None, every=1 << 40, summary=False)
    quiet.step(0)  # the first call writes; every later one does not
    cases = {
        "bare loop (floor)": lambda i: None,
        "step(), not writing (every > 1)": lambda i: quiet.step(i),
        "step(), not writing, with extras": lambda i: quiet.step(i, loss=0.5, lr=1e-4),
        "step(), writing a callback record": lambda i: callback.step(i),
        "step(), writing a JSON lines record": lambda i: jsonl.step(i, loss=0.5),
        "step(), writing a CSV record": lambda i: csv_log.step(i, loss=0.5),
        "vramkit.tqdm_postfix()": lambda i: vramkit.tqdm_postfix(),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(options.rounds):
        for name, fn in cases.items():
            # Writers get a tenth of the calls: a record a call is slower and fills the disk.
            calls = options.calls if "writing a" not in name else max(1000, options.calls // 10)
            best[name] = min(best[name], per_call(fn, calls))
    print(f"MemoryLogger.step() cost, source {vramkit.source()}, best of {options.rounds} "
          f"rounds of {options.calls} calls (writers: a tenth), microseconds per call:")
    for name, value in best.items():
        print(f"  {name:<40} {value:8.2f} us")
    for log in (jsonl, csv_log, callback, quiet):
        log.close()
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    del keep


if __name__ == "__main__":
    main()
