"""The OOM doctor (vramkit.diagnose, `vramkit doctor`): one planted case of each cause.

live, limit and fragmentation are planted on sim through the real API, each in a fresh
interpreter (the pool's capacity and limit are fixed when it is created), and each checks
that the pool is still whole after the failure: the live buffers keep their addresses and
sizes, the snapshot's blocks tile their segments, and a request that fits is served. sim
keeps one device per pool, so no other process can hold its memory: others is planted as
the figures the engine keeps on a real GPU (oom_info) and as a PyTorch snapshot whose oom
entry has little device_free. The command runs on a trace, on snapshots, and on bad files.
"""

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import vramkit
import vramkit.cli
from helpers import GiB, MiB, run_python
from vramkit.doctor import DoctorInputError, Fix, diagnose

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"

# Run in each child: the checks that the pool survived the OOM, then the diagnosis as JSON
# on the last line of stdout.
_INTACT = """
import json, vramkit
MiB = 1 << 20

def intact(buffers, device=0, probe=True):
    '''Each live buffer where it was, with its size; the blocks tile their segments; the
    allocated figure is the live buffers' sum; and (probe) a small request is served.'''
    expected = {b.ptr: b.nbytes for b in buffers}
    snap = vramkit.snapshot(device)
    live = {}
    for seg in snap["segments"]:
        at = seg["address"]
        for block in seg["blocks"]:
            assert block["address"] == at, "blocks do not tile their segment"
            at += block["size"]
            if block["state"] == "active_allocated":
                live[block["address"]] = block["size"]
        assert at == seg["address"] + seg["total_size"], "blocks do not fill their segment"
    for ptr, nbytes in expected.items():
        assert ptr in live and live[ptr] >= nbytes, f"buffer at {ptr:#x} is gone"
    assert vramkit.memory_allocated(device) == sum(live.values())
    if probe:
        small = vramkit.empty(1 << 20, device=device)
        small.free()

def show(d):
    print(json.dumps(d.to_dict()))
"""


def _child(code: str, env: dict | None = None) -> dict:
    done = run_python(_INTACT + code, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _doctor(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vramkit", "doctor", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------------------
# One planted case of each cause, through the real API.
# ---------------------------------------------------------------------------------------

def test_live_memory_over_the_device():
    d = _child("""
vramkit.configure(0, source="sim", sim_capacity="64M")
kept = [vramkit.empty(40 * MiB)]
try:
    vramkit.empty(40 * MiB)
    raise SystemExit("no OOM")
except vramkit.OutOfMemoryError as exc:
    error = exc
intact(kept)
import torch
peaks = {"baseline": 100, "half_batch": 60, "bf16_autocast": 80, "checkpointing": 30}
show(vramkit.diagnose(error, estimate_fn=lambda v: peaks[v] * MiB,
                      model=torch.nn.Linear(1000, 100)))
""")
    assert d["cause"] == "live"
    assert "80.0 MiB, more than the device's 64.0 MiB" in d["summary"]
    n = d["numbers"]
    assert n["requested"] == 40 * MiB and n["allocated"] == 40 * MiB
    assert n["device_total"] == 64 * MiB
    # The parameter count, the guide's first step: 1000 x 100 weights and 100 biases.
    assert n["parameters"] == 100_100 and n["parameter_bytes"] == 400_400
    # Ranked by the savings estimate_fn predicts: 70, 40, then 20 MiB.
    effects = [f["effect_bytes"] for f in d["fixes"]]
    assert effects == [70 * MiB, 40 * MiB, 20 * MiB]
    assert "checkpointing" in d["fixes"][0]["text"]
    assert "batch" in d["fixes"][1]["text"] and "bf16" in d["fixes"][2]["text"]


def test_limit_set_too_low():
    # VRAMKIT_LIMIT on a 1 GiB device: the device has room, the limit refuses.
    d = _child("""
kept = [vramkit.empty(40 * MiB)]
try:
    vramkit.empty(40 * MiB)
    raise SystemExit("no OOM")
except vramkit.OutOfMemoryError as exc:
    error = exc
intact(kept)
d = vramkit.diagnose(error)
# The predicted raise is enough: with it, the same request is served.
vramkit.set_memory_limit(0, 64 * MiB + d.fixes[0].effect)
again = vramkit.empty(40 * MiB)
intact(kept + [again], probe=False)  # full to the new limit
show(d)
""", env={"VRAMKIT_LIMIT": "64M", "VRAMKIT_SIM_CAPACITY": "1G"})
    assert d["cause"] == "limit"
    assert "the limit of 64.0 MiB refused it" in d["summary"]
    assert d["numbers"]["limit"] == 64 * MiB
    first = d["fixes"][0]
    assert first["effect_bytes"] == 16 * MiB  # reserved 40 + asked 40 - limit 64
    assert "VRAMKIT_LIMIT" in first["text"] and "to at least 80.0 MiB" in first["text"]
    assert "fraction" in first["text"]



def test_a_limit_just_under_a_unit_is_shown_in_the_next():
    # A limit 512 bytes short of 1 GiB: "1.0 GiB" at one decimal, as the engine's report
    # writes it, never "1024.0 MiB".
    pool = vramkit.Pool(source="sim", limit=GiB - 512)
    kept = pool.allocate(GiB - 2 * MiB)
    with pytest.raises(vramkit.OutOfMemoryError) as caught:
        pool.allocate(8 * MiB)
    text = str(diagnose(caught.value))
    assert "the limit of 1.0 GiB refused it" in text and "limit 1.0 GiB" in text
    assert "1024.0" not in text
    del kept


def test_the_limit_and_fraction_to_raise_to_are_enough():
    # A limit the fix names is one the user sets: rounded to the nearest tenth it could be
    # below what the request needs (1030 MiB shown "1.0 GiB", a fraction 0.0101 shown
    # "0.010"), and the same OOM would come back. Each figure printed must be enough.
    import re

    pool = vramkit.Pool(source="sim", capacity="100G", limit=GiB - 512)
    kept = pool.allocate(GiB - 2 * MiB)
    with pytest.raises(vramkit.OutOfMemoryError) as caught:
        pool.allocate(8 * MiB)
    d = diagnose(caught.value)
    needed = d.numbers["reserved"] + d.numbers["requested"]
    units = {"KiB": 1 << 10, "MiB": MiB, "GiB": GiB}
    text = d.fixes[0].text
    by, unit_by, target, unit, fraction = re.search(
        r"by ([\d.]+) (\wiB) to at least ([\d.]+) (\wiB), .* to ([\d.]+)", text).groups()
    assert float(by) * units[unit_by] >= needed - d.numbers["limit"], text
    assert float(target) * units[unit] >= needed, text
    assert float(fraction) * d.numbers["device_total"] >= needed, text
    del kept

def test_fragmentation_every_other_block_freed():
    # A 60 MiB segment carved into six 10 MiB buffers, every other one freed: 30 MiB free in
    # three pieces, 4 MiB left on the device, 20 MiB asked. Fixed segments only: with large
    # blocks virtual (the default) the 60 MiB would be virtual memory.
    d = _child("""
vramkit.configure(0, source="sim", sim_capacity="64M", virtual_threshold=1, large_blocks="fixed")
vramkit.record_memory_history()
def make_activations():
    return [vramkit.empty(10 * MiB) for _ in range(6)]
whole = vramkit.empty(60 * MiB)
del whole
buffers = make_activations()
kept = buffers[0::2]
del buffers
try:
    vramkit.empty(20 * MiB)
    raise SystemExit("no OOM")
except vramkit.OutOfMemoryError as exc:
    error = exc
d = vramkit.diagnose(error)
intact(kept)
show(d)
""")
    assert d["cause"] == "fragmentation"
    n = d["numbers"]
    assert n["cached_free"] == 30 * MiB and n["largest_free_block"] == 10 * MiB
    assert n["allocated"] == 30 * MiB and n["device_free"] == 4 * MiB
    # The vmm source first: what it gains is the cached free memory it could use.
    assert "vmm" in d["fixes"][0]["text"] and d["fixes"][0]["effect_bytes"] == 30 * MiB
    texts = " ".join(f["text"] for f in d["fixes"])
    assert "VRAMKIT_TIGHT_THRESHOLD=0" in texts and "empty_cache" in texts
    assert "VRAMKIT_VIRTUAL_THRESHOLD" in texts
    # The live call sites, from the recorded stacks.
    assert d["call_sites"][0]["bytes"] == 30 * MiB
    assert "make_activations" in d["call_sites"][0]["site"]


# The figures a pool on a real GPU keeps when other processes hold it (vram_oom_info_t as
# _core.oom_info gives it: the cause the engine chose, the neighbours from NVML and the
# published records).
OTHERS_INFO = {
    "cause": "others", "device": 0, "source": "cuda", "preallocate": False,
    "requested": 2 * GiB, "max_request": 0, "capacity": 8 * GiB, "device_free": 1 * GiB,
    "limit": None, "reserved": 1536 * MiB, "allocated": 1 * GiB, "cached_free": 512 * MiB,
    "largest_free_block": 512 * MiB, "granularity": 2 * MiB, "may_reserve": 1 * GiB,
    "raise_limit_by": 0, "others_used": 5632 * MiB, "shortfall": 0, "fragmentation": 0.0,
    "neighbours_total": 2,
    "neighbours": [{"pid": 77, "name": "trainer", "bytes": 512 * MiB, "reserved": 512 * MiB,
                    "allocated": 256 * MiB, "cached_free": 256 * MiB},
                   {"pid": 4242, "name": "bigjob", "bytes": 5 * GiB}],
}


def test_others_from_the_engines_figures():
    d = diagnose(OTHERS_INFO)
    assert d.cause == "others"
    assert d.numbers["others_bytes"] == int(5.5 * GiB)
    assert [(p["pid"], p["name"], p["bytes"]) for p in d.processes] == \
        [(4242, "bigjob", 5 * GiB), (77, "trainer", 512 * MiB)]
    assert d.processes[1]["cached_free"] == 256 * MiB
    # Ranked by what each gives back: the big job, the vramkit neighbour, its cache.
    assert [f.effect for f in d.fixes] == [5 * GiB, 512 * MiB, 256 * MiB]
    assert "pid 4242 (bigjob)" in d.fixes[0].text
    assert "empty_cache" in d.fixes[2].text
    text = str(d)
    assert "cause: others" in text and "pid 4242 (bigjob)" in text
    assert len(text.splitlines()) <= 30  # one screen
    # The same figures carried by an exception, as vramkit.torch's oom_report() sets them.
    error = MemoryError("CUDA out of memory. vramkit: out of memory on device 0 ...")
    error.oom_info = OTHERS_INFO
    assert diagnose(error).cause == "others"


def test_a_reports_text_is_not_parsed():
    # The figures are the engine's: a report's text is refused, saying where they are. In a
    # fresh process: an exception carrying the report takes the figures this process's
    # pool kept at its last OOM, which another test's OOM would have left.
    run_python("""
        import pytest
        from vramkit.doctor import DoctorInputError, diagnose
        text = ("vramkit: out of memory on device 0 (cuda source): tried to allocate 2.00 GiB "
                "(2147483648 bytes) on the default stream.\\n  cause: others: ...")
        with pytest.raises(DoctorInputError, match=r"oom_info"):
            diagnose(text)
        with pytest.raises(DoctorInputError, match=r"oom_info"):
            diagnose(MemoryError(text))
    """)


# The engine's causes (vram_oom_cause_name), spelled out so that none can drop silently.
ENGINE_CAUSES = ["preallocate", "fragmentation", "granularity", "limit", "live", "others",
                 "group_limit"]


@pytest.mark.parametrize("cause", ENGINE_CAUSES)
def test_every_cause_of_the_engine_is_known(cause):
    from vramkit import _core

    classified = {_core.oom_classify({"requested": r, **f})["cause"] for r, f in _PLANTED}
    assert set(vramkit.doctor.CAUSES) == set(ENGINE_CAUSES) == classified | {"preallocate"}
    d = diagnose(dict(OTHERS_INFO, cause=cause, preallocate=cause == "preallocate"))
    assert d.cause == cause and d.fixes and d.summary


# Figures the engine classifies as each cause but preallocate (a request against them).
_PLANTED = [
    (20 * MiB, {"capacity": 64 * MiB, "device_free": 4 * MiB, "reserved": 60 * MiB,
                "allocated": 30 * MiB, "cached_free": 30 * MiB, "largest_free_block": 10 * MiB}),
    (3 * MiB, {"capacity": 64 * MiB, "device_free": 3 * MiB, "reserved": 0, "allocated": 0,
               "granularity": 2 * MiB}),
    (40 * MiB, {"capacity": 1 * GiB, "device_free": 1 * GiB, "limit": 64 * MiB,
                "reserved": 40 * MiB, "allocated": 40 * MiB}),
    (40 * MiB, {"capacity": 64 * MiB, "device_free": 24 * MiB, "reserved": 40 * MiB,
                "allocated": 40 * MiB}),
    (2 * GiB, {"capacity": 8 * GiB, "device_free": 1 * GiB, "reserved": 1536 * MiB,
               "allocated": 1 * GiB, "cached_free": 512 * MiB}),
    (36 * MiB, {"capacity": 64 * MiB, "device_free": 16 * MiB, "reserved": 0, "allocated": 0,
                "group_limit": 56 * MiB, "group_reserved": 48 * MiB}),
]


def _torch_snapshot(blocks, oom_size, device_free, expandable=False):
    """A snapshot in PyTorch's format (no vramkit keys): one segment of these (size,
    state, frames) blocks and an oom entry in the trace of device 0."""
    segment_blocks, address = [], 0x7F0000000000
    for size, state, frames in blocks:
        segment_blocks.append({"address": address, "size": size, "requested_size": size,
                               "state": state, "frames": frames})
        address += size
    total = sum(size for size, _, _ in blocks)
    return {
        "segments": [{"device": 0, "address": 0x7F0000000000, "total_size": total,
                      "allocated_size": sum(s for s, st, _ in blocks if st != "inactive"),
                      "active_size": 0, "requested_size": 0, "stream": 0,
                      "segment_type": "large", "segment_pool_id": (0, 0),
                      "is_expandable": expandable, "frames": [], "blocks": segment_blocks}],
        "device_traces": [[
            {"action": "alloc", "addr": 0x7F0000000000, "size": blocks[0][0], "stream": 0,
             "time_us": 1, "frames": []},
            {"action": "oom", "device_free": device_free, "size": oom_size, "stream": 0,
             "time_us": 2, "frames": []},
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
        "external_annotations": [],
    }


MODEL = [{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125,
          "name": "forward"}, {"filename": "train.py", "line": 42, "name": "step"}]


def test_others_from_a_pytorch_snapshot(tmp_path):
    # 1 GiB live, 2 GiB asked, 256 MiB free on an 8 GiB device.
    snap = _torch_snapshot([(1 * GiB, "active_allocated", MODEL)], 2 * GiB, 256 * MiB)
    path = tmp_path / "torch_snapshot.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    d = diagnose(path, capacity="8G")
    assert d.cause == "others"
    assert d.numbers["others_bytes"] == 8 * GiB - 1 * GiB - 256 * MiB
    assert d.fixes[0].effect == d.numbers["others_bytes"]
    # The call site is the user's frame, not PyTorch's.
    assert d.call_sites == [("train.py:42:step", 1 * GiB)]
    # Without the capacity a snapshot cannot tell others from live memory, and says so.
    d = diagnose(path)
    assert d.cause == "live" and "capacity" in d.notes[0]
    # The command says the same.
    done = _doctor(path, "--capacity", "8G", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cause"] == "others"


def test_a_snapshots_request_larger_than_the_device(tmp_path):
    """A request past the device is no setting's to serve, as the engine's own report of
    it says: the doctor advises checking how its size was computed, never a smaller batch;
    an entry asking nothing records no failure and is refused."""
    snap = _torch_snapshot([(3 * MiB, "active_allocated", MODEL)], 200 * GiB, 8 * GiB)
    path = tmp_path / "past_the_device.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    d = diagnose(path, capacity="10G")
    assert d.cause == "live" and d.numbers["max_request"] == 10 * GiB
    assert "the request alone (200.0 GiB) is more than the device can hold" in d.summary
    assert [f.text for f in d.fixes] == ["check how the request's size is computed: no "
                                         "setting serves a request larger than the device"]
    assert "batch" not in str(d)
    snap = _torch_snapshot([(3 * MiB, "active_allocated", MODEL)], 0, 8 * GiB)
    path.write_bytes(pickle.dumps(snap, protocol=4))
    done = _doctor(path, "--capacity", "10G")
    assert done.returncode == 2 and "asks 0 bytes" in done.stderr
    assert "Traceback" not in done.stderr


def test_fragmentation_of_a_preallocation():
    # The same holes in a preallocation of the whole device: the vmm source and placement
    # settings would not move them (the region is mapped whole on every source), so the fix
    # is to grow on demand, and the numbers say what is preallocated.
    d = _child("""
vramkit.configure(0, source="sim", sim_capacity="60M", preallocate="60M")
buffers = [vramkit.empty(10 * MiB) for _ in range(6)]
kept = buffers[0::2]
del buffers
try:
    vramkit.empty(20 * MiB)
    raise SystemExit("no OOM")
except vramkit.OutOfMemoryError as exc:
    error = exc
d = vramkit.diagnose(error)
intact(kept)
show(d)
""")
    assert d["cause"] == "fragmentation"
    assert d["numbers"]["preallocated"] == 60 * MiB
    assert len(d["fixes"]) == 1
    assert "leave VRAMKIT_PREALLOCATE unset" in d["fixes"][0]["text"]
    assert "vmm" not in d["fixes"][0]["text"].replace("every source", "")


def test_pytorch_snapshots_of_fragmentation_and_a_limit(tmp_path):
    pieces = [(20 * MiB, "active_allocated", MODEL), (10 * MiB, "inactive", []),
              (20 * MiB, "active_allocated", MODEL), (10 * MiB, "inactive", [])]
    frag = tmp_path / "frag.pickle"
    frag.write_bytes(pickle.dumps(_torch_snapshot(pieces, 16 * MiB, 2 * MiB)))
    d = diagnose(frag, capacity=1 * GiB)
    assert d.cause == "fragmentation"
    assert d.numbers["cached_free"] == 20 * MiB and d.numbers["largest_free_block"] == 10 * MiB
    assert d.fixes[0].effect == 20 * MiB and "vmm" in d.fixes[0].text
    assert not any("after the OOM" in note for note in d.notes)
    # Memory that moved after the failure makes the blocks those of a later moment.
    later = _torch_snapshot(pieces, 16 * MiB, 2 * MiB)
    later["device_traces"][0].append({"action": "free_requested", "addr": 0, "size": 1,
                                      "stream": 0, "time_us": 3, "frames": []})
    frag.write_bytes(pickle.dumps(later))
    assert any("after the OOM" in note for note in diagnose(frag).notes)
    # The device had room for the whole request in a segment of its own: a limit refused it.
    limited = tmp_path / "limit.pickle"
    limited.write_bytes(pickle.dumps(_torch_snapshot(pieces[:1], 64 * MiB, 4 * GiB)))
    d = diagnose(limited)
    assert d.cause == "limit"
    assert "to at least 84.0 MiB" in d.fixes[0].text


# ---------------------------------------------------------------------------------------
# The command, on a trace and on a snapshot.
# ---------------------------------------------------------------------------------------

def _trace_fixes(trace, capacity):
    done = _doctor(trace, "--capacity", capacity, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_command_on_a_trace_that_fragments():
    # stream_prefetch's peak live is 1546.6 MiB; the default settings need more than 1552
    # MiB for it, and so does every setting the doctor tries.
    trace = TRACES / "stream_prefetch.trace.gz"
    d = _trace_fixes(trace, "1552M")
    assert d["cause"] == "fragmentation"
    n = d["numbers"]
    assert n["peak_live"] <= 1552 * MiB < n["min_capacity_default"] < n["min_capacity_fixed"]
    assert n["ooms_default"] > 0 and n["ooms_fixed"] > n["ooms_default"]
    assert n["ooms_vmm"] and n["ooms_virtual_early"] and n["ooms_tight"]
    # No setting fits: the one fix is the smallest capacity the replays found that fits.
    least = min(n[f"min_capacity_{k}"] for k in ("default", "vmm", "virtual_early", "tight"))
    assert n["min_capacity_fits"] == least
    assert [f["effect_bytes"] for f in d["fixes"]] == [None]
    assert f"the smallest capacity that fits is {least / MiB:.1f} MiB" in d["fixes"][0]["text"]
    assert "no setting tried fits" in d["summary"]
    # Text: one screen with the cause first.
    text = _doctor(trace, "--capacity", "1552M")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[1].startswith("cause: fragmentation")
    assert len(text.stdout.splitlines()) <= 30


def test_a_trace_lists_only_fixes_on_which_it_fits():
    # bert_infer_varlen (peak live 686.5 MiB) under 690 MiB: the default settings fail, and
    # so do vmm, VIRTUAL_THRESHOLD=0 and tight segments: no fix is listed that still OOMs;
    # the doctor says what would fit instead.
    trace = TRACES / "bert_infer_varlen.trace.gz"
    d = _trace_fixes(trace, "690M")
    assert d["cause"] == "fragmentation"
    n = d["numbers"]
    assert n["ooms_default"] and n["ooms_vmm"] and n["ooms_virtual_early"] and n["ooms_tight"]
    assert len(d["fixes"]) == 1 and "OOM" not in d["fixes"][0]["text"]
    assert n["min_capacity_fits"] > 690 * MiB
    assert f"{n['min_capacity_fits'] / MiB:.1f} MiB" in d["fixes"][0]["text"]
    # Where a setting fits and the default does not, it is the fix, with its measured gain.
    between = n["min_capacity_fits"]
    assert between < n["min_capacity_default"], "no capacity where only a fix fits"
    d = _trace_fixes(trace, str(between))
    assert d["cause"] == "fragmentation" and d["fixes"]
    for fix in d["fixes"]:
        assert "with no OOM" in fix["text"]
        assert fix["effect_bytes"] is not None and fix["effect_bytes"] > 0
    n = d["numbers"]
    fitting = {k for k in ("vmm", "virtual_early", "tight") if n[f"ooms_{k}"] == 0}
    assert len(d["fixes"]) == len(fitting) >= 1


def test_command_on_a_trace_that_fits_only_with_virtual_growth():
    # bert_infer_varlen (peak live 686.5 MiB) under 800 MiB: fixed segments alone need 990
    # MiB, the default settings (large blocks in virtual memory) fit.
    trace = TRACES / "bert_infer_varlen.trace.gz"
    d = json.loads(_doctor(trace, "--capacity", "800M", "--json").stdout)
    assert d["cause"] is None and "no out-of-memory" in d["summary"]
    n = d["numbers"]
    assert n["ooms_default"] == 0 and n["ooms_fixed"] > 0
    assert n["min_capacity_default"] <= 800 * MiB < n["min_capacity_fixed"]
    assert "VRAMKIT_VIRTUAL_THRESHOLD=1" in d["summary"]


def test_command_on_a_trace_too_large_and_one_that_fits():
    trace = TRACES / "bert_infer_varlen.trace.gz"
    d = json.loads(_doctor(trace, "--capacity", "600M", "--json").stdout)
    assert d["cause"] == "live"
    assert d["numbers"]["peak_live"] > 600 * MiB
    assert f"by {(d['numbers']['peak_live'] - 600 * MiB) / MiB:.1f} MiB" in d["summary"]
    d = json.loads(_doctor(trace, "--capacity", "2G", "--json").stdout)
    assert d["cause"] is None and "no out-of-memory" in d["summary"]
    d = json.loads(_doctor(trace, "--json").stdout)
    assert d["cause"] is None and "no capacity given" in d["summary"]


def test_the_smallest_capacity_of_a_tiny_trace_and_of_one_no_device_holds(tmp_path):
    # One 100-byte block needs the pool's first 2 MiB segment, far past four times its
    # live bytes (the search reaches the uncapped replay's peak too); 2^64 - 1 bytes fit no
    # device, and the doctor says how far the search went, not that it "needs none".
    tiny, huge = tmp_path / "tiny.trace.gz", tmp_path / "huge.trace.gz"
    tiny.write_bytes(gzip.compress(b"# vramkit-trace v1\na 1 100 0 0\n"))
    huge.write_bytes(gzip.compress(b"# vramkit-trace v1\na 1 18446744073709551615 0 0\n"))
    d = json.loads(_doctor(tiny, "--json").stdout)
    assert d["numbers"]["min_capacity_default"] == 2 * MiB
    assert "the trace needs 2.0 MiB on the default settings" in d["summary"], d["summary"]
    d = json.loads(_doctor(huge, "--json").stdout)
    assert d["numbers"]["min_capacity_default"] is None
    assert ("more than any device holds (none up to 256.0 TiB fits) on the default settings"
            in d["summary"] and "none on" not in d["summary"]), d["summary"]



def test_one_op_and_one_failure_are_counted_in_the_singular(tmp_path):
    # A trace of one allocation larger than the cap: one op, one allocation failed.
    one = tmp_path / "one.trace.gz"
    one.write_bytes(gzip.compress(b"# vramkit-trace v1\na 1 3000000 0 0\n"))
    d = json.loads(_doctor(one, "--capacity", "2M", "--json").stdout)
    assert d["origin"] == "trace one (1 op)", d["origin"]
    assert d["numbers"]["ooms_default"] == 1 and d["numbers"]["ooms_vmm"] == 1
    assert "(1 allocation failed on the default settings, 1 on vmm)" in d["summary"], \
        d["summary"]

def test_command_on_a_vramkit_snapshot(tmp_path):
    path = tmp_path / "snapshot.pickle"
    run_python(f"""
import vramkit
MiB = 1 << 20
vramkit.configure(0, source="sim", sim_capacity="64M", virtual_threshold=1)
vramkit.record_memory_history()
def carve():
    return [vramkit.empty(10 * MiB) for _ in range(6)]
whole = vramkit.empty(60 * MiB)
del whole
kept = carve()[0::2]
try:
    vramkit.empty(20 * MiB)
except vramkit.OutOfMemoryError:
    pass
vramkit.dump_snapshot({str(path)!r})
""")
    done = _doctor(path, "--capacity", "64M")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("cause: fragmentation")
    assert any("carve" in line and "30.0 MiB" in line for line in lines), done.stdout


# ---------------------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------------------

def test_bad_files_exit_2_with_the_reason(tmp_path):
    corrupt = tmp_path / "corrupt.pickle"
    corrupt.write_bytes(b"\x80\x04\x95garbage")
    done = _doctor(corrupt)
    assert done.returncode == 2
    assert str(corrupt) in done.stderr and "pickle" in done.stderr
    assert done.stdout == ""
    missing = tmp_path / "nowhere.pickle"
    done = _doctor(missing)
    assert done.returncode == 2 and "cannot read" in done.stderr and str(missing) in done.stderr
    bad_trace = tmp_path / "bad.trace.gz"
    bad_trace.write_bytes(gzip.compress(b"# vramkit-trace v1\na 0 100 0 1\nx what\n"))
    done = _doctor(bad_trace, "--capacity", "1G")
    assert done.returncode == 2 and "bad.trace.gz" in done.stderr
    not_a_snapshot = tmp_path / "list.pickle"
    not_a_snapshot.write_bytes(pickle.dumps([1, 2, 3]))
    done = _doctor(not_a_snapshot)
    assert done.returncode == 2 and "not a memory snapshot" in done.stderr
    with pytest.raises(DoctorInputError, match="cannot read"):
        diagnose(missing)
    with pytest.raises(DoctorInputError, match="not a vramkit out-of-memory report"):
        diagnose(MemoryError("out of memory"))


def _oom_snapshot():
    seg = {"device": 0, "address": 0, "total_size": 4 * MiB,
           "blocks": [{"address": 0, "size": 4 * MiB, "state": "active_allocated"}]}
    oom = {"action": "oom", "size": 8 * MiB, "device_free": 0, "time_us": 5}
    return {"segments": [seg], "device_traces": [[oom]]}


@pytest.mark.parametrize("change, says", [
    (lambda s: s["segments"].extend([dict(s["segments"][0], device="a"),
                                     dict(s["segments"][0], device=1)]),
     "segments[1].device is 'a'"),
    (lambda s: s["segments"].append(dict(s["segments"][0], device={})),
     "segments[1].device is a dict"),
    (lambda s: s["device_traces"].append([{"action": "oom", "size": 1, "time_us": "late"}]),
     "device_traces[1][0].time_us is 'late'"),
    (lambda s: s["device_traces"][0][0].update(time_us=float("nan")), "time_us is nan"),
    # Missing, not summed as zero:
    (lambda s: s["segments"][0].pop("total_size"), "segments[0] has no 'total_size'"),
    (lambda s: s["segments"][0]["blocks"][0].pop("size"),
     "segments[0].blocks[0] has no 'size'"),
    (lambda s: [s["segments"][0]["blocks"][0].pop(k) for k in ("size", "state")],
     "segments[0].blocks[0] has no 'size' and no 'state'"),
    (lambda s: s["device_traces"][0][0].pop("size"),
     "the out-of-memory entry of device_traces[0] has no 'size'"),
    (lambda s: s["device_traces"][0][0].pop("device_free"),
     "the out-of-memory entry of device_traces[0] has no 'device_free'"),
    # Figures that cannot all be true: more allocated in a segment than it holds.
    (lambda s: s["segments"][0]["blocks"].append(dict(s["segments"][0]["blocks"][0])),
     "segments[0]'s blocks hold more than its total_size of 4,194,304 bytes"),
])
def test_a_snapshot_with_a_value_of_the_wrong_kind_or_none_exits_2_naming_it(tmp_path, change,
                                                                             says):
    snap = _oom_snapshot()
    change(snap)
    path = tmp_path / "odd.pickle"
    path.write_bytes(pickle.dumps(snap))
    done = _doctor(path)
    assert done.returncode == 2 and done.stderr.startswith(f"vramkit doctor: {path}: "), \
        done.stderr
    assert says in done.stderr and done.stdout == ""


def test_a_pickle_that_repeats_objects_by_reference_is_refused_at_once(tmp_path):
    block = {"address": 0, "size": 1, "state": "active_allocated",
             "frames": [{"filename": "/torch/f.py", "line": 1, "name": "f"}] * 200}
    seg = {"device": 0, "address": 0, "total_size": 200, "blocks": [block] * 200}
    path = tmp_path / "amplified.pickle"
    path.write_bytes(pickle.dumps({"segments": [seg] * 200, "device_traces": []}))
    # Refused by the shape check's one pass over distinct objects, before any reader
    # walks the 200 x 200 blocks it names.
    with pytest.raises(DoctorInputError, match=r"blocks\[1\] is an object that appears"):
        diagnose(path)


def test_a_trace_list_repeated_by_reference_is_refused_at_once(tmp_path):
    """Entries that are not dicts are skipped, not tracked: the lists that hold them are."""
    entries = ["not an entry"] * 3000
    path = tmp_path / "amplified.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries] * 3000}))
    assert path.stat().st_size < 20_000
    with pytest.raises(DoctorInputError, match=r"device_traces\[1\] is an object that appears "
                                               r"earlier"):
        diagnose(path)


def test_a_file_name_that_is_not_utf8(tmp_path):
    name = os.fsencode(tmp_path) + b"/caf\xe9\x1b.trace"
    with open(name, "wb") as f:
        f.write(b"# vramkit-trace v1\na 0 1048576 0 1\nf 0 0 2\n")
    done = subprocess.run([sys.executable, "-m", "vramkit", "doctor", name, "--capacity", "1G"],
                          capture_output=True, timeout=300)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    # The C command's name, \ufffd for \xe9; the control byte shown as an escape.
    assert b"caf\xef\xbf\xbd\\x1b" in done.stdout and b"\x1b" not in done.stdout
    missing = os.fsencode(tmp_path) + b"/gone\xff\n.pickle"
    done = subprocess.run([sys.executable, "-m", "vramkit", "doctor", missing],
                          capture_output=True, timeout=300)
    assert done.returncode == 2 and b"gone\\xff\\x0a.pickle: cannot read" in done.stderr, \
        done.stderr


def test_bad_command_lines_exit_3():
    for args in ([], ["a", "b"], ["--capacity"], ["x.pickle", "--capacity", "lots"],
                 ["x.pickle", "--capacity", "0"], ["x.pickle", "--frobnicate"]):
        done = _doctor(*args)
        assert done.returncode == 3, (args, done.stderr)
        assert "vramkit doctor:" in done.stderr and "--help" in done.stderr
    done = _doctor("--help")
    assert done.returncode == 0 and "SNAPSHOT_OR_TRACE" in done.stdout


def test_exported_lazily():
    assert "diagnose" in vramkit.__all__
    assert vramkit.diagnose is diagnose
    assert isinstance(Fix("x", None), tuple)
    assert "doctor" in vramkit.cli.COMMANDS
    done = run_python("import sys, vramkit; print('vramkit.doctor' in sys.modules)")
    assert done.stdout.strip() == "False"


def test_a_wrapped_line_keeps_each_figure_with_its_unit():
    # A note's "0 B" fell at the width: "... 0" ended one line, "B cached free" began the
    # next. Every figure of a cause, fix or note now keeps its unit on its line.
    from vramkit.doctor import Diagnosis
    for lead in range(60, 100):
        text = "x" * lead + " 0 B cached free, 6.1 MiB asked, 1.0 GiB free"
        shown = str(Diagnosis("fragmentation", text, "a test", notes=[text],
                              fixes=[Fix(text, None)]))
        lines = shown.splitlines()
        for line, after in zip(lines, lines[1:]):
            assert not (line[-1:].isdigit() and after.split()[0] in ("B", "MiB", "GiB")), \
                (lead, line, after)
        # Nothing lost or changed but where lines break.
        assert " ".join(shown.split()).count("0 B cached free, 6.1 MiB asked, 1.0 GiB free") \
            == 3
