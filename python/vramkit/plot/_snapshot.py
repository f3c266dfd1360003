"""The shape of a memory snapshot, checked once before `vramkit plot` or `vramkit doctor`
reads one, so that neither meets a value of the wrong kind deep inside its arithmetic.

A snapshot is the dict of torch.cuda.memory._snapshot(): ``segments`` (dicts whose
``blocks`` are dicts) and ``device_traces`` (one list of entry dicts per device). A field
the readers compute with must hold what PyTorch writes there: a byte count or an address
is an int from 0 to 2**64 - 1, a device an int from 0, a stream an int, a time a finite
number of microseconds below 2**63, a block's state and a segment's type a str; a bool is
not an int here. Another kind of value is refused with its place
(``segments[3].blocks[0].size``), since no reading of it is right.
What a reader can skip and say so stays the reader's: a segment, block or entry that is
not a dict, an action it does not know, a field that is missing.

The work of reading is bounded by the size of the file. A pickle names an object it has
already stored in two bytes (its memo), so a file of a few kilobytes can list one block a
million times, in a million segments, and a reader walking that would run for minutes.
Every segment, block and trace entry of a snapshot PyTorch or vramkit writes is an object
of its own, and so is every list of them, so a file that repeats one is refused here, in
one pass over the distinct objects, before any reader walks it. Frame lists are
legitimately shared (vramkit gives the blocks of one stack the same list): readers look
each one up once (SiteCache), and take from a frame only a str or an int, never the text
of a container (which a repeating list makes as long as its expansion).
"""

from __future__ import annotations

import math

from ._read import PlotInputError

_ABSENT = object()
_U64 = 1 << 64
_I64 = 1 << 63


def _byte_count(value) -> bool:
    return type(value) is int and 0 <= value < _U64


def _device(value) -> bool:
    return type(value) is int and 0 <= value < (1 << 31)


def _stream(value) -> bool:
    return type(value) is int and -_I64 <= value < _U64


def _time(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and abs(value) < _I64


def _text(value) -> bool:
    return type(value) is str


_KINDS = {
    _byte_count: "a byte count or address from 0 to 2**64 - 1",
    _device: "a device number (an int from 0)",
    _stream: "a stream (an int)",
    _time: "a finite number of microseconds",
    _text: "a str",
}
_SEGMENT = {"device": _device, "address": _byte_count, "total_size": _byte_count,
            "stream": _stream, "segment_type": _text}
_BLOCK = {"address": _byte_count, "size": _byte_count, "requested_size": _byte_count,
          "state": _text}
_ENTRY = {"addr": _byte_count, "size": _byte_count, "requested_size": _byte_count,
          "device_free": _byte_count, "stream": _stream, "time_us": _time}


def check(path: str, snapshot) -> dict:
    """The snapshot itself, once its skeleton, its fields and the distinctness of its
    objects are as the module's text says; PlotInputError naming the file and the place
    otherwise."""
    if isinstance(snapshot, list):
        raise PlotInputError(f"{path}: not a memory snapshot vramkit reads: a list, as the "
                             f"legacy format (torch.cuda.memory_snapshot() before PyTorch "
                             f"2.1) is; vramkit reads the dict of "
                             f"torch.cuda.memory._snapshot()")
    if not isinstance(snapshot, dict):
        raise PlotInputError(f"{path}: not a memory snapshot: it holds a "
                             f"{type(snapshot).__name__}, not a dict with 'segments'")
    if "segments" not in snapshot:
        keys = ", ".join(sorted(k for k in snapshot if isinstance(k, str))[:8]) or "none"
        raise PlotInputError(f"{path}: not a memory snapshot: the dict has no 'segments' "
                             f"(its keys: {keys})")
    seen: set[int] = set()
    segments = _list(path, seen, snapshot["segments"], "segments")
    for i, seg in enumerate(segments):
        where = f"segments[{i}]"
        if _fields(path, seen, seg, where, _SEGMENT):
            blocks = _list(path, seen, seg.get("blocks", []), f"{where}.blocks")
            for j, block in enumerate(blocks):
                _fields(path, seen, block, f"{where}.blocks[{j}]", _BLOCK)
    traces = _list(path, seen, snapshot.get("device_traces", []), "device_traces")
    for device, entries in enumerate(traces):
        where = f"device_traces[{device}]"
        for j, entry in enumerate(_list(path, seen, entries, where)):
            _fields(path, seen, entry, f"{where}[{j}]", _ENTRY)
    return snapshot


def _list(path, seen, value, where):
    """A list of segments, blocks or entries, walked once: the same list twice (of entries
    that are not dicts, which _fields does not track) would multiply the walk too."""
    if not isinstance(value, (list, tuple)):
        raise PlotInputError(f"{path}: {where} is a {type(value).__name__}, not a list")
    if value:
        _once(path, seen, value, where)
    return value


def _once(path, seen, item, where):
    if id(item) in seen:
        raise PlotInputError(f"{path}: {where} is an object that appears earlier in the "
                             f"snapshot too (the file repeats it by reference, as no "
                             f"snapshot PyTorch or vramkit writes does): refused, since "
                             f"repeats multiply the work of reading it without bound")
    seen.add(id(item))


def _fields(path, seen, item, where, kinds) -> bool:
    """Check one segment, block or entry; False when it is not a dict (the reader's to
    skip)."""
    if not isinstance(item, dict):
        return False
    _once(path, seen, item, where)
    for key, kind in kinds.items():
        value = item.get(key, _ABSENT)
        if value is not _ABSENT and not kind(value):
            raise PlotInputError(f"{path}: {where}.{key} is {_brief(value)}, not "
                                 f"{_KINDS[kind]}")
    return True


def _brief(value) -> str:
    """A short text for a value, in time bounded by the file's size: the repr of a list
    whose items repeat one list by reference is as long as the expanded structure, and an
    int of thousands of digits has none."""
    if isinstance(value, (str, bytes)):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if value is None or isinstance(value, (int, float)):
        return repr(value)
    return f"a {type(value).__name__}"
