"""vramkit.replay(): the engine's replay in this process, with the command's figures, and
the estimator, the doctor and the plots using it with no child process (issue 36)."""

import glob
import gzip
import json
import os
import subprocess

import pytest

import vramkit
from vramkit import cli

TRACES = sorted(glob.glob("data/traces/*.trace.gz"))
FIGURES = ("ops", "peak_live_bytes", "peak_reserved_bytes", "ooms", "device_calls",
           "min_capacity_bytes", "min_capacity_source", "skipped_frees")


@pytest.mark.parametrize("source", ["sim", "sim:vmm"])
def test_same_figures_as_the_command(source):
    path = TRACES[0]
    done = subprocess.run([str(cli.binary_path()), "replay", "--json", "--repeat", "1",
                           "--min-capacity", "--source", source, path],
                          capture_output=True, text=True, env={})
    command = json.loads(done.stdout.splitlines()[-1])
    ours = vramkit.replay(path, source=source, min_capacity=True)
    assert set(command) <= set(ours)
    assert {k: ours[k] for k in FIGURES} == {k: command[k] for k in FIGURES}


@pytest.mark.parametrize("ops", ["", "a 1 0 0 1\nf 1 0 2\n"])
def test_nothing_live_has_no_smallest_capacity_here_or_in_the_command(tmp_path, ops):
    """A trace with nothing live fits any capacity: the search has no figure to give, None
    in process and null from the command, never a capacity of 0 over 0 live."""
    path = tmp_path / "nothing.trace"
    path.write_text("# vramkit-trace v1\n" + ops)
    ours = vramkit.replay(path, min_capacity=True)
    assert ours["min_capacity_bytes"] is None and ours["min_capacity_over_live"] is None
    done = subprocess.run([str(cli.binary_path()), "replay", "--json", "--repeat", "1",
                           "--min-capacity", str(path)], capture_output=True, text=True, env={})
    command = json.loads(done.stdout.splitlines()[-1])
    assert command["min_capacity_bytes"] is None and command["min_capacity_over_live"] is None


def test_arguments_are_checked_before_the_engine_sees_them(tmp_path):
    """What the command's options refuse, the function refuses too, naming the argument:
    no pass count that runs for hours, no True taken as one byte, no capacity 0 read as
    no cap, no negative bound; a capacity may be given as the command writes it."""
    path = tmp_path / "t.trace"
    path.write_text("# vramkit-trace v1\na 1 8388608 0 1\nf 1 0 2\n")
    for kwargs, error, says in (
            (dict(repeat=10**9), ValueError, "repeat must be a whole number from 1 to 1,000"),
            (dict(repeat=1.5), ValueError, "repeat"), (dict(repeat=True), ValueError, "repeat"),
            (dict(repeat="3"), ValueError, "repeat"), (dict(max_ops=-1), ValueError, "max_ops"),
            (dict(max_ops=10**30), ValueError, "max_ops"),
            (dict(capacity=0), ValueError, "capacity must be positive"),
            (dict(capacity=-5), ValueError, "capacity must be positive"),
            (dict(capacity=True), TypeError, "capacity must be a size"),
            (dict(capacity="1X"), ValueError, "capacity"),
            (dict(settings="x"), TypeError, "settings must be a mapping")):
        with pytest.raises(error, match=says):
            vramkit.replay(path, **kwargs)
    assert vramkit.replay(path, capacity="16M")["capacity_bytes"] == 16 << 20
    assert vramkit.replay(path, capacity=16 << 20, repeat=2, max_ops=10)["ooms"] == 0


def test_out_of_memory_is_a_figure_with_its_report(tmp_path):
    path = tmp_path / "t.trace"
    path.write_text("# vramkit-trace v1\na 1 8388608 0 1\na 2 8388608 0 2\n")
    result = vramkit.replay(path, capacity=10 << 20)
    assert result["ooms"] == 1 and result["capacity_bytes"] == 10 << 20
    assert "out of memory" in result["first_oom_report"]
    # The figures the report is written from, with the engine's cause as its name.
    first = result["first_oom"]
    assert first["cause"] == "live" and first["requested"] == 8 << 20
    assert first["allocated"] == 8 << 20 and first["capacity"] == 10 << 20
    assert first["shortfall"] == 6 << 20
    assert vramkit.replay(path, capacity=20 << 20)["first_oom"] is None


def test_the_environment_does_not_reach_the_replay(tmp_path, monkeypatch):
    path = tmp_path / "t.trace"
    path.write_text("# vramkit-trace v1\na 1 8388608 0 1\n")
    monkeypatch.setenv("VRAMKIT_LIMIT", "1M")
    assert vramkit.replay(path)["ooms"] == 0
    assert vramkit.replay(path, settings={"VRAMKIT_LIMIT": "1M"})["ooms"] == 1
    with pytest.raises(vramkit.ConfigError):
        vramkit.replay(path, settings={"VRAMKIT_LIMIT": "lots"})


def test_a_replay_pool_is_the_process_s_own(tmp_path, monkeypatch):
    """The replay's sim device is never one other pools share (VRAMKIT_SIM_SHARED), and a
    leak-report switch it does not use cannot fail it: its figures are the options'."""
    path = tmp_path / "t.trace"
    path.write_text("# vramkit-trace v1\na 1 104857600 0 1\nf 1 0 2\n")
    monkeypatch.setenv("VRAMKIT_SIM_SHARED", f"vk-test-{os.getpid()}")
    with vramkit.Pool(source="sim", capacity="64M"):  # the shared device: 64 MiB
        assert vramkit.replay(path)["ooms"] == 0
        assert vramkit.replay(path, min_capacity=True)["min_capacity_bytes"] >= 100 << 20
    monkeypatch.setenv("VRAMKIT_LEAK_REPORT", "maybe")
    assert vramkit.replay(path)["ooms"] == 0


def test_a_file_that_cannot_be_read_raises_what_python_raises(tmp_path):
    """A missing path, a folder, a damaged gzip: the errors of Python's own readers (not a
    driver's error, for no driver was called); a malformed record stays the engine's."""
    with pytest.raises(FileNotFoundError):
        vramkit.replay(tmp_path / "missing.trace")
    with pytest.raises(IsADirectoryError):
        vramkit.replay(tmp_path)
    damaged = tmp_path / "damaged.trace.gz"
    records = "".join(f"a {n} {512 * n} 0 {n}\n" for n in range(1, 2000))
    whole = gzip.compress(("# vramkit-trace v1\n" + records).encode())
    damaged.write_bytes(whole[:len(whole) // 2] + b"\xff" * 64 + whole[len(whole) // 2:])
    with pytest.raises(OSError) as raised:
        vramkit.replay(damaged)
    assert not isinstance(raised.value, vramkit.VramError)
    malformed = tmp_path / "malformed.trace"
    malformed.write_text("# vramkit-trace v1\na 1 lots 0 1\n")
    with pytest.raises(vramkit.InvalidArgumentError):
        vramkit.replay(malformed)


def test_no_child_process(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    path = tmp_path / "t.trace"
    path.write_text("# vramkit-trace v1\na 1 8388608 0 1\na 2 8388608 0 2\nf 1 0 3\n")
    assert vramkit.diagnose(str(path), capacity=12 << 20).cause is not None
    from vramkit.estimator import _replay

    assert _replay.vramkit_replay(str(path), "cuda", None)["ooms"] == 0
    from vramkit.plot import _replay as plot_replay, load

    steps, note = plot_replay.Replay(load(str(path), None, 0)).result()
    assert note == "" and steps[-1][1] > 0


@pytest.mark.parametrize("source, model, settings", [
    ("cuda", "sim", {}),
    ("vmm", "sim:vmm", {}),
    ("managed", "sim", {"VRAMKIT_VIRTUAL_THRESHOLD": "1", "VRAMKIT_LARGE_BLOCKS": "fixed"}),
])
def test_a_gpu_source_replays_on_the_engines_host_model(source, model, settings):
    """host_model=True: the engine says which sim models a source (the estimator asks it
    rather than keeping its own table); managed memory is fixed segments throughout."""
    path = TRACES[0]
    modelled = vramkit.replay(path, source=source, host_model=True, min_capacity=True)
    direct = vramkit.replay(path, source=model, settings=settings, min_capacity=True)
    assert modelled["source"] == model
    assert {k: modelled[k] for k in FIGURES} == {k: direct[k] for k in FIGURES}


def test_the_source_names_are_the_engines():
    assert vramkit._core.source_names() == ("auto", "sim", "sim:cuda", "sim:vmm", "cuda",
                                            "vmm", "managed")
    with pytest.raises(vramkit.InvalidArgumentError, match="source must be one of auto, sim"):
        vramkit.configure(0, source="gpu")


def test_a_pool_that_could_not_be_made_names_the_source_it_was_asked_on(tmp_path):
    """A preallocation past the capacity: no pool, one out-of-memory, and the row names the
    source auto stood for (the GPU's where a driver sees one, else sim), not "auto"."""
    path = tmp_path / "t.trace"
    path.write_text("# vramkit-trace v1\na 1 8388608 0 1\nf 1 0 2\n")
    result = vramkit.replay(path, source="auto", capacity=64 << 20,
                            settings={"VRAMKIT_PREALLOCATE": "128M"})
    assert result["ooms"] == 1 and result["peak_reserved_bytes"] == 0
    # No op ran: nothing was timed and there is no ratio (None, not a made-up 0.0).
    assert result["ns_per_op"] is None and result["reserved_over_live"] is None
    try:
        gpus = vramkit.device_count("cuda")
    except vramkit.NoDriverError:
        gpus = 0
    assert result["source"] == ("cuda" if gpus else "sim")
