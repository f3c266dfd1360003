"""bench/record_step.py on a machine without a GPU: the estimator's traces of chosen
workloads (tiny versions) are written and read back as traces, one JSON line each; a name
no workload has is refused with the names there are."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "record_step.py"


def test_estimated_traces_are_written_and_read_back(tmp_path):
    from vramkit.estimator.torch_caching import read_trace
    run = subprocess.run([sys.executable, str(SCRIPT), "estimate", str(tmp_path),
                          "--only", "gpt2 fp32 b1x1024,resnet50 fp32", "--small"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["workload"] for r in rows] == ["gpt2 fp32 b1x1024 adamw", "resnet50 fp32 b32 sgd"]
    for row in rows:
        events = read_trace(row["trace"])
        live = peak = 0
        sizes = {}
        for e in events:
            if e[0] == "a":
                sizes[e[1]] = e[2]
                live += e[2]
                peak = max(peak, live)
            else:
                live -= sizes.pop(e[1], 0)
        assert 0 < peak <= row["peak_allocated"] <= row["peak_reserved"]


def test_an_unknown_workload_is_refused_with_the_names():
    run = subprocess.run([sys.executable, str(SCRIPT), "vramkit", "no such model", "x.gz"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "no workload's name has 'no such model'" in run.stderr
    assert "gpt2 fp32 b1x1024 adamw" in run.stderr
