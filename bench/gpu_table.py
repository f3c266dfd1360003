#!/usr/bin/env python3
"""gpu_table.py - the compact table of a bench/gpu_bench.sh run.

Reads the step files in OUT (default .gpu/out) and prints small tables: the alloc+free
pair, the random workload, the traces (fragmentation, smallest cap, speed), the
alternated before/after rounds of bench/ab_rounds.sh when the run made them, the run's
verdict on each target it measures (issue 14's; the GPT-2 124M step and batch targets
are bench/fit_check.py's), and the step log. A figure whose step failed or was skipped shows as "-", so the
table always prints and says what is missing. Usage: gpu_table.py [OUT]
"""
import json
import os
import re
import sys

MIB = 1 << 20


def read_text(out, name):
    try:
        with open(os.path.join(out, name)) as handle:
            return handle.read()
    except OSError:
        return ""


def read_jsonl(out, name):
    rows = []
    for line in read_text(out, name).splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def fmt(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}"


def table(title, header, rows, text=False):
    """Columns padded to their widest cell: figures to the right, the first column (and
    every column, for text) to the left."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]

    def line(cells):
        return "  ".join(str(c).rjust(w) if i and not text else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([title, line(header)] + [line(row) for row in rows]) + "\n"


def size_label(size):
    for unit, name in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{name}"
    return str(size)


def summarize_checks(text):
    """gpu_check.py prints one JSON object per check with an "ok" key; count them."""
    lines = text.strip().splitlines()
    if not lines:
        return "not run or no output"
    passed, failed = [], []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "ok" in row:
            (passed if row["ok"] else failed).append(str(row.get("check", "?")))
    if not passed and not failed:
        return lines[-1][:200]
    summary = f"{len(passed)} ok, {len(failed)} failed"
    return summary + (" (" + ", ".join(failed) + ")" if failed else "")


def spread(values, digits):
    """min to max (median) of a list, or "-"."""
    if not values:
        return "-"
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return f"{fmt(ordered[0], digits)} to {fmt(ordered[-1], digits)} ({fmt(median, digits)})"


def rounds_section(out):
    """The alternated rounds of bench/ab_rounds.sh: per build and trace, ns per op and its
    ratio to the hash-table yardstick as min to max (median), and how many rounds met 8x;
    then the scale ratio, and the sim alloc+free pair (target: 50 ns)."""
    replay = read_jsonl(out, "ab_replay.jsonl")
    scale = read_jsonl(out, "ab_scale.jsonl")
    pair = read_jsonl(out, "ab_pair.jsonl")
    if not replay and not scale:
        return ""
    builds = {"a": "before", "b": "this tree"}
    rows = []
    for build in ("a", "b"):
        for trace in sorted({r["trace"] for r in replay}):
            runs = [r for r in replay if r["build"] == build and r["trace"] == trace]
            ratios = [r["ns_over_baseline"] for r in runs]
            rows.append([f"{builds[build]}: {trace}", len(runs), spread([r["ns_per_op"] for r in runs], 1),
                         spread(ratios, 2), sum(1 for x in ratios if x <= 8.0)])
        runs = [r for r in scale if r["build"] == build]
        if runs:
            rows.append([f"{builds[build]}: scale 1k / 1M live", len(runs),
                         f"{spread([r['ns_per_op_small'] for r in runs], 1)} / "
                         f"{spread([r['ns_per_op_large'] for r in runs], 1)}",
                         spread([r["large_over_small"] for r in runs], 2),
                         sum(1 for r in runs if r["large_over_small"] <= 2.0)])
        for size in sorted({r["size"] for r in pair}):
            runs = [r for r in pair if r["build"] == build and r["size"] == size]
            rows.append([f"{builds[build]}: pair {size_label(size)}", len(runs),
                         spread([r["ns_per_pair"] for r in runs], 1), "-",
                         sum(1 for r in runs if r["ns_per_pair"] <= 50.0)])
    return table("alternated rounds (bench/ab_rounds.sh, sim): min to max (median); last column: "
                 "rounds within target (8x the yardstick, 2x for scale, 50 ns a pair)",
                 ["build: case", "rounds", "ns/op", "ratio", "met"], rows)


# Issue 14's targets and guards that one bench run measures, with their bounds.
CAP_TARGET = 1.03         # smallest cap over peak live, default settings
GPU_CHECK_STEP = 1.01     # gpu_check.py's step time over PyTorch's
REPLAY_GUARD = 12.0       # sim ns per op over the hash-table yardstick, every trace
SCALE_GUARD = 4.0         # ns per op at 1,000,000 live over 1,000


def verdict(values, ok):
    """"met" when every value passes ok, "not met" when one does not, "not measured" when
    the run lacks any of them (a failed or skipped step)."""
    if not values or any(v is None or (isinstance(v, tuple) and None in v) for v in values):
        return "not measured"
    return "met" if all(ok(v) for v in values) else "not met"


def targets_section(results, pair, scale, checks):
    """One line per target: what this run measured for it, and whether it is met."""
    traces = sorted({trace for (_, trace) in results})

    def get(allocator, trace, key):
        row = results.get((allocator, trace))
        if row and key == "reserved_over_live" and row.get("peak_live_bytes") and \
                not row.get("ooms"):
            # From the bytes: the rounded ratios of two tools tie where the bytes are equal
            # (a replay that ran out of memory has none: it never held the trace's live).
            return row.get("peak_reserved_bytes", 0) / row["peak_live_bytes"] or None
        return row.get(key) if row else None

    def per_trace(values, digits):
        return ", ".join(f"{t} {fmt(v, digits)}" for t, v in zip(traces, values))

    def against(ours, theirs, digits):
        return ", ".join(f"{t} {fmt(a, digits)} vs {' / '.join(fmt(x, digits) for x in b)}"
                         for t, a, b in zip(traces, ours, theirs))

    rows = []
    warm = [get(a, t, "device_calls_warm") for a in ("vramkit cuda", "vramkit vmm") for t in traces]
    rows.append(["no driver call in a warm pass (default and vmm, every trace)",
                 " ".join(fmt(v, 0) for v in warm), verdict(warm, lambda v: v == 0)])
    caps = [get("vramkit cuda", t, "min_capacity_over_live") for t in traces]
    rows.append([f"smallest cap at most {CAP_TARGET}x peak live (default)", per_trace(caps, 3),
                 verdict(caps, lambda v: v <= CAP_TARGET)])
    for key, digits, label in (("ns_per_op", 1, "cold ns per op"), ("reserved_over_live", 3, "reserved / live")):
        ours = [get("vramkit vmm", t, key) for t in traces]
        theirs = [get("torch expandable", t, key) for t in traces]
        rows.append([f"vmm {label} at most expandable segments'", against(ours, [(x,) for x in theirs], digits),
                     verdict(list(zip(ours, theirs)), lambda v: v[0] <= v[1])])
    for key, digits, label in (("reserved_over_live", 3, "reserved / live"), ("ns_per_op", 1, "cold ns per op")):
        ours = [get("vramkit cuda", t, key) for t in traces]
        theirs = [(get("rmm pool", t, key), get("rmm arena", t, key)) for t in traces]
        rows.append([f"default ahead of RMM pool / arena: {label}", against(ours, theirs, digits),
                     verdict([(a,) + b for a, b in zip(ours, theirs)], lambda v: v[0] < min(v[1:]))])
    sizes = sorted({size for (name, size) in pair if name == "vramkit cuda"})
    trios = [(pair.get(("vramkit cuda", s)), pair.get(("rmm pool", s)), pair.get(("rmm arena", s))) for s in sizes]
    rows.append(["default ahead of RMM pool / arena: cached pair ns",
                 ", ".join(f"{size_label(s)} {fmt(v[0])} vs {fmt(v[1])} / {fmt(v[2])}" for s, v in zip(sizes, trios)),
                 verdict(trios, lambda v: v[0] < min(v[1:]))])
    guard = [get("vramkit sim", t, "ns_over_baseline") for t in traces]
    rows.append([f"guard: replay at most {REPLAY_GUARD:g}x the yardstick (sim)", per_trace(guard, 2),
                 verdict(guard, lambda v: v <= REPLAY_GUARD)])
    ratio = [scale[0].get("large_over_small")] if scale else []
    rows.append([f"guard: scale at most {SCALE_GUARD:g}x", fmt(ratio[0], 2) if ratio else "-",
                 verdict(ratio, lambda v: v <= SCALE_GUARD)])
    train = next((c for c in checks if c.get("check") == "train_compare"), None)
    figures = (train.get("losses_equal"), train.get("step_time_ratio"), train.get("reserved_ratio"),
               train.get("device_calls_warm_vramkit")) if train else None
    rows.append([f"gpu_check.py train: same losses, step within {GPU_CHECK_STEP}x, reserved at or below, "
                 "no call after step 2",
                 (f"losses equal {figures[0]}, step {fmt(figures[1], 3)}x, reserved {fmt(figures[2], 3)}x, "
                  f"calls {figures[3]}") if figures else "-",
                 verdict([figures] if figures else [],
                         lambda v: v[0] is True and v[1] <= GPU_CHECK_STEP and v[2] <= 1.0 and v[3] == 0)])
    return table("issue 14's targets in this run (traces: " + ", ".join(traces) + ")",
                 ["target", "this run", "verdict"], rows, text=True)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else ".gpu/out"
    micro = read_text(out, "anchors_micro.txt")
    torch_text = {mode: read_text(out, f"torch_bench_{mode}.txt") for mode in ("native", "expandable")}
    sections = []
    env = read_text(out, "env.txt").strip()
    if env:
        sections.append(env + "\n")

    # -- alloc+free pair ------------------------------------------------------------------
    pair = {}
    for source in ("cuda", "vmm", "managed", "cuda_large_fixed"):
        for row in read_jsonl(out, f"vramkit_pair_{source}.jsonl"):
            pair[(f"vramkit {source.replace('_', ' ')}", row["size"])] = row["ns_per_pair"]
    for mode, text in torch_text.items():
        for size, ns in re.findall(r"raw_alloc\+raw_delete size=(\d+) ns_per_pair=([\d.]+)", text):
            pair[(f"torch {mode}", int(size))] = float(ns)
    for api, size, ns in re.findall(r"^(cudaMalloc|cudaMallocAsync) size=(\d+) ns_per_pair=([\d.]+)", micro, re.M):
        pair[(api, int(size))] = float(ns)
    for row in read_jsonl(out, "rmm_pair.jsonl"):  # bench/rmm_replay.cpp --pair
        pair[(row["allocator"].replace("-", " "), row["size"])] = row["ns_per_pair"]
    columns = ["vramkit cuda", "vramkit vmm", "vramkit managed", "vramkit cuda large fixed",
               "torch native", "torch expandable", "cudaMallocAsync", "cudaMalloc", "rmm pool",
               "rmm arena"]
    sizes = sorted({size for (_, size) in pair}) or [512, 65536, 2 << 20, 64 << 20]
    rows = [[size_label(s)] + [fmt(pair.get((c, s))) for c in columns] for s in sizes]
    best_torch = {s: pair.get(("torch native", s)) for s in sizes}
    speedup = []
    for s in sizes:
        ours, theirs = pair.get(("vramkit cuda", s)), best_torch[s]
        speedup.append(fmt(theirs / ours) + "x" if ours and theirs else "-")
    sections.append(table("alloc+free pair, ns (median of 5 batches); last column: torch native / vramkit cuda",
                          ["size"] + columns + ["speed-up"], [r + [x] for r, x in zip(rows, speedup)]))

    # -- random workload --------------------------------------------------------------------
    rows = []
    for source in ("cuda", "vmm", "managed", "cuda_tight", "cuda_large_fixed"):
        for row in read_jsonl(out, f"vramkit_random_{source}.jsonl"):
            calls = (f"{row['device_calls']} / {row['device_calls_warm']}"
                     if "device_calls" in row else "-")
            rows.append([f"vramkit {source.replace('_', ' ')}", row["ops"], fmt(row["ns_per_op"]),
                         fmt(row["reserved_over_live"], 3), calls])
    for mode, text in torch_text.items():
        match = re.search(r"random ops=(\d+) ns_per_op=([\d.]+).*ratio_reserved_over_live=([\d.]+)", text)
        if match:
            rows.append([f"torch {mode}", match.group(1), match.group(2), match.group(3), "-"])
    for api, ns in re.findall(r"^random (cudaMalloc|cudaMallocAsync) ns_per_op=([\d.]+)", micro, re.M):
        rows.append([api + " (20k ops)", "-", ns, "-", "-"])
    sections.append(table("random workload (seed 42, <= 1000 live, 256 B..32 MiB); source calls: "
                          "first pass / last pass; tight: VRAMKIT_TIGHT_THRESHOLD=0 (large blocks fixed); large fixed: "
                          "VRAMKIT_LARGE_BLOCKS=fixed",
                          ["allocator", "ops", "ns/op", "reserved/live", "source calls"],
                          rows or [["-"] * 5]))

    # -- traces -------------------------------------------------------------------------------
    results = {}
    for source in ("cuda", "vmm", "sim", "sim_vmm"):
        for row in read_jsonl(out, f"vramkit_replay_{source}.jsonl"):
            results[(f"vramkit {source.replace('_', ':')}", row["trace"])] = row
    for row in read_jsonl(out, "vramkit_replay_cuda_large_fixed.jsonl"):
        results[("vramkit cuda large fixed", row["trace"])] = row
    for source in ("cuda", "sim"):
        for row in read_jsonl(out, f"vramkit_replay_{source}_tight.jsonl"):
            results[(f"vramkit {source} tight", row["trace"])] = row
    for mode in ("native", "expandable"):
        for row in read_jsonl(out, f"torch_replay_{mode}.jsonl"):
            results[(f"torch {mode}", row["trace"])] = row
    for row in read_jsonl(out, "torch_replay_async.jsonl"):
        results[("cudaMallocAsync", row["trace"])] = row
    # bench/rmm_replay.cpp: allocator "rmm-pool" or "rmm-arena", one line per trace.
    for row in read_jsonl(out, "rmm_replay.jsonl"):
        results[(row["allocator"].replace("-", " "), row["trace"])] = row
    names = sorted({trace for (_, trace) in results})
    allocators = ["vramkit cuda", "vramkit vmm", "vramkit sim", "vramkit sim:vmm",
                  "vramkit cuda large fixed", "torch native", "torch expandable",
                  "cudaMallocAsync", "rmm pool", "rmm arena"]
    tight = ["vramkit cuda tight", "vramkit sim tight"]

    def cell(allocator, trace, key, digits):
        row = results.get((allocator, trace))
        return fmt(row.get(key) if row else None, digits)

    rows = [[t] + [cell(a, t, "reserved_over_live", 3) for a in allocators] for t in names]
    sections.append(table("traces: peak reserved / peak live (rmm arena: the high-water extent of its "
                          "arena, which it takes whole up front)", ["trace"] + allocators,
                          rows or [["-"] * (1 + len(allocators))]))
    capped = allocators[:7] + ["rmm pool", "rmm arena"]
    rows = [[t] + [cell(a, t, "min_capacity_over_live", 3) for a in capped] for t in names]
    sections.append(table("traces: smallest cap without OOM / peak live (vramkit: bisection on the sim "
                          "model of its family; torch: setMemoryFraction; rmm pool: a limiting_resource_adaptor "
                          "between it and cudaMalloc; rmm arena: its size)", ["trace"] + capped,
                          rows or [["-"] * (1 + len(capped))]))
    rows = [[t] + [cell(a, t, "ns_per_op", 1) for a in allocators]
            + [cell("vramkit cuda", t, "ns_per_op_warm", 1), cell("vramkit vmm", t, "ns_per_op_warm", 1),
               cell("vramkit sim", t, "baseline_ns_per_op", 2), cell("vramkit sim", t, "ns_over_baseline", 2)]
            for t in names]
    sections.append(table("traces: ns per op (cold pass; torch after a warm-up pass then emptyCache, "
                          "rmm on a fresh resource after a warm-up pass)",
                          ["trace"] + allocators + ["cuda warm", "vmm warm", "baseline", "sim/baseline"],
                          rows or [["-"] * (5 + len(allocators))]))

    rows = [[t] + [cell(a, t, key, digits) for a in tight
                   for key, digits in (("reserved_over_live", 3), ("min_capacity_over_live", 3),
                                       ("ns_per_op", 1), ("ns_per_op_warm", 1))]
            for t in names]
    sections.append(table("traces with tight placement (VRAMKIT_TIGHT_THRESHOLD=0): reserved/live, "
                          "smallest cap/live, ns per op cold, warm",
                          ["trace"] + [f"{a.split()[1]} {k}" for a in tight
                                       for k in ("res/live", "cap/live", "ns cold", "ns warm")],
                          rows or [["-"] * 9]))

    mine = allocators[:5] + tight
    rows = [[t] + [f"{cell(a, t, 'device_calls', 0)} / {cell(a, t, 'device_calls_warm', 0)}" for a in mine]
            for t in names]
    sections.append(table("traces: source calls (driver allocations + releases, or map + unmap "
                          "calls), cold pass / warm pass", ["trace"] + mine,
                          rows or [["-"] * (1 + len(mine))]))

    scale = read_jsonl(out, "vramkit_scale.jsonl")
    if scale:
        s = scale[0]
        sections.append(f"scale (sim): {s['live_small']} live {fmt(s['ns_per_op_small'])} ns/op, "
                        f"{s['live_large']} live {fmt(s['ns_per_op_large'])} ns/op, ratio {fmt(s['large_over_small'], 2)}\n")

    sections.append(targets_section(results, pair, scale, read_jsonl(out, "gpu_check.txt")))

    rounds = rounds_section(out)
    if rounds:
        sections.append(rounds)

    # -- correctness and the step log ----------------------------------------------------------
    ctest = read_text(out, "ctest_gpu.txt")
    match = re.search(r"\d+% tests passed.*", ctest)
    sections.append("ctest (VRAMKIT_TEST_GPU=1): " + (match.group(0) if match else "not run or no summary") + "\n")
    sections.append("gpu_check.py: " + summarize_checks(read_text(out, "gpu_check.txt")) + "\n")
    sections.append("steps:\n" + "".join("  " + line + "\n" for line in read_text(out, "steps.txt").splitlines()))
    print("\n".join(sections), end="")


if __name__ == "__main__":
    main()
