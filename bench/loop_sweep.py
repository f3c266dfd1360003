"""loop_sweep.py - how soon a training loop stops calling the driver, on each source, for
one recorded loop at many sizes (issue 14: no driver call after a loop's second step).

A recording of a training loop (default data/recordings/resnet50_train.trace.gz: ResNet-50
trained on an H200, a first step of 2,016 ops, then 1,530 ops a step) is made longer by
repeating its last step, and every size in it is scaled by each factor: the same loop at
other batch sizes and widths, each with its own rounding to segments and granules, where
one recording alone would show one of them. Each loop is replayed on the host models of
the sources (`vramkit replay --calls-after` at every step boundary: calls are counted, not
timed) and the sweep prints the driver calls of each step and peak reserved over peak live.
The VRAMKIT_* settings of the environment apply: on sim, large blocks are in virtual
ranges by default and in fixed segments with VRAMKIT_LARGE_BLOCKS=fixed.

    python3 bench/loop_sweep.py [--sources sim,sim:vmm] [--scales 0.5,0.7,...]
                                [--steps 20] [--first 2016 --period 1530]
                                [--recording PATH] [--tool PATH] [--json]

--tool is the `vramkit` command (default: build/vramkit when it is built, else `vramkit`
on the PATH). With --json, one JSON object per source and scale, then one per source
with the totals; otherwise a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCALES = (0.5, 0.7, 0.9, 1.0, 1.1, 1.3, 1.5, 1.7, 2.0, 2.3, 3.0)


def read_ops(path: str) -> list[list[str]]:
    """The recording's ops as the fields of their lines, read by the library's trace
    reader (the one replay uses), so that a recording replay would refuse is refused here."""
    from vramkit.plot import PlotInputError, _read

    try:
        ops, _unmatched = _read.parse_trace(path, 0)
    except PlotInputError as error:
        raise SystemExit(str(error)) from None
    return [["a", str(i), str(size), str(stream), str(t)] if is_alloc
            else ["f", str(i), str(stream), str(t)] for is_alloc, i, size, stream, t in ops]


def write_loop(path: str, lines: list[str]) -> None:
    """The loop's lines written as a trace by the library's writer (the one save_trace
    uses), so that it is one replay reads."""
    from vramkit.history import write_trace

    ops = ((fields[0], *map(int, fields[1:])) for fields in (line.split() for line in lines))
    write_trace(path, ops, "loop_sweep")


def make_loop(ops: list[list[str]], first: int, period: int, steps: int,
              scale: float) -> list[str]:
    """The recording as a loop of `steps` steps (its last step repeated, ids renumbered),
    every size scaled and rounded up to PyTorch's 512 bytes."""
    recorded = 1 + (len(ops) - first) // period
    if first + (recorded - 1) * period != len(ops) or recorded < 2:
        raise SystemExit(f"the recording has {len(ops)} ops: not a first step of {first} "
                         f"ops and whole steps of {period}")
    last = ops[len(ops) - period:]
    allocated = {op[1] for op in last if op[0] == "a"}
    if allocated != {op[1] for op in last if op[0] == "f"}:
        raise SystemExit("the last step frees blocks of other steps or keeps its own: "
                         "repeating it would not be the same loop")
    stride = 1 + max(int(op[1]) for op in ops)
    span = int(last[-1][-1]) - int(last[0][-1]) + 1
    loop = list(ops)
    for k in range(1, steps - recorded + 1):
        for op in last:
            renumbered = [op[0], str(int(op[1]) + k * stride), *op[2:-1],
                          str(int(op[-1]) + k * span)]
            loop.append(renumbered)
    lines = []
    for op in loop:
        if op[0] == "a":
            op = [op[0], op[1], str(max(512, -(-int(int(op[2]) * scale) // 512) * 512)),
                  *op[3:]]
        lines.append(" ".join(op))
    return lines


def replay(tool: str, source: str, trace: str, calls_after: int) -> dict:
    done = subprocess.run([tool, "replay", "--json", "--repeat", "1", "--source", source,
                           "--calls-after", str(calls_after), trace],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"vramkit replay failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout.splitlines()[-1])


def sweep_one(tool: str, source: str, trace: str, first: int, period: int,
              steps: int) -> dict:
    """Driver calls of each step, from the calls after each step's first op."""
    bounds = [0] + [first + k * period for k in range(steps - 1)]
    after = []
    for b in bounds:
        result = replay(tool, source, trace, b)
        after.append(result["device_calls_after"])
    after.append(0)
    calls = [after[k] - after[k + 1] for k in range(steps)]
    settled = next(k for k in range(steps + 1) if not any(calls[k:]))
    return {"source": source, "reserved_over_live": result["reserved_over_live"],
            "calls_by_step": calls, "calls_from_step_2": sum(calls[2:]),
            "settled_at_step": settled}


def default_tool() -> str:
    built = os.path.join(ROOT, "build", "vramkit")
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("vramkit")
    if not found:
        raise SystemExit("no vramkit command: build it (make build) or pass --tool")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recording",
                    default=os.path.join(ROOT, "data", "recordings", "resnet50_train.trace.gz"))
    ap.add_argument("--first", type=int, default=2016, help="ops of the first step")
    ap.add_argument("--period", type=int, default=1530, help="ops of each later step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sources", default="sim,sim:vmm")
    ap.add_argument("--scales", default=",".join(map(str, SCALES)))
    ap.add_argument("--tool", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.steps < 3:
        ap.error("--steps must be at least 3")
    tool = a.tool or default_tool()
    ops = read_ops(a.recording)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (float(s) for s in a.scales.split(",")):
            trace = os.path.join(tmp, f"loop_x{scale}.trace.gz")
            write_loop(trace, make_loop(ops, a.first, a.period, a.steps, scale))
            for source in a.sources.split(","):
                row = {"scale": scale, **sweep_one(tool, source, trace, a.first, a.period,
                                                   a.steps)}
                rows.append(row)
                if a.json:
                    print(json.dumps(row), flush=True)
    for source in a.sources.split(","):
        mine = [r for r in rows if r["source"] == source]
        total = {"source": source, "loops": len(mine),
                 "calls_from_step_2": sum(r["calls_from_step_2"] for r in mine),
                 "latest_settling_step": max(r["settled_at_step"] for r in mine),
                 "mean_reserved_over_live": round(
                     sum(r["reserved_over_live"] for r in mine) / len(mine), 4)}
        if a.json:
            print(json.dumps(total))
            continue
        print(f"\n{source}: calls per step, and peak reserved over peak live")
        for r in mine:
            print(f"  x{r['scale']:<4} {r['reserved_over_live']:.3f}  "
                  + " ".join(f"{c:3d}" for c in r["calls_by_step"]))
        print(f"  {total['loops']} loops: {total['calls_from_step_2']} calls from step 2 on, "
              f"the last settled at step {total['latest_settling_step']}, mean reserved "
              f"over live {total['mean_reserved_over_live']:.4f}")


if __name__ == "__main__":
    sys.exit(main())
