"""From a recorded step to reserved memory: the engine's policy and PyTorch's, on a model.

The recording is written as a vramkit trace and replayed by ``vramkit replay`` on the
``sim`` source, a simulated device of the chosen size run by the engine's own placement
code, so the reserved figure is what vramkit would hold, not a formula. The same events
go through :mod:`.torch_caching`, a model of PyTorch's caching allocator (default and
expandable segments), for users who keep PyTorch's.
"""

from __future__ import annotations

import json
import os
import subprocess

from .. import cli
from . import torch_caching

# Sources whose placement ``vramkit replay`` reproduces on a simulated device.
_SIM_OF_SOURCE = {"cuda": "sim", "sim": "sim", "managed": "sim", "vmm": "sim:vmm",
                  "sim:vmm": "sim:vmm", "sim:cuda": "sim"}
# VRAMKIT_* variables that change where blocks go, and so what fits: kept for the replay.
_PLACEMENT_SETTINGS = ("VRAMKIT_TIGHT_THRESHOLD", "VRAMKIT_VIRTUAL_THRESHOLD",
                       "VRAMKIT_LARGE_BLOCKS")


def write_trace(events, path: str, comment: str) -> int:
    """Write ``events`` (("a", id, size, stream), ("f", id, stream)) as a trace whose
    times are the ops' numbers, through the package's one trace writer."""
    from ..history import write_trace as write

    timed = (event + (t,) for t, event in enumerate(events))
    return write(path, timed, comment)


def vramkit_replay(trace: str, source: str, capacity: int | None,
                   min_capacity: bool = False) -> dict:
    """One ``vramkit replay --json`` run on the simulated device; its JSON object."""
    sim = _SIM_OF_SOURCE.get(source)
    if sim is None:
        raise ValueError(f"estimate(): source must be one of {sorted(_SIM_OF_SOURCE)}, "
                         f"not {source!r}")
    binary = cli.binary_path()
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"estimate(): the vramkit command is missing from this "
                           f"installation (expected at {binary}); reinstall vramkit")
    args = [str(binary), "replay", "--json", "--repeat", "1", "--source", sim]
    if capacity is not None:
        args += ["--capacity", str(capacity)]
    if min_capacity:
        args.append("--min-capacity")
    args.append(trace)
    # The placement settings of the user's allocator stay (they change what fits); sizes,
    # limits and the source are this call's.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VRAMKIT_") or k in _PLACEMENT_SETTINGS}
    if source == "managed":  # no virtual ranges to grow into
        env["VRAMKIT_VIRTUAL_THRESHOLD"] = "1"
        env["VRAMKIT_LARGE_BLOCKS"] = "fixed"
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode not in (0, 1) or not lines:
        raise RuntimeError(f"estimate(): vramkit replay failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[:500]}")
    return json.loads(lines[-1])


def torch_replay(events, expandable: bool, capacity: int | None) -> dict:
    return torch_caching.replay(events, expandable_segments=expandable, capacity=capacity)
