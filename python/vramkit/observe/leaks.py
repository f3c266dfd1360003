"""Leak finding from the memory history: what is still live since a mark, and which call
sites keep growing in a training loop.

Both group blocks by the user's call site, the innermost frame of the allocation's Python
stack once vramkit's and the frameworks' frames are folded away (history.py), so a leak is
named by the line that made it: ``train.py:42:step``.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections import deque
from dataclasses import dataclass, field

from .. import _core
from .._figures import UNITS, binary_size
from . import history as _h

UNKNOWN = ("<no stack>", 0, "<recorded without stacks>")


class MemoryLeakWarning(UserWarning):
    """A call site whose live bytes kept growing (LeakDetector)."""


@dataclass(frozen=True)
class Mark:
    """A point in a device's history (history_mark()); leaks(since=mark) looks after it."""

    device: int
    context: int
    time_us: int


@dataclass
class LeakSite:
    """Blocks still live from one call site."""

    filename: str
    line: int
    name: str
    count: int = 0
    bytes: int = 0            # block bytes the pool holds for them
    requested_bytes: int = 0  # bytes the caller asked for
    frames: list = field(default_factory=list, repr=False)  # the first block's full stack

    @property
    def site(self) -> str:
        return f"{self.filename}:{self.line}:{self.name}"


def _fmt(n: int) -> str:
    return binary_size(n, 1, units=UNITS[:5])


class LeakReport:
    """Blocks allocated after a mark and still live, grouped by call site, largest first.
    Iterate it (LeakSite), test it (true when something leaked), or print it."""

    def __init__(self, device: int = 0):
        self.device = device
        self.sites: list[LeakSite] = []
        self.done = False  # leak_check() fills it when its block ends

    @property
    def count(self) -> int:
        return sum(s.count for s in self.sites)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.sites)

    def __iter__(self):
        return iter(self.sites)

    def __len__(self) -> int:
        return len(self.sites)

    def __bool__(self) -> bool:
        return bool(self.sites)

    def as_dicts(self) -> list[dict]:
        return [{"site": s.site, "filename": s.filename, "line": s.line, "name": s.name,
                 "count": s.count, "bytes": s.bytes, "requested_bytes": s.requested_bytes}
                for s in self.sites]

    def __str__(self) -> str:
        if not self.done:
            return f"vramkit leaks on device {self.device}: (the leak_check block is still running)"
        if not self.sites:
            return f"vramkit leaks on device {self.device}: none"
        lines = [f"vramkit leaks on device {self.device}: {self.count} block(s), "
                 f"{_fmt(self.bytes)} still live"]
        for s in self.sites:
            lines.append(f"  {_fmt(s.bytes):>12} in {s.count:>6} block(s)  {s.site}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<LeakReport device={self.device} sites={len(self.sites)} bytes={self.bytes}>"


def _site(frames) -> tuple:
    if not frames:
        return UNKNOWN
    f = frames[0]
    return (f["filename"], f["line"], f["name"])


def _ensure_recording(d: int, enabled: str, what: str) -> bool:
    """Start recording with stacks on device d if it is not recording; True if started
    here. A recording without stacks is kept (restarting would clear it), with a warning
    that call sites will be unknown."""
    rec = _h._recordings.get(d)
    if rec is not None and rec.on and (rec.enabled == "all" or enabled == "state"):
        if rec.stacks is None:
            warnings.warn(f"{what}: device {d} records without stacks, so call sites are "
                          f"unknown; record_memory_history(stacks='python') names them",
                          stacklevel=3)
        return False
    _h.record_memory_history(enabled=enabled, stacks="python",
                             max_entries=rec.max_entries if rec is not None and
                             rec.enabled == "all" else _h.DEFAULT_MAX_ENTRIES, device=d)
    return True


def history_mark(device=None) -> Mark:
    """Mark this moment in the device's history for leaks(since=...). Starts recording
    (enabled='all', stacks='python') if the device is not recording all events."""
    d = _h._device(device)
    _ensure_recording(d, "all", "history_mark()")
    context = _h._new_annotation("vramkit.history_mark")
    _core.history_annotate(d, context)
    events, _ = _h._read(d)
    t = next((e[0] for e in reversed(events) if e[7] == _h._ANNOTATE and e[5] == context), 0)
    return Mark(d, context, t)


def leaks(since: Mark, device=None) -> LeakReport:
    """The blocks allocated after the mark that are still live, grouped by call site."""
    report = LeakReport()
    _fill(report, since, device)
    return report


def _fill(report: LeakReport, since, device) -> None:
    if not isinstance(since, Mark):
        raise TypeError(f"since must be a mark from vramkit.history_mark(), not "
                        f"{type(since).__name__}")
    d = since.device if device is None else _h._device(device)
    if d != since.device:
        raise _h._invalid(f"device={device!r}: the mark was taken on device {since.device}")
    _h._full_recording(d, "leaks()")
    events, dropped = _h._read(d)
    start = next((i + 1 for i, e in enumerate(events)
                  if e[7] == _h._ANNOTATE and e[5] == since.context), None)
    if start is None:
        if dropped and events and events[0][0] >= since.time_us:
            warnings.warn(f"leaks(): the history of device {d} overflowed past the mark "
                          f"({dropped} oldest events overwritten): blocks allocated between "
                          f"the mark and the oldest kept event are not counted; raise "
                          f"max_entries", stacklevel=3)
            start = 0
        else:
            raise _h._invalid("since: this mark is not in the device's history (recording "
                              "was restarted after it was taken)")
    live: dict[int, tuple] = {}
    for e in events[start:]:
        if e[7] == _h._ALLOC:
            live[e[1]] = e
        elif e[7] == _h._FREE_REQUESTED:
            live.pop(e[1], None)
    frames_of = _h._frames_of([e[5] for e in live.values()])
    sites: dict[tuple, LeakSite] = {}
    for e in live.values():
        frames = frames_of.get(e[5], [])
        key = _site(frames)
        s = sites.get(key)
        if s is None:
            s = sites[key] = LeakSite(*key, frames=frames)
        s.count += 1
        s.bytes += e[2]
        s.requested_bytes += e[3]
    report.device = d
    report.sites = sorted(sites.values(), key=lambda s: (-s.bytes, s.filename, s.line))
    report.done = True


class leak_check:
    """``with vramkit.leak_check() as report:`` - on leaving the block, report lists what
    the block allocated and did not free, by call site (empty when nothing leaked). Starts
    recording for the block's length if the device was not recording; warn=True also
    warns (MemoryLeakWarning) when something leaked."""

    def __init__(self, device=None, warn: bool = False):
        self._device = _h._device(device)
        self._warn = warn
        self.report = LeakReport(self._device)

    def __enter__(self) -> LeakReport:
        self._started = _ensure_recording(self._device, "all", "leak_check()")
        self._mark = history_mark(self._device)
        return self.report

    def __exit__(self, *exc) -> bool:
        try:
            _fill(self.report, self._mark, None)
        finally:
            if self._started:
                _h.record_memory_history(enabled=None, device=self._device)
        if self._warn and self.report:
            warnings.warn(str(self.report), MemoryLeakWarning, stacklevel=2)
        return False


@dataclass
class Growth:
    """A call site whose live bytes grew at each of the last `checks` checks."""

    filename: str
    line: int
    name: str
    bytes: int          # live now
    grown_bytes: int    # growth over those checks
    checks: int

    @property
    def site(self) -> str:
        return f"{self.filename}:{self.line}:{self.name}"

    def __str__(self) -> str:
        return (f"{self.site}: live bytes grew at each of the last {self.checks} checks, by "
                f"{_fmt(self.grown_bytes)} to {_fmt(self.bytes)}")


class LeakDetector:
    """A growth detector for training loops: call .step() once per iteration; every
    `every` steps it counts the live bytes of each call site, and flags (returns, keeps in
    .findings, warns with MemoryLeakWarning unless warn=False, and passes to callback) a
    site whose live bytes grew at each of `window` consecutive checks. A steady loop, whose
    live bytes per site come back to the same figure, is never flagged. Records stacks
    (enabled='state', which costs only the stack capture) if the device is not recording."""

    def __init__(self, every: int = 100, window: int = 5, device=None, callback=None,
                 warn: bool = True):
        for name, value, low in (("every", every, 1), ("window", window, 2)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
            if value < low:
                raise _h._invalid(f"{name} must be >= {low}, got {value}")
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable or None")
        self.every, self.window, self.callback, self.warn = every, window, callback, warn
        self.device = _h._device(device)
        self.findings: list[Growth] = []
        self.steps = 0
        self._series: dict[tuple, deque] = {}
        self._flagged: set[tuple] = set()
        _ensure_recording(self.device, "state", "LeakDetector")

    def step(self) -> list[Growth]:
        """Count one step; on every `every`-th, check. Returns the sites newly flagged."""
        self.steps += 1
        if self.steps % self.every:
            return []
        return self.check()

    def check(self) -> list[Growth]:
        """Check now, whatever the step count."""
        blocks = _h._live_blocks(self.device)
        frames_of = _h._frames_of([b[3] for b in blocks])
        now: dict[tuple, int] = {}
        for b in blocks:
            key = _site(frames_of.get(b[3], []))
            now[key] = now.get(key, 0) + b[1]
        new = []
        for key in set(now) | set(self._series):
            series = self._series.setdefault(key, deque(maxlen=self.window + 1))
            series.append(now.get(key, 0))
            if len(series) <= self.window or key in self._flagged:
                continue
            values = list(series)
            if all(b > a for a, b in zip(values, values[1:])):
                self._flagged.add(key)
                new.append(Growth(*key, bytes=values[-1], grown_bytes=values[-1] - values[0],
                                  checks=self.window))
        for g in sorted(new, key=lambda g: -g.grown_bytes):
            self.findings.append(g)
            if self.warn:
                warnings.warn(f"vramkit: possible leak at {g}", MemoryLeakWarning,
                              stacklevel=3)
            if self.callback is not None:
                self.callback(g)
        return new


class _CallableModule(types.ModuleType):
    # vramkit.leaks is this module and the function leaks() at once: `import vramkit.leaks`
    # makes the package's attribute the module, which must then still answer
    # vramkit.leaks(since=mark).
    def __call__(self, since: Mark, device=None) -> LeakReport:
        return leaks(since, device)


sys.modules[__name__].__class__ = _CallableModule
