"""`vramkit top`: a live view of GPU memory, per GPU and per process, from outside and inside.

NVML (vramkit.observe._nvml) gives what the driver sees: each GPU's total / used / free, its
utilisation, and each process's used memory. The records vramkit processes publish
(vramkit.records) give what only the allocator knows: allocated, reserved, cached free,
largest free block, fragmentation, peaks and OOMs. A vramkit process is joined to its GPU by
UUID (its record's, or its CUDA device ordinal mapped through its CUDA_VISIBLE_DEVICES) and
to NVML's entry by pid. What cannot be seen is said, in a "notes" list: NVML missing, another
user's processes (their records are theirs alone), a pid NVML does not list.

    vramkit top            refreshed each second (curses), q quits
    vramkit top --once     one screen, plain text
    vramkit top --json     one JSON document, for scripts

This module gathers and draws the view; its command line is vramkit.cli.top.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

from . import records as _records
from ._nvml import NvmlError, nvml, select_visible
from .._shown import shown

# The smallest terminal the table fits in legibly; below it a line says so.
MIN_COLUMNS, MIN_LINES = 60, 6


def _vramkit_fields(device: _records.DeviceRecord) -> dict:
    return dataclasses.asdict(device)


def _environ(pid: int) -> dict[str, str] | None:
    """Another process's environment (/proc/<pid>/environ: readable for our own processes)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _gpu_of(device: _records.DeviceRecord, pid: int, uuids: list[str]) -> str | None:
    """The UUID of the physical GPU a record's device is on, or None (sim, or not known).
    The engine stores the UUID; a record without one is mapped by its ordinal through the
    process's own CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES."""
    if device.source.startswith("sim"):
        return None
    if device.uuid:
        # Compared as NVML writes them, whatever case the engine formatted the bytes in.
        return next((uuid for uuid in uuids if uuid.lower() == device.uuid.lower()), None)
    environ = _environ(pid)
    if environ is None:
        return None
    visible = select_visible(uuids, environ)
    return visible[device.device] if 0 <= device.device < len(visible) else None


def _sort_key(entry: dict):
    # Most memory first: NVML's figure, else (a process NVML does not list) what its pool holds.
    vramkit = entry["vramkit"] or {}
    used = entry["nvml_used_bytes"]
    return (-(used if used is not None else vramkit.get("reserved_bytes", 0)), entry["pid"])


def snapshot(directory: str | os.PathLike | None = None) -> dict:
    """Everything `vramkit top` shows, as the JSON document --json prints: "gpus" (each with
    its "processes"), "unmatched_processes" (vramkit processes on no GPU NVML shows, e.g. on
    sim) and "notes" (what could not be seen, and why, as shown text: foreign names in
    them escaped, so that they print as they are)."""
    notes: list[str] = []
    problems: list[str] = []
    process_records = _records.read_records(directory, problems)
    notes.extend(f"record skipped: {problem}" for problem in problems)
    try:
        gpus = nvml().devices()
    except NvmlError as error:
        gpus = []
        notes.append(f"no GPU figures: {shown(str(error))}. Shown: the vramkit processes of "
                     f"this user, from their records")
    else:
        if not gpus:
            notes.append("NVML sees no GPU (none is given to this machine or container)")

    me = os.getuid()
    document_gpus = []
    by_uuid = {}
    others = 0
    for gpu in gpus:
        entries = []
        for process in gpu.processes:
            entries.append({"pid": process.pid, "name": process.name,
                            "nvml_used_bytes": process.used_bytes, "vramkit": None})
            owner = _owner(process.pid)
            others += owner is not None and owner != me
        entry = {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name,
                 "total_bytes": gpu.total, "used_bytes": gpu.used, "free_bytes": gpu.free,
                 "utilization_gpu": gpu.utilization_gpu, "processes": entries}
        document_gpus.append(entry)
        by_uuid[gpu.uuid] = entry
    if others:
        notes.append(f"{others} process{'es' if others > 1 else ''} of other users: NVML's "
                     f"figures only (a process's record is readable by its own user alone)")

    unmatched = []
    uuids = [gpu.uuid for gpu in gpus]
    for record in process_records:
        for device in record.devices:
            vramkit = _vramkit_fields(device)
            uuid = _gpu_of(device, record.pid, uuids)
            gpu_entry = by_uuid.get(uuid) if uuid else None
            if gpu_entry is None:
                unmatched.append({"pid": record.pid, "name": record.name,
                                  "nvml_used_bytes": None, "vramkit": vramkit})
                if not device.source.startswith("sim") and gpus:
                    notes.append(f"process {record.pid} ({shown(record.name)}) device "
                                 f"{device.device} ({shown(device.source)}) is on none of "
                                 f"NVML's GPUs")
                continue
            listed = [e for e in gpu_entry["processes"]
                      if e["pid"] == record.pid and e["vramkit"] is None]
            if listed:
                listed[0]["vramkit"] = vramkit
                if not listed[0]["name"]:
                    listed[0]["name"] = record.name
            else:
                # NVML lists pids of its own pid namespace: a process in a container seen from
                # the host, or the other way round, has another number there.
                gpu_entry["processes"].append({"pid": record.pid, "name": record.name,
                                               "nvml_used_bytes": None, "vramkit": vramkit})
                notes.append(f"process {record.pid} ({shown(record.name)}) is not in NVML's "
                             f"list for GPU {gpu_entry['index']} (another pid namespace?): "
                             f"its NVML used memory is not known")
    for entry in document_gpus:
        entry["processes"].sort(key=_sort_key)
    unmatched.sort(key=_sort_key)
    return {"hostname": socket.gethostname(), "time": time.time(), "gpus": document_gpus,
            "unmatched_processes": unmatched, "notes": notes}


def format_bytes(value: int | None) -> str:
    """Bytes in at most 7 characters, binary units: 0, 512B, 3.0K, 12.5M, 139.8G."""
    if value is None:
        return "-"
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if value >= 1 << shift:
            return f"{value / (1 << shift):.1f}{unit}"
    return f"{value}B" if value else "0"


# The DEVICE column: a source and its device number, "managed:15" and "sim:vmm:12" whole.
_DEVICE_WIDTH = 10
# GIVABLE: of the cached memory, what a neighbour's request could get back (whole idle
# segments); GAVE: what the process gave back to neighbours that asked (issue 39).
_HEADER = (f"{'PID':>8} {'NAME':<15} {'DEVICE':<{_DEVICE_WIDTH}} {'NVML':>7} {'ALLOC':>7} "
           f"{'RESERVED':>8} {'CACHED':>7} {'GIVABLE':>7} {'LARGEST':>7} {'FRAG':>5} {'PEAK':>7} "
           f"{'OOMS':>5} {'GAVE':>7}")


_SLOW_COLUMNS = ("GIVABLE, LARGEST and FRAG are as of each pool's last segment change, OOM or "
                 "empty_cache; the other figures are current")


def _cut(text: str, width: int) -> str:
    """Shown text cut to a column's width, never inside a \\xNN escape: half of one would
    read as other characters than the name holds."""
    cut = text[:width]
    opened = cut.rfind("\\", max(0, width - 3))
    return cut[:opened] if opened >= 0 and opened + 4 > width else cut


def _device_cell(vramkit: dict) -> str:
    """SOURCE:DEVICE in the column: a long source is cut, never the device number, which
    cut short would name another device (a record's number is shown whole, however long)."""
    number = f":{vramkit['device']}"
    return _cut(shown(vramkit["source"]), max(0, _DEVICE_WIDTH - len(number))) + number


def _process_line(entry: dict) -> str:
    vramkit = entry["vramkit"]
    head = f"{entry['pid']:>8} {_cut(shown(entry['name'] or '?'), 15):<15} "
    if vramkit is None:
        return head + f"{'':<{_DEVICE_WIDTH}} {format_bytes(entry['nvml_used_bytes']):>7}"
    head += (f"{_device_cell(vramkit):<{_DEVICE_WIDTH}} "
             f"{format_bytes(entry['nvml_used_bytes']):>7} ")
    if vramkit["busy"]:
        return head + "busy (being written)"
    return head + (f"{format_bytes(vramkit['allocated_bytes']):>7} "
                   f"{format_bytes(vramkit['reserved_bytes']):>8} "
                   f"{format_bytes(vramkit['cached_free_bytes']):>7} "
                   f"{format_bytes(vramkit['givable_bytes']):>7} "
                   f"{format_bytes(vramkit['largest_free_block']):>7} "
                   f"{vramkit['fragmentation'] * 100:>4.0f}% "
                   f"{format_bytes(vramkit['peak_reserved_bytes']):>7} "
                   f"{vramkit['num_ooms']:>5} "
                   f"{format_bytes(vramkit['given_back_bytes']):>7}")


def _group_limits(entries: list[dict]) -> list[str]:
    """The give-back group's limit (VRAMKIT_GROUP_LIMIT) as the processes listed set it."""
    limits = sorted({e["vramkit"]["group_limit_bytes"] for e in entries
                     if e["vramkit"] and e["vramkit"]["group_limit_bytes"]})
    if not limits:
        return []
    return ["  group limit (VRAMKIT_GROUP_LIMIT, or a pool's group_limit): " +
            ", ".join(format_bytes(v) for v in limits)]


def render(document: dict) -> list[str]:
    """The screen as lines of text (--once prints them; the live view draws them)."""
    gpus, unmatched = document["gpus"], document["unmatched_processes"]
    count = len({e["pid"] for g in gpus for e in g["processes"] if e["vramkit"]}
                | {e["pid"] for e in unmatched})
    lines = [f"vramkit top - {shown(document['hostname'])} - {len(gpus)} GPU{'s' * (len(gpus) != 1)}, "
             f"{count} vramkit process{'es' * (count != 1)} - "
             f"{time.strftime('%H:%M:%S', time.localtime(document['time']))}"]
    for gpu in gpus:
        utilization = "-" if gpu["utilization_gpu"] is None else f"{gpu['utilization_gpu']}%"
        lines += ["", f"GPU {gpu['index']}  {shown(gpu['name'])}  {shown(gpu['uuid'])}",
                  f"  used {format_bytes(gpu['used_bytes'])} of {format_bytes(gpu['total_bytes'])}"
                  f", free {format_bytes(gpu['free_bytes'])}, utilisation {utilization}"]
        if gpu["processes"]:
            lines.append(_HEADER)
            lines += [_process_line(entry) for entry in gpu["processes"]]
            lines += _group_limits(gpu["processes"])
        else:
            lines.append("  no compute process")
    if unmatched:
        lines += ["", "vramkit processes on no GPU that NVML shows (e.g. on sim):", _HEADER]
        lines += [_process_line(entry) for entry in unmatched]
        lines += _group_limits(unmatched)
    if not gpus and not unmatched:
        lines += ["", "no GPU and no vramkit process to show"]
    if count:
        # A pool measures these three at its slow events only, where the other columns move
        # at every allocation and free: a row must not read as one moment's figures.
        lines += ["", _SLOW_COLUMNS]
    if document["notes"]:
        # Notes are shown text already (foreign names escaped where each note is made).
        lines += ["", "notes:"] + [f"  {note}" for note in document["notes"]]
    return lines


def _draw(screen, lines: list[str]) -> None:
    import curses

    height, width = screen.getmaxyx()
    screen.erase()
    try:
        if width < MIN_COLUMNS or height < MIN_LINES:
            message = (f"terminal too small ({width}x{height}): vramkit top needs "
                       f"{MIN_COLUMNS}x{MIN_LINES}; q quits")
            screen.addnstr(0, 0, message, max(width - 1, 1))
        else:
            shown = lines[:height - 1]
            if len(lines) > height - 1:
                shown[-1] = f"... {len(lines) - len(shown) + 1} more lines (a taller terminal shows them)"
            for row, line in enumerate(shown):
                screen.addnstr(row, 0, line, width - 1)
            screen.addnstr(height - 1, 0, "q quits", width - 1, curses.A_REVERSE)
    except curses.error:
        pass  # the terminal shrank between measuring and drawing: the next refresh fits it
    screen.refresh()


def live(directory, interval: float) -> None:
    """Redraw the view every interval seconds until q, Esc or Ctrl-C. Raises curses.error
    when the terminal cannot be drawn on."""
    import curses

    def loop(screen) -> None:
        try:
            curses.curs_set(0)
        except curses.error:
            pass  # a terminal without an invisible cursor
        screen.timeout(int(interval * 1000))
        while True:
            _draw(screen, render(snapshot(directory)))
            key = screen.getch()
            if key in (ord("q"), ord("Q"), 27):
                return

    try:
        curses.wrapper(loop)
    except KeyboardInterrupt:
        pass
