"""bench/gpu_table.py's verdicts on issue 14's targets, from a bench run's step files.

The bench run on the card writes one JSON file per step; gpu_table.py reads them and says,
target by target, "met", "not met" or "not measured" (a step that failed or was skipped).
These tests write small runs by hand, each figure chosen on one side of its bound, and
read the verdicts back from the printed table.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

TABLE = Path(__file__).resolve().parents[2] / "bench" / "gpu_table.py"
TRACES = ("bert_infer_varlen", "gpt2_train")
LIVE = 1_000_000_000


def replay_row(trace, ratio, **extra):
    row = {"trace": trace, "ops": 1000, "peak_live_bytes": LIVE,
           "peak_reserved_bytes": round(LIVE * ratio), "reserved_over_live": round(ratio, 3)}
    row.update(extra)
    return row


def good_run():
    """Step files of a run that meets every target it measures."""
    files = {
        "vramkit_replay_cuda.jsonl": [replay_row(t, 1.10, ns_per_op=200.0, device_calls_warm=0,
                                                 min_capacity_over_live=1.02) for t in TRACES],
        "vramkit_replay_vmm.jsonl": [replay_row(t, 1.10, ns_per_op=250.0, device_calls_warm=0)
                                     for t in TRACES],
        "vramkit_replay_sim.jsonl": [replay_row(t, 1.10, ns_per_op=40.0, ns_over_baseline=10.0)
                                     for t in TRACES],
        # The same bytes as vmm's: a tie, which meets "at or below".
        "torch_replay_expandable.jsonl": [replay_row(t, 1.10, ns_per_op=500.0) for t in TRACES],
        "rmm_replay.jsonl": [replay_row(t, 1.30, allocator=a, ns_per_op=400.0)
                             for t in TRACES for a in ("rmm-pool", "rmm-arena")],
        "vramkit_pair_cuda.jsonl": [{"size": 512, "ns_per_pair": 30.0}],
        "rmm_pair.jsonl": [{"allocator": a, "size": 512, "ns_per_pair": 300.0}
                           for a in ("rmm-pool", "rmm-arena")],
        "vramkit_scale.jsonl": [{"live_small": 1000, "live_large": 1000000, "ns_per_op_small": 50.0,
                                 "ns_per_op_large": 150.0, "large_over_small": 3.0}],
        "gpu_check.txt": [{"check": "train_compare", "losses_equal": True, "step_time_ratio": 1.002,
                           "reserved_ratio": 0.98, "device_calls_warm_vramkit": 0}],
    }
    return files


def verdicts(tmp_path, files):
    for name, rows in files.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run([sys.executable, str(TABLE), str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("issue 14's targets in this run")[1].split("\n\n")[0]
    found = {}
    for line in section.splitlines()[2:]:
        for verdict in ("not measured", "not met", "met"):
            if line.rstrip().endswith(verdict):
                found[line.split("  ")[0]] = verdict
                break
    return found


def test_a_run_that_meets_every_target(tmp_path):
    found = verdicts(tmp_path, good_run())
    assert len(found) == 10
    assert set(found.values()) == {"met"}, found


@pytest.mark.parametrize("file, index, key, value, target", [
    ("vramkit_replay_vmm.jsonl", 1, "device_calls_warm", 2, "no driver call in a warm pass"),
    ("vramkit_replay_cuda.jsonl", 0, "min_capacity_over_live", 1.031, "smallest cap"),
    ("vramkit_replay_vmm.jsonl", 0, "ns_per_op", 501.0, "vmm cold ns per op"),
    ("vramkit_replay_cuda.jsonl", 1, "ns_per_op", 450.0, "default ahead of RMM pool / arena: cold"),
    ("vramkit_replay_sim.jsonl", 0, "ns_over_baseline", 12.5, "guard: replay"),
    ("vramkit_scale.jsonl", 0, "large_over_small", 4.2, "guard: scale"),
    ("gpu_check.txt", 0, "step_time_ratio", 1.02, "gpu_check.py train"),
])
def test_one_figure_past_its_bound_fails_that_target_alone(tmp_path, file, index, key, value, target):
    files = good_run()
    files[file][index][key] = value
    found = verdicts(tmp_path, files)
    failed = {name for name, verdict in found.items() if verdict != "met"}
    assert len(failed) == 1 and next(iter(failed)).startswith(target), found
    assert found[next(iter(failed))] == "not met"


def test_reserved_is_compared_in_bytes(tmp_path):
    files = good_run()
    # One byte more than expandable segments', though both ratios round to 1.100.
    files["vramkit_replay_vmm.jsonl"][0]["peak_reserved_bytes"] += 1
    found = verdicts(tmp_path, files)
    assert found["vmm reserved / live at most expandable segments'"] == "not met"


def test_a_missing_step_is_not_measured_rather_than_met(tmp_path):
    files = good_run()
    del files["rmm_replay.jsonl"], files["gpu_check.txt"]
    found = verdicts(tmp_path, files)
    assert found["default ahead of RMM pool / arena: reserved / live"] == "not measured"
    assert found["default ahead of RMM pool / arena: cold ns per op"] == "not measured"
    assert found["default ahead of RMM pool / arena: cached pair ns"] == "met"
    assert next(v for k, v in found.items() if k.startswith("gpu_check.py")) == "not measured"
