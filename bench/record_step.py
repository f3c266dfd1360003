"""record_step.py - one real step's allocations, and the estimator's, as files to compare.

The workloads are those of bench/estimate_check.py and bench/estimate_families.py, chosen
by a part of their name (the first that has it). Three ways to run:

    python3 bench/record_step.py vramkit "unet fp16" OUT.trace.gz
        the build and two steps under vramkit.torch.install() with vramkit's memory
        history: the trace (`vramkit replay`, bench/host_model_table.py) and the peaks
    python3 bench/record_step.py pytorch "llama bf16-amp b4x1024 adamw ckpt-all" OUT.txt
        the same under PyTorch's own allocator with its memory history: the address the
        driver gave each of its segments, in order (one hexadecimal address a line, after
        comment lines), for CachingAllocatorModel(segment_addresses=...), and its peaks
    python3 bench/record_step.py estimate DIR [--only A,B] [--small]
        the estimator's trace of every workload (generation left out) in DIR, one JSON
        line each with its figures; --small: the tiny versions, on a machine without a GPU

The first two need a GPU. One JSON line per result on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def workloads():
    """(name, make(small) -> Work) for every workload of the two checks."""
    import estimate_check
    import estimate_families
    out = [(estimate_check._key(w), lambda small, w=w: estimate_check._workload(w, small))
           for w in estimate_check.WORKLOADS]
    out += [(name, lambda small, name=name: estimate_families.work_of(name, small))
            for name in estimate_families.FAMILIES]
    return out


def find(part: str):
    for name, make in workloads():
        if part in name:
            return name, make
    raise SystemExit(f"no workload's name has {part!r}; names: "
                     + "; ".join(name for name, _ in workloads()))


def under_vramkit(part: str, path: str) -> None:
    name, make = find(part)
    import vramkit
    import vramkit.torch
    vramkit.torch.install()
    import torch
    torch.manual_seed(0)
    work = make(False)
    vramkit.record_memory_history(stacks=None)
    net, opt, data = work.build()
    for _ in range(2):
        work.step(net, opt, data)
    torch.cuda.synchronize()
    ops = vramkit.save_trace(path)
    print(json.dumps({"workload": name, "allocator": "vramkit", "trace": path, "ops": ops,
                      "peak_allocated": vramkit.max_memory_allocated(0),
                      "peak_reserved": vramkit.max_memory_reserved(0)}))


def under_pytorch(part: str, path: str) -> None:
    name, make = find(part)
    import torch
    torch.manual_seed(0)
    work = make(False)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=10_000_000)
    net, opt, data = work.build()
    for _ in range(2):
        work.step(net, opt, data)
    torch.cuda.synchronize()
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    addresses = [e["addr"] for e in events if e["action"] == "segment_alloc"]
    with open(path, "w") as f:
        f.write(f"# The address the driver gave each cudaMalloc of PyTorch's caching "
                f"allocator, in order,\n# over the build and two steps of {name}: "
                f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}.\n")
        f.writelines(f"{a:#x}\n" for a in addresses)
    print(json.dumps({"workload": name, "allocator": "native", "segments": len(addresses),
                      "peak_allocated": torch.cuda.max_memory_allocated(),
                      "peak_reserved": torch.cuda.max_memory_reserved()}))


def estimates(folder: str, only: list[str] | None, small: bool) -> None:
    import vramkit
    os.makedirs(folder, exist_ok=True)
    for name, make in workloads():
        if "generate" in name or (only and not any(part in name for part in only)):
            continue
        path = os.path.join(folder, name.replace(" ", "_") + ".trace.gz")
        started = time.perf_counter()
        try:
            work = make(small)
            e = vramkit.estimate(work.step, build=work.build, device_memory="24G",
                                 trace_path=path)
        except Exception as error:  # noqa: BLE001 - one workload's failure is its line's
            print(json.dumps({"workload": name, "error": f"{type(error).__name__}: "
                                                        f"{error}"[:300]}), flush=True)
            continue
        print(json.dumps({"workload": name, "trace": path,
                          "peak_allocated": e.peak_allocated,
                          "peak_reserved": e.peak_reserved,
                          "torch_peak_reserved": e.torch_peak_reserved,
                          "torch_expandable_peak_reserved": e.torch_expandable_peak_reserved,
                          "seconds": round(time.perf_counter() - started, 1)}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="how", required=True)
    for how in ("vramkit", "pytorch"):
        one = sub.add_parser(how)
        one.add_argument("workload", help="a part of the workload's name")
        one.add_argument("out", help="the file to write")
    many = sub.add_parser("estimate")
    many.add_argument("folder")
    many.add_argument("--only", default=None, help="parts of names, comma-separated")
    many.add_argument("--small", action="store_true")
    args = parser.parse_args(argv)
    if args.how == "vramkit":
        under_vramkit(args.workload, args.out)
    elif args.how == "pytorch":
        under_pytorch(args.workload, args.out)
    else:
        estimates(args.folder, args.only.split(",") if args.only else None, args.small)
    return 0


if __name__ == "__main__":
    sys.exit(main())
