"""Reading a training-loop memory log (vramkit.MemoryLogger's JSON lines or CSV) as a History,
so that `vramkit plot memory.jsonl -o memory.html` draws it like a trace.

A log has no blocks, only what was allocated and reserved at each record. Each record becomes
one band of its allocated bytes, lasting until the next record (hover names its step), the
reserved series is the records' reserved bytes, and a rise of num_ooms between two records is
an out-of-memory point. The peaks the page states are the log's own (its records'
peak_allocated and peak_reserved, highs between records), not the highest record drawn. A
log cut short by a crash (its last line incomplete) is drawn up to that line, with a note;
any other unreadable line is an error naming it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re

from ._history import Block, History
from ._read import PlotInputError
from ._snapshot import _I64, _U64

# The first line of a JSON lines log as MemoryLogger writes it (time first) or a hand-made
# one (step first); a snapshot in JSON starts with other keys.
_JSON_HEAD = re.compile(rb'^\s*\{\s*"(?:time|step)"\s*:')
_REQUIRED = ("time", "step", "allocated", "reserved")
# The largest device number a record may name: CUDA's ordinals are C ints.
MOST_DEVICE = (1 << 31) - 1


def is_log(raw: bytes) -> bool:
    """Whether the content is a memory log, from its first line."""
    first = raw[:4096].split(b"\n", 1)[0]
    if _JSON_HEAD.match(first):
        return b'"allocated"' in first and b'"reserved"' in first
    columns = first.strip().decode("ascii", "replace").split(",")
    return columns[:2] == ["time", "step"] and "allocated" in columns and "reserved" in columns


def _clipped(value) -> str:
    """A value of the file for a message: its first 40 characters, a string quoted. Not
    repr(): the command line escapes what it prints, and would escape repr's escapes."""
    text = str(value)[:40]
    return f"'{text}'" if isinstance(value, str) else text


def _number(path, where, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not math.isfinite(value)):
        raise PlotInputError(f"{path}:{where}: '{name}' is not a number: {_clipped(value)}")
    return value


def parse_log(path: str, raw: bytes) -> tuple[list[dict], list[str]]:
    """The records of a log (each with at least time, step, allocated, reserved) and notes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PlotInputError(f"{path}: not a text log: byte {error.start} is not UTF-8") \
            from None
    notes = []
    records = []
    if text.lstrip().startswith("{"):
        lines = text.split("\n")
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except RecursionError:
                raise PlotInputError(f"{path}:{number}: not a JSON record: nested deeper "
                                     f"than a record ever is") from None
            except ValueError as error:
                if number - 1 == last and records:
                    notes.append(f"the last line ({number}) is incomplete (the run stopped "
                                 f"while writing it): drawn up to line {number - 1}")
                    break
                raise PlotInputError(f"{path}:{number}: not a JSON record: {error}") from None
            if not isinstance(record, dict):
                raise PlotInputError(f"{path}:{number}: a {type(record).__name__}, not a "
                                     f"record (a JSON object)")
            records.append((number, record))
    else:
        reader = csv.DictReader(io.StringIO(text))
        for number, row in enumerate(reader, 2):
            record = {}
            for name, value in row.items():
                if name is None or value is None or value == "":
                    continue
                try:
                    record[name] = int(value)
                except ValueError:
                    try:
                        parsed = float(value)
                    except ValueError:
                        parsed = math.nan
                    # past a float's range the text stays, to be named as it is written
                    record[name] = parsed if math.isfinite(parsed) else value
            records.append((number, record))
    out = []
    for number, record in records:
        missing = [name for name in _REQUIRED if name not in record]
        if missing:
            raise PlotInputError(f"{path}:{number}: the record lacks {', '.join(missing)} "
                                 f"(a MemoryLogger record has time, step, allocated, reserved)")
        for name in _REQUIRED:
            _number(path, number, name, record[name])
        # Memory figures are byte counts as the engine keeps them (64-bit), held to a
        # snapshot's bounds; a time or a step past a signed 64-bit count is no clock's or
        # loop's, and past a float's range an int would stop the drawing's arithmetic.
        # The peaks are optional (a hand-made log may lack them) but stated on the page.
        peaks = [name for name in ("peak_allocated", "peak_reserved") if name in record]
        for name in peaks:
            _number(path, number, name, record[name])
        for name in ("allocated", "reserved", *peaks):
            if not 0 <= record[name] < _U64:
                raise PlotInputError(f"{path}:{number}: '{name}' is not a byte count from 0 "
                                     f"to 2**64 - 1: {_clipped(record[name])}")
        for name, what in (("time", "a time in seconds"), ("step", "a step number")):
            if not abs(record[name]) < _I64:
                raise PlotInputError(f"{path}:{number}: '{name}' is not {what}: "
                                     f"{_clipped(record[name])}")
        device = record.get("device")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)
                                   or not 0 <= device <= MOST_DEVICE):
            raise PlotInputError(f"{path}:{number}: 'device' is not a device number: "
                                 f"{_clipped(device)}")
        out.append(record)
    return out, notes


def from_log(path: str, records: list[dict], notes: list[str]) -> History:
    """A History of a memory log (see the module's notes)."""
    h = History(path, "log")
    h.notes.extend(notes)
    if not records:
        h.reserved_note = "the log holds no records"
        h.segments_note = "a memory log records no segments"
        return h.finish()
    devices = {r.get("device") for r in records}
    h.device = devices.pop() if len(devices) == 1 else None
    if h.device is None and records[0].get("device") is not None:
        h.notes.append("the log mixes records of several devices: they are drawn as one")
    t0 = records[0]["time"]
    times = []
    backwards = 0
    previous = 0.0
    for r in records:
        # Seconds in the log; the page's axis is in µs. parse_log bounded the times, so
        # the difference of two is finite.
        t = (r["time"] - t0) * 1e6
        if t < previous:
            backwards += 1
            t = previous             # a clock set back: keep the order of the records
        previous = t
        times.append(t)
    if backwards:
        h.notes.append(f"{backwards} records have a time before the one above them (the "
                       f"clock was set back): drawn at the earlier record's time")
    blocks = []
    ooms = records[0].get("num_ooms") if isinstance(records[0].get("num_ooms"), int) else None
    for i, (r, t) in enumerate(zip(records, times)):
        block = Block(int(r["allocated"]), t, 0, f"step {r['step']}")
        if i + 1 < len(records):
            block.end = times[i + 1]
        blocks.append(block)
        h.events.append((t, block, True))
        if block.end is not None:
            h.events.append((block.end, block, False))
        count = r.get("num_ooms")
        if isinstance(count, int) and ooms is not None and count > ooms:
            h.ooms.append((t, f"out of memory: {count - ooms} failed allocation(s) by step "
                              f"{r['step']} ({count} in all)"))
        if isinstance(count, int):
            ooms = count
    # Events sorted by time with frees before allocations at the same instant, so that
    # one record's band ends where the next begins rather than doubling up.
    h.events.sort(key=lambda e: (e[0], e[2]))
    h.blocks = blocks
    h.reserved = [(t, int(r["reserved"])) for r, t in zip(records, times)]
    # A record's figures are what was held at its step() call; a high inside the steps
    # between two records is only in its peaks.
    h.stated_peak_allocated = max(int(r.get("peak_allocated", 0)) for r in records)
    h.stated_peak_reserved = max(int(r.get("peak_reserved", 0)) for r in records)
    h.segments_note = "a memory log records no segments: this view needs a snapshot"
    h.last_time = times[-1]
    return h.finish()
