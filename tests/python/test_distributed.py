"""vramkit.distributed on gloo and the sim source: every rank's statistics gathered to one
rank, the summary's tables, and files named per rank.

Ranks are real processes, each with its own sim pools. The 4-rank test starts them as
torchrun does (fresh interpreters with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and
LOCAL_RANK in the environment); rank r allocates (r + 1) MiB on device r % 2, so the two
devices hold two ranks each. The 64-rank test of the gather path at scale forks its ranks
from one interpreter that imported torch.distributed and vramkit already (torch's import is
seconds of CPU each: 64 fresh interpreters take minutes on a 2-core machine, 64 forks
seconds); each child still makes its own process group and its own fresh pools.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import MiB, SIM_ENV, run_python

pytest.importorskip("torch.distributed")

HERE = pathlib.Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dist_env(port: int) -> dict:
    # Gloo on the loopback: a sandbox's hostname may not resolve to a usable interface.
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}


def _launch(code: str, n: int, out: pathlib.Path, timeout: float = 240) -> None:
    """Run code in n fresh interpreters as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT), on the sim source; fail with every rank's output if one fails."""
    port = _free_port()
    script = out / "rank.py"
    script.write_text(textwrap.dedent(code))
    procs = []
    for r in range(n):
        env = dict(os.environ, **SIM_ENV, **_dist_env(port), RANK=str(r), WORLD_SIZE=str(n),
                   LOCAL_RANK=str(r), OUT=str(out))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=out,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    deadline = time.monotonic() + timeout
    outputs, failed = [], False
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            text, _ = p.communicate()
            text += "\n(timed out)"
            failed = True
        failed |= p.returncode != 0
        outputs.append(text)
    if failed:
        pytest.fail("\n".join(f"--- rank {r} (rc {p.returncode})\n{t}"
                              for r, (p, t) in enumerate(zip(procs, outputs))), pytrace=False)


def _check_gathered(stats, n, devices, local):
    """The gathered list against what each rank read itself, and the known figures."""
    assert [r["rank"] for r in stats] == list(range(n))
    host = socket.gethostname()
    for r, rec in enumerate(stats):
        assert rec["world_size"] == n and rec["group_rank"] == r
        assert rec["local_rank"] == r and rec["hostname"] == host
        assert rec["device"] == r % devices and rec["source"] == "sim" and rec["uuid"] is None
        assert rec["in_use"] is True
        assert rec["allocated"] == rec["peak_allocated"] == (r + 1) * MiB
        assert rec["memory_stats"]["allocated_bytes.all.current"] == (r + 1) * MiB
        mine = local[r]
        assert rec["pid"] == mine["pid"]
        for key in ("reserved", "peak_reserved", "largest_free_block", "fragmentation",
                    "num_ooms", "num_mallocs"):
            assert rec[key] == mine[key], (r, key)
    assert len({rec["pid"] for rec in stats}) == n


def _expected_spread(stats, key):
    values = [(rec["rank"], rec[key]) for rec in stats]
    lo = min(values, key=lambda v: v[1])
    hi = max(values, key=lambda v: v[1])
    mean = sum(v for _, v in values) / len(values)
    return {"min": lo[1], "min_rank": lo[0], "max": hi[1], "max_rank": hi[0], "mean": mean,
            "imbalance": hi[1] / mean if mean else 1.0}


def _overall_row(text, name):
    """The cells of the all-ranks table's row for a metric."""
    table = text[text.rindex(" ranks "):]  # the last table, titled "all N ranks"
    rows = [line for line in table.splitlines() if line.startswith(f"| {name} ")]
    assert len(rows) == 1, (name, text)
    return [c.strip() for c in rows[0].strip("|").split("|")]


# ---------------------------------------------------------------------------------------
# 4 ranks, started as torchrun starts them.
# ---------------------------------------------------------------------------------------

RANK_CODE = """
import datetime, json, os
import torch.distributed as dist
import vramkit
import vramkit.distributed as vd

MiB = 1 << 20
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
r, n = dist.get_rank(), dist.get_world_size()
d = r % 2
buf = vramkit.empty((r + 1) * MiB, device=d)
out = os.environ["OUT"]
json.dump(vd.local_stats(d), open(os.path.join(out, f"local{r}.json"), "w"))

stats = vd.gather_stats(device=d)
text = vd.memory_summary(device=d)
assert (stats is None) == (text is None) == (r != 0), (r, stats is None, text is None)

# A dst outside the group fails on every rank before any communication: nobody hangs.
for bad, kind in ((n, ValueError), (-1, ValueError), (True, TypeError), ("0", TypeError)):
    try:
        vd.gather_stats(device=d, dst=bad)
    except kind as error:
        assert "dst" in str(error), error
    else:
        raise AssertionError(f"dst={bad!r} was accepted")

# Another destination, and a subgroup of ranks 1 and 3 (every rank makes the group).
to3 = vd.gather_stats(device=d, dst=3)
assert (to3 is None) == (r != 3)
group = dist.new_group([1, 3])
sub = vd.gather_stats(group=group, device=d, dst=1)
sub_text = vd.memory_summary(group=group, device=d)  # to the group's first rank, 1
if r in (1, 3):
    try:
        vd.gather_stats(group=group, device=d, dst=0)
    except ValueError as error:
        assert "dst=0 is not a rank of the group (its global ranks: 1, 3)" in str(error), error
    else:
        raise AssertionError("dst=0 outside the subgroup was accepted")
assert (sub is None) == (sub_text is None) == (r != 1)

if r == 0:
    json.dump({"stats": stats, "text": text}, open(os.path.join(out, "gathered.json"), "w"))
if r == 3:
    json.dump(to3, open(os.path.join(out, "to3.json"), "w"))
if r == 1:
    json.dump({"stats": sub, "text": sub_text}, open(os.path.join(out, "sub.json"), "w"))
dist.barrier()
dist.destroy_process_group()
"""


def test_gather_four_ranks(tmp_path):
    import vramkit.distributed as vd

    n = 4
    _launch(RANK_CODE, n, tmp_path)
    local = [json.loads((tmp_path / f"local{r}.json").read_text()) for r in range(n)]
    gathered = json.loads((tmp_path / "gathered.json").read_text())
    stats, text = gathered["stats"], gathered["text"]
    _check_gathered(stats, n, 2, local)
    assert json.loads((tmp_path / "to3.json").read_text()) == stats

    s = vd.summarize(stats)
    assert s["ranks"] == 4 and s["hosts"] == 1 and s["num_ooms"] == 0
    alloc = s["metrics"]["allocated"]
    assert alloc == {"min": 1 * MiB, "min_rank": 0, "max": 4 * MiB, "max_rank": 3,
                     "mean": 2.5 * MiB, "imbalance": 1.6}
    for key in ("reserved", "peak_allocated", "peak_reserved", "fragmentation"):
        assert s["metrics"][key] == _expected_spread(stats, key), key
    # One table per device: device 0 holds ranks 0 and 2, device 1 ranks 1 and 3.
    assert [(d["device"], d["ranks"]) for d in s["devices"]] == [(0, [0, 2]), (1, [1, 3])]
    assert s["devices"][0]["sum"]["allocated"] == 4 * MiB
    assert s["devices"][1]["sum"]["allocated"] == 6 * MiB
    assert s["devices"][1]["metrics"]["allocated"]["max_rank"] == 3
    assert s["devices"][1]["metrics"]["allocated"]["imbalance"] == 4 / 3

    host = socket.gethostname()
    assert text.startswith("vramkit memory across 4 ranks (world size 4), 1 host, 2 devices;"
                           " 0 OOMs\n")
    assert f"{host}, device 0 (sim): ranks 0, 2" in text
    assert f"{host}, device 1 (sim): ranks 1, 3" in text
    assert "all 4 ranks" in text
    assert _overall_row(text, "allocated") == ["allocated", "1.00 MiB", "0", "4.00 MiB", "3",
                                               "2.50 MiB", "1.60"]
    row = _overall_row(text, "reserved")
    assert row[2] == str(s["metrics"]["reserved"]["min_rank"])
    assert row[4] == str(s["metrics"]["reserved"]["max_rank"])
    assert "4.00 MiB (r3)" in text  # device 1's max allocated, on rank 3

    sub = json.loads((tmp_path / "sub.json").read_text())
    assert [r["rank"] for r in sub["stats"]] == [1, 3]
    assert [r["group_rank"] for r in sub["stats"]] == [0, 1]
    assert sub["stats"][1]["allocated"] == 4 * MiB
    assert sub["text"].startswith("vramkit memory across 2 ranks (world size 4)")
    assert _overall_row(sub["text"], "allocated")[1:5] == ["2.00 MiB", "1", "4.00 MiB", "3"]


# ---------------------------------------------------------------------------------------
# 64 ranks: the gather path at scale, forked from one interpreter.
# ---------------------------------------------------------------------------------------

SCALE_CODE = """
import datetime, json, os, sys, time
t0 = time.monotonic()
import torch.distributed as dist
import torch.multiprocessing as mp
import vramkit
import vramkit.distributed as vd

MiB = 1 << 20
N, DEVICES = int(os.environ["N"]), 8
OUT = os.environ["OUT"]
assert not any(vramkit._pool_in_use(d) for d in range(DEVICES))  # children get fresh pools
t_import = time.monotonic() - t0

def rank(r):
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(N))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    t_init = time.monotonic()
    d = r % DEVICES
    buf = vramkit.empty((r + 1) * MiB, device=d)
    local = vd.local_stats(d)
    t = time.monotonic()
    stats = vd.gather_stats(device=d)
    t_gather = time.monotonic() - t
    text = vd.memory_summary(device=d)
    if r == 0:
        json.dump({"stats": stats, "text": text, "t_gather": t_gather,
                   "t_init": t_init - t0}, open(os.path.join(OUT, "gathered.json"), "w"))
    else:
        assert stats is None and text is None
    json.dump(local, open(os.path.join(OUT, f"local{r}.json"), "w"))
    dist.destroy_process_group()

t = time.monotonic()
mp.start_processes(rank, nprocs=N, start_method="fork", join=True)
print(json.dumps({"import": t_import, "ranks": time.monotonic() - t}))
"""


def test_gather_sixty_four_ranks(tmp_path):
    import vramkit.distributed as vd

    n = 64
    t = time.monotonic()
    proc = run_python(SCALE_CODE, env={**_dist_env(_free_port()), "N": str(n),
                                       "OUT": str(tmp_path)}, cwd=tmp_path)
    wall = time.monotonic() - t
    timings = json.loads(proc.stdout.strip().splitlines()[-1])
    local = [json.loads((tmp_path / f"local{r}.json").read_text()) for r in range(n)]
    gathered = json.loads((tmp_path / "gathered.json").read_text())
    stats, text = gathered["stats"], gathered["text"]
    _check_gathered(stats, n, 8, local)

    s = vd.summarize(stats)
    alloc = s["metrics"]["allocated"]
    assert (alloc["min"], alloc["min_rank"], alloc["max"], alloc["max_rank"]) == \
        (MiB, 0, 64 * MiB, 63)
    assert alloc["mean"] == 32.5 * MiB and alloc["imbalance"] == 64 / 32.5
    for key in ("reserved", "peak_allocated", "peak_reserved", "fragmentation"):
        assert s["metrics"][key] == _expected_spread(stats, key), key
    assert [d["ranks"] for d in s["devices"]] == [list(range(d, n, 8)) for d in range(8)]
    # Device 7 holds ranks 7, 15, ..., 63: (8 + 16 + ... + 64) MiB.
    assert s["devices"][7]["sum"]["allocated"] == sum(range(8, 65, 8)) * MiB
    assert text.startswith("vramkit memory across 64 ranks (world size 64), 1 host, "
                           "8 devices; 0 OOMs\n")
    assert _overall_row(text, "allocated") == ["allocated", "1.00 MiB", "0", "64.00 MiB",
                                               "63", "32.50 MiB", "1.97"]
    print(f"64 ranks: {wall:.1f} s in all (parent's imports {timings['import']:.1f} s, ranks "
          f"{timings['ranks']:.1f} s, rank 0's init {gathered['t_init']:.1f} s after the "
          f"start, one gather {gathered['t_gather'] * 1000:.0f} ms)")


# ---------------------------------------------------------------------------------------
# Bad input, a world of one, and the lazy import.
# ---------------------------------------------------------------------------------------

def test_not_initialised_and_world_of_one(tmp_path):
    port = _free_port()
    run_python(f"""
        import datetime, sys
        import vramkit
        assert "torch" not in sys.modules
        lazy = vramkit.distributed           # loaded on first access, as vramkit.torch is
        import vramkit.distributed as vd
        assert lazy is vd and "torch" not in sys.modules  # no framework imported
        import torch.distributed as dist

        for call in (vd.gather_stats, vd.memory_summary):
            try:
                call()
            except RuntimeError as error:
                assert "init_process_group" in str(error), error
                assert "not initialised" in str(error), error
            else:
                raise AssertionError(f"{{call.__name__}} ran without a process group")

        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=60))
        try:
            vd.gather_stats(dst=1)
        except ValueError as error:
            assert str(error) == ("vramkit.distributed.gather_stats(): dst=1 is not a rank of "
                                  "the group (its global ranks: 0 to 0)"), error
        else:
            raise AssertionError("dst=1 accepted in a world of one")
        try:
            vd.memory_summary(dst=2.0)
        except TypeError as error:
            assert "dst must be an int" in str(error), error
        else:
            raise AssertionError("dst=2.0 accepted")

        # Nothing allocated: zeros, and the pool is not created by the gather.
        stats = vd.gather_stats()
        assert len(stats) == 1 and stats[0]["in_use"] is False and stats[0]["allocated"] == 0
        assert stats[0]["source"] is None and not vramkit._pool_in_use(0)
        vramkit.configure(0, source="sim")   # still possible
        buf = vramkit.empty(3 << 20)
        stats = vd.gather_stats()
        assert stats[0]["allocated"] == 3 << 20 and stats[0]["rank"] == 0
        assert stats[0]["world_size"] == 1 and stats[0]["source"] == "sim"
        text = vd.memory_summary()
        assert "all 1 ranks" in text and "| allocated " in text, text
        assert vd.summarize(stats)["metrics"]["allocated"]["imbalance"] == 1.0
        dist.destroy_process_group()
    """, env={"GLOO_SOCKET_IFNAME": "lo"}, cwd=tmp_path)


def test_summarize_edge_cases():
    import vramkit.distributed as vd

    with pytest.raises(ValueError, match="no ranks"):
        vd.summarize([])

    def rec(rank, allocated, host="h", device=0, uuid=None):
        return {"rank": rank, "hostname": host, "device": device, "uuid": uuid,
                "source": "cuda", "allocated": allocated, "reserved": allocated,
                "peak_allocated": allocated, "peak_reserved": allocated,
                "fragmentation": 0.0, "num_ooms": rank}

    # Ties name the lowest rank; all zeros are balanced; UUIDs group ranks whose ordinals
    # differ (CUDA_VISIBLE_DEVICES renumbers), hosts keep the same ordinal apart.
    s = vd.summarize([rec(2, 5, "b", 0, "GPU-x"), rec(0, 5, "a", 1, "GPU-y"),
                      rec(1, 0, "a", 0, "GPU-y"), rec(3, 5, "b", 0)])
    assert s["metrics"]["allocated"]["max_rank"] == 0
    assert s["metrics"]["fragmentation"]["imbalance"] == 1.0
    assert s["num_ooms"] == 6 and s["hosts"] == 2
    assert [(d["hostname"], d["ranks"]) for d in s["devices"]] == \
        [("a", [0, 1]), ("b", [3]), ("b", [2])]


# ---------------------------------------------------------------------------------------
# Files per rank.
# ---------------------------------------------------------------------------------------

@pytest.fixture
def no_rank_env(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("path, expected", [
    ("mem.jsonl", "mem.rank3.jsonl"),
    ("out/mem.jsonl", os.path.join("out", "mem.rank3.jsonl")),
    ("run.v2/mem.csv", os.path.join("run.v2", "mem.rank3.csv")),
    ("trace.tar.gz", "trace.rank3.tar.gz"),
    ("log", "log.rank3"),
    (".mem.jsonl", ".mem.rank3.jsonl"),
    (".hidden", ".hidden.rank3"),
    ("/abs/snap.pickle", "/abs/snap.rank3.pickle"),
    ("mem.rank3.jsonl", "mem.rank3.jsonl"),       # already per rank: unchanged
    ("mem.rank31.jsonl", "mem.rank3.rank31.jsonl"),
])
def test_rank_path(path, expected, no_rank_env):
    from vramkit.distributed import rank_path

    assert rank_path(path, 3) == expected
    assert rank_path(rank_path(path, 3), 3) == expected


def test_rank_path_types_and_environment(no_rank_env):
    from vramkit.distributed import rank_path

    p = rank_path(pathlib.Path("a/mem.jsonl"), 0)
    assert isinstance(p, pathlib.Path) and p == pathlib.Path("a/mem.rank0.jsonl")
    p = rank_path(pathlib.PurePosixPath("mem.jsonl"), 12)
    assert type(p) is pathlib.PurePosixPath and str(p) == "mem.rank12.jsonl"

    # No rank known: unchanged, the same object.
    path = "mem.jsonl"
    assert rank_path(path) is path
    no_rank_env.setenv("LOCAL_RANK", "2")
    assert rank_path(path) == "mem.rank2.jsonl"
    no_rank_env.setenv("RANK", "7")                  # the global rank comes first
    assert rank_path(path) == "mem.rank7.jsonl"
    assert rank_path(path, 1) == "mem.rank1.jsonl"   # an explicit rank wins
    no_rank_env.setenv("RANK", "seven")
    with pytest.raises(ValueError, match="RANK='seven' is not a rank"):
        rank_path(path)
    no_rank_env.setenv("RANK", "-1")
    with pytest.raises(ValueError, match="RANK='-1'"):
        rank_path(path)


def test_rank_path_bad_input(no_rank_env):
    from vramkit.distributed import rank_path

    with pytest.raises(ValueError, match="must be >= 0"):
        rank_path("mem.jsonl", -1)
    with pytest.raises(TypeError, match="rank must be an int"):
        rank_path("mem.jsonl", True)
    with pytest.raises(TypeError, match="rank must be an int"):
        rank_path("mem.jsonl", "3")
    with pytest.raises(TypeError, match="not bytes"):
        rank_path(b"mem.jsonl", 1)
    with pytest.raises(TypeError):
        rank_path(3, 1)
    with pytest.raises(ValueError, match="names a directory"):
        rank_path("out/", 1)
    with pytest.raises(ValueError, match="names a directory"):
        rank_path("", 1)


def test_logger_and_snapshot_per_rank(tmp_path):
    run_python("""
        import csv, json, os
        import vramkit
        import vramkit.distributed as vd

        os.environ.update(RANK="3", LOCAL_RANK="1")     # as torchrun sets them
        buf = vramkit.empty(2 << 20)
        with vd.MemoryLogger("mem.jsonl", nvml=False, summary=False) as log:
            assert log.path == "mem.rank3.jsonl" and log.rank == 3
            for step in range(3):
                log.step(loss=0.5)
            summary = log.summary()
        assert summary.startswith("vramkit memory log (rank 3, device 0)"), summary
        records = [json.loads(line) for line in open("mem.rank3.jsonl")]
        assert [r["rank"] for r in records] == [3, 3, 3]
        assert records[0]["allocated"] == 2 << 20 and records[0]["loss"] == 0.5
        assert not os.path.exists("mem.jsonl")

        with vd.MemoryLogger("mem.csv", rank=5, nvml=False, summary=False) as log:
            log.step()
            try:
                log.step(rank=1)
            except ValueError as error:
                assert "'rank' is this logger's own field" in str(error)
            else:
                raise AssertionError("rank= accepted as an extra")
        rows = list(csv.DictReader(open("mem.rank5.csv")))
        assert rows[0]["rank"] == "5" and list(rows[0])[-1] == "rank"

        seen = []
        with vd.MemoryLogger(seen.append, rank=2, nvml=False, summary=False) as log:
            log.step()
        assert seen[0]["rank"] == 2

        assert vd.dump_snapshot("snap.pickle") == "snap.rank3.pickle"
        assert os.path.getsize("snap.rank3.pickle") > 0 and not os.path.exists("snap.pickle")
        assert vd.dump_snapshot("snap.pickle", rank=0) == "snap.rank0.pickle"

        del os.environ["RANK"], os.environ["LOCAL_RANK"]
        with vd.MemoryLogger("plain.jsonl", nvml=False, summary=False) as log:
            log.step()
        assert json.loads(open("plain.jsonl").readline())["rank"] is None
    """, cwd=tmp_path)
