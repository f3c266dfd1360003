"""Memory in the training loop: :class:`MemoryLogger` writes one record every N steps (JSON
lines, CSV, or a callback) and prints a one-screen summary at the end; :func:`tqdm_postfix`
gives a short dict for a progress bar.

    with vramkit.MemoryLogger("memory.jsonl", every=10) as log:
        for step, batch in enumerate(loader):
            train_step(batch)
            log.step(step, loss=loss.item())

Peaks between records. The engine keeps one peak per statistic, since start or since the last
reset_peak_memory_stats(). Resetting it at each record would give exact per-record peaks but
change what the user's own max_memory_allocated() answers, so by default the logger never
resets: it reads the statistics at every step() (a few microseconds) and keeps its own
running maximum. A record's peak_allocated is then the engine's peak when that peak rose since
the last record (exact: the new high happened in this window), else the highest value seen at
a step() call of the window (a lower bound: what happened inside a step and stayed below the
earlier high is not seen). reset_peaks=True opts into the exact form, resetting the engine's
peaks after each record. Because the statistics are read at every step, the summary names the
step during which the overall peak happened even when only every tenth step is written.

The logger never creates a pool: until the device's pool is in use (vramkit.torch installed
and used, or vramkit allocations), it records zeros, so that configure() stays possible.

What a writing step costs. An NVML query takes tens of microseconds, a flush is a system
call: neither is on the step path. A daemon thread per logger ("vramkit-logger") wakes every
SAMPLE_PERIOD (0.1 s): it refreshes the NVML figures (the first record queries NVML itself,
so that it has them) and flushes records written since its last wake. A record's NVML
figures are therefore up to about 0.1 s old, and it says how old: nvml_age_s. A file holds
each record within about 0.1 s; close(), the end of a with block and interpreter exit
(atexit) flush what is left, so a crash (a kill, a segfault) loses at most the records of the
last 0.1 s. Records are built in FIELDS order directly and encoded by a prebuilt JSON encoder
or csv.writer.
"""

from __future__ import annotations

import atexit
import csv
import io
import json
import math
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable

from .. import _core
from .._figures import UNITS, binary_size, counted
from .._shown import shown

__all__ = ["MemoryLogger", "tqdm_postfix"]

# The fields every record has, in this order (CSV columns; JSON keys); extras follow.
FIELDS = ("time", "step", "device", "allocated", "reserved", "peak_allocated",
          "peak_reserved", "active", "largest_free_block", "fragmentation", "nvml_used",
          "nvml_process_used", "nvml_age_s", "num_alloc_retries", "num_ooms", "step_time")
_FIELD_SET = frozenset(FIELDS)

# How often the logger's thread refreshes NVML's figures and flushes the file, in seconds:
# the most a record's NVML figures lag, and the most a crash loses.
SAMPLE_PERIOD = 0.1

_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


def _device_index(device) -> int:
    """The ordinal of ``device``, refused (InvalidDeviceError) past the devices the source
    has: a log of a device that is not there would record zeros for the whole run."""
    from .. import _core as core, _device, _error

    index = _device(device)
    try:
        count = core.device_count()
    except core.VramError:
        return index  # no driver to count with: the first record says so
    if index >= count:
        there = f"devices 0 to {count - 1} are there" if count else "no device is there"
        raise _error(core.VRAM_EDEVICE, f"device {index}: invalid device ordinal ({there})")
    return index


def _pool_in_use(device: int) -> bool:
    from .. import _pool_in_use as in_use

    return in_use(device)


def _nvml_applies(device: int) -> bool:
    """NVML has figures for the device: not on the sim sources, which have no GPU."""
    return not _core.source(device).startswith("sim")


def _size(n: float) -> str:
    """Bytes in binary units, short enough for a summary line or a progress bar."""
    return binary_size(n, 2, units=UNITS[:5])


class _NvmlView:
    """NVML's figures for one vramkit device ordinal: the GPU's used bytes and this process's.
    The ordinal is mapped to a physical GPU once, by UUID (CUDA_VISIBLE_DEVICES renumbers).
    Any NVML failure turns it off for good with one warning: a monitor must not break the
    loop it monitors, nor repeat a failing driver call at every record."""

    def __init__(self, device: int):
        self.device = device
        self.index: int | None = None
        self.off = False
        self.error: str | None = None
        # The latest sample: (used, mine, time.monotonic() of the query), replaced whole by
        # the sampler thread so that the step path reads it without a lock.
        self.sample: tuple[int | None, int | None, float] | None = None
        self.queries = 0

    def refresh(self) -> None:
        used, mine = self.read()
        self.sample = (used, mine, time.monotonic())

    def read(self) -> tuple[int | None, int | None]:
        """NVML's (GPU used, this process's used) now; (None, None) once off. A failure
        sets self.error (the caller warns, on the training loop's thread) and turns it off."""
        if self.off:
            return None, None
        try:
            from ._nvml import NvmlError, nvml, visible_uuids
        except ImportError:
            self.off = True
            return None, None
        try:
            if self.index is None:
                visible = visible_uuids()
                if visible is None or self.device >= len(visible):
                    self.off = True  # no NVML, or no such GPU: nothing to report, no warning
                    return None, None
                self.index = nvml().uuids().index(visible[self.device])
            self.queries += 1
            gpu = nvml().device(self.index)
        except (NvmlError, ValueError, OSError) as error:
            self.off = True
            self.error = f"vramkit.MemoryLogger: NVML figures are off from now on: {error}"
            return None, None
        pid = os.getpid()
        mine = next((p.used_bytes for p in gpu.processes if p.pid == pid), None)
        return gpu.used, mine


class MemoryLogger:
    """One record of the device's memory every `every` calls of :meth:`step`.

    path_or_callback: a file name ending in .jsonl/.ndjson/.json (one JSON object a line) or
    .csv (a header, then a row a record; extras not in the first record are dropped with a
    warning), or a callable that receives each record as a dict. The file is replaced, and
    flushed by the logger's thread within about SAMPLE_PERIOD (0.1 s) of each record, so that
    it can be followed while training runs; close() and interpreter exit flush the rest (a
    crash loses at most the last 0.1 s of records).

    device: the vramkit device (an ordinal, "cuda:1", a torch.device); None is device 0.
    nvml: add NVML's used bytes of the GPU and of this process (None where NVML or the GPU is
    missing, and always on the sim source), sampled off the step path every SAMPLE_PERIOD;
    nvml_age_s says how old the record's sample is (None without figures). reset_peaks: see the module's notes.
    summary: where close() prints its summary (a file object; None: sys.stderr; False: not at
    all).
    """

    def __init__(self, path_or_callback: str | os.PathLike | Callable[[dict], Any],
                 every: int = 1, device=None, *, nvml: bool = True,
                 reset_peaks: bool = False, summary=None):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self.every = every
        self.device = _device_index(device)
        self.reset_peaks = bool(reset_peaks)
        if summary is not None and summary is not False and not callable(
                getattr(summary, "write", None)):
            # Checked here, not when close() prints to it at the end of a run.
            raise TypeError(f"summary must be a file object, None (stderr) or False, not "
                            f"{type(summary).__name__}")
        self._summary_to = summary
        self._callback: Callable[[dict], Any] | None = None
        self._file: io.TextIOBase | None = None
        self._csv = None
        self._csv_fields: list[str] | None = None
        self._csv_extra: list[str] = []
        self._dropped: set[str] = set()
        self.path: str | None = None
        if callable(path_or_callback) and not isinstance(path_or_callback, (str, os.PathLike)):
            self._callback = path_or_callback
            self._format = "callback"
        else:
            self.path = os.fsdecode(path_or_callback)
            lower = self.path.lower()
            if lower.endswith(_JSON_SUFFIXES):
                self._format = "jsonl"
            elif lower.endswith(".csv"):
                self._format = "csv"
            else:
                raise ValueError(f"{self.path}: the log's name must end in .jsonl, .ndjson, "
                                 f".json or .csv (that picks the format), or pass a callable")
            # Opened now, so a bad path fails before training starts, not at the first record.
            self._file = open(self.path, "w", newline="" if self._format == "csv" else None,
                              encoding="utf-8")
        self._nvml = _NvmlView(self.device) if nvml else None
        self._in_use = False
        self._calls = 0              # step() calls so far
        self._since = 0              # calls since the last record
        self._t_window = None        # perf_counter at the last record (or at the first call)
        self._t_last = None          # perf_counter at the last call
        # (allocated, reserved) engine peaks at the last call, so that a rise is seen. From
        # the start when the pool exists already: a peak from before the logger is not one
        # of its steps. (A pool that does not exist yet is left alone: see the notes.)
        self._engine_peaks = None
        if _pool_in_use(self.device):
            raw = _core.stats(self.device)
            self._engine_peaks = (raw["allocated_bytes"][1], raw["reserved_bytes"][1])
        self._win_alloc = 0          # running maxima of this window
        self._win_res = 0
        self._win_rose = False       # the engine's allocated peak rose in this window
        self._win_res_rose = False
        # Over the whole run: the highest allocated and reserved, and the step of each.
        self.peak_allocated = 0
        self.peak_allocated_step = None
        self.peak_allocated_time = None
        self.peak_reserved = 0
        self.peak_reserved_step = None
        self._first_step = None
        self._last_step = None
        self._records = 0
        self._last_stats: dict | None = None
        self._t0 = time.time()
        self._closed = False
        # The thread that samples NVML and flushes; started at the first record. The lock
        # orders its flushes with the step path's writes (a TextIOWrapper is not
        # thread-safe); _dirty says a record was written since the last flush.
        self._lock = threading.Lock()
        self._dirty = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_on = False        # NVML figures apply (decided at the first record)
        if self._file is not None:
            _open_logs.add(self)

    # -- reading ------------------------------------------------------------------------

    def _stats(self):
        """The engine's raw statistics, or None while the pool does not exist."""
        if not self._in_use:
            if not _pool_in_use(self.device):
                return None
            self._in_use = True
        return _core.stats(self.device)

    def step(self, step_number: int | None = None, step_time: float | None = None,
             **extra) -> dict | None:
        """Call once per training step, after it. Returns the record when this call wrote
        one, else None. step_number defaults to a count of the calls; step_time (seconds)
        defaults to the mean time between calls over the record's window; extra fields
        (loss=..., lr=...) are added to the record as given."""
        if self._closed:
            raise ValueError("MemoryLogger.step() after close()")
        _check_step(step_number, step_time)
        now = time.perf_counter()
        self._calls += 1
        self._since += 1
        step = self._calls - 1 if step_number is None else step_number
        if self._first_step is None:
            self._first_step = step
        self._last_step = step
        raw = self._stats()
        if raw is not None:
            alloc, alloc_peak = raw["allocated_bytes"][0], raw["allocated_bytes"][1]
            res, res_peak = raw["reserved_bytes"][0], raw["reserved_bytes"][1]
            previous = self._engine_peaks
            # A peak that rose since the last call happened during this step: exact.
            if previous is None or alloc_peak > previous[0]:
                seen_alloc = alloc_peak
                self._win_rose = True
            else:
                seen_alloc = alloc
            if previous is None or res_peak > previous[1]:
                seen_res = res_peak
                self._win_res_rose = True
            else:
                seen_res = res
            self._engine_peaks = (alloc_peak, res_peak)
            if seen_alloc > self._win_alloc:
                self._win_alloc = seen_alloc
            if seen_res > self._win_res:
                self._win_res = seen_res
            if seen_alloc > self.peak_allocated:
                self.peak_allocated = seen_alloc
                self.peak_allocated_step = step
                self.peak_allocated_time = time.time()
            if seen_res > self.peak_reserved:
                self.peak_reserved = seen_res
                self.peak_reserved_step = step
        if self._t_window is None:
            self._t_window = self._t_last if self._t_last is not None else now
        self._t_last = now
        # The first call writes a record, then every `every`-th: step 0's memory (the model
        # loaded) is worth having, and the pattern is the same whatever every is.
        if (self._calls - 1) % self.every:
            return None
        return self._write(step, now, raw, step_time, extra)

    def _write(self, step, now, raw, step_time, extra) -> dict:
        if step_time is None and self._since and now > self._t_window:
            step_time = (now - self._t_window) / self._since
        if self._thread is None:
            self._start_thread(raw)
        used = mine = age = None
        if self._nvml_on:
            nv = self._nvml
            sample = nv.sample
            if sample is not None:
                used, mine, taken = sample
                if used is not None:
                    age = time.monotonic() - taken
            if nv.error is not None:
                message, nv.error = nv.error, None
                warnings.warn(message, RuntimeWarning, stacklevel=3)
        # Built in FIELDS order at once: the record is the dict written and returned.
        if raw is None:
            record = {"time": time.time(), "step": step, "device": self.device,
                      "allocated": 0, "reserved": 0, "peak_allocated": 0, "peak_reserved": 0,
                      "active": 0, "largest_free_block": 0, "fragmentation": 0.0,
                      "nvml_used": None, "nvml_process_used": None, "nvml_age_s": None,
                      "num_alloc_retries": 0, "num_ooms": 0, "step_time": step_time}
        else:
            record = {"time": time.time(), "step": step, "device": self.device,
                      "allocated": raw["allocated_bytes"][0],
                      "reserved": raw["reserved_bytes"][0],
                      "peak_allocated": self._win_alloc, "peak_reserved": self._win_res,
                      "active": raw["active_bytes"][0],
                      "largest_free_block": raw["largest_free_block"],
                      "fragmentation": raw["fragmentation"],
                      "nvml_used": used, "nvml_process_used": mine, "nvml_age_s": age,
                      "num_alloc_retries": raw["num_alloc_retries"],
                      "num_ooms": raw["num_ooms"], "step_time": step_time}
        if extra:
            for key in extra:
                if key in _FIELD_SET:
                    raise ValueError(f"MemoryLogger.step(): extra field {key!r} would replace "
                                     f"the record's own")
            record.update(extra)
        self._emit(record)
        self._records += 1
        self._last_stats = record
        if self.reset_peaks and raw is not None:
            _core.reset_peak_stats(self.device)
            after = _core.stats(self.device)
            self._engine_peaks = (after["allocated_bytes"][1], after["reserved_bytes"][1])
        # The next window starts from what is held now.
        if raw is not None:
            self._win_alloc = raw["allocated_bytes"][0]
            self._win_res = raw["reserved_bytes"][0]
        self._win_rose = self._win_res_rose = False
        self._since = 0
        self._t_window = now
        return record

    def _emit(self, record: dict) -> None:
        if self._callback is not None:
            self._callback(record)
            return
        assert self._file is not None
        if self._format == "jsonl":
            line = _json_line(record)
        else:
            if self._csv is None:
                self._csv_fields = list(record)
                self._csv_extra = self._csv_fields[len(FIELDS):]
                self._csv = csv.writer(self._file)
                with self._lock:
                    self._csv.writerow(self._csv_fields)
            if len(record) != len(self._csv_fields) or \
                    (self._csv_extra and list(record)[len(FIELDS):] != self._csv_extra):
                new = set(record) - set(self._csv_fields) - self._dropped
                if new:
                    self._dropped |= new
                    warnings.warn(f"vramkit.MemoryLogger: {self.path}: the CSV columns were "
                                  f"fixed by the first record; dropping the new fields "
                                  f"{', '.join(sorted(new))}", RuntimeWarning, stacklevel=4)
                row = [record.get(k, "") for k in self._csv_fields]
            else:
                row = record.values()
            try:
                line = ",".join([_CSV_CELL[type(v)](v) for v in row]) + "\r\n"
            except KeyError:  # a string or another type that may need quoting
                line = None
            if line is None:
                with self._lock:
                    self._csv.writerow(row)  # None is an empty cell, as csv.writer writes it
                    self._dirty = True
                return
        with self._lock:
            self._file.write(line)
            self._dirty = True

    # -- the thread: NVML samples and flushes off the step path ---------------------------

    def _start_thread(self, raw) -> None:
        """At the first record: take the first NVML sample here (so that the first record has
        figures), then start the thread that refreshes it and flushes the file."""
        self._nvml_on = (self._nvml is not None and raw is not None
                         and _nvml_applies(self.device))
        if self._nvml_on:
            self._nvml.refresh()
        if not self._nvml_on and self._file is None:
            self._thread = False  # nothing to do off the step path: no thread
            return
        # The thread holds the logger weakly: one dropped without close() ends it.
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop),
                                        name="vramkit-logger", daemon=True)
        self._thread.start()

    def _flush(self) -> None:
        with self._lock:
            if self._file is not None and not self._file.closed:
                self._dirty = False
                self._file.flush()

    # -- the end ------------------------------------------------------------------------

    def summary(self) -> str:
        """The one-screen summary close() prints: the peaks, when and at which step."""
        where = self.path or "a callback"
        lines = [f"vramkit memory log (device {self.device}): {counted(self._calls, 'step')}, "
                 f"{counted(self._records, 'record')} -> {where}"]
        if self._calls == 0:
            lines.append("  no steps were logged")
            return "\n".join(lines)
        if not self._in_use:
            lines.append("  the device's vramkit pool was never used: nothing allocated "
                         "through vramkit (is vramkit.torch installed?)")
            return "\n".join(lines)
        if self.peak_allocated_time is not None:
            elapsed = self.peak_allocated_time - self._t0
            clock = time.strftime("%H:%M:%S", time.localtime(self.peak_allocated_time))
            lines.append(f"  peak allocated {_size(self.peak_allocated)} "
                         f"({self.peak_allocated} bytes) during step {self.peak_allocated_step}"
                         f", at {clock} ({elapsed:.1f} s in)")
        lines.append(f"  peak reserved  {_size(self.peak_reserved)} ({self.peak_reserved} "
                     f"bytes) during step {self.peak_reserved_step}")
        raw = _core.stats(self.device)
        lines.append(f"  now: allocated {_size(raw['allocated_bytes'][0])}, reserved "
                     f"{_size(raw['reserved_bytes'][0])}, largest free block "
                     f"{_size(raw['largest_free_block'])}, fragmentation "
                     f"{raw['fragmentation']:.2f}")
        lines.append(f"  out of memory: {counted(raw['num_ooms'], 'OOM')}, "
                     f"{counted(raw['num_alloc_retries'], 'allocation')} retried after emptying "
                     f"the cache")
        if self._last_stats and self._last_stats.get("nvml_used") is not None:
            lines.append(f"  NVML at the last record: GPU used "
                         f"{_size(self._last_stats['nvml_used'])}, this process "
                         f"{_size(self._last_stats['nvml_process_used'] or 0)}")
        if self.path:
            lines.append(f"  draw it: vramkit plot {self.path} -o memory.html")
        return "\n".join(lines)

    def close(self) -> None:
        """Close the log and print the summary (once)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self._file is not None:
            _open_logs.discard(self)
            with self._lock:
                self._file.close()
        if self._summary_to is not False:
            out = self._summary_to if self._summary_to is not None else sys.stderr
            print(self.summary(), file=out, flush=True)

    def __enter__(self) -> "MemoryLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# A step number past a signed 64-bit count is no loop's; `vramkit plot` refuses it too.
_STEP_END = 1 << 63


def _check_step(step_number, step_time) -> None:
    """Refuse at the call a step or step time that the log could not be drawn with:
    `vramkit plot` needs each record's step to be a finite number, and a step time is a
    duration. numpy and torch scalars are numbers here, as the log writes them."""
    for name, value, what in (("step_number", step_number, "a finite number (an int)"),
                              ("step_time", step_time, "a finite number of seconds >= 0")):
        if value is None:
            continue
        number = None
        if not isinstance(value, (bool, str, bytes)):
            try:
                number = float(value)
            except OverflowError:  # an int past a float's range: a number, out of range
                number = math.inf
            except (TypeError, ValueError, RuntimeError):
                pass
        if number is None:
            quoted = f"'{shown(value)}'" if isinstance(value, str) else repr(value) \
                if isinstance(value, bool) else f"a {type(value).__name__}"
            raise TypeError(f"MemoryLogger.step(): {name} must be {what}, not {quoted}")
        if not -_STEP_END < number < _STEP_END or (name == "step_time" and not number >= 0):
            # NaN fails every comparison: refused too
            quoted = f"an int of {value.bit_length()} bits" if isinstance(value, int) and \
                value.bit_length() > 128 else repr(value)  # repr fails past 4300 digits
            raise ValueError(f"MemoryLogger.step(): {name} must be {what}, not {quoted}")


def _plain(value):
    """JSON for the extras users pass most: numpy and torch scalars, paths."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def _run(ref, stop: threading.Event) -> None:
    """The logger's thread: every SAMPLE_PERIOD, a fresh NVML sample and a flush of the
    records written since the last one."""
    while not stop.wait(SAMPLE_PERIOD):
        log = ref()
        if log is None:
            return
        if log._nvml_on and not log._nvml.off:
            log._nvml.refresh()
        if log._dirty:
            log._flush()
        del log


# File loggers not closed yet: interpreter exit flushes them (their threads are daemons,
# stopped without a last flush).
_open_logs: "weakref.WeakSet[MemoryLogger]" = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for log in list(_open_logs):
        log._stop.set()
        log._flush()


# Made once: json.dumps with any argument builds a new encoder at every call.
_JSON = json.JSONEncoder(default=_plain)


def _json_value(v) -> str:
    """v as json.dumps writes it, without the encoder's per-call setup for the common types."""
    if v is None:
        return "null"
    kind = type(v)
    if kind is int or (kind is float and v - v == 0.0):  # finite floats; NaN/inf: the encoder
        return repr(v)
    return _JSON.encode(v)


# The fixed part of a JSON line with its keys written once; the values the engine gives as
# ints go in as %d, the others through _json_value. Equal to json.dumps(record).
_JSON_HEAD = ('{"time": %s, "step": %s, "device": %d, "allocated": %d, "reserved": %d, '
              '"peak_allocated": %d, "peak_reserved": %d, "active": %d, '
              '"largest_free_block": %d, "fragmentation": %s, "nvml_used": %s, '
              '"nvml_process_used": %s, "nvml_age_s": %s, "num_alloc_retries": %d, '
              '"num_ooms": %d, "step_time": %s')


def _json_line(r: dict) -> str:
    v = _json_value
    head = _JSON_HEAD % (
        v(r["time"]), v(r["step"]), r["device"], r["allocated"], r["reserved"],
        r["peak_allocated"], r["peak_reserved"], r["active"], r["largest_free_block"],
        v(r["fragmentation"]), v(r["nvml_used"]), v(r["nvml_process_used"]),
        v(r["nvml_age_s"]), r["num_alloc_retries"], r["num_ooms"], v(r["step_time"]))
    if len(r) == len(FIELDS):
        return head + "}\n"
    # Extras are keyword arguments: str keys, escaped as json.dumps escapes them.
    key = _json_key
    return head + "".join([", " + key(k) + ": " + v(r[k]) for k in list(r)[len(FIELDS):]]) + \
        "}\n"


_json_key = json.encoder.encode_basestring_ascii


# CSV cells as csv.writer writes them for the types that never need quoting (floats by
# repr, None empty); any other type sends the row through csv.writer.
_CSV_CELL = {int: int.__repr__, float: float.__repr__, type(None): lambda v: ""}


def tqdm_postfix(device=None) -> dict[str, str]:
    """A short dict for tqdm's pbar.set_postfix(): allocated, reserved and peak allocated
    of the device, e.g. {"alloc": "1.20 GiB", "resv": "2.00 GiB", "peak": "1.80 GiB"}."""
    d = _device_index(device)
    if not _pool_in_use(d):
        return {"alloc": "0 B", "resv": "0 B", "peak": "0 B"}
    raw = _core.stats(d)
    return {"alloc": _size(raw["allocated_bytes"][0]), "resv": _size(raw["reserved_bytes"][0]),
            "peak": _size(raw["allocated_bytes"][1])}
