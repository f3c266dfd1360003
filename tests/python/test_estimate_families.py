"""Every step of bench/estimate_families.py (families the estimator was never measured on:
other decoders, encoders, an encoder-decoder, torchvision's and timm's convnets and
vision transformers, a segmentation model, gradient accumulation, inference and KV-cache
generation) is estimated on this machine without a GPU, in its tiny form, as the card's
check runs it: each gives a row, none an error, and each row holds what its step must
hold at its peak (the weights; an optimizer's state where the step trains, and no
gradient where it does not)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("timm")
pytest.importorskip("transformers")

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "estimate_families.py")


def test_every_family_is_estimated_without_a_gpu():
    sys.path.insert(0, os.path.dirname(BENCH))
    try:
        import estimate_families
    finally:
        sys.path.pop(0)
    done = subprocess.run([sys.executable, BENCH, "--estimates-only", "--small"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["workload"]] = row
    assert set(rows) == set(estimate_families.FAMILIES), set(estimate_families.FAMILIES) ^ set(rows)
    for name, row in rows.items():
        assert "error" not in row, (name, row["error"])
        held = row["breakdown"]
        assert held["parameters"] > 0, name
        assert row["peak_allocated"] >= sum(held.values()), (name, held)
        assert row["peak_reserved"] >= row["peak_allocated"], name
        trains = "inference" not in name and "generate" not in name
        # The state lives from the first step on; gradients only between backward and
        # zero_grad, which may not hold the peak.
        assert (held["optimizer state"] > 0) == trains, (name, held)
        assert trains or held["gradients"] == 0, (name, held)
