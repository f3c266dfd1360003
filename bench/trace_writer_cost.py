"""What the library's trace writer costs against the Python gzip writer it replaced.

One million ops (allocations of four sizes on four streams, each freed at once) written
by _core.trace_write, the writer history.save_trace and the estimator use, and by a plain
Python gzip writer of the same format; best of three each, the file sizes, and whether
both files read back as the same ops through the library's reader.

    .venv/bin/python bench/trace_writer_cost.py [--ops N]
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import tempfile
import time

from vramkit import _core


def make_ops(count: int) -> list[tuple]:
    rng = random.Random(1)
    ops = []
    for i in range(count // 2):
        size = rng.choice([512, 4096, 1 << 20, 9 << 20])
        ops.append(("a", i, size, i % 4, 1_700_000_000_000_000 + 2 * i))
        ops.append(("f", i, i % 4, 1_700_000_000_000_001 + 2 * i))
    return ops


def python_writer(path: str, ops: list[tuple]) -> None:
    with gzip.open(path, "wt", encoding="ascii") as f:
        f.write("# vramkit-trace v1 bench\n")
        for op in ops:
            f.write(" ".join(map(str, op)) + "\n")


def best_of_three(write, path: str) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        write(path)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    ops = make_ops(parser.parse_args().ops)
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for name, write in (("library writer", lambda p: _core.trace_write(p, ops, "bench")),
                            ("Python gzip writer", lambda p: python_writer(p, ops))):
            paths[name] = os.path.join(folder, name.split()[0] + ".trace.gz")
            seconds = best_of_three(write, paths[name])
            print(f"{name}: {len(ops)} ops, best of 3 {seconds:.2f} s, "
                  f"{os.path.getsize(paths[name]):,} bytes")
        read = [_core.trace_read(path, 0)[0] for path in paths.values()]
        print("the same ops read back:", read[0] == read[1])


if __name__ == "__main__":
    main()
