"""What a picture is drawn from: the blocks of one device over time, its reserved memory,
its out-of-memory points and its segments, built from a trace or from a snapshot.

Both inputs become the same History, so the layout and the renderers never look at file
formats. Whatever cannot be drawn faithfully is not dropped quietly: it goes into
History.notes, which the command prints on stderr and the page shows above the picture.
Times are microseconds from the first event.
"""

from __future__ import annotations

from ._read import PlotInputError
from ._snapshot import check

PRE_HISTORY_SITE = "(allocated before the history began)"


class Block:
    """One allocation: its size, when it lived (end None: still live at the end), the
    stream, the call site as "file:line:function" ("" when the input records none) and,
    from a snapshot, the address and requested size."""

    __slots__ = ("size", "start", "end", "stream", "site", "addr", "requested")

    def __init__(self, size, start, stream, site="", addr=None, requested=None):
        self.size = size
        self.start = start
        self.end = None
        self.stream = stream
        self.site = site
        self.addr = addr
        self.requested = requested


class History:
    """Blocks in allocation order (oldest first) and the events that made them, in order:
    (time, block, is_alloc). reserved: [(time, bytes)] steps, or None with reserved_note
    saying why it is unknown. segments: the segments view, or None with segments_note."""

    def __init__(self, path, kind):
        self.path = path
        self.kind = kind
        self.device = None
        self.blocks: list[Block] = []
        self.events: list[tuple[float, Block, bool]] = []
        self.end_time = 1.0
        self.time_unit = "µs"
        self.reserved: list[tuple[float, int]] | None = None
        self.reserved_note = ""
        self.ooms: list[tuple[float, str]] = []
        self.segments: list[dict] | None = None
        self.segments_note = ""
        self.notes: list[str] = []
        self.peak_allocated = 0
        # Peaks the input states beside its series (a log's peak_allocated and peak_reserved,
        # highs reached between two records): the page's peaks are never read below them.
        self.stated_peak_allocated = 0
        self.stated_peak_reserved = 0
        self.last_time = 0.0     # the last entry of any kind, so the axis covers it too

    def finish(self):
        """Peak allocated and the end of the time axis, from the events."""
        live = peak = 0
        last = 0.0
        for t, block, is_alloc in self.events:
            live += block.size if is_alloc else -block.size
            if live > peak:
                peak = live
            last = t
        for t, _ in self.ooms:
            last = max(last, t)
        for t, _ in self.reserved or ():
            last = max(last, t)
        self.peak_allocated = max(peak, self.stated_peak_allocated)
        self.end_time = max(last, self.last_time, 1.0)
        return self


def from_trace(path, ops, unmatched):
    """A History from parsed trace ops (see _read.parse_trace)."""
    h = History(path, "trace")
    t0 = ops[0][4] if ops else 0
    live = {}
    blocks = h.blocks
    events = h.events
    for is_alloc, ident, size, stream, t in ops:
        t -= t0
        if is_alloc:
            block = Block(size, t, stream)
            live[ident] = block
            blocks.append(block)
        else:
            block = live.pop(ident)
            block.end = t
        events.append((t, block, is_alloc))
    if unmatched:
        h.notes.append(f"{unmatched} free lines of IDs not live then were skipped (blocks "
                       f"allocated before the trace began, or freed twice; a trace gives "
                       f"no size for them): memory below may be undercounted by such "
                       f"blocks")
    h.segments_note = "a trace records no segments: this view needs a snapshot"
    return h


# ---- snapshots -------------------------------------------------------------------------

_KNOWN_ACTIONS = {"alloc", "free_requested", "free_completed", "free", "segment_alloc",
                  "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
                  "annotate"}
_INTERNAL_PARTS = ("/torch/", "/vramkit/", "/site-packages/torch", "torch/csrc/")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def call_site(frames):
    """The first frame that is not PyTorch's or vramkit's own (nor an unsymbolized C++
    frame), as "file:line:function"; the innermost frame when every one is internal."""
    if not isinstance(frames, (list, tuple)):
        return ""
    first = ""
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        # Only a str or an int: str() of a list that repeats itself by reference is as
        # long as its expansion.
        filename, line, name = (frame.get(k) for k in ("filename", "line", "name"))
        filename = filename if isinstance(filename, str) else "??"
        text = (f"{filename}:{line if isinstance(line, int) else '?'}:"
                f"{name if isinstance(name, str) else '?'}")
        if not first:
            first = text
        normal = filename.replace("\\", "/")
        if filename in ("??", "") or any(part in normal for part in _INTERNAL_PARTS) \
                or normal.startswith(("torch/", "vramkit/")):
            continue
        return text
    return first


class SiteCache:
    """call_site of each frame list, worked out once per list: the blocks of a snapshot
    share lists (vramkit gives those of one stack the same one, and a crafted pickle can
    make every block share one long list). Valid while the snapshot is alive."""

    def __init__(self):
        self._sites: dict[int, str] = {}

    def __call__(self, frames) -> str:
        if not isinstance(frames, (list, tuple)):
            return ""
        site = self._sites.get(id(frames))
        if site is None:
            site = self._sites[id(frames)] = call_site(frames)
        return site


def _overflowed(snapshot, device):
    flag = snapshot.get("trace_alloc_overflowed")
    if isinstance(flag, (list, tuple)):
        return device < len(flag) and bool(flag[device])
    if isinstance(flag, dict):
        return bool(flag.get(device))
    return bool(flag)


def from_snapshot(path, snapshot, device=None):
    """A History of one device (the given one, else the one with the most trace entries)
    from a snapshot dict in the format of torch.cuda.memory._snapshot()."""
    check(path, snapshot)
    segments = snapshot["segments"]
    traces = snapshot.get("device_traces", [])
    if device is None:
        counts = [len(t) if isinstance(t, (list, tuple)) else 0 for t in traces]
        if counts and max(counts) > 0:
            device = counts.index(max(counts))
        else:
            devices = [s.get("device") for s in segments if isinstance(s, dict)]
            device = next((d for d in devices if _is_int(d)), 0)
    elif traces and device >= len(traces):
        raise PlotInputError(f"{path}: no device {device}: the snapshot has traces for "
                             f"{len(traces)} device(s)")
    h = History(path, "snapshot")
    h.device = device
    entries = traces[device] if device < len(traces) else []
    sites = SiteCache()
    seg_view, seg_reserved, seg_active = _segments(h, segments, device, sites)
    _trace_entries(h, entries, seg_reserved, seg_active, sites)
    if _overflowed(snapshot, device):
        h.notes.insert(0, "the history overflowed (trace_alloc_overflowed): its oldest "
                          "entries were lost, so the timeline starts part-way and blocks "
                          "allocated before that are drawn without their call sites")
    return h


def _segments(h, segments, device, sites):
    """The segments view of the device, its reserved and active bytes at snapshot time."""
    view = []
    reserved = active = 0
    bad = 0
    for number, seg in enumerate(segments):
        if not isinstance(seg, dict) or not _is_int(seg.get("total_size")) \
                or not isinstance(seg.get("blocks", []), (list, tuple)):
            bad += 1
            continue
        if seg.get("device", 0) != device:
            continue
        base = seg.get("address") if _is_int(seg.get("address")) else None
        blocks = []
        offset = 0
        for b in seg.get("blocks", []):
            if not isinstance(b, dict) or not _is_int(b.get("size")) or b["size"] < 0:
                bad += 1
                continue
            state = str(b.get("state", "?"))
            addr = b.get("address")
            if base is not None and _is_int(addr):
                offset = addr - base
            requested = b.get("requested_size")
            blocks.append((offset, b["size"], requested if _is_int(requested) else None,
                           state, sites(b.get("frames"))))
            if state.startswith("active"):
                active += b["size"]
            offset += b["size"]
        if offset != seg["total_size"] and blocks:
            h.notes.append(f"segment {number} ({_hex(base)}): its blocks cover {offset} of "
                           f"{seg['total_size']} bytes")
        reserved += seg["total_size"]
        view.append({"address": base, "size": seg["total_size"],
                     "stream": seg.get("stream", 0) if _is_int(seg.get("stream")) else 0,
                     "type": str(seg.get("segment_type", "")), "blocks": blocks})
    if bad:
        h.notes.append(f"{bad} malformed segments or blocks were skipped in the segments view")
    view.sort(key=lambda s: (s["address"] is None, s["address"] or 0))
    h.segments = view
    if not view:
        h.segments_note = f"the snapshot holds no segments for device {device}"
    return view, reserved, active


def _hex(address):
    return "?" if address is None else f"0x{address:x}"


class _TraceWalk:
    """What walking a snapshot's trace entries in order finds: the blocks (those freed but
    allocated before the history apart), the alloc and free events, the reserved bytes at
    each segment event, and the counts of what could not be drawn."""

    def __init__(self):
        self.live = {}
        self.pre = []          # blocks freed in the history but allocated before it
        self.regular = []
        self.events = []
        self.reserved_steps = []
        self.reserved = 0
        self.unknown: dict[str, int] = {}
        self.malformed = []
        self.unmatched_no_size = 0
        self.realloc = 0

    def alloc(self, t, e, addr, size, sites):
        if addr in self.live:
            self.realloc += 1
            old = self.live[addr]
            old.end = t
            self.events.append((t, old, False))
        block = Block(size, t, e.get("stream", 0), sites(e.get("frames")), addr,
                      e.get("requested_size"))
        self.live[addr] = block
        self.regular.append(block)
        self.events.append((t, block, True))

    def free(self, t, e, addr, size):
        block = self.live.pop(addr, None)
        if block is None:
            if size == 0:
                self.unmatched_no_size += 1
                return
            block = Block(size, 0.0, e.get("stream", 0), PRE_HISTORY_SITE, addr)
            self.pre.append(block)
        block.end = t
        self.events.append((t, block, False))


def _time_axis(h, entries) -> tuple[bool, float]:
    """(whether every entry drawn has time_us, the time the axis starts at). Malformed
    entries are skipped (and counted) by the walk: they say nothing of the recorder."""
    drawn = [e for e in entries if isinstance(e, dict) and isinstance(e.get("action"), str)]
    have_time = all(isinstance(e.get("time_us"), (int, float))
                    and not isinstance(e.get("time_us"), bool) for e in drawn)
    # From the earliest, not the first: an entry out of order must not fall before the axis.
    t0 = min(e["time_us"] for e in drawn) if drawn and have_time else 0
    if drawn and not have_time:
        h.time_unit = "entries"
        h.notes.append("the history has no time_us on every entry (PyTorch before 2.2): "
                       "the time axis counts entries")
    return have_time, t0


def _walk_trace(h, entries, sites) -> _TraceWalk:
    walk = _TraceWalk()
    have_time, t0 = _time_axis(h, entries)
    for number, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("action"), str):
            walk.malformed.append(number)
            continue
        action = e["action"]
        if action not in _KNOWN_ACTIONS:
            walk.unknown[action] = walk.unknown.get(action, 0) + 1
            continue
        t = (e["time_us"] - t0) if have_time else number
        h.last_time = max(h.last_time, t)
        if action in ("snapshot", "annotate"):
            continue
        size = e.get("size", 0)
        if action == "oom":
            free = e.get("device_free")
            h.ooms.append((t, f"out of memory: {size if _is_int(size) else '?'} bytes asked "
                              f"on stream {e.get('stream', '?')}, "
                              f"{free if _is_int(free) else '?'} bytes free on the device"))
            continue
        addr = e.get("addr")
        if not _is_int(addr) or not _is_int(size) or size < 0:
            walk.malformed.append(number)
            continue
        if action.startswith("segment_"):
            walk.reserved += size if action in ("segment_alloc", "segment_map") else -size
            walk.reserved_steps.append((t, walk.reserved))
        elif action == "alloc":
            walk.alloc(t, e, addr, size, sites)
        elif action == "free_requested":
            # Its free_completed follows; a block not live is counted there.
            continue
        else:  # free_completed, or the legacy "free"
            walk.free(t, e, addr, size)
    return walk


def _skipped_notes(h, walk: _TraceWalk) -> None:
    if walk.pre:
        h.notes.append(f"{len(walk.pre)} blocks ({sum(b.size for b in walk.pre)} bytes) were "
                       f"allocated before the history began: drawn from its start, call site "
                       f"unknown")
    if walk.unknown:
        listed = ", ".join(f"'{a[:30]}' ({n})" for a, n in sorted(walk.unknown.items()))
        h.notes.append(f"skipped entries with an unknown action: {listed}")
    if walk.malformed:
        h.notes.append(f"skipped {len(walk.malformed)} malformed trace entries (the first: "
                       f"entry {walk.malformed[0]})")
    if walk.unmatched_no_size:
        h.notes.append(f"skipped {walk.unmatched_no_size} frees of blocks never allocated in "
                       f"the history and of unknown size")
    if walk.realloc:
        h.notes.append(f"{walk.realloc} allocations reused an address never freed in the "
                       f"history: the earlier block is ended there")


def _trace_entries(h, entries, seg_reserved, seg_active, sites):
    walk = _walk_trace(h, entries, sites)
    # Bytes still allocated at snapshot time that no alloc entry accounts for: blocks that
    # predate the history and outlive it, drawn as one band from the start.
    live_end = sum(b.size for b in walk.live.values())
    baseline = seg_active - live_end
    if h.segments and baseline > 0:
        block = Block(baseline, 0.0, 0, PRE_HISTORY_SITE + ", still allocated at the end")
        walk.pre.insert(0, block)
    h.blocks = walk.pre + walk.regular
    h.events = [(0.0, b, True) for b in walk.pre] + walk.events
    _skipped_notes(h, walk)
    if walk.reserved_steps or h.segments:
        start = seg_reserved - walk.reserved if h.segments else 0
        if start < 0:
            h.notes.append(f"the segment events free {-start} bytes more than the snapshot's "
                           f"segments and the history account for: reserved is drawn from 0")
            start = 0
        h.reserved = [(0.0, start)] + [(t, start + r) for t, r in walk.reserved_steps]
    else:
        h.reserved_note = "no segment events and no segments: reserved memory is unknown"
    h.finish()
