"""preallocate_fit.py - issue 39's RMM table, like for like: a pool that takes its whole size
S at the start and never grows, under vramkit and under RMM, on the replay traces.

  vramkit-preallocate  `vramkit replay` with VRAMKIT_PREALLOCATE=S and --capacity S: one
                       segment of S made when the pool is created, and a limit of S, so
                       nothing more is ever taken (on sim the device itself has S).
  rmm-pool-fixed       RMM's pool_memory_resource with initial_pool_size = maximum_pool_size
                       = S (bench/rmm_replay.cpp, built by bench/rmm_build.sh): dask-cuda's
                       rmm_pool_size with its maximum set to the same size.

For each trace and allocator: the time per op of a replay at S = OVER_LIVE (default 2) times
the trace's peak live bytes, and the smallest S under which the trace replays with no
out-of-memory, by bisection to 1 MiB between peak live and 4 x peak live (each try a fresh
pool). On the GPU sources `vramkit replay` runs every op on the legacy default stream, while
rmm_replay gives each trace stream a CUDA stream of its own; on sim vramkit sees the trace's
streams as they are.

    python3 bench/preallocate_fit.py --source cuda --rmm .gpu/rmm-build/rmm_replay TRACE...
    python3 bench/preallocate_fit.py --source sim data/traces/*.trace.gz   # host model only

One JSON line per (trace, allocator) on stdout, then a table. Exit status 0, or 2 for a bad
command line or a replay that could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MIB = 1 << 20


def _vramkit_replay(binary: str, source: str, trace: str, size: int, repeat: int) -> dict:
    env = dict(os.environ, VRAMKIT_PREALLOCATE=str(size))
    cmd = [binary, "replay", "--json", "--repeat", str(repeat), "--source", source,
           "--capacity", str(size), trace]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        # A preallocation larger than the device fails at pool creation: out of memory.
        if "preallocate" in done.stderr:
            return {"ooms": 1}
        sys.exit(f"preallocate_fit: {' '.join(cmd)} printed no result "
                 f"(exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads(lines[0])


def _smallest(fits, live: int) -> int | None:
    """The smallest size in MiB steps, between peak live and 4 x peak live, that fits."""
    lo, hi = max(live // MIB, 1), -(-2 * live // MIB)
    while not fits(hi * MIB):
        if hi * MIB >= 4 * live:
            return None
        lo, hi = hi, min(hi * 2, -(-4 * live // MIB))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * MIB):
            hi = mid
        else:
            lo = mid
    return hi * MIB


def vramkit_rows(args, trace: str) -> dict:
    unbounded = subprocess.run([args.vramkit, "replay", "--json", "--repeat", "1", "--source",
                                args.source, trace], capture_output=True, text=True)
    first = [line for line in unbounded.stdout.splitlines() if line.startswith("{")]
    if not first:
        sys.exit(f"preallocate_fit: cannot replay {trace}: {unbounded.stderr.strip()[-400:]}")
    live = json.loads(first[0])["peak_live_bytes"]
    size = -(-int(args.over_live * live) // 512) * 512
    timed = _vramkit_replay(args.vramkit, args.source, trace, size, args.repeat)
    smallest = _smallest(
        lambda s: _vramkit_replay(args.vramkit, args.source, trace, s, 1)["ooms"] == 0, live)
    return {"trace": timed.get("trace", os.path.basename(trace)), "allocator": "vramkit-preallocate",
            "source": args.source, "peak_live_bytes": live, "size_bytes": size,
            "ns_per_op": timed.get("ns_per_op"), "ooms": timed["ooms"],
            "device_calls": timed.get("device_calls"), "min_size_bytes": smallest,
            "min_size_over_live": round(smallest / live, 4) if smallest else None}


def rmm_rows(args, traces: list[str]) -> list[dict]:
    env = dict(os.environ, RMM_REPLAY_ALLOCATORS="rmm-pool-fixed",
               RMM_REPLAY_POOL_OVER_LIVE=str(args.over_live))
    done = subprocess.run([args.rmm, *traces], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"preallocate_fit: {args.rmm} failed (exit {done.returncode}): "
                 f"{done.stderr.strip()[-400:]}")
    rows = []
    for line in done.stdout.splitlines():
        r = json.loads(line)
        rows.append({"trace": r["trace"], "allocator": "rmm-pool-fixed",
                     "peak_live_bytes": r["peak_live_bytes"],
                     "size_bytes": r.get("pool_size_bytes"), "ns_per_op": r["ns_per_op"],
                     "ooms": 0 if r["ok"] else 1, "min_size_bytes": r["min_capacity_bytes"],
                     "min_size_over_live": r["min_capacity_over_live"]})
    return rows


def _cell(row: dict | None, key: str, fmt: str) -> str:
    if not row or row.get(key) is None:
        return "-"
    return format(float(row[key]), fmt)


def table(rows: list[dict]) -> str:
    by = {(r["trace"], r["allocator"]): r for r in rows}
    out = ["| trace | ns/op vramkit | ns/op RMM | smallest S / live, vramkit | RMM |",
           "|---|---|---|---|---|"]
    for trace in dict.fromkeys(r["trace"] for r in rows):
        v, m = by.get((trace, "vramkit-preallocate")), by.get((trace, "rmm-pool-fixed"))
        out.append(f"| {trace} | {_cell(v, 'ns_per_op', '.1f')} | {_cell(m, 'ns_per_op', '.1f')} "
                   f"| {_cell(v, 'min_size_over_live', '.3f')} "
                   f"| {_cell(m, 'min_size_over_live', '.3f')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", metavar="TRACE")
    parser.add_argument("--source", default="cuda", help="vramkit's source (default cuda)")
    parser.add_argument("--vramkit", default="build/vramkit", help="the vramkit command")
    parser.add_argument("--rmm", help="rmm_replay, for the RMM column (else vramkit alone)")
    parser.add_argument("--over-live", type=float, default=2.0,
                        help="the timed replay's S over peak live (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="timed replays, best kept")
    args = parser.parse_args(argv)
    if args.over_live < 1 or args.repeat < 1:
        parser.error("--over-live must be at least 1 and --repeat at least 1")
    rows = [vramkit_rows(args, t) for t in args.traces]
    if args.rmm:
        rows += rmm_rows(args, args.traces)
    for r in rows:
        print(json.dumps(r), flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
