"""The reader of the records vramkit processes publish: what each pool holds, seen from outside.

Every process with a vramkit pool keeps one small shared-memory file, ``<pid>.rec``, in
``$VRAMKIT_PUBLISH_DIR`` or ``/dev/shm/vramkit-<uid>/`` (layout: include/vramkit_record.h;
the engine writes it with plain stores and a per-device sequence counter). :func:`read_records`
returns them as :class:`ProcessRecord` values, for ``vramkit top``, ``vramkit export`` and
anything else that watches memory:

    from vramkit.records import read_records
    problems = []
    for process in read_records(problems=problems):
        for device in process.devices:
            print(process.pid, process.name, device.device, device.allocated_bytes)
    for problem in problems:
        print("skipped:", problem)

Nothing in a folder of records can make the reader fail: a file that is short, foreign,
of another version or another user's, is skipped with a reason; a record of a process that
has exited (or whose pid was reused) is skipped and, when it is ours, removed; a device being
written for longer than a few retries is returned marked ``busy`` rather than waited for.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DeviceRecord", "ProcessRecord", "default_directory", "read_record", "read_records",
           "RECORD_MAGIC", "RECORD_VERSION", "RECORD_SIZE", "DEVICE_RECORD_SIZE"]

# vramkit_record.h, field for field (little-endian; sizes static-asserted there).
RECORD_MAGIC = 0x314345524D525655  # "UVRMREC1"
RECORD_VERSION = 1
MAX_DEVICES = 16
NAME_MAX = 64
CMDLINE_MAX = 512

# vram_process_record up to its devices: magic, version, record_size, pid, uid, start_ticks,
# name, cmdline, n_devices, reserved_.
HEADER = struct.Struct(f"<QIIiIQ{NAME_MAX}s{CMDLINE_MAX}sII")
# vram_device_record: seq, device, in_use, source, uuid, then twelve uint64 counters.
DEVICE = struct.Struct("<Qii16s48s12Q")
DEVICE_RECORD_SIZE = DEVICE.size  # 176
DEVICES_OFFSET = HEADER.size      # 616
RECORD_SIZE = DEVICES_OFFSET + MAX_DEVICES * DEVICE_RECORD_SIZE  # 3,432
assert (DEVICE_RECORD_SIZE, RECORD_SIZE) == (176, 3432)

# The twelve counters of a device, in the header's order.
_COUNTERS = ("allocated_bytes", "reserved_bytes", "active_bytes", "cached_free_bytes",
             "largest_free_block", "peak_allocated_bytes", "peak_reserved_bytes", "num_ooms",
             "num_alloc_retries", "limit_bytes", "capacity_bytes", "updated_ns")

# A writer holds a device's sequence odd only for a handful of stores, under the pool's lock;
# a reader that still sees it odd (or changing) after this many tries is looking at a writer
# that is stopped (a debugger, SIGSTOP, killed mid-update) and says "busy" instead of waiting.
_SPIN_TRIES = 200
_SLEEP_TRIES = 20
_SLEEP_S = 0.0005


@dataclass
class DeviceRecord:
    """One device's pool in a process, in bytes (the counters as the engine published them).

    busy is True when the device was being written on every try; its figures are then 0 and
    not to be shown or exported as values. fragmentation is 1 - largest_free_block /
    cached_free_bytes: 0 when the cached memory is one block (or there is none), near 1 when
    it is in many small pieces."""

    device: int
    source: str
    uuid: str
    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    cached_free_bytes: int
    largest_free_block: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    num_ooms: int
    num_alloc_retries: int
    limit_bytes: int
    capacity_bytes: int
    updated_ns: int
    busy: bool = False
    fragmentation: float = field(init=False)

    def __post_init__(self) -> None:
        if self.cached_free_bytes > 0:
            # largest_free_block is refreshed at slow-path events only, so it can briefly
            # exceed what is cached now: clamp rather than report negative fragmentation.
            ratio = min(self.largest_free_block, self.cached_free_bytes) / self.cached_free_bytes
            self.fragmentation = 1.0 - ratio
        else:
            self.fragmentation = 0.0


@dataclass
class ProcessRecord:
    """A process's published record: who it is and one DeviceRecord per device with a pool.
    cmdline is "" unless the process opted in (VRAMKIT_PUBLISH=cmdline)."""

    pid: int
    uid: int
    name: str
    cmdline: str
    start_ticks: int
    devices: list[DeviceRecord]
    path: str = ""


def default_directory() -> Path:
    """Where this user's processes publish: $VRAMKIT_PUBLISH_DIR, else /dev/shm/vramkit-<uid>."""
    configured = os.environ.get("VRAMKIT_PUBLISH_DIR")
    return Path(configured) if configured else Path(f"/dev/shm/vramkit-{os.getuid()}")


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (the start time in clock ticks since boot), or None where
    the process does not exist. The name in field 2 may hold spaces and parentheses, so the
    fields are counted after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            line = stat_file.read()
    except OSError:
        return None
    try:
        return int(line[line.rindex(b")") + 1:].split()[19])
    except (ValueError, IndexError):
        return None


def _read_device(view, index: int) -> DeviceRecord | None:
    """One device under the seqlock protocol: copy its bytes between two reads of seq and keep
    the copy only when seq was even and unchanged. None when the slot is not in use."""
    offset = DEVICES_OFFSET + index * DEVICE_RECORD_SIZE
    fields = None
    # seq is read as one aligned 8-byte word (a memoryview of format "Q" copies an item
    # with one load), as the engine stores it. struct's "<Q" reads it a byte at a time:
    # bytes from before and after a carry can make an old even value, and a reader
    # preempted mid-copy then took a torn copy for a stable one (CI, 2026-12-02).
    with memoryview(view) as whole, whole[offset:offset + 8] as raw, raw.cast("Q") as seq:
        for attempt in range(_SPIN_TRIES + _SLEEP_TRIES):
            if attempt >= _SPIN_TRIES:
                time.sleep(_SLEEP_S)
            before = seq[0]
            if before & 1:
                continue
            fields = DEVICE.unpack_from(view, offset)
            if seq[0] == before:
                break
            fields = None
    if fields is None:
        # Still being written: say so with what identifies the device, and no figures.
        _, device, in_use, source, uuid, *_ = DEVICE.unpack_from(view, offset)
        return DeviceRecord(device, _text(source), _text(uuid), *([0] * len(_COUNTERS)),
                            busy=True)
    _, device, in_use, source, uuid, *counters = fields
    if in_use != 1:
        return None
    return DeviceRecord(device, _text(source), _text(uuid), *counters)


class _Skip(Exception):
    """A file that is not a readable record of a live process of ours; the message says why."""

    def __init__(self, reason: str, remove: bool = False):
        super().__init__(reason)
        self.remove = remove


def _parse(path: Path, fd: int) -> ProcessRecord:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise _Skip("not a regular file")
    if info.st_uid != os.getuid():
        raise _Skip(f"owned by uid {info.st_uid}, not by this user ({os.getuid()})")
    if info.st_size < HEADER.size:
        raise _Skip(f"too short for a record ({info.st_size} bytes, the header needs "
                    f"{HEADER.size})")
    # mmap the record (the writer's stores appear in it as they happen) rather than read()
    # it: the seqlock needs each device's sequence read before and after its fields.
    with mmap.mmap(fd, info.st_size, mmap.MAP_SHARED, mmap.PROT_READ) as view:
        (magic, version, record_size, pid, uid, ticks, name, cmdline, n_devices,
         _) = HEADER.unpack_from(view, 0)
        if magic == 0:
            # A writer ftruncate()s, maps, then fills the header: the moment in between.
            raise _Skip("not initialised yet (a process is creating it)")
        if magic != RECORD_MAGIC:
            raise _Skip(f"not a vramkit record (magic {magic:#018x})")
        if version != RECORD_VERSION:
            raise _Skip(f"record version {version}; this reader knows version {RECORD_VERSION}")
        if record_size != RECORD_SIZE or info.st_size < RECORD_SIZE:
            raise _Skip(f"record of {record_size} bytes in a file of {info.st_size}; "
                        f"version {RECORD_VERSION} records are {RECORD_SIZE}")
        if uid != info.st_uid:
            raise _Skip(f"the record claims uid {uid} in a file of uid {info.st_uid}")
        if path.stem != str(pid):
            raise _Skip(f"the record's pid {pid} is not its file's name")
        alive = start_ticks(pid)
        if alive is None:
            raise _Skip(f"process {pid} has exited", remove=True)
        if ticks and alive != ticks:
            raise _Skip(f"process {pid} has exited (its pid now names another process)",
                        remove=True)
        devices = []
        for index in range(min(n_devices, MAX_DEVICES)):
            device = _read_device(view, index)
            if device is not None:
                devices.append(device)
    return ProcessRecord(pid=pid, uid=uid, name=_text(name), cmdline=_text(cmdline),
                         start_ticks=ticks, devices=devices, path=str(path))


def read_record(path: str | os.PathLike, problems: list[str] | None = None,
                clean: bool = True) -> ProcessRecord | None:
    """One record file, or None (with the reason appended to problems) where it is not a
    record of a live process of this user; a dead process's file is removed when clean."""
    path = Path(path)
    try:
        # O_NOFOLLOW: a link planted in the folder is not followed to some other file.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno != errno.ENOENT:  # gone meanwhile: the process exited, nothing to say
            if problems is not None:
                reason = ("not readable by this user (another user's record)"
                          if error.errno == errno.EACCES else
                          "a symbolic link" if error.errno == errno.ELOOP else error.strerror)
                problems.append(f"{path}: {reason}")
        return None
    try:
        return _parse(path, fd)
    except _Skip as skip:
        if skip.remove and clean:
            try:
                path.unlink()  # ours (checked in _parse), and its writer is gone
            except OSError:
                pass
        elif problems is not None and not skip.remove:
            # An exited process's record is no problem: it is what a crash leaves behind.
            problems.append(f"{path}: {skip}")
    except (OSError, ValueError, struct.error) as error:
        if problems is not None:
            problems.append(f"{path}: cannot be read ({error})")
    finally:
        os.close(fd)
    return None


def read_records(directory: str | os.PathLike | None = None, problems: list[str] | None = None,
                 clean: bool = True) -> list[ProcessRecord]:
    """The records of this user's live vramkit processes in directory (default:
    :func:`default_directory`), sorted by pid. Files that are not such records are skipped,
    with a line each appended to problems when given; records of exited processes are removed
    (clean=False leaves them). Never raises for what is in the folder."""
    folder = Path(directory) if directory is not None else default_directory()
    try:
        info = os.stat(folder)
    except FileNotFoundError:
        return []  # no vramkit process has published yet
    except OSError as error:
        if problems is not None:
            problems.append(f"{folder}: {error.strerror}")
        return []
    if info.st_uid != os.getuid() and directory is None:
        # Another user made the folder this user's processes publish in: what is in it is not
        # this user's to trust or to clean.
        if problems is not None:
            problems.append(f"{folder}: owned by uid {info.st_uid}, not by this user; "
                            f"its records are not read")
        return []
    try:
        names = sorted(entry.name for entry in os.scandir(folder))
    except OSError as error:
        if problems is not None:
            problems.append(f"{folder}: {error.strerror}")
        return []
    records = []
    for name in names:
        if not name.endswith(".rec"):
            continue  # the writer's temporaries and anything else that is not a record
        record = read_record(folder / name, problems, clean)
        if record is not None:
            records.append(record)
    records.sort(key=lambda record: record.pid)
    return records
