"""Memory history and snapshots, in the vocabulary and file format of PyTorch's.

The engine records each pool's events (alloc, frees, segments, OOMs...) into a ring and
describes its segments on demand; the extension hands both over as packed C records. This
module turns them into what ``torch.cuda.memory._snapshot()`` returns, so that
``torch.cuda._memory_viz``, https://pytorch.org/memory_viz and ``vramkit plot`` read
vramkit's pickle unchanged, and into the trace format ``vramkit replay`` reads.

Python stacks are captured by the extension as interned ids (no Python objects on the hot
path); they become ``{filename, line, name}`` frames here, once per distinct stack, with
vramkit's and the frameworks' own frames folded away so the innermost frame is the user's.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
import time
import warnings

from .. import _core

# The C records, as the extension copies them (include/vramkit.h).
_EVENT = struct.Struct("=6Q2i")    # time_us addr size requested stream context device kind
_SEGMENT = struct.Struct("=5Q2iQ")  # addr size stream first_block n_blocks device expandable
#                                    context
_BLOCK = struct.Struct("=4Q2i")    # addr size requested context state reserved_
if (_EVENT.size, _SEGMENT.size, _BLOCK.size) != (_core.EVENT_SIZE, _core.SEGMENT_SIZE,
                                                 _core.BLOCK_SIZE):
    raise ImportError("vramkit._core was built against another layout of the history "
                      "records; reinstall vramkit")

_ALLOC = _core.VRAM_EVENT_ALLOC
_FREE_REQUESTED = _core.VRAM_EVENT_FREE_REQUESTED
_SEGMENT_ALLOC = _core.VRAM_EVENT_SEGMENT_ALLOC
_OOM = _core.VRAM_EVENT_OOM
_SNAPSHOT = _core.VRAM_EVENT_SNAPSHOT
_ANNOTATE = _core.VRAM_EVENT_ANNOTATE
_EMPTY_CACHE = _core.VRAM_EVENT_EMPTY_CACHE
_GIVE_BACK = _core.VRAM_EVENT_GIVE_BACK

# PyTorch's action names. empty_cache has none: its effect is already in the trace as the
# segment_free entries it causes, so snapshot() leaves it out (memory_history() keeps it).
_ACTIONS = {
    _ALLOC: "alloc",
    _FREE_REQUESTED: "free_requested",
    _core.VRAM_EVENT_FREE_COMPLETED: "free_completed",
    _SEGMENT_ALLOC: "segment_alloc",
    _core.VRAM_EVENT_SEGMENT_FREE: "segment_free",
    _core.VRAM_EVENT_SEGMENT_MAP: "segment_map",
    _core.VRAM_EVENT_SEGMENT_UNMAP: "segment_unmap",
    _OOM: "oom",
    _SNAPSHOT: "snapshot",
    _ANNOTATE: "annotate",
}
_STATES = {
    _core.VRAM_SNAPSHOT_INACTIVE: "inactive",
    _core.VRAM_SNAPSHOT_ACTIVE_ALLOCATED: "active_allocated",
    _core.VRAM_SNAPSHOT_ACTIVE_PENDING_FREE: "active_pending_free",
}

DEFAULT_MAX_ENTRIES = 100_000
_ENABLED = ("all", "state")
_STACKS = ("python",)

# Annotation contexts live above every stack id (stack ids count up from 1).
_ANNOTATION_BIT = 1 << 62

# The engine stamps CLOCK_MONOTONIC microseconds (time.monotonic on Linux); PyTorch's
# time_us are Unix microseconds. One offset for the process keeps every file consistent.
_UNIX_OFFSET_US = time.time_ns() // 1000 - time.monotonic_ns() // 1000

_lock = threading.Lock()


class _Recording:
    """What record_memory_history() started on one device."""

    __slots__ = ("enabled", "stacks", "max_entries", "baseline", "on")

    def __init__(self, enabled, stacks, max_entries, baseline):
        self.enabled = enabled
        self.stacks = stacks
        self.max_entries = max_entries
        self.baseline = baseline  # blocks live when recording started, for save_trace
        self.on = True


_recordings: dict[int, _Recording] = {}
_annotations: dict[int, str] = {}  # annotation context -> its text
_frames_cache: dict[int, list] = {}  # stack id -> folded frames (ids are never reused)


def _pkg():
    # The package imports this module while it loads; by the time anything here runs, it
    # is complete, and its device and pool helpers are the ones to use.
    return sys.modules[__name__.partition(".")[0]]  # vramkit, above observe/


def _device(device) -> int:
    return _pkg()._device(device)


def _invalid(message: str):
    return _core.error(_core.VRAM_EINVAL, message)


def _devices_in_use() -> list[int]:
    pkg = _pkg()
    return [d for d in range(pkg._TRACKED_DEVICES) if pkg._pool_in_use(d)]


# ---------------------------------------------------------------------------------------
# Recording.
# ---------------------------------------------------------------------------------------

def check_recording_args(enabled, stacks, max_entries) -> None:
    """Refuse what record_memory_history() (a device's or a Pool's) cannot record."""
    if enabled is not None and not isinstance(enabled, str):
        raise TypeError(f"enabled must be 'all', 'state' or None, not "
                        f"{type(enabled).__name__}")
    if enabled is not None and enabled not in _ENABLED:
        raise _invalid(f"enabled must be 'all', 'state' or None, got {enabled!r}")
    if stacks is not None and not isinstance(stacks, str):
        raise TypeError(f"stacks must be 'python' or None, not {type(stacks).__name__}")
    if stacks is not None and stacks not in _STACKS:
        extra = " (vramkit captures Python frames only, not C++ ones)" if stacks == "all" \
            else ""
        raise _invalid(f"stacks must be 'python' or None, got {stacks!r}{extra}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int):
        raise TypeError(f"max_entries must be an int, not {type(max_entries).__name__}")
    if max_entries <= 0:
        raise _invalid(f"max_entries must be > 0, got {max_entries}")


def ring_size(enabled: str, max_entries: int) -> int:
    """The engine's ring for a recording: one entry for "state" (it needs no events, only
    the stacks the engine keeps on live blocks), else max_entries, at most the newest
    HISTORY_EVERY_EVENT: PyTorch's default asks for every event (sys.maxsize), and the
    engine reserves its ring whole at the start, as the PyTorch backend's recordings do."""
    return 1 if enabled == "state" else min(max_entries, _core.HISTORY_EVERY_EVENT)


def record_memory_history(enabled: str | None = "all", stacks: str | None = "python",
                          max_entries: int = DEFAULT_MAX_ENTRIES, device=None) -> None:
    """Start recording the pools' memory history, as torch.cuda.memory._record_memory_history.

    enabled: "all" records every event (the ``device_traces`` of snapshot()); "state" keeps
    only what a snapshot needs (the stack of each live block), as PyTorch's does; None stops
    recording (what was recorded stays readable until the next start). stacks: "python"
    attaches the Python stack of each allocation; None records none (cheaper). max_entries:
    the size of the ring of events, at most HISTORY_EVERY_EVENT (ring_size()); the oldest
    are overwritten beyond it, and snapshot() says so (``trace_alloc_overflowed``).
    device: one device, or None for every device in use (device 0 at least). Starting
    again clears what was recorded.
    """
    check_recording_args(enabled, stacks, max_entries)
    if device is None:
        devices = sorted(set(_devices_in_use()) | {0})
    else:
        devices = [_device(device)]
    with _lock:
        for d in devices:
            if enabled is None:
                rec = _recordings.get(d)
                if rec is not None and rec.on:
                    _core.history_stop(d)
                    rec.on = False
                continue
            ring = ring_size(enabled, max_entries)
            _core.history_start(d, ring, stacks is not None)
            # The blocks live now, so that a trace of this history replays from the true
            # starting state. The engine marks this snapshot in the ring (a snapshot event):
            # events before that mark are already counted in it.
            baseline = _live_blocks(d) if enabled == "all" else []
            _recordings[d] = _Recording(enabled, stacks, max_entries, baseline)


def _live_blocks(device: int) -> list[tuple]:
    """(addr, size, requested, context, stream) of each live block of the pool."""
    return live_blocks_of(*_core.snapshot(device))


def live_blocks_of(segs: bytes, raw: bytes) -> list[tuple]:
    """_live_blocks() of a pool's snapshot records."""
    blocks = list(_BLOCK.iter_unpack(raw))
    out = []
    for s in _SEGMENT.iter_unpack(segs):
        for b in blocks[s[3]:s[3] + s[4]]:
            if b[4] == _core.VRAM_SNAPSHOT_ACTIVE_ALLOCATED:
                out.append((b[0], b[1], b[2], b[3], s[2]))  # a block's stream is its segment's
    return out


def _recording(device: int, what: str) -> _Recording:
    rec = _recordings.get(device)
    if rec is None:
        raise _invalid(f"{what}: no memory history was recorded on device {device}; call "
                       f"vramkit.record_memory_history() first")
    return rec


def _full_recording(device: int, what: str) -> _Recording:
    """The device's recording, which must keep events (enabled='all')."""
    rec = _recording(device, what)
    if rec.enabled != "all":
        raise _invalid(f"{what}: device {device} records enabled='state', which keeps no "
                       f"events; record_memory_history(enabled='all') keeps them")
    return rec


def _read(device: int) -> tuple[list[tuple], int]:
    """(events oldest first, how many were overwritten)."""
    raw, dropped = _core.history_read(device)
    return list(_EVENT.iter_unpack(raw)), dropped


def annotate(name: str, device=None) -> None:
    """Record an ``annotate`` entry carrying name (its ``user_metadata``) in the history,
    to find a moment of the program in the timeline."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    d = _device(device)
    _recording(d, "annotate()")
    _core.history_annotate(d, _new_annotation(name))


def _new_annotation(name: str) -> int:
    with _lock:
        context = _ANNOTATION_BIT | (len(_annotations) + 1)
        _annotations[context] = name
    return context


# ---------------------------------------------------------------------------------------
# Frames.
# ---------------------------------------------------------------------------------------

def _folded_dirs() -> tuple[str, ...]:
    """Directories whose frames are the allocator's or a framework's, not the user's."""
    dirs = [os.path.dirname(os.path.abspath(_core.__file__))]
    for name in ("torch", "cupy", "numba", "cupy_backends"):
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None) if mod is not None else None
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)))
    return tuple(d + os.sep for d in dirs)


def _frames_of(ids) -> dict[int, list]:
    """Stack id -> frames [{filename, line, name}], innermost first, folded; [] for none."""
    wanted = [i for i in set(ids) if i and i < _ANNOTATION_BIT and i not in _frames_cache]
    if wanted:
        folded = _folded_dirs()
        for sid, frames in _core.stack_frames(wanted).items():
            mine = [f for f in frames if not os.path.abspath(f[0]).startswith(folded)]
            # A stack that is all framework keeps its frames: something beats nothing.
            kept = mine or list(frames)
            _frames_cache[sid] = [{"filename": f[0], "line": f[1], "name": f[2]}
                                  for f in kept]
    return {i: _frames_cache.get(i, []) for i in ids}


# ---------------------------------------------------------------------------------------
# Snapshot.
# ---------------------------------------------------------------------------------------

def _capture_reuse() -> bool:
    hooks = sys.modules.get("vramkit.plug.torch")
    return bool(hooks is not None and hooks.capture_reuse())


def _allocator_settings(sources, overflowed: bool, max_entries: int) -> dict:
    return {
        # PyTorch's keys, with what they mean under vramkit: no split limit, no garbage
        # collection threshold, expandable segments where the source maps virtual memory.
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": any(s in ("vmm", "sim:vmm") for s in sources),
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "graph_capture_record_stream_reuse": _capture_reuse(),
        "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
        "trace_alloc_max_entries": max_entries,
        "trace_alloc_overflowed": overflowed,
        "vramkit_version": _core.VERSION,
        "vramkit_source": ",".join(sources),
    }


def _trace_entry(e, frames_of, with_empty_cache=False):
    t, addr, size, requested, stream, context, device, kind = e
    if kind == _EMPTY_CACHE:
        action = "empty_cache" if with_empty_cache else None
    elif kind == _GIVE_BACK:
        # Not a PyTorch action either: its segment_free entries carry its effect.
        action = "give_back" if with_empty_cache else None
    else:
        action = _ACTIONS.get(kind)
    if action is None:
        return None
    entry = {"action": action}
    if kind == _OOM:
        entry["device_free"] = addr  # the engine puts the device's free bytes in addr
    elif kind == _GIVE_BACK:
        entry["to_pid"] = addr  # the engine puts the asking process's pid in addr
    else:
        entry["addr"] = addr
    entry.update(size=size, stream=stream, time_us=t + _UNIX_OFFSET_US,
                 frames=frames_of.get(context, []) if kind != _ANNOTATE else [],
                 compile_context="N/A",
                 user_metadata=_annotations.get(context, "") if kind == _ANNOTATE else "")
    return entry


def snapshot(device=None) -> dict:
    """The dict of torch.cuda.memory._snapshot(): ``segments`` (each with the ``blocks``
    that tile it), ``device_traces`` (one list per device, the recorded events as trace
    entries; empty unless record_memory_history(enabled="all") ran), ``allocator_settings``
    (with ``trace_alloc_max_entries`` and ``trace_alloc_overflowed``) and
    ``external_annotations``. device: one device (which must have been used), or None for
    every device in use. Works without recording too: blocks then have no frames."""
    if device is None:
        devices = _devices_in_use()
    else:
        d = _device(device)
        if not _pkg()._pool_in_use(d):
            raise _invalid(f"device={device!r}: nothing was ever allocated on device {d} in "
                           f"this process, so there is no pool to snapshot (device=None "
                           f"covers every device in use)")
        devices = [d]
    raw = {}
    for d in devices:
        segs, blocks = _core.snapshot(d)
        rec = _recordings.get(d)
        raw[d] = raw_records(segs, blocks, _core.history_read(d)
                             if rec is not None and rec.enabled == "all" else None)
    return assemble_snapshot(raw, _recordings, sorted({_pkg().source(d) for d in devices}))


def raw_records(segs: bytes, blocks: bytes, history) -> tuple:
    """(segments, blocks, events, dropped) unpacked from a pool's records (history: what
    history_read gave, or None when the pool keeps no events)."""
    events, dropped = ([], 0) if history is None else \
        (list(_EVENT.iter_unpack(history[0])), history[1])
    return (list(_SEGMENT.iter_unpack(segs)), list(_BLOCK.iter_unpack(blocks)), events,
            dropped)


def assemble_snapshot(raw: dict, recordings: dict, sources: list) -> dict:
    """snapshot()'s dict of {device: raw_records(...)}, with each device's recording."""
    ids = [b[3] for _, blocks, _, _ in raw.values() for b in blocks]
    ids += [e[5] for _, _, events, _ in raw.values() for e in events]
    ids += [s[7] for segs, _, _, _ in raw.values() for s in segs]
    frames_of = _frames_of(ids)

    segments, traces, overflowed, max_entries = [], [], False, 0
    for d, (segs, blocks, events, dropped) in raw.items():
        rec = recordings.get(d)
        if rec is not None:
            max_entries = max(max_entries, rec.max_entries if rec.enabled == "all" else 0)
            overflowed = overflowed or dropped > 0
        segments += [_segment(s, blocks, frames_of) for s in segs]
        while len(traces) <= d:
            traces.append([])
        entries = traces[d]
        for e in events:
            entry = _trace_entry(e, frames_of)
            if entry is None:
                continue
            if entry["action"] == "snapshot" and entries and \
                    entries[-1]["action"] == "snapshot":
                continue  # one snapshot() that had to ask the engine twice
            entries.append(entry)
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": _allocator_settings(sources, overflowed, max_entries),
        "external_annotations": [],
    }


def _segment(s, blocks, frames_of) -> dict:
    addr, size, stream, first, count, device, expandable, made_by = s
    out_blocks = []
    allocated = active = requested_total = 0
    for b in blocks[first:first + count]:
        b_addr, b_size, requested, context, state, _ = b
        name = _STATES.get(state, "inactive")
        if name == "active_allocated":
            allocated += b_size
        if name != "inactive":
            active += b_size
            requested_total += requested
        out_blocks.append({
            "address": b_addr,
            "size": b_size,
            # PyTorch gives an inactive block its size as requested; segsum counts only
            # active ones, and a requested size above the size would break its sums.
            "requested_size": requested if name != "inactive" else b_size,
            "state": name,
            "frames": frames_of.get(context, []) if name != "inactive" else [],
        })
    return {
        "device": device,
        "address": addr,
        "total_size": size,
        "allocated_size": allocated,
        "active_size": active,
        "requested_size": requested_total,
        "stream": stream,
        "segment_type": "large" if size > (1 << 20) else "small",
        "segment_pool_id": (0, 0),
        "is_expandable": bool(expandable),
        "frames": frames_of.get(made_by, []),  # those of the allocation that made it
        "blocks": out_blocks,
    }


def dump_snapshot(path="dump_snapshot.pickle", device=None) -> None:
    """Write snapshot() to path as a pickle of protocol 4, the newest one PyTorch's viewer
    reads (Python 3.14 would write 5 by default)."""
    data = snapshot(device)
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=4)


def memory_history(device=None) -> list[dict]:
    """The device's recorded events as trace entries (snapshot()'s device_traces[device]),
    with the ``empty_cache`` entries PyTorch has no action for kept in."""
    d = _device(device)
    _full_recording(d, "memory_history()")
    return trace_entries(_core.history_read(d)[0])


def trace_entries(raw: bytes) -> list[dict]:
    """memory_history()'s entries of a pool's recorded events (history_read's bytes)."""
    events = list(_EVENT.iter_unpack(raw))
    frames_of = _frames_of([e[5] for e in events])
    out = []
    for e in events:
        entry = _trace_entry(e, frames_of, with_empty_cache=True)
        if entry is not None:
            out.append(entry)
    return out


# ---------------------------------------------------------------------------------------
# Trace for `vramkit replay`.
# ---------------------------------------------------------------------------------------

def save_trace(path, device=None) -> int:
    """Write the device's recorded history as a vramkit trace (format v1: gzip text,
    ``a ID SIZE STREAM T_US`` and ``f ID STREAM T_US``), which ``vramkit replay`` reads.
    The blocks live when recording started come first, so the replay starts where the
    program did and its peak live bytes equal the peak allocated bytes of the recording.
    Sizes are block sizes (what memory_allocated() counts). Returns the number of ops."""
    d = _device(device)
    rec = _full_recording(d, "save_trace()")
    events, dropped = _read(d)
    ops = recorded_ops(events, dropped, rec.baseline, f"device {d}")
    return write_trace(path, ops, f"recorded by vramkit.save_trace on device {d} "
                                  f"({_pkg().source(d)} source)")


def recorded_ops(events: list[tuple], dropped: int, baseline: list[tuple],
                 whose: str) -> list[tuple]:
    """The trace ops of a recording: the blocks live at its start (baseline), then its
    allocations and frees; `whose` names the recording in the warning of an overflow."""
    # Events before the engine's mark of the baseline snapshot are counted in it already.
    start = 0
    if dropped == 0:
        for i, e in enumerate(events):
            if e[7] == _SNAPSHOT:
                start = i + 1
                break
    else:
        warnings.warn(f"save_trace(): the history of {whose} overflowed ({dropped} "
                      f"oldest events overwritten; raise max_entries): the trace starts "
                      f"mid-way and its peak may differ from the program's", stacklevel=3)
    t0 = events[start][0] if start < len(events) else time.monotonic_ns() // 1000
    live: dict[int, int] = {}
    next_id = 0
    ops = []
    if dropped == 0:
        for b in baseline:
            live[b[0]] = next_id
            ops.append(("a", next_id, b[1], b[4], t0 + _UNIX_OFFSET_US))
            next_id += 1
    for e in events[start:]:
        kind = e[7]
        if kind == _ALLOC:
            live[e[1]] = next_id
            ops.append(("a", next_id, e[2], e[4], e[0] + _UNIX_OFFSET_US))
            next_id += 1
        elif kind == _FREE_REQUESTED:
            block = live.pop(e[1], None)
            if block is not None:  # a block from before an overflow: nothing to free
                ops.append(("f", block, e[4], e[0] + _UNIX_OFFSET_US))
    return ops


def write_trace(path, ops, header: str) -> int:
    """Write ``ops`` as a vramkit trace (format v1: gzip text, a ``# vramkit-trace v1``
    line carrying ``header``, then ``a ID SIZE STREAM T_US`` for ("a", id, size, stream,
    t_us) and ``f ID STREAM T_US`` for ("f", id, stream, t_us)) through the library's
    trace writer, so the file is one ``vramkit replay`` reads back. An op the reader would
    refuse is an InvalidArgumentError (a ValueError), a tuple of the wrong kind a
    TypeError, a failed write an OSError; each leaves no file. Returns the ops written."""
    return _core.trace_write(os.fspath(path), ops, header)
