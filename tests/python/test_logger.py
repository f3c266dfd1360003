"""vramkit.MemoryLogger, tqdm_postfix and the framework callbacks on sim: records equal to
memory_stats() at each step in JSON lines, CSV and callback form; every=N; peaks between
records without touching the user's peaks (and exactly, with reset_peaks); the summary names
the step of the peak; no pool is created by logging; `vramkit plot` draws the logs.

Each test runs its training loop in a fresh interpreter (fresh pools, so peaks and counters
start at zero) that writes what it saw as JSON; the assertions run here.
"""

import csv
import json
import re
import subprocess
import sys
import textwrap

import pytest

MiB = 1 << 20

# The loop of most tests: at each step, allocations that stay, and inside some steps a
# transient allocation freed before the step ends (as activations are), so that the step's
# peak is above what is held when step() is called.
LOOP = """
import json, sys, vramkit
from vramkit import MemoryLogger
MiB = 1 << 20
TRANSIENT = {3: 200, 6: 50, 8: 20}     # step -> MiB allocated and freed inside the step
def train(log, steps=10):
    keep, seen = [], []
    for step in range(steps):
        keep.append(vramkit.empty((step + 1) * MiB))
        if step in TRANSIENT:
            vramkit.empty(TRANSIENT[step] * MiB).free()
        stats = vramkit.memory_stats()
        record = log.step(step, loss=1.0 / (step + 1))
        seen.append({"stats": stats, "record": record})
    return keep, seen
"""

FIELDS = ["time", "step", "device", "allocated", "reserved", "peak_allocated", "peak_reserved",
          "active", "largest_free_block", "fragmentation", "nvml_used", "nvml_process_used",
          "nvml_age_s", "num_alloc_retries", "num_ooms", "step_time"]


@pytest.fixture
def child(run, tmp_path):
    def go(body):
        proc = run(LOOP + textwrap.dedent(body), env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr

    return go


def _check_against_stats(record, stats):
    assert record["allocated"] == stats["allocated_bytes.all.current"]
    assert record["reserved"] == stats["reserved_bytes.all.current"]
    assert record["active"] == stats["active_bytes.all.current"]
    assert record["largest_free_block"] == stats["largest_free_block"]
    assert record["fragmentation"] == pytest.approx(stats["fragmentation"])
    assert record["num_alloc_retries"] == stats["num_alloc_retries"]
    assert record["num_ooms"] == stats["num_ooms"]


def test_jsonl_records_equal_memory_stats_at_each_step(child, tmp_path):
    log_path = tmp_path / "memory.jsonl"
    seen, stderr = child(f"""
        with MemoryLogger({str(log_path)!r}) as log:
            keep, seen = train(log)
        print(json.dumps(seen))
    """)
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(lines) == 10
    for step, (line, at) in enumerate(zip(lines, seen)):
        assert list(line)[:len(FIELDS)] == FIELDS and line["loss"] == 1.0 / (step + 1)
        assert line == at["record"]                       # what step() returned was written
        assert line["step"] == step and line["device"] == 0
        _check_against_stats(line, at["stats"])
        assert line["nvml_used"] is None                  # sim: no GPU to ask NVML about
        assert (line["step_time"] is None) == (step == 0)
        assert step == 0 or line["step_time"] > 0
    assert lines[0]["time"] <= lines[-1]["time"]
    # Held memory grows by step + 1 MiB at each step.
    assert [b["allocated"] - a["allocated"] for a, b in zip(lines, lines[1:])] == \
        [(s + 2) * MiB for s in range(9)]
    assert "peak allocated" in stderr                     # the summary, on stderr


def test_csv_has_the_same_records(child, tmp_path):
    log_path = tmp_path / "memory.csv"
    seen, _ = child(f"""
        with MemoryLogger({str(log_path)!r}, summary=False) as log:
            keep, seen = train(log, steps=4)
        print(json.dumps(seen))
    """)
    with open(log_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == FIELDS + ["loss"]
    assert len(rows) == 4
    for row, at in zip(rows, seen):
        record = at["record"]
        for name in FIELDS + ["loss"]:
            expected = record[name]
            if expected is None:
                assert row[name] == "", name
            elif isinstance(expected, float):
                assert float(row[name]) == pytest.approx(expected), name
            else:
                assert int(row[name]) == expected, name
        _check_against_stats({k: (float(v) if k == "fragmentation" else int(v))
                              for k, v in row.items() if k in
                              ("allocated", "reserved", "active", "largest_free_block",
                               "fragmentation", "num_alloc_retries", "num_ooms")},
                             at["stats"])


def test_every_n_and_the_peaks_between_records(child):
    seen, _ = child("""
        records = []
        log = MemoryLogger(records.append, every=3, summary=False)
        before = vramkit.max_memory_allocated()
        keep, seen = train(log)
        print(json.dumps({"records": records, "seen": seen,
                          "user_peak": vramkit.max_memory_allocated()}))
    """)
    records = seen["records"]
    assert [r["step"] for r in records] == [0, 3, 6, 9]      # the first, then every third
    assert [s["record"] is not None for s in seen["seen"]] == \
        [step % 3 == 0 for step in range(10)]
    by_step = {r["step"]: r for r in records}
    stats = {step: s["stats"] for step, s in enumerate(seen["seen"])}
    for step, record in by_step.items():
        _check_against_stats(record, stats[step])
    # Step 3's 200 MiB transient set a new high: the record of that window has it exactly.
    assert by_step[3]["peak_allocated"] == stats[3]["allocated_bytes.all.peak"]
    assert by_step[3]["peak_allocated"] >= by_step[3]["allocated"] + 200 * MiB
    # Step 6's 50 MiB stayed below that high: the running max sees only held memory
    # (a lower bound), as documented, and the user's own peak is left alone.
    assert by_step[6]["peak_allocated"] == stats[6]["allocated_bytes.all.current"]
    assert seen["user_peak"] == stats[3]["allocated_bytes.all.peak"]
    # step_time is the window's mean: three calls per record after the first.
    assert records[0]["step_time"] is None and all(r["step_time"] > 0 for r in records[1:])


def test_reset_peaks_gives_each_window_its_own_peak(child):
    seen, _ = child("""
        records = []
        log = MemoryLogger(records.append, every=3, reset_peaks=True, summary=False)
        keep, seen = train(log)
        print(json.dumps({"records": records, "seen": seen,
                          "user_peak": vramkit.max_memory_allocated()}))
    """)
    by_step = {r["step"]: r for r in seen["records"]}
    held = {step: s["stats"]["allocated_bytes.all.current"] for step, s in
            enumerate(seen["seen"])}
    # Window 4..6 holds step 5's memory plus step 6's 50 MiB transient: exact now.
    assert by_step[6]["peak_allocated"] == held[5] + 7 * MiB + 50 * MiB
    assert by_step[9]["peak_allocated"] == held[7] + 9 * MiB + 20 * MiB
    assert seen["user_peak"] < held[2] + 200 * MiB           # reset, as asked


def test_the_summary_names_the_peak_step_between_records(child, tmp_path):
    log_path = tmp_path / "memory.jsonl"
    _, stderr = child(f"""
        with MemoryLogger({str(log_path)!r}, every=5) as log:
            keep, seen = train(log)
        print(json.dumps(None))
    """)
    # Step 3 is not a record step (0, 5): the summary still names it.
    peak_line = next(line for line in stderr.splitlines() if "peak allocated" in line)
    assert "during step 3," in peak_line and "MiB" in peak_line
    assert f"vramkit plot {log_path}" in stderr
    assert len(log_path.read_text().splitlines()) == 2



def test_the_summary_counts_one_in_the_singular(run, tmp_path):
    # One step, one record, one OOM and one retry: "1 step", never "1 steps".
    out = run("""
        import vramkit
        vramkit.configure(0, limit="1G")
        log = vramkit.MemoryLogger(lambda record: None)
        buf = vramkit.empty(1 << 20)
        log.step(0)
        try:
            vramkit.empty(2 << 30)
        except vramkit.OutOfMemoryError:
            pass
        print(log.summary())
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}).stdout
    assert ": 1 step, 1 record ->" in out, out
    assert "out of memory: 1 OOM, 1 allocation retried after" in out, out

def test_logging_creates_no_pool(run, tmp_path):
    out = run(f"""
        import json, vramkit
        records = []
        log = vramkit.MemoryLogger(records.append, summary=False)
        log.step(0)
        in_use = vramkit._pool_in_use(0)
        postfix = vramkit.tqdm_postfix()
        vramkit.configure(0, limit="1G")     # still possible: logging made no pool
        buf = vramkit.empty(5 << 20)
        log.step(1)
        print(json.dumps({{"in_use": in_use, "records": records, "postfix": postfix,
                          "summary": log.summary()}}))
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}).stdout
    result = json.loads(out)
    assert result["in_use"] is False
    assert result["records"][0]["allocated"] == 0
    assert result["records"][1]["allocated"] == 5 * MiB
    assert result["postfix"] == {"alloc": "0 B", "resv": "0 B", "peak": "0 B"}


def test_tqdm_postfix_is_short_and_current(run, tmp_path):
    out = run("""
        import json, vramkit
        buf = vramkit.empty(3 << 30)
        print(json.dumps(vramkit.tqdm_postfix()))
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}).stdout
    postfix = json.loads(out)
    assert postfix["alloc"] == "3.00 GiB" and postfix["peak"] == "3.00 GiB"
    assert set(postfix) == {"alloc", "resv", "peak"}



def test_tqdm_postfix_of_a_size_just_under_a_unit(run, tmp_path):
    # 512 bytes short of 1 GiB rounds to 1.00 GiB at two decimals: shown so, in the unit
    # the reserved figure beside it is in, never as "1024.00 MiB".
    out = run("""
        import json, vramkit
        buf = vramkit.empty((1 << 30) - 512)
        print(json.dumps(vramkit.tqdm_postfix()))
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}).stdout
    postfix = json.loads(out)
    assert postfix["alloc"] == "1.00 GiB" and postfix["peak"] == "1.00 GiB"

def test_bad_arguments(tmp_path):
    from vramkit import MemoryLogger

    with pytest.raises(ValueError, match="must end in .jsonl"):
        MemoryLogger(tmp_path / "memory.txt")
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        MemoryLogger(lambda r: None, every=0)
    with pytest.raises(OSError):
        MemoryLogger(tmp_path / "no" / "such" / "folder.jsonl")
    for summary in (True, "stderr"):  # refused at close(), at the end of a run, before
        with pytest.raises(TypeError, match="summary must be a file object"):
            MemoryLogger(lambda r: None, summary=summary)
    # A device the source does not have: refused before the file is made, where it logged
    # "the pool was never used" at every record of a run.
    import vramkit
    count = vramkit.device_count()
    with pytest.raises(vramkit.InvalidDeviceError, match=f"device {count}: invalid device "
                                                         f"ordinal \\(devices 0 to {count - 1} "
                                                         f"are there\\)"):
        MemoryLogger(tmp_path / "absent.jsonl", device=count)
    assert not (tmp_path / "absent.jsonl").exists()
    MemoryLogger(lambda r: None, device=count - 1, summary=False).close()
    log = MemoryLogger(lambda r: None, summary=False)
    with pytest.raises(ValueError, match="would replace"):
        log.step(0, allocated=1)
    log.close()
    with pytest.raises(ValueError, match="after close"):
        log.step(1)


def test_a_step_the_log_could_not_be_drawn_with_is_refused_at_the_call(tmp_path):
    # step("epoch 1"), step(float("nan")), step_time="fast" were written as given: the run's
    # log was then refused by `vramkit plot` ("'step' is not a number"), hours too late.
    from vramkit import MemoryLogger

    path = tmp_path / "memory.jsonl"
    log = MemoryLogger(path, summary=False)
    for bad, error, says in [("epoch 1\x1b[2J", TypeError, "'epoch 1\\x1b[2J'"),
                             (True, TypeError, "True"), (float("nan"), ValueError, "nan"),
                             (2 ** 70, ValueError, str(2 ** 70))]:
        with pytest.raises(error, match="MemoryLogger.step\\(\\): step_number must be") as info:
            log.step(bad)
        assert says in str(info.value), info.value
    for bad, error in [("fast", TypeError), (float("inf"), ValueError), (-1.0, ValueError)]:
        with pytest.raises(error, match="MemoryLogger.step\\(\\): step_time must be"):
            log.step(3, step_time=bad)
    log.step(4, step_time=0.25)
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 4  # nothing refused was kept
    from vramkit.plot import load

    assert [b.site for b in load(str(path)).blocks] == ["step 4"]
    # A path given as bytes is a path: it raised "a bytes-like object is required".
    MemoryLogger(bytes(tmp_path / "bytes.csv"), summary=False).close()
    assert (tmp_path / "bytes.csv").exists()


def test_csv_drops_fields_the_header_lacks_with_a_warning(run, tmp_path):
    log_path = tmp_path / "memory.csv"
    proc = run(f"""
        import vramkit, warnings
        warnings.simplefilter("always")
        with vramkit.MemoryLogger({str(log_path)!r}, summary=False) as log:
            log.step(0, loss=1.0)
            log.step(1, loss=0.5, lr=0.1)
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
    assert "dropping the new fields lr" in proc.stderr
    rows = list(csv.DictReader(open(log_path, newline="")))
    assert [row["loss"] for row in rows] == ["1.0", "0.5"] and "lr" not in rows[0]


# ---- vramkit plot draws the logs ---------------------------------------------------------

def _plot(path, out):
    return subprocess.run([sys.executable, "-m", "vramkit", "plot", str(path), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_plot_draws_a_log(child, tmp_path, suffix):
    log_path = tmp_path / f"memory.{suffix}"
    child(f"""
        with MemoryLogger({str(log_path)!r}, summary=False) as log:
            keep, seen = train(log)
        print(json.dumps(None))
    """)
    from vramkit.plot import load

    history = load(str(log_path))
    assert history.kind == "log"
    lines = log_path.read_text().splitlines()
    last = json.loads(lines[-1]) if suffix == "jsonl" else \
        dict(zip(lines[0].split(","), lines[-1].split(",")))
    assert history.reserved[-1][1] == int(last["reserved"])
    # The step with 200 MiB freed inside it holds the peak, above anything held at a record.
    peaks = [json.loads(line)["peak_allocated"] for line in lines] if suffix == "jsonl" else \
        [int(row["peak_allocated"]) for row in csv.DictReader(open(log_path, newline=""))]
    assert history.peak_allocated == max(peaks) > int(last["allocated"])
    assert [b.site for b in history.blocks][:2] == ["step 0", "step 1"]
    done = _plot(log_path, tmp_path / "memory.html")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "memory.html").read_text()
    assert "memory log" in page and "step 9" in page


def test_plot_log_with_an_oom_and_a_cut_last_line(tmp_path):
    records = [{"time": 100.0 + i, "step": i, "allocated": (i + 1) * MiB,
                "reserved": 64 * MiB, "num_ooms": 0 if i < 2 else 1} for i in range(4)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    path = tmp_path / "cut.jsonl"
    path.write_text(text + '{"time": 105.0, "step": 4, "allocat')
    from vramkit.plot import load

    history = load(str(path))
    assert len(history.blocks) == 4
    assert len(history.ooms) == 1 and "by step 2" in history.ooms[0][1]
    assert history.ooms[0][0] == pytest.approx(2e6)            # seconds drawn in µs
    assert any("incomplete" in note for note in history.notes)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(records[0]) + "\nnot json\n" + json.dumps(records[1]) + "\n")
    done = _plot(bad, tmp_path / "bad.html")
    assert done.returncode == 2 and "bad.jsonl:2: not a JSON record" in done.stderr


def test_plot_states_the_logs_peaks_not_the_highest_record(tmp_path):
    # A high inside the steps between two records is only in the records' peaks: the page
    # said "peak allocated 4.00 MiB, peak reserved 64.00 MiB" of a log whose peaks were
    # 40 MiB and 96 MiB.
    records = [{"time": 100.0 + i, "step": i, "allocated": (i + 1) * MiB, "reserved": 64 * MiB,
                "peak_allocated": (40 if i == 1 else i + 1) * MiB,
                "peak_reserved": (96 if i == 1 else 64) * MiB} for i in range(4)]
    path = tmp_path / "peaks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = _plot(path, tmp_path / "peaks.html")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "peaks.html").read_text()
    data = json.loads(re.search(r'id="vk-data">(.*?)</script>', page, re.S).group(1))
    assert (data["peak"], data["peakReserved"]) == (40 * MiB, 96 * MiB)
    # A peak field that is no byte count is refused by name, as allocated is.
    path.write_text(json.dumps(dict(records[0], peak_reserved="lots")) + "\n")
    done = _plot(path, tmp_path / "bad.html")
    assert done.returncode == 2 and "'peak_reserved' is not a number" in done.stderr


HUGE = "1" + "0" * 400  # an int no float holds


@pytest.mark.parametrize("name, text, says", [
    ("time.jsonl", f'{{"time": {HUGE}, "step": 0, "allocated": 5, "reserved": 6}}\n',
     "bad.log:1: 'time' is not a time in seconds: 1000000000"),
    ("allocated.jsonl", f'{{"time": 1, "step": 0, "allocated": {HUGE}, "reserved": 6}}\n',
     "bad.log:1: 'allocated' is not a byte count from 0 to 2**64 - 1: 1000000000"),
    ("reserved.csv", f"time,step,allocated,reserved\n1,0,5,{HUGE}\n",
     "bad.log:2: 'reserved' is not a byte count from 0 to 2**64 - 1: 1000000000"),
    ("float.jsonl", '{"time": 1, "step": 0, "allocated": 1e30, "reserved": 6}\n',
     "bad.log:1: 'allocated' is not a byte count from 0 to 2**64 - 1: 1e+30"),
    ("negative.csv", "time,step,allocated,reserved\n1,0,-1,6\n",
     "bad.log:2: 'allocated' is not a byte count from 0 to 2**64 - 1: -1"),
])
def test_plot_refuses_a_log_figure_no_memory_or_clock_holds(tmp_path, name, text, says):
    # An int past a float's range in a log stopped `vramkit plot` with an OverflowError
    # traceback (time, allocated, reserved alike); 1e30 bytes was drawn as if it were memory.
    path = tmp_path / "bad.log"
    path.write_text(text)
    done = _plot(path, tmp_path / "out.html")
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out.html").exists()


# ---- the framework callbacks -------------------------------------------------------------

def test_integrations_import_no_framework(run, tmp_path):
    out = run("""
        import sys, vramkit, vramkit.integrations
        from vramkit.integrations import log_path
        assert log_path("m.jsonl", 0, 1) == "m.jsonl"
        assert log_path("runs/m.jsonl", 2, 4) == "runs/m.rank2.jsonl"
        print(sorted(m for m in ("transformers", "lightning", "pytorch_lightning", "torch",
                                 "prometheus_client") if m in sys.modules))
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)}).stdout
    assert out.strip() == "[]"


def test_hf_callback_logs_steps(run, tmp_path):
    pytest.importorskip("transformers")
    log_path = tmp_path / "hf.jsonl"
    proc = run(f"""
        from types import SimpleNamespace
        import vramkit
        from vramkit.integrations.hf import MemoryCallback
        cb = MemoryCallback({str(log_path)!r})
        args = SimpleNamespace(device=SimpleNamespace(type="cpu"), process_index=0,
                               world_size=1)
        state = SimpleNamespace(global_step=0, epoch=0.0)
        cb.on_train_begin(args, state, None)
        keep = []
        for step in range(1, 4):
            keep.append(vramkit.empty(step << 20))
            state.global_step, state.epoch = step, step / 3
            cb.on_step_end(args, state, None)
        cb.on_train_end(args, state, None)
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3] and lines[-1]["epoch"] == 1.0
    assert lines[-1]["allocated"] == 6 * MiB
    assert "during step 3" in proc.stderr


def test_hf_callback_gives_each_rank_its_own_log_for_a_path_object(run, tmp_path):
    """A pathlib.Path was taken for an open file: every rank wrote the one log."""
    pytest.importorskip("transformers")
    run(f"""
        import pathlib
        from types import SimpleNamespace
        from vramkit.integrations.hf import MemoryCallback
        cb = MemoryCallback(pathlib.Path({str(tmp_path / "hf.jsonl")!r}))
        args = SimpleNamespace(device=SimpleNamespace(type="cpu"), process_index=1,
                               world_size=2)
        state = SimpleNamespace(global_step=1, epoch=0.0)
        cb.on_train_begin(args, state, None)
        cb.on_step_end(args, state, None)
        cb.on_train_end(args, state, None)
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
    assert (tmp_path / "hf.rank1.jsonl").exists() and not (tmp_path / "hf.jsonl").exists()


def test_lightning_callback_logs_batches(run, tmp_path):
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        pytest.importorskip("pytorch_lightning")
    log_path = tmp_path / "pl.jsonl"
    run(f"""
        from types import SimpleNamespace
        import vramkit
        from vramkit.integrations.lightning import MemoryCallback
        cb = MemoryCallback({str(log_path)!r})
        trainer = SimpleNamespace(global_step=0, current_epoch=0, global_rank=0, world_size=1)
        module = SimpleNamespace(device=SimpleNamespace(type="cpu"))
        cb.on_train_start(trainer, module)
        keep = []
        for batch in range(3):
            keep.append(vramkit.empty(1 << 20))
            trainer.global_step = batch + 1
            cb.on_train_batch_end(trainer, module, None, None, batch)
        cb.on_train_end(trainer, module)
    """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [(r["step"], r["batch_idx"]) for r in lines] == [(1, 0), (2, 1), (3, 2)]


def test_nvml_is_sampled_off_the_step_path(run, tmp_path):
    # The fake NVML lists this process with 5 GiB on GPU 0 (10 GiB used by others); the
    # logger is told the device is a GPU (sim has none, so it would not ask NVML). Steps in a
    # tight loop until the logger's thread has refreshed the sample three times (however long
    # a loaded machine makes that take): every record has the fake's figures and their age,
    # and NVML was queried about once per SAMPLE_PERIOD, not once per record.
    from test_nvml import build_fake_nvml
    library = build_fake_nvml(tmp_path)
    path = tmp_path / "nvml.jsonl"
    proc = run(f"""
        import json, os, time, vramkit
        os.environ["FAKE_NVML_PROCESSES"] = f"0:{{os.getpid()}}:{5 << 30}"
        from vramkit import logger
        logger._nvml_applies = lambda device: True
        keep = vramkit.empty(1 << 20)
        log = vramkit.MemoryLogger({str(path)!r}, every=1, summary=False)
        start = time.monotonic()
        log.step()                           # the first record queries NVML itself
        while log._nvml.queries < 4 and time.monotonic() - start < 60:
            log.step()
        log.step()
        elapsed = time.monotonic() - start
        queries = log._nvml.queries
        log.close()
        print(json.dumps({{"queries": queries, "elapsed": elapsed,
                          "period": logger.SAMPLE_PERIOD}}))
    """, env={"VRAMKIT_NVML_LIBRARY": str(library), "VRAMKIT_PUBLISH_DIR": str(tmp_path)})
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(r["nvml_used"] == 15 << 30 and r["nvml_process_used"] == 5 << 30
               for r in records)
    assert 4 <= seen["queries"] <= seen["elapsed"] / seen["period"] + 2
    ages = [r["nvml_age_s"] for r in records]
    assert ages[0] < seen["period"]
    assert all(0 <= age <= seen["elapsed"] for age in ages)
    # Samples refresh: three refreshes came between records, so the age fell back.
    assert any(later < earlier for earlier, later in zip(ages, ages[1:]))
    assert len(records) > 10 * seen["queries"]


def test_records_reach_the_file_within_a_period_and_at_close_or_exit(run, tmp_path):
    # Open: the thread flushes within about SAMPLE_PERIOD. close() flushes at once. An exit
    # without close() flushes at exit (atexit).
    for suffix in ("jsonl", "csv"):
        follow, closed, exited = (tmp_path / f"{n}.{suffix}" for n in ("follow", "closed", "exit"))
        proc = run(f"""
            import json, os, time, vramkit
            keep = vramkit.empty(1 << 20)
            log = vramkit.MemoryLogger({str(follow)!r}, summary=False)
            for step in range(5):
                log.step(step)
            deadline, seen = time.monotonic() + 5, 0
            while time.monotonic() < deadline:
                with open({str(follow)!r}) as f:
                    seen = len(f.read().splitlines())
                if seen == 5 + ({suffix!r} == "csv"):
                    break
                time.sleep(0.01)
            waited = 5 - (deadline - time.monotonic())
            log.close()
            closing = vramkit.MemoryLogger({str(closed)!r}, summary=False)
            for step in range(7):
                closing.step(step)
            closing.close()
            with open({str(closed)!r}) as f:
                at_close = len(f.read().splitlines())
            left_open = vramkit.MemoryLogger({str(exited)!r}, summary=False)
            for step in range(3):
                left_open.step(step)
            print(json.dumps({{"seen": seen, "waited": waited, "at_close": at_close}}))
        """, env={"VRAMKIT_PUBLISH_DIR": str(tmp_path)})
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        header = 1 if suffix == "csv" else 0
        assert out["seen"] == 5 + header and out["waited"] < 2, out
        assert out["at_close"] == 7 + header
        assert len(exited.read_text().splitlines()) == 3 + header
