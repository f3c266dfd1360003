"""vramkit plot: traces and snapshots drawn as an offline HTML page or a PNG, bad input
refused with a message naming the file, and the page checked in a real browser.

The fixtures are built here: small traces of known blocks, a snapshot dict in the format of
torch.cuda.memory._snapshot() whose frames point at a known file and line, and a
200,000-op trace for the size bound of a long history.
"""

import gzip
import json
import os
import pickle
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import browser_chromium
from helpers import MiB
from vramkit.plot import PlotInputError, load, plot
from vramkit.plot import _layout

TRAIN = "/home/user/project/train.py"
TRACE_DIR = Path(__file__).resolve().parents[2] / "data" / "traces"
TRACES = sorted(TRACE_DIR.glob("*.trace.gz"))
BASE = 0x7F0000000000
INTERNAL = {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
            "line": 125, "name": "forward"}
UNWIND = {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"}


def frames(line, name):
    return [UNWIND, INTERNAL, {"filename": TRAIN, "line": line, "name": name},
            {"filename": TRAIN, "line": 200, "name": "main"}]


def write_trace(path, lines, compress=True):
    text = "# vramkit-trace v1 workload=test\n" + "\n".join(lines) + "\n"
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture
def small_trace(tmp_path):
    """Three blocks: 0 lives throughout, 1 dies at t=20 under 2, which then drops."""
    return write_trace(tmp_path / "small.trace.gz", [
        f"a 0 {100 * MiB} 0 1000", f"a 1 {50 * MiB} 0 1010", f"a 2 {70 * MiB} 0 1015",
        "f 1 0 1020", "f 0 0 1030", "a 3 4096 0 1031", "f 3 0 1032", "f 2 0 1040"])


def entry(action, t, addr=0, size=0, frames_=(), **extra):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": list(frames_), "compile_context": "N/A", "user_metadata": "", **extra}


def snapshot_dict():
    """One 20 MiB segment: A (8 MiB, train.py:42) and C (6 MiB, train.py:57) live, X freed,
    D pending free; an OOM at t=1700."""
    seg = 20 * MiB
    blocks = [
        {"address": BASE, "size": 8 * MiB, "requested_size": 8 * MiB - 100,
         "state": "active_allocated", "frames": frames(42, "forward")},
        {"address": BASE + 8 * MiB, "size": 4 * MiB, "requested_size": 0, "state": "inactive",
         "frames": []},
        {"address": BASE + 12 * MiB, "size": 6 * MiB, "requested_size": 6 * MiB,
         "state": "active_allocated", "frames": frames(57, "backward")},
        {"address": BASE + 18 * MiB, "size": 2 * MiB, "requested_size": 2 * MiB,
         "state": "active_pending_free", "frames": frames(61, "step")},
    ]
    trace = [
        entry("segment_alloc", 1000, BASE, seg),
        entry("alloc", 1100, BASE, 8 * MiB, frames(42, "forward")),
        entry("alloc", 1200, BASE + 8 * MiB, 4 * MiB, frames(50, "loss")),
        entry("alloc", 1300, BASE + 12 * MiB, 6 * MiB, frames(57, "backward")),
        entry("free_requested", 1400, BASE + 8 * MiB, 4 * MiB),
        entry("free_completed", 1450, BASE + 8 * MiB, 4 * MiB),
        entry("alloc", 1500, BASE + 18 * MiB, 2 * MiB, frames(61, "step")),
        entry("free_requested", 1600, BASE + 18 * MiB, 2 * MiB),
        {"action": "oom", "size": 64 * MiB, "stream": 0, "time_us": 1700, "device_free": MiB,
         "frames": frames(70, "grow")},
        entry("snapshot", 1800),
    ]
    return {"segments": [{"device": 0, "address": BASE, "total_size": seg,
                          "allocated_size": 16 * MiB, "active_size": 16 * MiB,
                          "requested_size": 16 * MiB - 100, "stream": 0,
                          "segment_type": "large", "segment_pool_id": (0, 0),
                          "is_expandable": False, "frames": [], "blocks": blocks}],
            "device_traces": [trace],
            "allocator_settings": {"expandable_segments": False},
            "external_annotations": []}


def write_snapshot(path, snapshot):
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    return path


@pytest.fixture
def snapshot_file(tmp_path):
    return write_snapshot(tmp_path / "snapshot.pickle", snapshot_dict())


def vramkit_plot(*args):
    """`vramkit plot ARGS` as a user runs it: (exit status, stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "vramkit", "plot", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def page_json(path):
    text = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="vk-data">(.*?)</script>', text,
                      re.S)
    return json.loads(found.group(1))


def big_trace(path, ops=200_000, seed=7):
    """ops lines of random sizes (512 B to 64 MiB) freed in random order, up to 3,000 live:
    the shape that moves bands the most, since any older block may go first."""
    rng = random.Random(seed)
    lines = []
    live = []
    t = 1_000_000
    ident = 0
    while len(lines) < ops:
        t += rng.randint(1, 50)
        if live and (len(live) > 3000 or rng.random() < 0.5):
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            lines.append(f"f {live.pop()} {rng.randint(0, 1)} {t}")
        else:
            size = int(2 ** rng.uniform(9, 26)) // 512 * 512 + 512
            lines.append(f"a {ident} {size} 0 {t}")
            live.append(ident)
            ident += 1
    return write_trace(path, lines)


# ---- reading and the common model --------------------------------------------------------

def test_trace_and_snapshot_are_told_apart_by_content(tmp_path, small_trace, snapshot_file):
    renamed_trace = tmp_path / "looks_like.pickle"
    renamed_trace.write_bytes(small_trace.read_bytes())
    renamed_snapshot = tmp_path / "looks_like.trace.gz"
    renamed_snapshot.write_bytes(snapshot_file.read_bytes())
    assert load(str(renamed_trace)).kind == "trace"
    assert load(str(renamed_snapshot)).kind == "snapshot"
    plain = write_trace(tmp_path / "plain.trace", ["a 0 512 0 1", "f 0 0 2"], compress=False)
    assert load(str(plain)).peak_allocated == 512


def test_snapshot_history_names_call_sites_past_internal_frames(snapshot_file):
    h = load(str(snapshot_file))
    sites = {b.size: b.site for b in h.blocks}
    assert sites[8 * MiB] == f"{TRAIN}:42:forward"
    assert sites[6 * MiB] == f"{TRAIN}:57:backward"
    ends = {b.size: b.end for b in h.blocks}
    assert ends[4 * MiB] == 450          # free_completed, in µs from the first entry
    assert ends[2 * MiB] is None         # free requested only: still held at the end
    assert h.peak_allocated == 18 * MiB    # A, X and C; X is gone before D comes
    assert h.reserved == [(0.0, 0), (0, 20 * MiB)]
    assert len(h.ooms) == 1 and f"{64 * MiB} bytes asked" in h.ooms[0][1]
    assert [s["size"] for s in h.segments] == [20 * MiB]
    assert h.notes == []


def test_blocks_from_before_the_history_are_drawn_and_said(tmp_path):
    snap = snapshot_dict()
    trace = snap["device_traces"][0]
    # A free of a 3 MiB block never allocated in the history, and 1 MiB more live at the
    # end than the history allocates (a 1 MiB block the trace never saw).
    trace.insert(1, entry("free_completed", 1050, BASE + 64 * MiB, 3 * MiB))
    snap["segments"][0]["blocks"][1:2] = [
        {"address": BASE + 8 * MiB, "size": 3 * MiB, "requested_size": 0,
         "state": "inactive", "frames": []},
        {"address": BASE + 11 * MiB, "size": MiB, "requested_size": MiB,
         "state": "active_allocated", "frames": []}]
    h = load(str(write_snapshot(tmp_path / "pre.pickle", snap)))
    pre = [b for b in h.blocks if b.site.startswith("(allocated before")]
    assert sorted((b.size, b.start, b.end) for b in pre) == [(MiB, 0.0, None),
                                                             (3 * MiB, 0.0, 50)]
    assert any("2 blocks" in note and "before the history began" in note for note in h.notes)


def test_a_trace_without_sizes_for_early_frees_says_what_it_skipped(tmp_path):
    path = write_trace(tmp_path / "t.trace.gz", ["f 99 0 1", "a 0 4096 0 2", "f 0 0 3"])
    h = load(str(path))
    assert h.peak_allocated == 4096
    assert any("1 free lines" in note for note in h.notes)


# ---- the layout ------------------------------------------------------------------------

def _trace_steps(path):
    """(time from the first op, live bytes after it) per op, read from the trace file
    itself, not through the plot's reader, as the replay counts: frees of ids not live
    are skipped."""
    with gzip.open(path, "rt") as f:
        rows = [line.split() for line in f if line[:1] in ("a", "f")]
    t0 = int(rows[0][-1])
    sizes = {}
    live = 0
    steps = []
    for row in rows:
        if row[0] == "a":
            sizes[row[1]] = int(row[2])
            live += int(row[2])
        elif row[1] in sizes:
            live -= sizes.pop(row[1])
        else:
            continue
        steps.append((int(row[-1]) - t0, live))
    return steps


def _most_per_bucket(steps, bucket, width):
    """The most of a step series at any instant inside each bucket, the value carried in
    at the bucket's start included."""
    most = [0] * width
    value = 0
    k_now = 0
    for t, v in steps:
        k = bucket(t)
        for j in range(k_now + 1, k + 1):
            most[j] = value
        k_now = max(k_now, k)
        value = v
        most[k_now] = max(most[k_now], v)
    for j in range(k_now + 1, width):
        most[j] = value
    return most


def _drawn_tops(lay, page):
    """Per bucket, the top of every band drawn there in bytes: the bands of the layout (as
    the PNG and the page's points place them) and the merged band as the page draws it."""
    tops = [[] for _ in range(lay.width)]
    for block, first, end, points in lay.bands:
        for j in range(0, len(points), 2):
            stop = points[j + 2] if j + 2 < len(points) else end
            for k in range(points[j], stop):
                tops[k].append(points[j + 1] + block.size)
    unit = page["unit"]
    for k, top in enumerate(page["small"]["top"]):
        # The page holds heights in units: half a unit is its rounding, not a crossing.
        tops[k].append(top * unit - unit / 2)
    return tops


# A big block too short-lived for a band of its own; then, inside one bucket (100 µs), 64
# small blocks live at once and gone before a big block starts: the merged band's most
# and the new band never coexist there.
SYNTHETIC = [f"a 0 {100 * MiB} 0 0", f"a 66 {40 * MiB} 0 20000", "f 66 0 20010"]
SYNTHETIC += [f"a {i} {64 * 1024} 0 {50_000 + i}" for i in range(1, 65)]
SYNTHETIC += [f"f {i} 0 50070" for i in range(1, 65)]
SYNTHETIC += [f"a 65 {100 * MiB} 0 50080", "f 65 0 90000", "f 0 0 100000"]


@pytest.mark.parametrize("name", ["synthetic"] + [p.name for p in TRACES])
def test_every_band_stays_under_live_and_reserved_at_its_time(tmp_path, name):
    """Issue 36: what the timeline draws at a time is at most what was live then (the
    trace's own count) and at most what the engine reserved then (its replay)."""
    from vramkit.plot import _html, _replay

    path = write_trace(tmp_path / name, SYNTHETIC) if name == "synthetic" \
        else TRACE_DIR / name
    h = load(str(path))
    lay = _layout.layout(h)
    h.reserved, note = _replay.Replay(h).result()
    assert h.reserved is not None, note
    lay.reserved = _layout.reserved_per_bucket(h, lay.width)
    page = _html.page_data(h, lay)
    bucket = _layout.bucketer(h, lay.width)
    live = _most_per_bucket(_trace_steps(path), bucket, lay.width)
    reserved = _most_per_bucket(h.reserved, bucket, lay.width)
    tops = _drawn_tops(lay, page)
    over_live = [(k, max(t), live[k]) for k, t in enumerate(tops) if t and max(t) > live[k]]
    over_reserved = [(k, max(t), reserved[k]) for k, t in enumerate(tops)
                     if t and max(t) > reserved[k]]
    assert not over_live, f"{len(over_live)} buckets drawn above live: {over_live[:3]}"
    assert not over_reserved, \
        f"{len(over_reserved)} buckets drawn above reserved: {over_reserved[:3]}"
    assert max(max(t, default=0) for t in tops) <= max(v for _, v in _trace_steps(path))
    # The page's reserved line is the engine's: the most reserved inside each bucket.
    assert lay.reserved == reserved


def test_a_band_drops_when_an_older_one_is_freed(small_trace):
    h = load(str(small_trace))
    lay = _layout.layout(h, width=40)   # 40 buckets of 1 µs over the 40 µs of the trace
    bands = {block.size: (first, end, points) for block, first, end, points in lay.bands}
    assert set(bands) == {100 * MiB, 50 * MiB, 70 * MiB}   # the 4 KiB block is merged
    assert bands[100 * MiB] == (0, 30, [0, 0])
    assert bands[50 * MiB] == (10, 20, [10, 100 * MiB])
    # Block 2 starts on top of 0 and 1, falls by 50 MiB when 1 goes, to 0 when 0 goes.
    assert bands[70 * MiB] == (15, 39, [15, 150 * MiB, 20, 100 * MiB, 30, 0])
    assert lay.merged == 1 and lay.small_max[31] == 4096 and lay.small_count[31] == 1


def test_many_small_blocks_merge_into_one_band_per_bucket(tmp_path):
    lines = [f"a 0 {64 * MiB} 0 0"]
    lines += [f"a {i} 1024 0 {i}\nf {i} 0 {i}" for i in range(1, 5000)]
    lines += ["f 0 0 5000"]
    h = load(str(write_trace(tmp_path / "m.trace.gz", lines)))
    lay = _layout.layout(h, width=100)
    assert [b[0].size for b in lay.bands] == [64 * MiB]
    assert lay.merged == 4999
    assert max(lay.small_max) == 1024 and sum(lay.small_count) >= 4999


def test_a_200000_op_trace_renders_under_5_mb(tmp_path):
    trace = big_trace(tmp_path / "big.trace.gz")
    out = tmp_path / "big.html"
    plot(str(trace), str(out))
    size = out.stat().st_size
    assert size < 5 * 1000 * 1000, f"{size} bytes"
    data = page_json(out)
    with gzip.open(trace, "rt") as f:
        allocations = sum(line.startswith("a ") for line in f)
    assert data["blockCount"] == allocations > 90_000
    assert 0 < len(data["bands"]) <= _layout.MAX_BANDS
    assert data["merged"] == allocations - len(data["bands"])
    assert data["peakReserved"] >= data["peak"] > 0


# ---- the HTML page ---------------------------------------------------------------------

def test_the_page_is_self_contained(small_trace, tmp_path):
    out = tmp_path / "p.html"
    plot(str(small_trace), str(out))
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    for outside in ("http:", "https:", "//cdn", "<link", " src=", " href=", "import(",
                    "fetch(", "XMLHttpRequest"):
        assert outside not in text, outside
    data = page_json(out)
    assert len(data["bands"]) == 3
    assert data["peak"] == 220 * MiB
    assert data["peakReserved"] >= 220 * MiB
    assert data["reservedNote"] == ""


def test_a_traces_peak_is_named_for_the_requested_bytes_it_counts(tmp_path, snapshot_file):
    # A trace holds requested sizes; the engine allocates them rounded up to 512 bytes. The
    # page said "peak allocated 2 B" of two 1-byte requests the engine holds as 1 KiB.
    trace = write_trace(tmp_path / "odd.trace.gz", ["a 0 1 0 1", "a 1 1 0 2", "f 0 0 3",
                                                     "f 1 0 4"])
    out = tmp_path / "odd.html"
    plot(str(trace), str(out))
    data = page_json(out)
    assert (data["peak"], data["peakLabel"]) == (2, "peak live (requested)")
    assert "Timeline: requested memory by allocation" in out.read_text(encoding="utf-8")
    plot(str(snapshot_file), str(out))
    assert page_json(out)["peakLabel"] == "peak allocated"
    assert "Timeline: allocated memory by allocation" in out.read_text(encoding="utf-8")


def test_a_snapshot_page_carries_reserved_oom_and_segments(snapshot_file, tmp_path):
    out = tmp_path / "s.html"
    notes = plot(str(snapshot_file), str(out))
    assert notes == []
    data = page_json(out)
    assert data["peakReserved"] == 20 * MiB
    assert len(data["ooms"]) == 1
    (seg,) = data["segments"]
    assert [b[1] for b in seg["b"]] == [8 * MiB, 4 * MiB, 6 * MiB, 2 * MiB]
    assert [data["states"][b[3]] for b in seg["b"]] == [
        "active_allocated", "inactive", "active_allocated", "active_pending_free"]
    assert data["sites"][seg["b"][0][4]] == f"{TRAIN}:42:forward"


@pytest.mark.parametrize("streams", [(1, 2 ** 31 + 1), (2 ** 31 - 1, 2 ** 64 - 1)])
def test_distinct_trace_streams_stay_distinct_in_the_replay(tmp_path, streams):
    # The replay kept 31 bits of each stream number: two streams differing above them were
    # replayed as one, which shares its segment where two streams each grow their own.
    def reserved(pair):
        a, b = pair
        trace = write_trace(tmp_path / "s.trace.gz", [f"a 0 {MiB} {a} 1", f"a 1 {MiB} {b} 2",
                                                     f"f 1 {b} 3", f"f 0 {a} 4"])
        out = tmp_path / "s.html"
        plot(str(trace), str(out))
        return page_json(out)["peakReserved"]

    assert reserved(streams) == reserved((1, 2)) > reserved((1, 1))


def test_no_replay_says_reserved_is_unknown(small_trace, tmp_path):
    out = tmp_path / "p.html"
    notes = plot(str(small_trace), str(out), replay=False)
    assert any("reserved is unknown" in n for n in notes)
    assert page_json(out)["reserved"] is None


# ---- the command and bad input ---------------------------------------------------------

def test_the_command_writes_the_page(small_trace, tmp_path):
    status, out, err = vramkit_plot(small_trace, "-o", tmp_path / "p.html")
    assert (status, err) == (0, "")
    assert "wrote" in out and (tmp_path / "p.html").stat().st_size > 0


def test_usage_errors_exit_3(small_trace, tmp_path):
    assert vramkit_plot(small_trace)[0] == 3
    status, _, err = vramkit_plot(small_trace, "-o", tmp_path / "p.svg")
    assert status == 3 and ".html or .png" in err
    assert vramkit_plot("--help")[0] == 0


def bad(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("name, content, says", [
    ("truncated.pickle", pickle.dumps(snapshot_dict(), protocol=4)[:300], "truncated"),
    ("corrupt.pickle", b"\x80\x04\x95garbage", "pickle"),
    ("legacy.pickle", pickle.dumps([{"address": 0, "blocks": []}], protocol=4), "legacy"),
    ("nosegments.pickle", pickle.dumps({"device_traces": []}, protocol=4), "no 'segments'"),
    ("notdict.pickle", pickle.dumps(42, protocol=4), "not a memory snapshot"),
    ("cut.trace.gz", gzip.compress(b"# vramkit-trace v1\na 0 1 0 1\n" * 50)[:40],
     "cannot decompress"),
    ("v2.trace", b"# vramkit-trace v2\na 0 1 0 1\n", "another format version"),
    ("badline.trace", b"# vramkit-trace v1\na 0 1 0 1\nx 1 2\n", "badline.trace:3: unknown"),
    ("notnumber.trace", b"# vramkit-trace v1\na 0 -1 0 1\n", "notnumber.trace:2"),
    ("random.bin", b"\x00\x01binary", "not a vramkit trace"),
    ("empty", b"", "empty"),
])
def test_bad_input_is_a_clear_error_naming_the_file(tmp_path, name, content, says):
    path = bad(tmp_path, name, content)
    status, _, err = vramkit_plot(path, "-o", tmp_path / "out.html")
    assert status == 2, err
    assert err.startswith(f"vramkit plot: {path}") and says in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out.html").exists()


def _with(change):
    snap = snapshot_dict()
    change(snap)
    return snap


def _set(path, value):
    """A change to snapshot_dict(): the value at path (keys and indexes) set to value."""
    def change(snap):
        at = snap
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
    return change


@pytest.mark.parametrize("change, says", [
    (_set(("device_traces", 0, 1, "time_us"), float("nan")), "device_traces[0][1].time_us is nan"),
    (_set(("device_traces", 0, 1, "time_us"), float("inf")), "time_us is inf"),
    (_set(("device_traces", 0, 1, "stream"), b"s"), "device_traces[0][1].stream is b's'"),
    (_set(("device_traces", 0, 1, "size"), 1 << 64), "not a byte count"),
    (_set(("device_traces", 0, 1, "time_us"), "soon"), "time_us is 'soon'"),
    (_set(("segments", 0, "device"), True), "segments[0].device is True"),
    (_set(("segments", 0, "device"), {}), "segments[0].device is a dict"),
    (_set(("segments", 0, "blocks", 0, "size"), -1), "segments[0].blocks[0].size is -1"),
    (_set(("device_traces", 0), {"a": 1}), "device_traces[0] is a dict, not a list"),
])
def test_a_snapshot_with_a_value_of_the_wrong_kind_is_refused_naming_it(tmp_path, change,
                                                                         says):
    path = write_snapshot(tmp_path / "odd.pickle", _with(change))
    status, _, err = vramkit_plot(path, "-o", tmp_path / "out.html")
    assert status == 2 and err.startswith(f"vramkit plot: {path}: ") and says in err, err
    assert not (tmp_path / "out.html").exists()


def test_a_json_snapshot_with_nan_times_is_refused(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(_with(_set(("device_traces", 0, 2, "time_us"), float("nan")))))
    status, _, err = vramkit_plot(path, "-o", tmp_path / "out.png")
    assert status == 2 and "device_traces[0][2].time_us is nan" in err, err


def test_an_entry_earlier_than_the_first_is_drawn_on_the_axis(tmp_path):
    pytest.importorskip("matplotlib")
    path = write_snapshot(tmp_path / "early.pickle",
                          _with(_set(("device_traces", 0, 2, "time_us"), 500)))
    status, _, err = vramkit_plot(path, "-o", tmp_path / "out.png")
    assert status == 0, err


def test_a_file_name_that_is_not_utf8_is_shown_escaped_in_the_picture(tmp_path):
    name = os.fsencode(tmp_path) + b"/caf\xe9\x1b.trace"
    with open(name, "wb") as f:
        f.write(b"# vramkit-trace v1\na 0 4096 0 1\nf 0 0 2\n")
    out = tmp_path / "out.html"
    status, _, err = vramkit_plot(os.fsdecode(name), "-o", out, "--no-replay")
    assert status == 0, err
    assert "caf\\xe9\\x1b.trace" in out.read_text(encoding="utf-8")


def test_a_block_of_2_to_the_63_bytes_or_more_is_drawn_without_a_replay(tmp_path):
    path = write_trace(tmp_path / "huge.trace", [f"a 0 {1 << 63} 0 1", "a 1 4096 0 2",
                                                  "f 0 0 3", f"a 2 {(1 << 64) - 1} 0 4"])
    status, _, err = vramkit_plot(path, "-o", tmp_path / "out.html")
    assert status == 0 and "larger than any device" in err, err


def _amplified(n):
    """A pickle of a few KB whose every list repeats one object n times (by reference):
    n**2 blocks and n**2 frames per stack when walked."""
    frame = {"filename": "/x/site-packages/torch/nn/f.py", "line": 1, "name": "f"}
    block = {"address": 0, "size": 1, "state": "active_allocated", "frames": [frame] * n}
    seg = {"device": 0, "address": 0, "total_size": n, "blocks": [block] * n}
    entry = {"action": "alloc", "addr": 0, "size": 1, "time_us": 0, "frames": block["frames"]}
    return pickle.dumps({"segments": [seg] * n, "device_traces": [[entry] * n]}, protocol=4)


def test_a_pickle_that_repeats_objects_by_reference_is_refused_at_once(tmp_path):
    path = tmp_path / "amplified.pickle"
    path.write_bytes(_amplified(200))
    assert path.stat().st_size < 2500
    start = time.monotonic()
    with pytest.raises(PlotInputError, match=r"segments\[0\]\.blocks\[1\] is an object that "
                                             r"appears earlier"):
        load(str(path))
    assert time.monotonic() - start < 2  # walking it takes tens of seconds


def _expanding():
    """A list of 40 references to a list of 40... five deep: a few hundred bytes pickled,
    a hundred million items as text."""
    value = [0] * 40
    for _ in range(4):
        value = [value] * 40
    return value


@pytest.mark.parametrize("place", [("segments", 0, "blocks", 0, "state"),
                                   ("device_traces", 0, 1, "time_us"),
                                   ("segments", 0, "blocks", 0, "frames", 2, "filename"),
                                   ("device_traces", 0, 1, "frames", 2, "name")])
def test_a_value_that_expands_by_reference_costs_no_more_than_its_bytes(tmp_path, place):
    path = write_snapshot(tmp_path / "deep.pickle", _with(_set(place, _expanding())))
    start = time.monotonic()
    try:
        load(str(path))
    except PlotInputError as error:
        assert "is a list, not" in str(error)
    assert time.monotonic() - start < 2  # its text: tens of seconds


def test_blocks_sharing_one_long_frame_list_cost_one_walk_of_it(tmp_path):
    """Distinct blocks may share a frame list (vramkit's of one stack do): the call site is
    found once per list, not once per block."""
    frames_ = [INTERNAL] * 3000 + [{"filename": TRAIN, "line": 9, "name": "main"}]
    blocks = [{"address": BASE + i * 512, "size": 512, "state": "active_allocated",
               "frames": frames_} for i in range(3000)]
    snap = {"segments": [{"device": 0, "address": BASE, "total_size": 3000 * 512,
                          "blocks": blocks}], "device_traces": [[]]}
    path = write_snapshot(tmp_path / "shared.pickle", snap)
    start = time.monotonic()
    history = load(str(path))
    assert time.monotonic() - start < 2  # once per block: some ten seconds
    assert history.segments[0]["blocks"][0][4] == f"{TRAIN}:9:main"


class _RunsCode:
    """An object whose pickle calls a function when loaded: what a hostile file does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    snap = snapshot_dict()
    snap["allocator_settings"] = _RunsCode(str(marker))
    path = write_snapshot(tmp_path / "hostile.pickle", snap)
    status, _, err = vramkit_plot(path, "-o", tmp_path / "out.html")
    assert status == 2 and "io.open" in err and "only plain data" in err, err
    assert not marker.exists()


def test_skipped_and_uncertain_parts_are_warned_and_shown(tmp_path):
    snap = snapshot_dict()
    snap["trace_alloc_overflowed"] = True
    snap["device_traces"][0].insert(2, entry("teleport", 1150, BASE, 1))
    snap["device_traces"][0].insert(2, "not an entry")
    path = write_snapshot(tmp_path / "odd.pickle", snap)
    out = tmp_path / "odd.html"
    status, _, err = vramkit_plot(path, "-o", out)
    assert status == 0, err
    for says in ("overflowed", "unknown action: 'teleport' (1)", "1 malformed"):
        assert f"vramkit plot: warning: {path}: " in err and says in err, err
        assert any(says in note for note in page_json(out)["notes"])


def test_png_with_matplotlib(small_trace, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    plot(str(small_trace), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _png_legend(monkeypatch, trace, out):
    """The labels of the PNG's legend as plot draws it."""
    from matplotlib.axes import Axes

    labels = []
    legend = Axes.legend

    def keep(self, *args, **kwargs):
        labels.extend(self.get_legend_handles_labels()[1])
        return legend(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "legend", keep)
    plot(str(trace), str(out))
    return labels


def test_png_legend_lists_the_merged_band_only_where_blocks_were_merged(small_trace, tmp_path,
                                                                       monkeypatch):
    # The legend listed "small or short-lived blocks, merged" of a picture with no such band.
    pytest.importorskip("matplotlib")
    one = write_trace(tmp_path / "one.trace.gz", [f"a 0 {100 * MiB} 0 1000", "f 0 0 1040"])
    assert _png_legend(monkeypatch, one, tmp_path / "one.png") == ["reserved"]
    assert _png_legend(monkeypatch, small_trace, tmp_path / "small.png") == [
        "small or short-lived blocks, merged", "reserved"]


def _four_record_log(tmp_path):
    """A MemoryLogger log of four records, 1 to 4 MiB allocated, 8 MiB reserved."""
    log = tmp_path / "memory.jsonl"
    log.write_text("".join(json.dumps({"time": 100.0 + i, "step": i, "allocated": (i + 1) * MiB,
                                       "reserved": 8 * MiB}) + "\n" for i in range(4)))
    return log


def test_a_logs_timeline_heading_names_records(tmp_path):
    # The heading said "allocated memory by allocation" of a log, which holds records.
    log = _four_record_log(tmp_path)
    out = tmp_path / "log.html"
    plot(str(log), str(out))
    text = out.read_text(encoding="utf-8")
    assert "Timeline: allocated memory by record, reserved above it" in text
    assert "by allocation" not in text


def test_png_without_matplotlib_says_how_to_get_it(small_trace, tmp_path):
    # A module set to None in sys.modules fails to import, as if it were not installed.
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from vramkit.cli import main\n"
            f"sys.exit(main(['plot', {str(small_trace)!r}, '-o', {str(tmp_path / 'p.png')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 5  # a missing optional package, as vramkit --help says
    assert "pip install 'vramkit[plot]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "p.png").exists()


def test_plot_is_listed_among_the_commands():
    from vramkit.cli import COMMANDS

    assert "plot" in COMMANDS


# ---- in a real browser -----------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    browser_chromium.chromium() is None,
    reason="chromium is not installed (make deps installs it): the browser test is skipped")


def check_page_in_browser(page, size):
    dom, stderr = browser_chromium.open_page(page, f"selftest={size}")
    report = browser_chromium.selftest_report(dom)
    assert report is not None, f"the page's self-test wrote nothing:\n{stderr[-3000:]}"
    assert report["errors"] == []
    assert "Uncaught" not in stderr and "ERR_NAME_NOT_RESOLVED" not in stderr, stderr[-3000:]
    return report


@needs_chromium
def test_browser_draws_a_snapshot_and_hover_names_the_call_site(snapshot_file, tmp_path):
    page = tmp_path / "snapshot.html"
    plot(str(snapshot_file), str(page))
    report = check_page_in_browser(page, 8 * MiB)
    assert report["bands"] == 4
    assert report["reserved"] == 1 and report["ooms"] == 1 and report["segblocks"] == 4
    assert f"call site {TRAIN}:42:forward" in report["hover"], report
    assert "size 8.00 MiB" in report["hover"] and "lifetime 100 µs to the end" in report["hover"]
    assert f"call site {TRAIN}:42:forward" in report["segHover"], report
    assert "state active_allocated" in report["segHover"]


@needs_chromium
def test_browser_draws_a_trace(small_trace, tmp_path):
    page = tmp_path / "trace.html"
    plot(str(small_trace), str(page))
    report = check_page_in_browser(page, 70 * MiB)
    assert report["bands"] == 3 and report["small"] == 1 and report["reserved"] == 1
    assert "size 70.0 MiB" in report["hover"] and "15 µs to 40 µs (25 µs)" in report["hover"]
    assert "call site unknown (a trace records no call sites)" in report["hover"]


@needs_chromium
def test_browser_names_a_traces_peak_requested(tmp_path):
    page = tmp_path / "odd.html"
    plot(str(write_trace(tmp_path / "odd.trace.gz", ["a 0 1 0 1", "a 1 1 0 2"])), str(page))
    dom, stderr = browser_chromium.open_page(page)
    facts = re.search(r'<div class="facts" id="facts">(.*?)</div>', dom, re.S)
    assert facts is not None, stderr[-3000:]
    assert "peak live (requested) 2 B" in facts.group(1), facts.group(1)
    assert "peak allocated" not in facts.group(1)
    # A figure just under a unit is shown in the next, as the engine's reports show it.
    page = tmp_path / "near.html"
    plot(str(write_trace(tmp_path / "near.trace.gz", [f"a 0 {1024 * MiB - 1024} 0 1"])),
         str(page))
    dom, _ = browser_chromium.open_page(page)
    facts = re.search(r'<div class="facts" id="facts">(.*?)</div>', dom, re.S).group(1)
    assert f"peak live (requested) 1.00 GiB ({1024 * MiB - 1024} bytes)" in facts, facts


@needs_chromium
def test_browser_counts_a_logs_bands_as_records(tmp_path):
    # A memory log holds records, not allocations: the page said "4 allocations: 4 drawn as
    # bands" and "each coloured band is one allocation" of a log of 4 records.
    log = _four_record_log(tmp_path)
    page = tmp_path / "log.html"
    plot(str(log), str(page))
    dom, stderr = browser_chromium.open_page(page)
    facts = re.search(r'<div class="facts" id="facts">(.*?)</div>', dom, re.S)
    assert facts is not None, stderr[-3000:]
    assert "4 records: 4 drawn as bands" in facts.group(1), facts.group(1)
    assert "allocation" not in facts.group(1)
    assert "each coloured band is one record of the log" in dom


def test_make_runs_words_on_the_timeline_match_what_it_draws(tmp_path):
    # `make run` said "every block as a band" of a page that draws most of the GPT-2
    # trace's blocks merged into one grey band.
    makefile = (TRACE_DIR.parents[1] / "Makefile").read_text()
    said = " ".join(re.findall(r'@echo "2\. (.*?)"\n\t@echo "(.*?)"', makefile)[0])
    page = tmp_path / "timeline.html"
    plot(str(TRACE_DIR / "gpt2_train.trace.gz"), str(page))
    data = page_json(page)
    assert data["merged"] > 0
    assert "every block as a band" not in said and "merged" in said, said
