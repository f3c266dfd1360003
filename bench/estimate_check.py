"""How close vramkit.estimate comes to the real step, on the GPU, side by side in one run.

For each workload (model, precision, batch, checkpointing) it measures, each in its own
process so that no allocator sees another's memory:
  - the real step (two training steps, from a fresh model) under PyTorch's caching
    allocator, under PyTorch's allocator with expandable_segments:True, and under
    vramkit.torch.install(): peak allocated and peak reserved;
  - vramkit.estimate on this machine (fake CUDA tensors), the same with the CPU stand-in
    a machine without a GPU uses (emulate=True), and PyTorch's MemTracker under fake
    tensors (peak allocated only);
and prints one table of the estimates' errors. It also measures the two constants the
estimator models (the cuBLAS workspace per thread and the CUDA context), on lines
"workspace" and "context".

    python3 bench/estimate_check.py --out DIR [--only gpt2]

Needs a CUDA GPU, PyTorch, transformers and vramkit installed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

# (model, precision, batch, seq, checkpointing)
WORKLOADS = [
    ("gpt2", "fp32", 1, 1024, False),
    ("gpt2", "fp32", 4, 1024, False),
    ("gpt2", "fp32", 8, 1024, False),
    ("gpt2", "bf16-amp", 1, 1024, False),
    ("gpt2", "bf16-amp", 8, 1024, False),
    ("gpt2", "bf16-amp", 16, 1024, False),
    ("gpt2", "bf16-amp", 8, 1024, True),
    ("gpt2", "bf16-amp", 32, 1024, True),
    ("llama-1b", "bf16-amp", 1, 1024, False),
    ("llama-1b", "bf16-amp", 4, 1024, False),
    ("vit-b16", "fp32", 32, 0, False),
    ("vit-b16", "fp16-amp", 128, 0, False),
    ("resnet50", "fp32", 32, 0, False),
    ("resnet50", "fp32", 128, 0, False),
    ("resnet50", "fp16-amp", 128, 0, False),
    ("resnet50", "fp16-amp", 256, 0, False),
]


# The batch finder's check: the largest batch under a 24 GiB allocator cap, predicted and
# measured, for these (model, precision, seq).
FINDER = [("gpt2", "fp32", 1024), ("gpt2", "bf16-amp", 1024), ("resnet50", "fp32", 0),
          ("resnet50", "fp16-amp", 0)]
CAP = 24 << 30


def _workload(w):
    from vramkit.estimator import models
    model, precision, batch, seq, ckpt = w
    return models.workload(model, batch, seq=seq or 1024, precision=precision,
                           checkpointing=ckpt)


def _key(w) -> str:
    model, precision, batch, seq, ckpt = w
    return f"{model} {precision} b{batch}" + (f"x{seq}" if seq else "") + (" ckpt" if ckpt else "")


def measure(allocator: str, workloads) -> None:
    """One process, one allocator: the real steps, one JSON line each."""
    if allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator == "vramkit":
        import vramkit
        import vramkit.torch
        vramkit.torch.install()
    import torch
    torch.manual_seed(0)
    if allocator == "vramkit":
        import vramkit
        peaks = lambda: (vramkit.max_memory_allocated(0), vramkit.max_memory_reserved(0))
        def reset():
            vramkit.empty_cache(0)
            vramkit.reset_peak_memory_stats(0)
    else:
        peaks = lambda: (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
        def reset():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    if allocator == "native":
        _constants(torch)
    for w in workloads:
        work = _workload(w)
        gc.collect()
        torch._C._cuda_clearCublasWorkspaces()
        reset()
        try:
            with torch.device("cuda"):
                model, opt, batch = work.build()
            for _ in range(2):
                work.step(model, opt, batch)
            torch.cuda.synchronize()
            allocated, reserved = peaks()
            row = {"workload": _key(w), "allocator": allocator, "peak_allocated": allocated,
                   "peak_reserved": reserved}
        except torch.OutOfMemoryError:
            row = {"workload": _key(w), "allocator": allocator, "oom": True}
        print(json.dumps(row), flush=True)
        del work
        model = opt = batch = None
        gc.collect()


def _constants(torch) -> None:
    """The cuBLAS workspace a thread's first matrix product adds, and the context size."""
    import threading
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid == os.getpid()]
        context = mine[0] if mine else None
    except Exception as error:  # noqa: BLE001 - reported, not needed
        context = f"unavailable: {error}"
    print(json.dumps({"context": context, "total": total, "free": free}), flush=True)
    a = torch.randn(256, 256, device="cuda")
    before = torch.cuda.memory_allocated()
    a @ a
    main = torch.cuda.memory_allocated() - before
    other = {}

    def on_thread():
        b = torch.cuda.memory_allocated()
        a @ a
        other["bytes"] = torch.cuda.memory_allocated() - b

    t = threading.Thread(target=on_thread)
    t.start()
    t.join()
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    b = torch.cuda.memory_allocated()
    (x @ x).sum().backward()
    print(json.dumps({"workspace": main, "workspace_other_thread": other["bytes"],
                      "backward_adds": torch.cuda.memory_allocated() - b
                      - x.grad.numel() * 4}), flush=True)


def estimates(workloads) -> None:
    import torch
    import vramkit
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    for w in workloads:
        work = _workload(w)
        for emulate in (False, True):
            t0 = time.perf_counter()
            try:
                e = vramkit.estimate(work.step, build=work.build, device_memory="24G",
                                     emulate=emulate)
            except vramkit.estimator.UntraceableStep as error:
                print(json.dumps({"workload": _key(w), "allocator": "estimate-cpu"
                                  if emulate else "estimate", "error": str(error)[:300]}),
                      flush=True)
                continue
            print(json.dumps({"workload": _key(w), "allocator": "estimate-cpu" if emulate
                              else "estimate", "peak_allocated": e.peak_allocated,
                              "peak_reserved": e.peak_reserved,
                              "torch_peak_reserved": e.torch_peak_reserved,
                              "torch_expandable_peak_reserved":
                                  e.torch_expandable_peak_reserved,
                              "torch_peak_allocated": e.torch_peak_allocated,
                              "torch_expandable_peak_allocated":
                                  e.torch_expandable_peak_allocated,
                              "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
        t0 = time.perf_counter()
        with FakeTensorMode():
            with torch.device("cuda"):
                model, opt, batch = work.build()
            tracker = MemTracker()
            tracker.track_external(model, opt)
            peak = 0
            with tracker:
                for _ in range(2):  # MemTracker wants its module statistics reset per step
                    work.step(model, opt, batch)
                    snap = tracker.get_tracker_snapshot("peak")[torch.device("cuda", 0)]
                    peak = max(peak, snap["Total"])
                    tracker.reset_mod_stats()
        print(json.dumps({"workload": _key(w), "allocator": "memtracker",
                          "peak_allocated": peak,
                          "seconds": round(time.perf_counter() - t0, 2)}), flush=True)


def _finder_workload(f, batch):
    from vramkit.estimator import models
    model, precision, seq = f
    return models.workload(model, batch, seq=seq or 1024, precision=precision)


def predict_batches(finders) -> dict:
    """Largest batch under CAP by the estimate, for vramkit and PyTorch's allocator."""
    import vramkit
    from vramkit.estimator import predict_largest
    out = {}
    for f in finders:
        cache = {}

        def est(n, f=f, cache=cache):
            if n not in cache:
                w = _finder_workload(f, n)
                cache[n] = vramkit.estimate(w.step, build=w.build, memory_limit=CAP)
            return cache[n]
        t0 = time.perf_counter()
        for allocator, attr in (("vramkit", "fits"), ("native", "torch_fits")):
            best = predict_largest(est, attr)
            out[f"{f[0]} {f[1]} {allocator}"] = best
            print(json.dumps({"finder": f"{f[0]} {f[1]}", "allocator": allocator,
                              "predicted": best, "estimates": len(cache),
                              "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return out


def measure_batches(allocator: str, predicted: dict, finders) -> None:
    """Largest batch under CAP by real steps, starting from the prediction."""
    if allocator == "vramkit":
        import vramkit.torch
        vramkit.torch.install()
    from vramkit.estimator import _measure
    for f in finders:
        guess = predicted.get(f"{f[0]} {f[1]} {allocator}") or 1
        tries = []

        def make_batch(n, f=f):
            tries.append(n)
            w = _finder_workload(f, n)
            make_batch.step = w.step
            return w.build()

        def step(model, opt, batch):
            make_batch.step(model, opt, batch)

        t0 = time.perf_counter()
        best = _measure.largest_batch(step, make_batch, guess, CAP, 4096)
        print(json.dumps({"finder": f"{f[0]} {f[1]}", "allocator": allocator,
                          "measured": best, "tries": tries,
                          "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


def check_plan() -> None:
    """The checkpoint planner on the card: GPT-2 fp32 at batch 8 (15.8 GB at its peak)
    under a 10 GiB cap. The planned blocks are checkpointed in the real model and two
    real steps run under vramkit with the cap; without the plan the step runs out."""
    import vramkit
    import vramkit.torch
    vramkit.torch.install()
    import torch
    from vramkit.estimator import models, variants
    cap = 10 << 30
    work = models.workload("gpt2", 8, seq=1024, precision="fp32")
    t0 = time.perf_counter()
    plan = vramkit.plan_checkpointing(work.step, build=work.build, memory_limit=cap)
    seconds = round(time.perf_counter() - t0, 1)
    vramkit.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory, 0)
    results = {}
    for label, names in (("planned", plan.names), ("none", [])):
        gc.collect()
        vramkit.empty_cache(0)
        vramkit.reset_peak_memory_stats(0)
        try:
            with torch.device("cuda"):
                model, opt, batch = work.build()
            variants.apply_checkpointing(model, names)
            for _ in range(2):
                work.step(model, opt, batch)
            torch.cuda.synchronize()
            results[label] = {"ok": True, "peak_reserved": vramkit.max_memory_reserved(0)}
        except torch.OutOfMemoryError:
            results[label] = {"ok": False}
        model = opt = batch = None
    print(json.dumps({"plan": plan.names, "blocks": plan.blocks, "seconds": seconds,
                      "predicted_peak_reserved": plan.estimate.peak_reserved,
                      "cap": cap, **{f"real_{k}": v for k, v in results.items()}}), flush=True)


def _pct(estimate, real) -> str:
    if not estimate or not real:
        return "-"
    return f"{100.0 * (estimate - real) / real:+.2f}%"


def table(rows: list[dict]) -> str:
    """Each estimate against the real figure of the allocator it predicts: peak allocated
    as each allocator counts it (PyTorch's large pool counts unsplit remainders, vramkit
    and expandable segments do not), then peak reserved. MemTracker's allocated is set
    against PyTorch's, the figure it aims at."""
    by = {}
    for r in rows:
        if "workload" in r:
            by.setdefault(r["workload"], {})[r["allocator"]] = r
    gb = lambda n: f"{n / 1e9:.2f}" if n else "-"
    out = ["| workload | allocated PyTorch | est. | CPU stand-in | MemTracker | "
           "allocated vramkit | est. | allocated expandable | est. | "
           "reserved PyTorch | est. | expandable | est. | vramkit | est. |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in by.items():
        nat, exp, vk = r.get("native", {}), r.get("expandable", {}), r.get("vramkit", {})
        est, cpu, mt = r.get("estimate", {}), r.get("estimate-cpu", {}), r.get("memtracker", {})
        real = nat.get("peak_allocated")
        out.append(" | ".join([
            f"| {name}", gb(real), _pct(est.get("torch_peak_allocated"), real),
            _pct(cpu.get("torch_peak_allocated"), real), _pct(mt.get("peak_allocated"), real),
            gb(vk.get("peak_allocated")), _pct(est.get("peak_allocated"),
                                              vk.get("peak_allocated")),
            gb(exp.get("peak_allocated")), _pct(est.get("torch_expandable_peak_allocated"),
                                               exp.get("peak_allocated")),
            gb(nat.get("peak_reserved")), _pct(est.get("torch_peak_reserved"),
                                              nat.get("peak_reserved")),
            gb(exp.get("peak_reserved")), _pct(est.get("torch_expandable_peak_reserved"),
                                              exp.get("peak_reserved")),
            gb(vk.get("peak_reserved")), _pct(est.get("peak_reserved"),
                                             vk.get("peak_reserved")) + " |"]))
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--only", default=None,
                        help="only workloads whose name has one of these (comma-separated)")
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-finder", action="store_true")
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--skip-plan", action="store_true")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else None
    workloads = [w for w in WORKLOADS if not wanted or any(x in _key(w) for x in wanted)]
    finders = [f for f in FINDER if not wanted or any(x in f"{f[0]} {f[1]}" for x in wanted)]
    if args.role == "estimate":
        estimates(workloads)
        return 0
    if args.role == "plan":
        check_plan()
        return 0
    if args.role == "predict":
        predict_batches(finders)
        return 0
    if args.role and args.role.startswith("finder-"):
        measure_batches(args.role[len("finder-"):], json.loads(os.environ["PREDICTED"]),
                        finders)
        return 0
    if args.role:
        measure(args.role, workloads)
        return 0
    rows = []
    roles = [] if args.skip_accuracy else ["native", "expandable", "vramkit", "estimate"]
    if not args.skip_finder:
        roles += ["predict", "finder-native", "finder-vramkit"]
    if not args.skip_plan:
        roles += ["plan"]
    if args.plan_only:
        roles = ["plan"]
    predicted = {}
    for role in roles:
        cmd = [sys.executable, __file__, "--role", role] + (["--only", args.only]
                                                            if args.only else [])
        env = dict(os.environ, PREDICTED=json.dumps(predicted))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        sys.stderr.write(proc.stderr[-3000:])
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                rows.append(row)
                if "predicted" in row:
                    predicted[f"{row['finder']} {row['allocator']}"] = row["predicted"]
                print(line, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "estimate_check.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
