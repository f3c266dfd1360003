"""Tests of vramkit.records, the reader of the records vramkit processes publish.

Records are written here by Python in the layout of include/vramkit_record.h (struct module,
offsets written out independently of the reader's), for live child processes, exited ones
and reused pids; and, where the engine publishes, by a real child allocating on sim. Every
test points VRAMKIT_PUBLISH_DIR at its tmp_path: nothing is left in /dev/shm.
"""

import json
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import SIM_ENV, MiB
import vramkit
from vramkit import records
from vramkit.records import read_record, read_records

MAGIC = 0x314345524D525655
RECORD_SIZE = 4072
DEVICE_SIZE = 216
DEVICES_AT = 616
COUNTERS = ("allocated_bytes", "reserved_bytes", "active_bytes", "cached_free_bytes",
            "largest_free_block", "peak_allocated_bytes", "peak_reserved_bytes", "num_ooms",
            "num_alloc_retries", "limit_bytes", "capacity_bytes", "updated_ns", "givable_bytes",
            "given_back_bytes", "given_back_count", "group_limit_bytes",
            "largest_of_cached_bytes")


def ticks_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def record_bytes(pid, uid=None, ticks=None, name=b"trainer", cmdline=b"", devices=(),
                 magic=MAGIC, version=3, size=RECORD_SIZE, n_devices=None) -> bytearray:
    """A vram_process_record, field by field at the header's offsets."""
    data = bytearray(RECORD_SIZE)
    struct.pack_into("<QII", data, 0, magic, version, size)
    struct.pack_into("<iIQ", data, 16, pid, os.getuid() if uid is None else uid,
                     ticks_of(pid) if ticks is None else ticks)
    data[32:32 + len(name)] = name
    data[96:96 + len(cmdline)] = cmdline
    struct.pack_into("<I", data, 608, len(devices) if n_devices is None else n_devices)
    for slot, device in enumerate(devices):
        at = DEVICES_AT + slot * DEVICE_SIZE
        struct.pack_into("<Qii", data, at, device.get("seq", 2), device.get("device", slot),
                         device.get("in_use", 1))
        source, uuid = device.get("source", b"sim"), device.get("uuid", b"")
        data[at + 16:at + 16 + len(source)] = source
        data[at + 32:at + 32 + len(uuid)] = uuid
        struct.pack_into(f"<{len(COUNTERS)}Q", data, at + 80, *plausible(device).values())
    return data


def plausible(device: dict) -> dict:
    """A slot's counters, those not given made consistent as a pool writes them: active
    from allocated, reserved from active, the cache their difference, the peaks the
    figures (the reader refuses a slot whose figures contradict each other)."""
    counters = {key: device.get(key, 0) for key in COUNTERS}
    derived = (("active_bytes", "allocated_bytes"), ("reserved_bytes", "active_bytes"),
               ("peak_allocated_bytes", "allocated_bytes"),
               ("peak_reserved_bytes", "reserved_bytes"))
    for key, source in derived:
        counters[key] = device.get(key, counters[source])
    counters["cached_free_bytes"] = device.get(
        "cached_free_bytes", counters["reserved_bytes"] - counters["active_bytes"])
    counters["largest_of_cached_bytes"] = device.get(
        "largest_of_cached_bytes", max(counters["cached_free_bytes"],
                                       counters["largest_free_block"]))
    return counters


def write_record(folder: Path, pid: int, **fields) -> Path:
    path = folder / f"{pid}.rec"
    path.write_bytes(record_bytes(pid, **fields))
    path.chmod(0o600)
    return path


@pytest.fixture
def sleeper():
    """A live child process to publish records for; killed at the end."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()


def test_a_live_process_record_is_read_field_by_field(tmp_path, sleeper):
    device = {"source": b"cuda", "uuid": b"GPU-11111111-2222-3333-4444-555555555555",
              **{key: (i + 1) * MiB for i, key in enumerate(COUNTERS)}}
    device.update(allocated_bytes=5 * MiB, active_bytes=6 * MiB, reserved_bytes=14 * MiB,
                  cached_free_bytes=8 * MiB, largest_free_block=2 * MiB, num_ooms=3,
                  peak_allocated_bytes=7 * MiB, peak_reserved_bytes=15 * MiB,
                  largest_of_cached_bytes=8 * MiB)
    write_record(tmp_path, sleeper.pid, devices=[device, {"device": 1, "allocated_bytes": 5}],
                 cmdline=b"python train.py")
    problems = []
    (process,) = read_records(tmp_path, problems)
    assert problems == []
    assert (process.pid, process.uid, process.name, process.cmdline, process.start_ticks) == (
        sleeper.pid, os.getuid(), "trainer", "python train.py", ticks_of(sleeper.pid))
    first, second = process.devices
    assert (first.device, first.source, first.uuid) == (
        0, "cuda", "GPU-11111111-2222-3333-4444-555555555555")
    for key in COUNTERS:
        assert getattr(first, key) == device[key], key
    assert first.fragmentation == pytest.approx(0.75) and not first.busy
    assert (second.device, second.allocated_bytes, second.fragmentation) == (1, 5, 0.0)


def test_unused_slots_and_n_devices(tmp_path, sleeper):
    # A slot not in use is no device; slots past n_devices are not read at all.
    write_record(tmp_path, sleeper.pid, n_devices=3, devices=[
        {"allocated_bytes": 1}, {"in_use": 0, "allocated_bytes": 2}, {"allocated_bytes": 3},
        {"allocated_bytes": 4}])
    (process,) = read_records(tmp_path)
    assert [(d.device, d.allocated_bytes) for d in process.devices] == [(0, 1), (2, 3)]


def test_default_folder_is_the_publish_variable(tmp_path, sleeper, monkeypatch):
    monkeypatch.setenv("VRAMKIT_PUBLISH_DIR", str(tmp_path))
    write_record(tmp_path, sleeper.pid, devices=[{}])
    assert records.default_directory() == tmp_path
    assert [p.pid for p in read_records()] == [sleeper.pid]
    monkeypatch.delenv("VRAMKIT_PUBLISH_DIR")
    assert records.default_directory() == Path(f"/dev/shm/vramkit-{os.geteuid()}")
    # Set but empty is unset, as the writers read it: not the current folder.
    monkeypatch.setenv("VRAMKIT_PUBLISH_DIR", "")
    assert records.default_directory() == Path(f"/dev/shm/vramkit-{os.geteuid()}")


def test_a_publish_folder_too_long_to_name_is_refused(monkeypatch):
    monkeypatch.setenv("VRAMKIT_PUBLISH_DIR", "/tmp/" + "d" * 5000)
    with pytest.raises(vramkit.ConfigError, match="VRAMKIT_PUBLISH_DIR is longer"):
        records.default_directory()


def test_missing_folder_is_no_process(tmp_path):
    problems = []
    assert read_records(tmp_path / "none", problems) == [] and problems == []


def test_an_exited_process_is_skipped_and_its_file_removed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = ticks_of(child.pid)
    child.wait()
    kept = write_record(tmp_path, child.pid, ticks=ticks, devices=[{}])
    problems = []
    assert read_records(tmp_path, problems, clean=False) == [] and kept.exists()
    assert read_records(tmp_path, problems) == []
    assert not kept.exists() and problems == []


def test_a_reused_pid_is_an_exited_process(tmp_path, sleeper):
    stale = write_record(tmp_path, sleeper.pid, ticks=ticks_of(sleeper.pid) - 1, devices=[{}])
    assert read_records(tmp_path) == [] and not stale.exists()


def reasons(folder) -> str:
    problems = []
    assert read_records(folder, problems) == []
    return "\n".join(problems)


def test_bad_files_are_skipped_with_a_reason_and_kept(tmp_path, sleeper):
    pid = sleeper.pid
    folder = tmp_path / "publish"
    folder.mkdir(mode=0o700)
    (folder / "1.rec").write_bytes(b"not a record")
    (folder / "2.rec").write_bytes(b"\x7fELF" + bytes(4000))
    (folder / "3.rec").write_bytes(record_bytes(pid, version=2))
    (folder / "4.rec").write_bytes(record_bytes(pid, size=4000))
    (folder / "5.rec").write_bytes(record_bytes(pid)[:1000])
    (folder / "6.rec").write_bytes(bytes(RECORD_SIZE))  # created, header not written yet
    (folder / "7.rec").write_bytes(record_bytes(pid))  # pid is not the file's name
    (folder / "8.rec").symlink_to(write_record(tmp_path, pid))
    (folder / "9.rec").mkdir()
    (folder / "README").write_text("not a .rec: not looked at")
    text = reasons(folder)
    for number, reason in [(1, "too short for a record (12 bytes"),
                           (2, "not a vramkit record (magic 0x"),
                           (3, "record version 2; this reader knows version 3"),
                           (4, "record of 4000 bytes in a file of 4072"),
                           (5, "record of 4072 bytes in a file of 1000"),
                           (6, "not initialised yet"),
                           (7, f"the record's pid {pid} is not its file's name"),
                           (8, "a symbolic link"),
                           (9, "not a regular file")]:
        assert f"{folder / f'{number}.rec'}: {reason}" in text, (number, text)
    assert "README" not in text
    assert len(list(folder.iterdir())) == 10  # nothing removed: none was ours and dead


def test_a_slot_whose_figures_no_pool_writes_is_refused(tmp_path, sleeper):
    # A record of this user for a live process, readable, of the right size and version,
    # whose figures contradict each other: a pool stores allocated, active and reserved
    # together, so such a slot is not a pool's claim to show (top printed 2**64 - 1 bytes
    # allocated as 16777216.0T, and a negative device as given).
    cases = [({"device": -7, "allocated_bytes": MiB}, "a negative device"),
             ({"allocated_bytes": 2**64 - 1, "active_bytes": 0}, "allocated > active"),
             ({"active_bytes": 3 * MiB, "reserved_bytes": MiB, "cached_free_bytes": 0},
              "active > reserved"),
             ({"reserved_bytes": 2 * MiB, "cached_free_bytes": 2**63},
              "cached != reserved - active"),
             ({"allocated_bytes": MiB, "peak_allocated_bytes": 0}, "peak allocated < allocated"),
             ({"reserved_bytes": MiB, "peak_reserved_bytes": 0}, "peak reserved < reserved"),
             ({"reserved_bytes": MiB, "givable_bytes": 2 * MiB}, "givable > reserved"),
             ({"reserved_bytes": MiB, "largest_free_block": 2**64 - 1}, "largest free > reserved"),
             ({"reserved_bytes": MiB, "largest_free_block": MiB,
               "largest_of_cached_bytes": MiB // 2},
              "largest free > the cache it was measured in")]
    for device, contradiction in cases:
        write_record(tmp_path, sleeper.pid, devices=[{"allocated_bytes": MiB}, device])
        problems = []
        assert read_records(tmp_path, problems) == [], contradiction
        assert problems == [f"{tmp_path / f'{sleeper.pid}.rec'}: device slot 1's figures "
                            f"contradict each other ({contradiction}), which no pool writes"]
    # A slot given back (not in use) is zeroed by its pool but for its device: not refused.
    write_record(tmp_path, sleeper.pid, devices=[{"allocated_bytes": MiB},
                                                 {"in_use": 0, "device": -1}])
    (process,) = read_records(tmp_path)
    assert [d.allocated_bytes for d in process.devices] == [MiB]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a file of another user")
def test_another_user_s_record_is_not_read(tmp_path, sleeper):
    other = write_record(tmp_path, sleeper.pid, devices=[{}])
    os.chown(other, 12345, 12345)
    assert f"{other}: owned by uid 12345, not by this user" in reasons(tmp_path)
    assert other.exists()
    os.chown(other, os.getuid(), os.getgid())
    write_record(tmp_path, sleeper.pid, uid=12345, devices=[{}])
    assert "the record claims uid 12345 in a file of uid" in reasons(tmp_path)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a folder of another user")
def test_a_default_folder_of_another_user_is_not_trusted(tmp_path, monkeypatch, sleeper):
    folder = tmp_path / "publish"
    folder.mkdir()
    write_record(folder, sleeper.pid, devices=[{}])
    os.chown(folder, 12345, 12345)
    monkeypatch.setenv("VRAMKIT_PUBLISH_DIR", str(folder))
    problems = []
    assert read_records(problems=problems) == []
    assert problems == [f"{folder}: owned by uid 12345, not by this user; its records are not read"]


def test_a_device_held_mid_update_is_busy_not_waited_for(tmp_path, sleeper):
    # A writer stopped between its two increments leaves seq odd for good.
    write_record(tmp_path, sleeper.pid, devices=[{"seq": 7, "allocated_bytes": 99,
                                                  "source": b"sim:vmm"},
                                                 {"allocated_bytes": 5}])
    (process,) = read_records(tmp_path)  # returns: a reader that waited would hang here
    busy, fine = process.devices
    assert (busy.busy, busy.device, busy.source, busy.allocated_bytes) == (True, 0, "sim:vmm", 0)
    assert (fine.busy, fine.allocated_bytes) == (False, 5)


WRITER = """
    import mmap, os, struct, sys
    # The engine's protocol in Python: seq odd, fields, seq even; the fields always satisfy
    # reserved = 2 * allocated and peak = allocated + 1, so a torn copy breaks the relation
    # (and active = cached = allocated, peak reserved = reserved + 1, as a pool's would).
    # seq is stored as the engine stores it, one aligned 8-byte word (a memoryview item of
    # format "Q"); struct.pack_into writes it a byte at a time. It writes in bursts with a
    # pause between them, as an engine does (one update per allocation, not a busy loop):
    # a reader needs a moment without a store to take two alike copies, and gets that moment
    # between bursts whatever the load of the machine.
    import time
    fd = os.open(sys.argv[1], os.O_RDWR)
    view = mmap.mmap(fd, 4072)
    at = 616
    seq = memoryview(view)[at:at + 8].cast("Q")
    n = 0
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    while True:
        n += 1
        now = seq[0]
        seq[0] = now + 1
        struct.pack_into("<QQQQ", view, at + 80, n, 2 * n, n, n)
        struct.pack_into("<QQ", view, at + 120, n + 1, 2 * n + 1)
        seq[0] = now + 2
        if n % 64 == 0:
            time.sleep(0.0001)
"""


def test_a_record_changing_under_the_reader_is_never_torn(tmp_path):
    path = tmp_path / "placeholder"
    path.write_bytes(record_bytes(os.getpid(), devices=[{"peak_allocated_bytes": 1}]))
    path.chmod(0o600)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
        # Made the writer's own record: its pid and start time (the header is not its to write).
        with open(path, "r+b") as header:
            header.seek(16)
            header.write(struct.pack("<iIQ", writer.pid, os.getuid(), ticks_of(writer.pid)))
        record = tmp_path / f"{writer.pid}.rec"
        path.rename(record)  # the writer's mapping follows the file
        seen, busy = set(), 0
        for _ in range(2000):
            (device,) = read_record(record).devices
            if device.busy:
                busy += 1
                continue
            assert device.reserved_bytes == 2 * device.allocated_bytes
            assert device.peak_allocated_bytes == device.allocated_bytes + 1
            seen.add(device.allocated_bytes)
        assert len(seen) > 10 and busy < 2000  # it did change while read, and was read
    finally:
        writer.kill()
        writer.wait()


CHILD = """
    import json, sys, vramkit
    kept = [vramkit.empty(size) for size in (3 << 20, 5 << 20, 1 << 20, 700 << 10)]
    del kept[1]  # cached free memory in the pool
    stats = vramkit.memory_stats()
    print(json.dumps(stats), flush=True)
    sys.stdin.readline()
"""


def start_vramkit_child(publish_dir: Path, env: dict | None = None):
    """A child allocating through vramkit on sim and waiting on its stdin; returns it and the
    memory_stats() it printed."""
    full_env = dict(os.environ, **SIM_ENV, VRAMKIT_PUBLISH_DIR=str(publish_dir), **(env or {}))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD)], env=full_env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    if not line:
        child.wait()
        pytest.fail("the vramkit child failed before printing its statistics")
    return child, json.loads(line)


def engine_publishes() -> bool:
    include = Path(__file__).resolve().parents[2] / "include" / "vramkit_record.h"
    return include.exists()


def test_a_real_record_equals_memory_stats(tmp_path):
    if not engine_publishes():
        pytest.skip("the engine does not publish records in this tree")
    child, stats = start_vramkit_child(tmp_path)
    try:
        problems = []
        found = read_records(tmp_path, problems)
        if not found and not problems:
            pytest.skip("this build of libvramkit does not publish records yet")
        assert problems == []
        (process,) = found
        assert process.pid == child.pid and process.uid == os.getuid()
        assert process.name == Path(f"/proc/{child.pid}/comm").read_text().strip()
        assert process.cmdline == ""  # only with VRAMKIT_PUBLISH=cmdline
        (device,) = process.devices
        assert (device.device, device.uuid) == (0, "")
        assert device.source.startswith("sim")
        assert device.allocated_bytes == stats["allocated_bytes.all.current"]
        assert device.reserved_bytes == stats["reserved_bytes.all.current"]
        assert device.peak_allocated_bytes == stats["allocated_bytes.all.peak"]
        assert device.peak_reserved_bytes == stats["reserved_bytes.all.peak"]
        assert device.num_ooms == stats["num_ooms"]
        assert device.cached_free_bytes == device.reserved_bytes - device.allocated_bytes > 0
        assert 0 < device.largest_free_block <= device.cached_free_bytes
        assert oct((tmp_path / f"{child.pid}.rec").stat().st_mode & 0o777) == "0o600"
    finally:
        child.communicate("\n", timeout=60)
    # Removed at exit.
    assert not (tmp_path / f"{child.pid}.rec").exists()


FREED_CHILD = """
    import json, sys, vramkit
    pool = vramkit.Pool(source="sim")
    pieces = [pool.allocate(3 << 20) for _ in range(2)]
    for piece in pieces:
        piece.free()  # two frees, no segment change: the hot path alone publishes them
    print(json.dumps(pool.memory_stats()), flush=True)
    sys.stdin.readline()
    pool.reset_peak_stats()  # a slow event: the largest free block is measured again
    print(json.dumps(pool.memory_stats()), flush=True)
    sys.stdin.readline()
"""


def test_fragmentation_is_of_figures_of_one_moment(tmp_path):
    """The largest free block is measured at the pool's slow events, the cached memory at
    every free: freed blocks that merged into one were shown as 100% fragmentation (the
    largest block of before the frees, 0, over the cache after them) where the pool's own
    statistics said 0. The record pairs the largest block with the cache it was measured
    in, and its fragmentation is of those two."""
    env = dict(os.environ, **SIM_ENV, VRAMKIT_PUBLISH_DIR=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(FREED_CHILD)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        stats = json.loads(child.stdout.readline())
        (device,) = read_record(tmp_path / f"{child.pid}.rec").devices
        assert device.cached_free_bytes == stats["reserved_bytes.all.current"] > 0
        assert stats["fragmentation"] == 0.0
        assert device.fragmentation < 1.0
        assert device.fragmentation == (1.0 - device.largest_free_block /
                                        device.largest_of_cached_bytes
                                        if device.largest_of_cached_bytes else 0.0)
        child.stdin.write("\n")
        child.stdin.flush()
        stats = json.loads(child.stdout.readline())
        (device,) = read_record(tmp_path / f"{child.pid}.rec").devices
        # Measured again: the record's figures are the pool's own.
        assert device.largest_free_block == stats["largest_free_block"] > 0
        assert device.largest_of_cached_bytes == device.cached_free_bytes
        assert device.fragmentation == stats["fragmentation"] == 0.0
    finally:
        child.communicate("\n", timeout=60)


def test_a_planted_folder_is_not_read_nor_cleaned(tmp_path, sleeper, monkeypatch):
    # Another user can make /dev/shm/vramkit-UID before this user does: a link to a folder of
    # theirs, or a folder open to them. Neither is read, and nothing in it is deleted.
    real = tmp_path / "theirs"
    real.mkdir(mode=0o700)
    write_record(real, sleeper.pid, devices=[{}])
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = ticks_of(child.pid)
    child.wait()
    dead = write_record(real, child.pid, ticks=ticks, devices=[{}])
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("VRAMKIT_PUBLISH_DIR", str(link))
    for folder in (None, link):
        problems = []
        assert read_records(folder, problems) == []
        assert problems == [f"{link}: a symbolic link or not a folder; its records are not read"]
    real.chmod(0o755)
    for folder in (None, real):
        monkeypatch.setenv("VRAMKIT_PUBLISH_DIR", str(real))
        problems = []
        assert read_records(folder, problems) == []
        assert problems == [f"{real}: open to group or others (mode 0755, want 0700); its "
                            f"records are not read"]
    assert dead.exists()
    real.chmod(0o700)
    assert [p.pid for p in read_records(real)] == [sleeper.pid] and not dead.exists()


def other_user_process():
    """A live process of another user: a child that gave up root, or (not root) pid 1."""
    if os.getuid() != 0:
        return None, 1
    child = subprocess.Popen(["sleep", "120"], user=65534, group=65534)
    return child, child.pid


def test_a_record_for_another_user_s_process_is_not_believed(tmp_path):
    # Anybody can write "pid 1, 70 GiB" with pid 1's true start time; the process is not
    # theirs, so the record proves nothing of it. It is skipped, and kept (its pid lives).
    child, pid = other_user_process()
    try:
        spoof = write_record(tmp_path, pid, devices=[{"reserved_bytes": 70 << 30}])
        problems = []
        assert read_records(tmp_path, problems) == []
        assert problems == [f"{spoof}: process {pid} runs as another user, not as the "
                            f"record's uid {os.getuid()}"]
        assert spoof.exists()
    finally:
        if child:
            child.kill()
            child.wait()


TRUNCATOR = """
    import os, sys, time
    path, body = sys.argv[1], bytes.fromhex(sys.stdin.readline())
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    while True:
        os.pwrite(fd, body, 0)
        os.ftruncate(fd, 0)
        os.ftruncate(fd, 700)
        os.ftruncate(fd, 0)
"""

READER = """
    import sys
    from vramkit.records import read_records
    counts = [0, 0]
    for _ in range(int(sys.argv[2])):
        problems = []
        counts[bool(read_records(sys.argv[1], problems, clean=False))] += 1
    print(counts)
"""


def test_a_record_truncated_under_the_reader_never_kills_it(tmp_path):
    # A neighbour truncates and rewrites its record in a loop. Read through a mapping, a load
    # past the new end of the file is SIGBUS: the reader (and `vramkit top`, `export`) died.
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TRUNCATOR),
                               str(tmp_path / "placeholder")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        record = tmp_path / f"{writer.pid}.rec"
        writer.stdin.write(record_bytes(writer.pid, devices=[{"allocated_bytes": 5}]).hex() + "\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "ready\n"
        (tmp_path / "placeholder").rename(record)
        reader = subprocess.run([sys.executable, "-c", textwrap.dedent(READER), str(tmp_path),
                                 "3000"], capture_output=True, text=True, timeout=300)
        assert reader.returncode == 0, reader.stderr
        missed, found = json.loads(reader.stdout)
        assert missed + found == 3000
    finally:
        writer.kill()
        writer.wait()


def test_names_are_printed_escaped():
    from vramkit.cli._exit import shown

    assert shown("x\x1b[2J\x1b[41mX\x1b[8m\nforged") == "x\\x1b[2J\\x1b[41mX\\x1b[8m\\x0aforged"
    assert shown("trainer \u00e9\u4e2d") == "trainer \u00e9\u4e2d"
    # As the engine's reports show them: a C1 control or an override, byte by byte.
    assert shown("\u009b31m") == "\\xc2\\x9b31m"
    assert shown("a\u202eb") == "a\\xe2\\x80\\xaeb"
    assert shown(b"caf\xe9") == "caf\\xe9" and shown("\ud800") == "\\xed\\xa0\\x80"


def test_a_folder_name_too_long_is_refused_not_cut(tmp_path, sleeper, monkeypatch):
    # Cut short, the name would be another folder: tmp_path itself, where a record waits.
    write_record(tmp_path, sleeper.pid, devices=[{}])
    monkeypatch.setenv("VRAMKIT_PUBLISH_DIR", str(tmp_path) + "/" * 5000 + "sub")
    problems = []
    assert read_records(problems=problems) == []
    assert len(problems) == 1 and "the folder's name is too long" in problems[0]


def test_a_record_open_to_others_is_not_one_the_engine_made(tmp_path, sleeper):
    record = write_record(tmp_path, sleeper.pid, devices=[{}])
    record.chmod(0o644)
    assert f"{record}: open to group or others (mode 0644, want 0600)" in reasons(tmp_path)
    record.chmod(0o600)
    assert [p.pid for p in read_records(tmp_path)] == [sleeper.pid]
