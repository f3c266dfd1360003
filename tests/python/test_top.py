"""Tests of `vramkit top`, run as the installed `vramkit` command, on sim and with a fake NVML.

Children publish records into the test's own folder (VRAMKIT_PUBLISH_DIR); NVML is either
missing (a path that does not exist) or the fake built from fake_nvml.c, which can list a
test's child as a process on one of its GPUs. The live view is driven in a pseudo-terminal.
"""

import errno
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from helpers import GiB, MiB
from test_nvml import A100, H200, build_fake_nvml
from test_records import engine_publishes, start_vramkit_child, write_record

MISSING_NVML = "/nonexistent/libnvidia-ml.so.1"


def vramkit_command() -> str:
    beside = Path(sys.executable).with_name("vramkit")
    found = str(beside) if beside.exists() else shutil.which("vramkit")
    if not found:
        pytest.skip("the vramkit command is not installed")
    return found


@pytest.fixture
def publish(tmp_path):
    folder = tmp_path / "publish"
    folder.mkdir(mode=0o700)
    return folder


def top_env(publish: Path, nvml=MISSING_NVML, **more) -> dict:
    env = dict(os.environ, VRAMKIT_PUBLISH_DIR=str(publish), VRAMKIT_NVML_LIBRARY=str(nvml))
    env.pop("FAKE_NVML_PROCESSES", None)
    env.update(more)
    return env


def top(publish: Path, *args, nvml=MISSING_NVML, **more) -> subprocess.CompletedProcess:
    return subprocess.run([vramkit_command(), "top", *args], env=top_env(publish, nvml, **more),
                          capture_output=True, text=True, timeout=60)


def top_json(publish: Path, **kwargs) -> dict:
    done = top(publish, "--once", "--json", **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def sleepers():
    """Start live child processes on demand (for records written by the test); killed after."""
    started = []

    def start(env=None):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 env=dict(os.environ, **(env or {})))
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()


def need_publishing_engine(publish: Path, child) -> None:
    if not engine_publishes() or not (publish / f"{child.pid}.rec").exists():
        child.communicate("\n", timeout=60)
        pytest.skip("this build of libvramkit does not publish records yet")


def test_sim_children_show_with_their_memory_stats(publish):
    children = []
    try:
        for _ in range(2):
            child, stats = start_vramkit_child(publish)
            children.append((child, stats))
            need_publishing_engine(publish, child)
        document = top_json(publish)
        shown = {entry["pid"]: entry for entry in document["unmatched_processes"]}
        for child, stats in children:
            entry = shown[child.pid]
            assert entry["name"] == Path(f"/proc/{child.pid}/comm").read_text().strip()
            assert entry["nvml_used_bytes"] is None
            vramkit = entry["vramkit"]
            assert vramkit["allocated_bytes"] == stats["allocated_bytes.all.current"]
            assert vramkit["reserved_bytes"] == stats["reserved_bytes.all.current"]
            assert vramkit["source"].startswith("sim") and not vramkit["busy"]
        assert document["gpus"] == []
        assert any("no GPU figures" in note and MISSING_NVML in note
                   for note in document["notes"])
        # The plain screen shows them too.
        text = top(publish, "--once").stdout
        for child, stats in children:
            line = next(line for line in text.splitlines() if line.split()[:1] == [str(child.pid)])
            assert "sim" in line
        # LARGEST 0 beside CACHED 6.0M read as one moment's figures: the screen says which
        # columns are of the pool's last slow event.
        assert "GIVABLE, LARGEST and FRAG are as of each pool's last segment change" in text
    finally:
        for child, _ in children:
            if child.poll() is None:
                child.communicate("\n", timeout=60)


def test_a_killed_vramkit_child_disappears_and_its_file_is_cleaned(publish):
    child, _ = start_vramkit_child(publish)
    need_publishing_engine(publish, child)
    assert [e["pid"] for e in top_json(publish)["unmatched_processes"]] == [child.pid]
    child.send_signal(signal.SIGKILL)  # no atexit: the record stays behind
    child.wait()
    child.stdin.close()
    child.stdout.close()
    assert (publish / f"{child.pid}.rec").exists()
    document = top_json(publish)
    assert document["unmatched_processes"] == []
    assert not (publish / f"{child.pid}.rec").exists()
    assert not any("record skipped" in note for note in document["notes"])


def test_a_killed_process_s_record_is_cleaned(publish, sleepers):
    # The same without the engine: a record written for a process that is then killed.
    child = sleepers()
    record = write_record(publish, child.pid, devices=[{"allocated_bytes": 3 * MiB}])
    assert [e["vramkit"]["allocated_bytes"] for e in top_json(publish)["unmatched_processes"]] == [
        3 * MiB]
    child.kill()
    child.wait()
    assert top_json(publish)["unmatched_processes"] == [] and not record.exists()


def test_corrupt_and_foreign_files_are_skipped_with_a_reason(publish, sleepers):
    child = sleepers()
    write_record(publish, child.pid, devices=[{"allocated_bytes": 1}])
    (publish / "123.rec").write_bytes(b"\x00\x01garbage" * 500)
    (publish / "124.rec").write_text("# vramkit-trace v1\n" * 300)
    document = top_json(publish)
    assert [e["pid"] for e in document["unmatched_processes"]] == [child.pid]
    notes = "\n".join(document["notes"])
    assert f"record skipped: {publish / '123.rec'}: not a vramkit record (magic 0x" in notes
    assert f"record skipped: {publish / '124.rec'}: not a vramkit record (magic 0x" in notes
    assert (publish / "123.rec").exists() and (publish / "124.rec").exists()
    assert "not a vramkit record" in top(publish, "--once").stdout


def test_fake_nvml_gpus_and_a_vramkit_process_joined_by_uuid(publish, sleepers, tmp_path):
    library = build_fake_nvml(tmp_path)
    listed = sleepers()       # on the A100 by its record's UUID, and in NVML's list
    by_ordinal = sleepers({"CUDA_VISIBLE_DEVICES": "1"})  # its device 0 is the A100
    write_record(publish, listed.pid, devices=[{
        "source": b"cuda", "uuid": A100.encode(), "allocated_bytes": 2 * GiB,
        "reserved_bytes": 3 * GiB, "cached_free_bytes": 1 * GiB, "largest_free_block": GiB // 4,
        "peak_reserved_bytes": 4 * GiB, "num_ooms": 2, "givable_bytes": GiB // 2,
        "given_back_bytes": 3 * GiB, "group_limit_bytes": 8 * GiB}])
    write_record(publish, by_ordinal.pid, devices=[{"source": b"vmm", "reserved_bytes": GiB}])
    document = top_json(publish, nvml=library,
                        FAKE_NVML_PROCESSES=f"1:{listed.pid}:{int(3.5 * GiB)}")
    h200, a100 = document["gpus"]
    assert (h200["index"], h200["uuid"], h200["name"], h200["total_bytes"], h200["used_bytes"],
            h200["free_bytes"], h200["utilization_gpu"]) == (
        0, H200, "Fake H200", 140 * GiB, 10 * GiB, 129 * GiB, 37)
    # Sorted by NVML's used memory; a pid without a figure last; no vramkit view of them.
    assert [(p["pid"], p["nvml_used_bytes"], p["vramkit"]) for p in h200["processes"]] == [
        (4242, 3 * GiB, None), (4343, None, None)]
    assert (a100["uuid"], a100["utilization_gpu"]) == (A100, None)
    first, second = a100["processes"]
    assert (first["pid"], first["nvml_used_bytes"]) == (listed.pid, int(3.5 * GiB))
    assert first["vramkit"]["allocated_bytes"] == 2 * GiB
    assert first["vramkit"]["reserved_bytes"] == 3 * GiB
    assert first["vramkit"]["fragmentation"] == pytest.approx(0.75)
    assert first["name"] == Path(f"/proc/{listed.pid}/comm").read_text().strip()
    assert (second["pid"], second["nvml_used_bytes"], second["vramkit"]["reserved_bytes"]) == (
        by_ordinal.pid, None, GiB)
    assert document["unmatched_processes"] == []
    assert any(f"process {by_ordinal.pid}" in note and "not in NVML's list" in note
               for note in document["notes"])
    text = top(publish, "--once", nvml=library,
               FAKE_NVML_PROCESSES=f"1:{listed.pid}:{int(3.5 * GiB)}").stdout
    assert "GPU 0  Fake H200" in text and "GPU 1  Fake A100" in text
    row = next(line for line in text.splitlines() if line.split()[:1] == [str(listed.pid)])
    # ... CACHED, GIVABLE (idle in whole segments), LARGEST, FRAG, PEAK, OOMS, GAVE
    assert row.split()[2:13] == ["cuda:0", "3.5G", "2.0G", "3.0G", "1.0G", "512.0M", "256.0M",
                                 "75%", "4.0G", "2", "3.0G"]
    assert "group limit (VRAMKIT_GROUP_LIMIT, or a pool's group_limit): 8.0G" in text


def test_nvml_failing_init_is_a_note(publish, tmp_path):
    document = top_json(publish, nvml=build_fake_nvml(tmp_path), FAKE_NVML_INIT_FAIL="1")
    assert document["gpus"] == []
    assert any("Driver Not Loaded" in note for note in document["notes"])


def test_bad_arguments(publish):
    for args, message in [(["--bogus"], "unknown option '--bogus'"),
                          (["--interval"], "--interval needs a value"),
                          (["--interval", "0"], "--interval: expected seconds"),
                          (["--once", "--json", "--once"], None)]:
        done = top(publish, *args)
        if message is None:
            assert done.returncode == 0
            continue
        assert done.returncode == 3 and message in done.stderr, (args, done.stderr)
    assert "usage: vramkit top" in top(publish, "--help").stdout
    listing = subprocess.run([vramkit_command(), "--help"], capture_output=True, text=True)
    assert any(line.split()[:1] == ["top"] for line in listing.stdout.splitlines())


def test_not_a_terminal_prints_one_screen(publish):
    done = top(publish)  # stdout is a pipe here
    assert done.returncode == 0 and done.stdout.startswith("vramkit top - ")


def run_in_pty(publish: Path, columns: int, lines: int, expect: str):
    """Start `vramkit top` in a pseudo-terminal of that size, wait for expect on the screen,
    press q; returns (exit status, everything it drew)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its stdin and stdout
        os.environ.update(top_env(publish), TERM="xterm", LINES=str(lines), COLUMNS=str(columns))
        os.execv(vramkit_command(), ["vramkit", "top", "--interval", "0.2"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    seen = b""
    deadline = time.monotonic() + 30
    try:
        while expect.encode() not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError as error:  # EIO: the child has gone
                    if error.errno != errno.EIO:
                        raise
                    break
        os.write(fd, b"q")
        end = time.monotonic() + 20
        status = None
        while time.monotonic() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    pass
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"vramkit top did not quit on q; it drew:\n{seen[-2000:]!r}")
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), seen.decode("utf-8", "replace")


def test_live_view_starts_and_quits_on_q(publish, sleepers):
    child = sleepers()
    write_record(publish, child.pid, name=b"livechild", devices=[{"allocated_bytes": 5 * MiB}])
    status, screen = run_in_pty(publish, 120, 30, "livechild")
    assert status == 0, screen[-2000:]
    assert "livechild" in screen and "q quits" in screen and "Traceback" not in screen


def test_live_view_in_a_terminal_too_small(publish):
    status, screen = run_in_pty(publish, 40, 4, "terminal too small")
    assert status == 0, screen[-2000:]
    assert "terminal too small (40x4)" in screen and "Traceback" not in screen


def test_names_from_other_processes_are_shown_escaped(publish, sleepers):
    # A process name is whatever its owner wrote to /proc/self/comm: an escape sequence in
    # it would clear the screen and hide text, a newline would forge a line.
    child = sleepers()
    write_record(publish, child.pid, name=b"\x1b[2J\x1b[41mX\x1b[8m\nforged",
                 devices=[{"allocated_bytes": 5 * MiB}])
    text = top(publish, "--once").stdout
    assert "\x1b" not in text and "\nforged" not in text
    assert "\\x1b[2J\\x1b[4" in text


def test_a_skipped_files_name_is_escaped_once(publish, sleepers):
    """The note names the file as the engine shows foreign text, once: a control byte reads
    \\x1b, not \\x5cx1b (an escape of the escape, which names another file)."""
    (publish / "\x1b[2J.rec").write_bytes(b"not a record")
    text = top(publish, "--once").stdout
    assert "\x1b" not in text
    assert f"record skipped: {publish}/\\x1b[2J.rec: " in text, text
    assert "\\x5c" not in text


def test_a_long_escaped_name_is_never_cut_inside_an_escape(publish, sleepers):
    child = sleepers()
    write_record(publish, child.pid, name=b"abcdefghijkl\x1bZ",
                 devices=[{"allocated_bytes": 5 * MiB}])
    row = next(line for line in top(publish, "--once").stdout.splitlines()
               if line.lstrip().startswith(str(child.pid)))
    assert " abcdefghijkl " in row, row  # the column ends before the half of an escape


def test_a_device_number_is_never_cut_to_another_one(publish, sleepers):
    # The DEVICE column held 9 characters: "managed:12" (a 16-GPU machine) read "managed:1",
    # another device's name. The source may be cut; the device number is shown whole.
    child = sleepers()
    write_record(publish, child.pid, devices=[
        {"source": b"managed", "device": 12, "allocated_bytes": 5 * MiB},
        {"source": b"sim:vmm" + b"x" * 20, "device": 2147483647, "allocated_bytes": 5 * MiB}])
    rows = [line for line in top(publish, "--once").stdout.splitlines()
            if line.lstrip().startswith(str(child.pid))]
    assert len(rows) == 2, rows
    assert " managed:12 " in rows[0], rows
    assert ":2147483647 " in rows[1], rows
