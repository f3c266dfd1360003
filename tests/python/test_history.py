"""Memory history and snapshots (vramkit/observe/history.py) against PyTorch's snapshot format, on
the sim source: keys and types field by field, blocks tiling segments, frames naming this
file's lines, every action where it belongs, overflow, the pickle, and the trace that
`vramkit replay` reproduces. Where torch is installed, torch's own _memory_viz reads the
pickle; with a GPU, a small transformer trains under vramkit.torch.

Tests that need exact pools run in a fresh interpreter (the `run` fixture); the frames
test runs here, so that the frames point at this file.
"""

import gzip
import inspect
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import textwrap

import pytest

import vramkit
from helpers import MiB

ROOT = pathlib.Path(__file__).resolve().parents[2]

TOP_KEYS = {"segments", "device_traces", "allocator_settings", "external_annotations"}
SEGMENT_KEYS = {"device": int, "address": int, "total_size": int, "allocated_size": int,
                "active_size": int, "requested_size": int, "stream": int,
                "segment_type": str, "segment_pool_id": tuple, "is_expandable": bool,
                "frames": list, "blocks": list}
BLOCK_KEYS = {"address": int, "size": int, "requested_size": int, "state": str,
              "frames": list}
ENTRY_KEYS = {"action", "size", "stream", "time_us", "frames", "compile_context",
              "user_metadata"}
STATES = {"active_allocated", "active_pending_free", "inactive"}


def _line_below() -> int:
    """The line number after the caller's line: where the allocation under test is."""
    return inspect.currentframe().f_back.f_lineno + 1


def check_format(snap: dict) -> None:
    """Every field PyTorch's snapshot has, of PyTorch's types, and blocks that tile their
    segment (what the viewer assumes when it recomputes block addresses)."""
    assert set(snap) == TOP_KEYS
    for seg in snap["segments"]:
        assert set(seg) == set(SEGMENT_KEYS)
        for key, kind in SEGMENT_KEYS.items():
            assert isinstance(seg[key], kind), (key, seg[key])
        assert seg["segment_type"] in ("large", "small")
        assert len(seg["segment_pool_id"]) == 2
        offset = 0
        for b in seg["blocks"]:
            assert set(b) == set(BLOCK_KEYS)
            for key, kind in BLOCK_KEYS.items():
                assert isinstance(b[key], kind), (key, b[key])
            assert b["state"] in STATES
            assert b["address"] == seg["address"] + offset
            assert 0 < b["size"] and b["requested_size"] <= b["size"]
            for f in b["frames"]:
                assert set(f) == {"filename", "line", "name"}
                assert isinstance(f["line"], int) and isinstance(f["filename"], str)
            offset += b["size"]
        assert offset == seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"]
                                            if b["state"] == "active_allocated")
        assert seg["active_size"] == sum(b["size"] for b in seg["blocks"]
                                         if b["state"] != "inactive")
    assert isinstance(snap["device_traces"], list)
    for entries in snap["device_traces"]:
        last = 0  # time runs forward in each device's list
        for e in entries:
            assert ENTRY_KEYS <= set(e)
            assert ("device_free" in e) == (e["action"] == "oom")
            assert ("addr" in e) != (e["action"] == "oom")
            assert isinstance(e["time_us"], int) and e["time_us"] >= last
            last = e["time_us"]
    settings = snap["allocator_settings"]
    assert isinstance(settings["trace_alloc_max_entries"], int)
    assert isinstance(settings["trace_alloc_overflowed"], bool)
    assert isinstance(settings["expandable_segments"], bool)


def test_snapshot_format_and_frames_point_at_this_file():
    vramkit.record_memory_history(max_entries=10_000)
    try:
        line = _line_below()
        small = vramkit.empty(1000)
        big = vramkit.empty(3 * MiB + 5)
        gone = vramkit.empty(4096)
        gone.free()
        snap = vramkit.snapshot()
    finally:
        vramkit.record_memory_history(enabled=None)
    check_format(snap)
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    b = blocks[small.ptr]
    assert b["state"] == "active_allocated"
    assert b["requested_size"] == 1000 and b["size"] >= 1000
    assert b["frames"][0] == {"filename": __file__, "line": line,
                              "name": "test_snapshot_format_and_frames_point_at_this_file"}
    assert blocks[big.ptr]["frames"][0]["line"] == line + 1
    assert blocks[big.ptr]["requested_size"] == 3 * MiB + 5
    # vramkit's own frames are folded away everywhere, not only at the top.
    package = os.path.dirname(vramkit.__file__)
    assert not any(f["filename"].startswith(package) for b in blocks.values()
                   for f in b["frames"])
    # The totals are the pool's own (other tests in this process may use other devices).
    mine = [s for s in snap["segments"] if s["device"] == 0]
    assert sum(s["total_size"] for s in mine) == vramkit.memory_reserved(0)
    assert sum(s["allocated_size"] for s in mine) == vramkit.memory_allocated(0)
    assert [(s["address"], s["total_size"]) for s in vramkit.snapshot(0)["segments"]] == \
        [(s["address"], s["total_size"]) for s in mine]
    entries = snap["device_traces"][0]
    mine = [e for e in entries if e.get("addr") == small.ptr and e["action"] == "alloc"]
    assert mine and mine[-1]["frames"][0]["line"] == line and mine[-1]["size"] == b["size"]
    del small, big


ACTIONS = """
    import pickle, vramkit
    MiB = 1 << 20
    vramkit.record_memory_history()
    a = vramkit.empty(1000)
    big = vramkit.empty(64 * MiB)
    vramkit.annotate("after the big one")
    del big
    vramkit.empty_cache()
    try:
        vramkit.empty(3 << 30)
    except vramkit.OutOfMemoryError:
        pass
    free_bytes, _ = vramkit.mem_get_info()
    snap = vramkit.snapshot()
    vramkit.dump_snapshot("snap.pickle")
    raw = open("snap.pickle", "rb").read()
    assert raw[:2] == b"\\x80\\x04", raw[:2]
    assert pickle.loads(raw)["segments"] == snap["segments"]
    history = vramkit.memory_history()
    print(repr((snap, history, a.ptr, free_bytes, vramkit.memory_reserved(),
                vramkit.memory_allocated())))
"""


# With large blocks virtual (the default) the big block's memory is mapped granules, whose
# PyTorch actions are segment_map / segment_unmap (as expandable segments'); with large
# blocks fixed it is a segment of its own: segment_alloc / segment_free.
@pytest.mark.parametrize("large_blocks, gone", [("virtual", "segment_unmap"),
                                                ("fixed", "segment_free")])
def test_every_action_where_expected(run, tmp_path, large_blocks, gone):
    out = run(f"import os\nos.chdir({str(tmp_path)!r})\n" + textwrap.dedent(ACTIONS),
              env={"VRAMKIT_SIM_CAPACITY": "2G", "VRAMKIT_LARGE_BLOCKS": large_blocks})
    snap, history, a_ptr, free_bytes, reserved, allocated = eval(out.stdout)
    check_format(snap)
    entries = snap["device_traces"][0]
    actions = [e["action"] for e in entries]
    for action in ("alloc", "free_requested", "free_completed", "segment_alloc",
                   gone, "oom", "annotate", "snapshot"):
        assert action in actions, (action, actions)
    # empty_cache has no PyTorch action: left out of device_traces, kept in vramkit's view.
    assert "empty_cache" not in actions
    assert "empty_cache" in [e["action"] for e in history]
    big = next(e for e in entries if e["action"] == "alloc" and e["size"] >= 64 << 20)
    order = [i for i, e in enumerate(entries) if e.get("addr") == big["addr"] and
             e["action"] in ("alloc", "free_requested", "free_completed")]
    assert [entries[i]["action"] for i in order][:3] == ["alloc", "free_requested",
                                                         "free_completed"]
    # The big block's memory went back to the source at empty_cache.
    seg_free = [e for e in entries if e["action"] == gone]
    assert any(e["size"] >= 64 << 20 for e in seg_free), seg_free
    assert actions.index(gone) > actions.index("free_completed")
    oom = next(e for e in entries if e["action"] == "oom")
    assert oom["size"] >= 3 << 30 and "addr" not in oom
    assert abs(oom["device_free"] - free_bytes) <= 64 << 20  # free at the moment it failed
    note = next(e for e in entries if e["action"] == "annotate")
    assert note["user_metadata"] == "after the big one"
    assert actions.index("annotate") < actions.index(gone)
    assert sum(s["total_size"] for s in snap["segments"]) == reserved
    assert sum(s["allocated_size"] for s in snap["segments"]) == allocated
    assert any(b["address"] == a_ptr for s in snap["segments"] for b in s["blocks"])


def test_vmm_segments_map_and_unmap(run):
    out = run("""
        import vramkit
        vramkit.record_memory_history()
        b = vramkit.empty(40 << 20)
        del b
        vramkit.empty_cache()
        snap = vramkit.snapshot()
        print(repr(([e["action"] for e in snap["device_traces"][0]],
                    snap["allocator_settings"]["expandable_segments"])))
    """, env={"VRAMKIT_SOURCE": "sim:vmm"})
    actions, expandable = eval(out.stdout)
    assert "segment_map" in actions and "segment_unmap" in actions, actions
    assert expandable is True


def test_overflow_is_reported(run):
    out = run("""
        import vramkit
        vramkit.record_memory_history(max_entries=10)
        for _ in range(100):
            vramkit.empty(512).free()
        s = vramkit.snapshot()
        vramkit.record_memory_history(max_entries=10_000)
        vramkit.empty(512).free()
        t = vramkit.snapshot()
        print(repr((len(s["device_traces"][0]), s["allocator_settings"],
                    t["allocator_settings"])))
    """)
    n, settings, after = eval(out.stdout)
    assert n <= 10
    assert settings["trace_alloc_overflowed"] is True
    assert settings["trace_alloc_max_entries"] == 10
    assert after["trace_alloc_overflowed"] is False  # a new start clears the ring


def test_pytorch_s_default_of_every_event_records(run):
    """PyTorch's _record_memory_history asks for every event with max_entries=sys.maxsize;
    vramkit's own calls refused it as out of host memory (the engine reserves its ring
    whole). They keep the newest HISTORY_EVERY_EVENT, as the PyTorch backend does."""
    out = run("""
        import sys, vramkit
        from vramkit import _core
        vramkit.record_memory_history(max_entries=sys.maxsize)
        vramkit.empty(512).free()
        pool = vramkit.Pool(source="sim")
        pool.record_memory_history(max_entries=sys.maxsize)
        pool.allocate(512).free()
        print(repr((len(vramkit.snapshot()["device_traces"][0]),
                    len(pool.snapshot()["device_traces"][0]), _core.HISTORY_EVERY_EVENT)))
    """)
    default_events, pool_events, every = eval(out.stdout)
    assert default_events >= 2 and pool_events >= 2
    assert every == 1 << 22


def test_state_keeps_stacks_but_no_events(run):
    out = run("""
        import vramkit
        vramkit.record_memory_history(enabled="state")
        keep = vramkit.empty(2048)
        for _ in range(50):
            vramkit.empty(512).free()
        s = vramkit.snapshot()
        blk = next(b for g in s["segments"] for b in g["blocks"] if b["address"] == keep.ptr)
        print(repr((s["device_traces"], blk["frames"])))
    """)
    traces, frames = eval(out.stdout)
    assert traces == [[]]
    assert frames and frames[0]["line"] == 4 and frames[0]["name"] == "<module>"


def test_a_segment_names_the_allocation_that_made_it(run):
    # As PyTorch's segments do, in "state" too, where no event is recorded to pair it with.
    out = run("""
        import vramkit
        vramkit.record_memory_history(enabled="state")
        first = vramkit.empty(2048)
        s = vramkit.snapshot()
        print(repr(next(g["frames"] for g in s["segments"] for b in g["blocks"]
                        if b["address"] == first.ptr)))
    """)
    frames = eval(out.stdout)
    assert frames and frames[0]["line"] == 4 and frames[0]["name"] == "<module>"


def test_without_stacks_blocks_have_no_frames(run):
    out = run("""
        import vramkit
        vramkit.record_memory_history(stacks=None)
        keep = vramkit.empty(2048)
        s = vramkit.snapshot()
        print(repr([b["frames"] for g in s["segments"] for b in g["blocks"]]))
        print(vramkit._core.stack_count())
    """)
    frames, count = out.stdout.splitlines()
    assert all(f == [] for f in eval(frames))
    assert count == "0"


def _vramkit_command() -> str:
    for candidate in (pathlib.Path(sys.executable).parent / "vramkit",
                      ROOT / "build" / "vramkit"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("vramkit")
    if found is None:
        pytest.skip("no vramkit command installed or built")
    return found


def test_save_trace_replays_to_the_recorded_peak(run, tmp_path):
    path = tmp_path / "history.trace.gz"
    out = run(f"""
        import random, vramkit
        before = [vramkit.empty(3 << 20) for _ in range(3)]  # live when recording starts
        vramkit.reset_peak_memory_stats()
        vramkit.record_memory_history()
        rng = random.Random(7)
        live = []
        # Up to a peak with the blocks from before recording still live, then down, then
        # one of those is freed: the trace must hold them to reach the same peak.
        for i in range(3000):
            if live and rng.random() < (0.4 if i < 1500 else 0.8):
                live.pop(rng.randrange(len(live))).free()
            else:
                live.append(vramkit.empty(rng.choice([100, 4096, 70000, 1 << 20, 9 << 20])))
            if i == 2500:
                del before[0]
        ops = vramkit.save_trace({str(path)!r})
        print(vramkit.max_memory_allocated(), ops)
    """)
    peak, ops = map(int, out.stdout.split())
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("# vramkit-trace v1")
    assert len(lines) - 1 == ops
    assert lines[1].startswith("a ") and len(lines[1].split()) == 5
    assert any(line.startswith("f ") and len(line.split()) == 4 for line in lines)
    replay = subprocess.run([_vramkit_command(), "replay", "--json", "--source", "sim",
                             str(path)], capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr
    result = json.loads(replay.stdout.splitlines()[0])
    assert result["peak_live_bytes"] == peak
    assert result.get("skipped_frees", 0) == 0


def test_bad_arguments_name_themselves_and_leave_the_pool_valid(run):
    run("""
        import vramkit
        def fails(kind, word, fn, *args, **kwargs):
            try:
                fn(*args, **kwargs)
            except kind as exc:
                assert word in str(exc), (word, str(exc))
            else:
                raise AssertionError(f"no {kind.__name__} for {args} {kwargs}")
        r = vramkit.record_memory_history
        fails(ValueError, "enabled", r, enabled="yes")
        fails(TypeError, "enabled", r, enabled=1)
        fails(ValueError, "stacks", r, stacks="all")
        fails(ValueError, "stacks", r, stacks="cpp")
        fails(TypeError, "stacks", r, stacks=True)
        fails(ValueError, "max_entries", r, max_entries=0)
        fails(ValueError, "max_entries", r, max_entries=-5)
        fails(TypeError, "max_entries", r, max_entries=1.5)
        fails(TypeError, "max_entries", r, max_entries=True)
        fails(ValueError, "device", r, device="cuda:99")
        # Reading a history that was never started.
        fails(ValueError, "record_memory_history", vramkit.save_trace, "x.trace.gz")
        fails(ValueError, "record_memory_history", vramkit.memory_history)
        fails(ValueError, "record_memory_history", vramkit.annotate, "x")
        fails(TypeError, "name", vramkit.annotate, 5)
        # A device never used has no pool: refused, and none is created for it.
        b = vramkit.empty(1024)
        fails(ValueError, "device=3", vramkit.snapshot, device=3)
        assert not vramkit._core.pool_touched(3)
        assert vramkit.snapshot()["segments"]  # device=None: every device in use
        vramkit.record_memory_history(enabled="state")
        fails(ValueError, "enabled='all'", vramkit.save_trace, "x.trace.gz")
        # After all of it the pool still allocates, frees and records.
        vramkit.record_memory_history()
        c = vramkit.empty(4096); c.free(); del b
        assert vramkit.memory_allocated() == 0
        assert [e["action"] for e in vramkit.memory_history()].count("alloc") == 1
    """)


def _memory_viz(snapshot_path, command):
    """python -m torch.cuda._memory_viz COMMAND FILE; its `stats` action prints segsum."""
    proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", command,
                           str(snapshot_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_torch_memory_viz_reads_the_pickle(run, tmp_path):
    """PyTorch's own tool opens vramkit's pickle and finds vramkit's totals."""
    pytest.importorskip("torch")
    from torch.cuda._memory_viz import Bytes

    path = tmp_path / "snap.pickle"
    out = run(f"""
        import vramkit
        vramkit.record_memory_history()
        keep = [vramkit.empty(n) for n in (1000, 3 << 20, 25 << 20, 512)]
        keep[1].free()
        vramkit.dump_snapshot({str(path)!r})
        print(vramkit.memory_reserved(), vramkit.memory_allocated())
    """)
    reserved, allocated = map(int, out.stdout.split())
    segsum = _memory_viz(path, "stats")
    assert f"total_reserved: {Bytes(reserved)}" in segsum
    # segsum's allocated is what was asked for; vramkit's counts rounded blocks.
    snap = pickle.loads(path.read_bytes())
    requested = sum(b["requested_size"] for s in snap["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    assert f"total_allocated: {Bytes(requested)}" in segsum
    assert sum(s["allocated_size"] for s in snap["segments"]) == allocated
    trace = _memory_viz(path, "trace")
    assert "cudaMalloc(" in trace and "del " in trace


TRAIN = """
    import os, sys, vramkit, vramkit.torch
    vramkit.torch.install()
    import torch
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True), 4).cuda()
    opt = torch.optim.AdamW(model.parameters())
    vramkit.reset_peak_memory_stats()
    vramkit.record_memory_history(max_entries=1_000_000)
    detector = vramkit.LeakDetector(every=5, window=4, warn=False)
    kept = []
    for step in range(60):
        x = torch.randn(16, 128, 256, device="cuda")
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        kept.append(torch.empty(1 << 20, device="cuda"))  # PLANTED LEAK
        detector.step()
    torch.cuda.synchronize()
    vramkit.dump_snapshot(sys.argv[1] + "/train.pickle")
    vramkit.save_trace(sys.argv[1] + "/train.trace.gz")
    print(repr((vramkit.memory_reserved(), vramkit.memory_allocated(),
                vramkit.max_memory_allocated(), [g.site for g in detector.findings])))
"""


def test_torch_training_on_the_gpu(tmp_path):
    """On a GPU: a small transformer trains under vramkit.torch; torch's _memory_viz reads
    the snapshot with vramkit's reserved total, the trace replays to the peak, and the
    planted leak is named by file and line."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch.cuda._memory_viz import Bytes

    script = tmp_path / "train.py"
    script.write_text(inspect.cleandoc(TRAIN) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "VRAMKIT_SOURCE"}
    env.pop("VRAMKIT_SIM_CAPACITY", None)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    reserved, allocated, peak, findings = eval(proc.stdout.splitlines()[-1])
    leak_line = inspect.cleandoc(TRAIN).splitlines().index(
        next(l for l in inspect.cleandoc(TRAIN).splitlines() if "PLANTED LEAK" in l)) + 1
    assert f"{script}:{leak_line}:<module>" in findings, findings
    segsum = _memory_viz(tmp_path / "train.pickle", "stats")
    assert f"total_reserved: {Bytes(reserved)}" in segsum
    snap = pickle.loads((tmp_path / "train.pickle").read_bytes())
    assert sum(s["allocated_size"] for s in snap["segments"]) == allocated
    assert _memory_viz(tmp_path / "train.pickle", "trace")
    replay = subprocess.run([_vramkit_command(), "replay", "--json", "--source", "sim",
                             str(tmp_path / "train.trace.gz")],
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout.splitlines()[0])["peak_live_bytes"] == peak
