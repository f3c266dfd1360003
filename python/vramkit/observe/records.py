"""The reader of the records vramkit processes publish: what each pool holds, seen from outside.

Every process with a vramkit pool keeps one small shared-memory file, ``<pid>.rec``, in
``$VRAMKIT_PUBLISH_DIR`` or ``/dev/shm/vramkit-<uid>/`` (layout: include/vramkit_record.h).
:func:`read_records` returns them as :class:`ProcessRecord` values, for ``vramkit top``,
``vramkit export`` and anything else that watches memory:

    from vramkit.records import read_records
    problems = []
    for process in read_records(problems=problems):
        for device in process.devices:
            print(process.pid, process.name, device.device, device.allocated_bytes)
    for problem in problems:
        print("skipped:", problem)

The reading itself is the engine's (``vram_records_open`` and ``vram_record_read``), the
same the OOM report uses for its neighbours: files are read, never mapped, so one that
shrinks under the reader costs nothing; a folder that is a link, another user's or open to
others is not read; a record must be a regular file of this user, of this version, whose
process runs now with the start time and the uid the record claims. A file that is no such
record is skipped with a reason; a record of a process that has exited (or whose pid was
reused) is skipped and, when it is ours, removed; a device being written on every try is
returned marked ``busy`` rather than waited for.

What a record proves: that some process of this user wrote it, and that the pid it names is
alive, runs as this user and started when the record says. Its figures are what that
process says of itself; a process of the same user can write any figures, and the reader
only skips a record whose figures contradict each other as no pool's do (allocated above
reserved, a peak below its figure, a negative device).

Names (``name``, ``cmdline``) are the writers' own text: show them escaped (as ``vramkit
top`` does, through the commands' ``shown``), never raw.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import _core
from .._shown import shown

__all__ = ["DeviceRecord", "ProcessRecord", "default_directory", "read_record", "read_records"]

# vram_record_verdict (include/vramkit.h).
_LIVE, _EXITED, _SKIPPED, _GONE = 0, 1, 2, 3


@dataclass
class DeviceRecord:
    """One device's pool in a process, in bytes (the counters as the engine published them).

    busy is True when the device was being written on every try; its figures are then 0 and
    not to be shown or exported as values. The figures move at every allocation and free,
    but for largest_free_block, which the pool measures at its slow events (a segment
    change, an OOM, empty_cache, a limit or peak reset) together with the cached memory it
    lies in, largest_of_cached_bytes. fragmentation is 1 - largest_free_block /
    largest_of_cached_bytes, the two figures of that one moment: 0 when the cached memory
    was one block (or there was none), near 1 when it was in many small pieces. (Against
    cached_free_bytes, a later moment's figure, it would claim pieces the pool never had.)"""

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
    givable_bytes: int = 0  # idle memory a neighbour's request could get back
    given_back_bytes: int = 0  # given back to neighbours that asked
    given_back_count: int = 0
    group_limit_bytes: int = 0  # VRAMKIT_GROUP_LIMIT in force, 0 = none
    largest_of_cached_bytes: int = 0  # the cached memory largest_free_block was measured in
    busy: bool = False
    fragmentation: float = field(init=False)

    def __post_init__(self) -> None:
        # The engine's reader refuses a slot whose largest block exceeds the cache it was
        # measured in, so the ratio is within [0, 1].
        cached = self.largest_of_cached_bytes
        self.fragmentation = 1.0 - self.largest_free_block / cached if cached else 0.0


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
    """Where this user's processes publish: $VRAMKIT_PUBLISH_DIR, else
    /dev/shm/vramkit-<euid>; the engine's rule (vram_records_dir), asked rather than
    repeated, so that the writers and this reader name one folder."""
    return Path(_core.records_dir())


def _process(values: dict, path: Path) -> ProcessRecord:
    devices = [DeviceRecord(**device) for device in values.pop("devices")]
    return ProcessRecord(**values, devices=devices, path=str(path))


def _read_in(folder_fd: int, folder: Path, name: str, problems: list[str] | None,
             clean: bool) -> ProcessRecord | None:
    path = folder / name
    verdict, values, why = _core.record_read(folder_fd, name)
    if verdict == _LIVE:
        return _process(values, path)
    if verdict == _EXITED and clean:
        try:
            os.unlink(name, dir_fd=folder_fd)  # ours (checked by the engine), writer gone
        except OSError:
            pass
    elif verdict == _SKIPPED and problems is not None:
        # An exited process's record is no problem: it is what a crash leaves behind.
        problems.append(f"{shown(str(path))}: {why}")
    return None


def read_record(path: str | os.PathLike, problems: list[str] | None = None,
                clean: bool = True) -> ProcessRecord | None:
    """One record file, or None (with the reason appended to problems) where it is not a
    record of a live process of this user; a dead process's file is removed when clean.
    The file is named by its caller, so its folder is not held to the publish folder's
    rules (read_records does that)."""
    path = Path(path)
    try:
        folder_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        if problems is not None:
            problems.append(f"{shown(str(path.parent))}: {error.strerror}")
        return None
    try:
        return _read_in(folder_fd, path.parent, path.name, problems, clean)
    finally:
        os.close(folder_fd)


def read_records(directory: str | os.PathLike | None = None, problems: list[str] | None = None,
                 clean: bool = True) -> list[ProcessRecord]:
    """The records of this user's live vramkit processes in directory (default:
    :func:`default_directory`), sorted by pid. A folder that is a symbolic link, another
    user's or open to group or others is not read (a problem says why). Files that are not
    records are skipped, with a line each appended to problems when given; records of exited
    processes are removed (clean=False leaves them). Never raises for what is in the folder."""
    if directory is not None:
        folder = Path(directory)
    else:
        try:
            folder = default_directory()
        except _core.ConfigError:  # too long to name: records_open says so, as a problem
            folder = Path(os.environ.get("VRAMKIT_PUBLISH_DIR", ""))
    try:
        folder_fd = _core.records_open(None if directory is None else os.fspath(folder))
    except OSError as error:
        if error.errno != errno.ENOENT and problems is not None:  # none yet: no process
            problems.append(f"{shown(str(folder))}: {error.strerror}")
        return []
    try:
        names = sorted(entry for entry in os.listdir(folder_fd) if entry.endswith(".rec"))
        records = [_read_in(folder_fd, folder, name, problems, clean) for name in names]
    except OSError as error:
        if problems is not None:
            problems.append(f"{shown(str(folder))}: {error.strerror}")
        return []
    finally:
        os.close(folder_fd)
    return sorted((record for record in records if record is not None),
                  key=lambda record: record.pid)
