"""host_model_table.py - peak reserved over peak live on the host models, for the steps of
bench/estimate_check.py and the recorded traces, under vramkit and under the estimator's
models of PyTorch's allocator (with and without expandable segments), side by side: the
fragmentation half of issue 37's "no step holds more than under PyTorch's allocator or
expandable segments", measured without a GPU.

Each workload of estimate_check.py (or those --only names) is recorded once by
vramkit.estimate on this machine (the CPU stand-in when there is no GPU) over --steps
steps, and kept in --cache so that later runs replay the same traces. Every trace is then
replayed by `vramkit replay --source sim` (the host model of the default cuda source, on a
device of the H200's 141 GB; one or two builds: --tool, --before) and by
vramkit.estimator.torch_caching. The table has, per trace: peak live, vramkit's peak
reserved over it and its driver calls (all, and in the trace's last whole step, found as
its last period of repeating sizes), and PyTorch's, native and expandable.

    python3 bench/host_model_table.py [--only gpt2,bert] [--steps 3] [--cache DIR]
                                      [--tool PATH] [--before PATH] [--json] [TRACE...]

TRACE arguments are replayed as they are (data/recordings, data/traces); with none and no
--only, every estimate_check workload is recorded (minutes on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def record(names: list[str] | None, steps: int, cache: str) -> list[str]:
    """The traces of estimate_check's workloads, recorded where the cache lacks them."""
    import estimate_check
    import vramkit

    os.makedirs(cache, exist_ok=True)
    paths = []
    for w in estimate_check.WORKLOADS:
        name = estimate_check._key(w).replace(" ", "_")
        if names and not any(n in name for n in names):
            continue
        path = os.path.join(cache, f"{name}.s{steps}.trace.gz")
        if not os.path.exists(path):
            try:
                work = estimate_check._workload(w, False)
            except estimate_check.SkipWorkload as why:
                print(f"{name}: skipped ({why})", file=sys.stderr)
                continue
            vramkit.estimate(work.step, build=work.build, steps=steps, trace_path=path)
        paths.append(path)
    return paths


def read_ops(path: str) -> list[tuple]:
    """The trace's ops as the estimator's models take them, read by the library's trace
    reader (the one replay uses), so that a trace replay would refuse is refused here."""
    from vramkit.plot import PlotInputError, _read

    try:
        ops, _unmatched = _read.parse_trace(path, 0)
    except PlotInputError as error:
        raise SystemExit(str(error)) from None
    return [("a", i, size, stream) if is_alloc else ("f", i, stream)
            for is_alloc, i, size, stream, _t in ops]


def last_step(ops: list[tuple]) -> tuple[int, int] | None:
    """[start, end) of the trace's last whole step: the shortest tail period of the
    sequence of kinds and sizes (trailing frees, the teardown, left out); None if none."""
    end = len(ops)
    while end and ops[end - 1][0] == "f":
        end -= 1
    shape = [(op[0], op[2] if op[0] == "a" else 0) for op in ops[:end]]
    for period in range(64, end // 2 + 1):
        if shape[end - period:] == shape[end - 2 * period:end - period]:
            return end - period, end
    return None


# The sim device as large as the H200 the real steps ran on: the share of device memory
# within which a pool keeps what it maps (VRAMKIT_VIRTUAL_THRESHOLD) is the card's, and the
# largest steps fit.
SIM_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("VRAMKIT_")},
           "VRAMKIT_SIM_CAPACITY": "141G"}


def replay(tool: str, path: str, calls_after: int = 0) -> dict:
    done = subprocess.run([tool, "replay", "--json", "--repeat", "1", "--source", "sim",
                           "--calls-after", str(calls_after), path],
                          capture_output=True, text=True, env=SIM_ENV)
    if done.returncode not in (0, 1):
        raise SystemExit(f"vramkit replay failed on {path}: {done.stderr.strip()}")
    return json.loads(done.stdout.splitlines()[-1])


def row(path: str, tools: list[str]) -> dict:
    from vramkit.estimator import torch_caching

    ops = read_ops(path)
    step = last_step(ops)
    out = {"trace": os.path.basename(path).split(".")[0]}
    for label, tool in zip(("vramkit", "before"), tools):
        whole = replay(tool, path)
        live = whole["peak_live_bytes"]
        out["peak_live"] = live
        out[label] = round(whole["peak_reserved_bytes"] / live, 4)
        out[f"{label}_calls"] = whole["device_calls"]
        if step:
            at, end = (replay(tool, path, b)["device_calls_after"] for b in step)
            out[f"{label}_last_step_calls"] = at - end
    for label, expandable in (("pytorch", False), ("expandable", True)):
        model = torch_caching.replay(ops, expandable_segments=expandable, capacity=None)
        out[label] = round(model["peak_reserved"] / out["peak_live"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--only", default=None, help="estimate_check workloads whose name has "
                                                  "one of these (comma-separated)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cache", default=os.path.join(ROOT, "build", "host_model_traces"))
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "vramkit"))
    ap.add_argument("--before", default=None, help="another build's vramkit, side by side")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    paths = list(a.traces)
    if a.only or not paths:
        paths += record(a.only.split(",") if a.only else None, a.steps, a.cache)
    tools = [a.tool] + ([a.before] if a.before else [])
    rows = [row(p, tools) for p in paths]
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    columns = ["trace", "peak live GB", "vramkit", "calls (last step)"]
    if a.before:
        columns += ["before", "calls (last step)"]
    columns += ["PyTorch", "expandable"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        line = (f"| {r['trace']} | {r['peak_live'] / 1e9:.2f} | {r['vramkit']:.3f} | "
                f"{r['vramkit_calls']} ({r.get('vramkit_last_step_calls', '-')}) |")
        if a.before:
            line += (f" {r['before']:.3f} | {r['before_calls']} "
                     f"({r.get('before_last_step_calls', '-')}) |")
        print(line + f" {r['pytorch']:.3f} | {r['expandable']:.3f} |")


if __name__ == "__main__":
    main()
