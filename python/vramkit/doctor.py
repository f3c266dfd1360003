"""The OOM doctor: why an allocation failed, in one screen, with numbers, and the fixes
ranked by what each is predicted to gain.

``vramkit.diagnose(source)`` reads what an out-of-memory failure leaves behind and names
one of four causes:

- ``live``: live memory plus the request is more than the cap (the limit, else the
  device): packed perfectly and with the GPU to itself the pool still could not serve it.
  The largest live call sites come from the snapshot's block frames where it has them, the
  parameter count from ``model=`` where given (the first thing to check: what the weights,
  their gradients and the optimizer's state take before any activation).
- ``fragmentation``: the memory is there (cached free, plus what the pool may still
  reserve) but no free block is large enough; the ``vmm`` source maps memory where it is
  needed, and a trace says what it would gain by replaying on ``sim:vmm``.
- ``others``: live memory and the request would fit the device, but other processes hold
  the difference (NVML's and the published records' pids, from the report).
- ``limit``: a limit or memory fraction refused it while the device had room.

The C engine chooses the cause when it writes the report (the ``cause:`` line of
``src/obs/stats.c``); this module reads that line where there is one and applies the same
rules itself to a snapshot or a trace. The source may be:

- a ``vramkit.OutOfMemoryError`` (or any exception carrying vramkit's report, as
  ``torch.OutOfMemoryError`` does under vramkit.torch), or the report text itself;
- a snapshot pickle, vramkit's (``vramkit.dump_snapshot``) or PyTorch's
  (``torch.cuda.memory._dump_snapshot``): segments with their blocks, and ``device_traces``
  whose ``oom`` entries carry the request's size and ``device_free``; a snapshot does not
  say the device's capacity, so ``capacity=`` gives it;
- a vramkit trace (format v1, what ``vramkit replay`` reads): with ``capacity=`` it is
  replayed under that cap by the packaged C command on the default settings (``sim``, the
  cuda source's model, large blocks in virtual ranges), on fixed segments alone
  (``VRAMKIT_LARGE_BLOCKS=fixed VRAMKIT_VIRTUAL_THRESHOLD=1``), on ``sim:vmm``, with large
  blocks mapped granule by granule from the start (``VRAMKIT_VIRTUAL_THRESHOLD=0``) and
  with tight fixed segments (``VRAMKIT_LARGE_BLOCKS=fixed VRAMKIT_TIGHT_THRESHOLD=0``),
  each with ``--min-capacity``, so that each fix's effect is a measured number rather
  than a guess.

``vramkit doctor SNAPSHOT_OR_TRACE [--capacity SIZE] [--json]`` prints the same after the
fact (:func:`main`).
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

__all__ = ["CAUSES", "Diagnosis", "DoctorInputError", "Fix", "LIVE_VARIANTS", "diagnose", "main"]

CAUSES = ("live", "fragmentation", "others", "limit")

# The variants an estimate_fn is asked about for a `live` cause, with the fix each stands
# for. "baseline" is asked first: the saving of a variant is baseline minus its estimate.
LIVE_VARIANTS = (
    ("half_batch", "halve the batch size (or accumulate gradients over two half batches)"),
    ("bf16_autocast", "bf16 autocast: torch.autocast('cuda', dtype=torch.bfloat16) around "
                      "the forward pass"),
    ("checkpointing", "activation checkpointing (torch.utils.checkpoint) on the largest "
                      "blocks: recompute activations in backward instead of keeping them"),
)

# Fixed-segment sources round segments up to this (the driver's and sim's granule).
_GRANULE = 2 << 20

USAGE = """usage: vramkit doctor SNAPSHOT_OR_TRACE [--capacity SIZE] [--json]

Say why an allocation ran out of memory, in one screen: live memory over the cap,
fragmentation, other processes holding the GPU, or a limit set too low; with the numbers,
and the fixes ranked by predicted effect.

SNAPSHOT_OR_TRACE is a memory snapshot pickle (vramkit.dump_snapshot or PyTorch's
torch.cuda.memory._dump_snapshot, recorded with the OOM in its trace), a vramkit trace
(format v1, as vramkit replay reads), or a saved OOM report.

  --capacity SIZE  a trace: replay it under this cap (on the default settings, on fixed
                   segments alone, on sim:vmm, and with VRAMKIT_VIRTUAL_THRESHOLD=0 and
                   VRAMKIT_TIGHT_THRESHOLD=0) to find the cause and what each fix gains;
                   a snapshot: the device's capacity, which a snapshot does not record
  --json           one JSON document instead of the text

SIZE takes K/M/G/T suffixes.
exit status (the table of vramkit --help): 0 diagnosed, 2 the file cannot be read or is
not a snapshot, trace or report, 3 bad arguments, 4 the C command is missing"""


class DoctorInputError(Exception):
    """What was given cannot be diagnosed: a missing or corrupt file, or something that is
    neither a report, a snapshot nor a trace. The message names it and says why."""


class Fix(NamedTuple):
    """One remedy: what to do, and the bytes it is predicted to gain (None: no number
    can be predicted from what was given)."""

    text: str
    effect: int | None


@dataclass
class Diagnosis:
    """The doctor's answer. cause is one of CAUSES, or None when nothing failed (a trace
    that fits its capacity, a snapshot without an OOM). numbers holds the figures the cause
    was chosen from, in bytes (keys such as requested, allocated, reserved, cached_free,
    largest_free_block, device_total, device_free, limit, peak_live, capacity); fixes are
    ranked by predicted effect, those without a prediction last."""

    cause: str | None
    summary: str
    origin: str
    numbers: dict = field(default_factory=dict)
    fixes: list[Fix] = field(default_factory=list)
    call_sites: list[tuple[str, int]] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The diagnosis as plain data (what `vramkit doctor --json` prints)."""
        return {
            "cause": self.cause,
            "summary": self.summary,
            "origin": self.origin,
            "numbers": dict(self.numbers),
            "fixes": [{"text": f.text, "effect_bytes": f.effect} for f in self.fixes],
            "call_sites": [{"site": s, "bytes": b} for s, b in self.call_sites],
            "processes": [dict(p) for p in self.processes],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        width = 100
        n = self.numbers
        lines = [f"vramkit doctor: {self.origin}"]
        lines += textwrap.wrap(f"cause: {self.cause or 'none'}: {self.summary}", width,
                               subsequent_indent="  ")
        # Three rows of figures: the pool at the failure, a trace's replays, the device.
        rows = ((("asked", "requested"), ("allocated", "allocated"), ("reserved", "reserved"),
                 ("cached free", "cached_free"), ("largest free block", "largest_free_block")),
                (("peak live", "peak_live"), ("capacity", "capacity"),
                 ("needs on fixed segments", "min_capacity_fixed"),
                 ("with vmm", "min_capacity_vmm")),
                (("device", "device_total"), ("free on device", "device_free"),
                 ("limit", "limit")))
        for row in rows:
            # A limit the report names as "none" is a figure too; other Nones are unknowns.
            shown = [f"{name} {_size(n[key])}" for name, key in row
                     if key in n and (n[key] is not None or key == "limit")]
            if shown:
                lines.append("  " + ", ".join(shown))
        if "parameters" in n:
            stored = n["parameter_bytes"]
            lines.append(f"  parameters {n['parameters'] / 1e6:.1f} M, {_size(stored)} as "
                         f"stored; weights, gradients and two Adam moments: about "
                         f"{_size(4 * stored)}")
        if self.call_sites:
            lines.append("largest live call sites:")
            lines += [f"  {_size(b):>10}  {s}" for s, b in self.call_sites[:5]]
        if self.processes:
            lines.append("other processes on the GPU:")
            for p in self.processes[:5]:
                held = _size(p.get("bytes")) if p.get("bytes") is not None else "?"
                name = f" ({p['name']})" if p.get("name") else ""
                lines.append(f"  {held:>10}  pid {p['pid']}{name}")
        if self.fixes:
            lines.append("fixes, by predicted effect:")
            for i, fix in enumerate(self.fixes, 1):
                gain = f" [{_size(fix.effect)}]" if fix.effect is not None else ""
                lines += textwrap.wrap(f"{i}. {fix.text}{gain}", width, initial_indent="  ",
                                       subsequent_indent="     ")
        for note in self.notes[:3]:
            lines += textwrap.wrap(f"note: {note}", width, subsequent_indent="  ")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Sizes.
# ---------------------------------------------------------------------------------------
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_SIZE = r"(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB|PiB|EiB)"


def _size(value) -> str:
    """Bytes with one decimal, as the C report's headline writes them."""
    if value is None:
        return "none"
    v, unit = float(abs(value)), 0
    while v >= 1024 and unit < len(_UNITS) - 1:
        v /= 1024
        unit += 1
    sign = "-" if value < 0 else ""
    return f"{sign}{v:.1f} {_UNITS[unit]}" if unit else f"{sign}{int(v)} B"


def _bytes_of(number: str, unit: str) -> int:
    return int(round(float(number) * 1024 ** _UNITS.index(unit)))


# ---------------------------------------------------------------------------------------
# The rules, as the C report applies them (src/obs/stats.c, classify_oom).
# ---------------------------------------------------------------------------------------

def _classify(requested: int, allocated: int, reserved: int, device_free: int,
              device_total: int | None, limit: int | None) -> str:
    """The cause of a failed request, by the C report's precedence: fragmentation (all of
    it fits, only placement failed: costs no memory to fix), limit (the user's setting is
    the only thing in the way), live (more than the device, or than the limit with no room
    on the device either), others (it would fit the device, other processes hold the
    rest). device_total None (a snapshot without capacity=): other processes cannot be
    told from live memory, so the answer is live and the caller says why in a note."""
    needed = allocated + requested
    under_limit = not limit or needed <= limit
    device_has_room = needed <= reserved + device_free
    if under_limit and device_has_room:
        return "fragmentation"
    if not under_limit:
        return "limit" if device_has_room else "live"
    if device_total is None:
        return "live"
    return "others" if needed <= device_total else "live"


def _rank(fixes: list[Fix]) -> list[Fix]:
    """Largest predicted effect first; fixes without a prediction after, in given order."""
    return sorted(fixes, key=lambda f: (f.effect is None, -(f.effect or 0)))


def _live_fixes(shortfall: int | None, estimate_fn, notes: list[str]) -> list[Fix]:
    """The remedies for live memory over the cap, each with the saving estimate_fn predicts
    (its estimate of "baseline" less that of the variant) when one is given."""
    savings: dict[str, int | None] = {name: None for name, _ in LIVE_VARIANTS}
    if estimate_fn is not None:
        try:
            baseline = int(estimate_fn("baseline"))
        except Exception as error:  # the callback is the user's: any failure is a note
            baseline = None
            notes.append(f"estimate_fn('baseline') failed ({type(error).__name__}: {error}): "
                         f"the fixes carry no predicted savings")
        if baseline is not None:
            for name, _ in LIVE_VARIANTS:
                try:
                    savings[name] = baseline - int(estimate_fn(name))
                except Exception as error:
                    notes.append(f"estimate_fn({name!r}) failed ({type(error).__name__}: "
                                 f"{error})")
    need = f" (live memory must shrink by {_size(shortfall)})" if shortfall else ""
    fixes = [Fix(text + (need if i == 0 else ""), savings[name])
             for i, (name, text) in enumerate(LIVE_VARIANTS)]
    return _rank(fixes)


def _fragmentation_fixes(source: str | None, cached_free: int | None) -> list[Fix]:
    """What serves a request the pool has room for but not in one piece. From a report or a
    snapshot the vmm source's gain is the cached free memory it could use (physical memory
    is mapped where it is needed, so free pieces no longer have to be adjacent); a trace
    replaces these with measured numbers."""
    fixes = []
    if source not in ("vmm", "sim:vmm"):
        fixes.append(Fix("the vmm source (VRAMKIT_SOURCE=vmm, or configure(source='vmm')): "
                         "cached free pieces serve one request wherever they lie",
                         cached_free or None))
        if source in ("cuda", "sim", None):
            fixes.append(Fix("large blocks in virtual memory from the first request "
                             "(VRAMKIT_LARGE_BLOCKS=virtual, the default; with "
                             "VRAMKIT_LARGE_BLOCKS=fixed, a lower VRAMKIT_VIRTUAL_THRESHOLD): "
                             "they go to virtual ranges before fixed segments fill with holes",
                             None))
        fixes.append(Fix("VRAMKIT_TIGHT_THRESHOLD=0 (with VRAMKIT_LARGE_BLOCKS=fixed): large "
                         "requests get segments of their own size instead of cuts of cached "
                         "ones, which pin them (more driver calls)", None))
    fixes.append(Fix("vramkit.empty_cache() between phases of the run (the OOM path already "
                     "gives back every wholly free segment, so it helps only between phases)",
                     None))
    return fixes


def _limit_fix(raise_by: int | None, reserved: int | None, requested: int | None,
               limit: int | None, total: int | None) -> Fix:
    target = (limit + raise_by) if (limit and raise_by) else \
        (reserved + requested if reserved is not None and requested is not None else None)
    text = "raise the limit (VRAMKIT_LIMIT, vramkit.set_memory_limit)"
    if raise_by:
        text += f" by {_size(raise_by)}"
    if target:
        text += f" to at least {_size(target)}"
        if total:
            text += (f", or the fraction (set_per_process_memory_fraction) to "
                     f"{min(1.0, target / total):.3f}")
    return Fix(text, raise_by)


def _model_numbers(model) -> dict:
    """Parameter count and bytes of a model (anything with .parameters())."""
    count = size = 0
    for p in model.parameters():
        count += p.numel()
        size += p.numel() * p.element_size()
    return {"parameters": count, "parameter_bytes": size}


# ---------------------------------------------------------------------------------------
# The report.
# ---------------------------------------------------------------------------------------
_HEADLINE = re.compile(r"vramkit: out of memory on device (\d+) \((\S+) source\): tried to "
                       r"allocate .*?\((\d+) bytes\)")
_CAUSE = re.compile(r"^  cause: (\w+): (.*)$", re.M)
_DEVICE = re.compile(rf"device capacity {_SIZE}, free on device {_SIZE}, limit (?:{_SIZE}|none)")
_POOL = re.compile(rf"reserved by vramkit {_SIZE}, allocated {_SIZE}, cached free {_SIZE}, "
                   rf"largest free block {_SIZE}")
_RAISE = re.compile(r"raise the limit by .*?\((\d+) bytes\)")
_OTHERS = re.compile(r"other processes hold " + _SIZE)
_NEIGHBOURS = re.compile(r"^  Other processes on this GPU: (.*)\.$", re.M)
_NEIGHBOUR = re.compile(rf"pid (\d+)(?: \((.*?)\))?(?: {_SIZE})?(?:, vramkit: reserved {_SIZE}, "
                        rf"{_SIZE} cached free)?")


def _report_text(text: str) -> str | None:
    """vramkit's report inside text (a PyTorch message carries it at its end), or None."""
    at = text.find("vramkit: out of memory")
    return text[at:] if at >= 0 else None


def _neighbours(report: str) -> list[dict]:
    m = _NEIGHBOURS.search(report)
    if not m or m.group(1).startswith("unknown"):
        return []
    out = []
    for clause in m.group(1).split(";"):
        n = _NEIGHBOUR.search(clause.strip())
        if not n:
            continue
        entry = {"pid": int(n.group(1)), "name": n.group(2) or "",
                 "bytes": _bytes_of(n.group(3), n.group(4)) if n.group(3) else None}
        if n.group(7):
            entry["cached_free"] = _bytes_of(n.group(7), n.group(8))
        out.append(entry)
    return sorted(out, key=lambda p: -(p["bytes"] or 0))


def _from_report(text: str, estimate_fn, origin: str) -> Diagnosis:
    report = _report_text(text)
    head = _HEADLINE.search(report or "")
    if head is None:
        raise DoctorInputError(f"{origin}: not a vramkit out-of-memory report (no line "
                               f"'vramkit: out of memory on device ...')")
    device, source, requested = int(head.group(1)), head.group(2), int(head.group(3))
    numbers: dict = {"device": device, "requested": requested}
    dev, pool = _DEVICE.search(report), _POOL.search(report)
    if dev:
        numbers["device_total"] = _bytes_of(dev.group(1), dev.group(2))
        numbers["device_free"] = _bytes_of(dev.group(3), dev.group(4))
        numbers["limit"] = _bytes_of(dev.group(5), dev.group(6)) if dev.group(5) else None
    if pool:
        for i, key in enumerate(("reserved", "allocated", "cached_free", "largest_free_block")):
            numbers[key] = _bytes_of(pool.group(2 * i + 1), pool.group(2 * i + 2))
    notes = ["the figures are the report's, rounded as it prints them"]
    cause_line = _CAUSE.search(report)
    if cause_line and cause_line.group(1) in CAUSES:
        cause, summary = cause_line.group(1), cause_line.group(2)
    elif dev and pool:
        # A report from before the cause line: the same rules on its figures.
        cause = _classify(requested, numbers["allocated"], numbers["reserved"],
                          numbers["device_free"], numbers["device_total"], numbers["limit"])
        summary = "chosen here from the report's figures (it has no cause line)"
    else:
        raise DoctorInputError(f"{origin}: the report has neither a cause line nor the "
                               f"figures to choose one from")
    processes = _neighbours(report)
    fixes: list[Fix] = []
    if cause == "fragmentation":
        fixes = _fragmentation_fixes(source, numbers.get("cached_free"))
    elif cause == "limit":
        m = _RAISE.search(report)
        raise_by = int(m.group(1)) if m else None
        if raise_by is None and numbers.get("limit"):
            raise_by = numbers["reserved"] + requested - numbers["limit"]
        fixes = [_limit_fix(raise_by, numbers.get("reserved"), requested, numbers.get("limit"),
                            numbers.get("device_total"))]
    elif cause == "live":
        shortfall = None
        if "allocated" in numbers and "device_total" in numbers:
            cap = min(numbers["limit"] or numbers["device_total"], numbers["device_total"])
            shortfall = max(0, numbers["allocated"] + requested - cap) or None
        if "more than the device can hold" in report or "No memory setting can serve" in report:
            fixes = [Fix("check how the request's size is computed: no setting serves a "
                         "request larger than the device", None)]
        else:
            fixes = _live_fixes(shortfall, estimate_fn, notes)
    elif cause == "others":
        fixes = _others_fixes(processes, numbers, report)
    return Diagnosis(cause, summary, f"out of memory on device {device} ({source} source), "
                     f"{_size(requested)} asked", numbers, _rank(fixes), [], processes, notes)


def _others_fixes(processes: list[dict], numbers: dict, report: str | None) -> list[Fix]:
    """Each neighbour's memory as the fix of stopping or moving it, and a vramkit
    neighbour's cached free memory as what its empty_cache would give back."""
    fixes = []
    for p in processes:
        name = f" ({p['name']})" if p.get("name") else ""
        if p.get("cached_free"):
            fixes.append(Fix(f"pid {p['pid']}{name} runs vramkit: its empty_cache() gives back "
                             f"{_size(p['cached_free'])} it holds unused", p["cached_free"]))
        fixes.append(Fix(f"stop pid {p['pid']}{name} or move it to another GPU", p.get("bytes")))
    held = None
    m = _OTHERS.search(report or "")
    if m:
        held = _bytes_of(m.group(1), m.group(2))
    elif numbers.get("device_total") is not None and numbers.get("device_free") is not None:
        held = max(0, numbers["device_total"] - numbers.get("reserved", 0) - numbers["device_free"])
    if held is not None:
        numbers["others_bytes"] = held
    if not processes:
        fixes.append(Fix("find what else holds the GPU (nvidia-smi, vramkit top) and stop it or "
                         "give this job another GPU", held))
    return fixes


# ---------------------------------------------------------------------------------------
# Snapshots.
# ---------------------------------------------------------------------------------------

def _last_oom(snap: dict) -> tuple[int, dict] | None:
    """The device and entry of the latest `oom` in device_traces (by time, then order) of a
    checked snapshot (plot._snapshot.check: lists, numbers where numbers belong)."""
    best, best_key = None, None
    for device, entries in enumerate(snap.get("device_traces") or []):
        for order, entry in enumerate(entries):
            if isinstance(entry, dict) and entry.get("action") == "oom":
                key = (entry.get("time_us") or 0, order)
                if best_key is None or key > best_key:
                    best, best_key = (device, entry), key
    return best


def _changed_after(snap: dict, device: int, oom: dict) -> bool:
    """Whether the device's trace allocates or frees after the OOM: the segments are then
    those of a later moment than the failure."""
    entries = snap["device_traces"][device]
    later = entries[next(i for i, e in enumerate(entries) if e is oom) + 1:]
    return any(isinstance(e, dict) and e.get("action") in ("alloc", "free_requested",
                                                           "free_completed", "segment_alloc",
                                                           "segment_free") for e in later)


def _from_snapshot(snap, capacity: int | None, estimate_fn, origin: str) -> Diagnosis:
    from .plot._history import SiteCache

    call_site = SiteCache()
    oom = _last_oom(snap)
    devices = {s.get("device", 0) for s in snap["segments"] if isinstance(s, dict)}
    device = oom[0] if oom else (min(devices) if devices else 0)
    reserved = allocated = cached = largest = 0
    sites: dict[str, int] = {}
    framed = False
    expandable = False
    for i, seg in enumerate(snap["segments"]):
        if not isinstance(seg, dict) or not isinstance(seg.get("blocks", []), list):
            raise DoctorInputError(f"{origin}: segment {i} is not a segment with a block list")
        if seg.get("device", 0) != device:
            continue
        reserved += seg.get("total_size", 0)
        expandable = expandable or bool(seg.get("is_expandable"))
        for block in seg.get("blocks", []):
            if not isinstance(block, dict):
                raise DoctorInputError(f"{origin}: a block of segment {i} is not a dict")
            size = block.get("size", 0)
            state = block.get("state")
            if state == "inactive":
                cached += size
                largest = max(largest, size)
            elif state in ("active_allocated", "active_pending_free"):
                allocated += size
                site = call_site(block.get("frames"))
                framed = framed or bool(site)
                site = site or "(no stack recorded)"
                sites[site] = sites.get(site, 0) + size
    if expandable:
        largest = cached  # mapped where needed: every free byte serves one request
    settings = snap.get("allocator_settings")
    settings = settings if isinstance(settings, dict) else {}
    source = settings.get("vramkit_source") or ("vmm" if expandable else None)
    numbers: dict = {"device": device, "allocated": allocated, "reserved": reserved,
                     "cached_free": cached, "largest_free_block": largest,
                     "device_total": capacity}
    call_sites = sorted(sites.items(), key=lambda kv: -kv[1]) if framed else []
    notes = []
    if not framed and allocated:
        notes.append("the blocks have no frames: record_memory_history() before the run "
                     "names the call sites")
    if oom is None:
        notes.append("the snapshot's trace records no out-of-memory; record_memory_history("
                     "enabled='all') before the failure keeps it")
        return Diagnosis(None, "no out-of-memory in the snapshot: these are its figures",
                         f"snapshot of device {device}", numbers, [], call_sites, [], notes)
    entry = oom[1]
    requested, device_free = entry.get("size", 0), entry.get("device_free", 0)
    numbers.update(requested=requested, device_free=device_free)
    if _changed_after(snap, oom[0], entry):
        notes.append("memory was allocated or freed after the OOM: the blocks are those of "
                     "the moment of the snapshot, not of the failure")
    needed = allocated + requested
    fixes: list[Fix] = []
    # The snapshot does not record a limit, so the rules differ from the report's in one
    # place: the device having room for the whole request in one piece (and no held memory
    # that could serve it) is what shows a limit refused it, as the pool would otherwise
    # have taken a new segment.
    if largest < requested <= cached:
        cause = "fragmentation"
    elif device_free >= _segment_for(requested, expandable, "vramkit_version" not in settings):
        cause = "limit"
    else:
        cause = _classify(requested, allocated, reserved, device_free, capacity, None)
    if cause == "fragmentation":
        summary = (f"{_size(cached)} is cached free and the device has {_size(device_free)} "
                   f"free, against a request of {_size(requested)}, but the largest free block "
                   f"is {_size(largest)}: the room is there, not in one piece (live memory "
                   f"plus the request, {_size(needed)}, would fit)")
        fixes = _fragmentation_fixes(source, cached)
    elif cause == "limit":
        summary = (f"the device had {_size(device_free)} free, enough for the request of "
                   f"{_size(requested)} in a segment of its own, yet it failed: a limit or "
                   f"memory fraction refused it (the snapshot does not record which; reserved "
                   f"is {_size(reserved)})")
        fixes = [_limit_fix(None, reserved, requested, None, capacity)]
    elif cause == "others":
        held = max(0, capacity - reserved - device_free)
        summary = (f"other processes hold {_size(held)} of the device's {_size(capacity)}: free "
                   f"on the device {_size(device_free)} plus cached free {_size(cached)} cannot "
                   f"serve the request {_size(requested)}, though live memory and the request "
                   f"({_size(needed)}) would fit on the device alone")
        fixes = _others_fixes([], numbers, None)
    else:
        if capacity is None:
            notes.insert(0, "the snapshot does not record the device's capacity: pass "
                            "capacity= (--capacity) to tell live memory from other processes")
            summary = (f"live memory {_size(allocated)} plus the request {_size(requested)} is "
                       f"{_size(needed)}, more than reserved {_size(reserved)} plus the "
                       f"{_size(device_free)} free on the device")
            shortfall = needed - reserved - device_free
        else:
            summary = (f"live memory {_size(allocated)} plus the request {_size(requested)} is "
                       f"{_size(needed)}, more than the device's {_size(capacity)}: live memory "
                       f"itself is too much")
            shortfall = needed - capacity
        fixes = _live_fixes(shortfall, estimate_fn, notes)
    return Diagnosis(cause, summary, f"snapshot of device {device}: out of memory, "
                     f"{_size(requested)} asked", numbers, _rank(fixes), call_sites, [], notes)


def _segment_for(requested: int, expandable: bool, pytorch: bool) -> int:
    """The device memory a new segment for the request takes: vramkit carves requests up to
    1 MiB from 2 MiB segments and rounds the rest up to 2 MiB; PyTorch's allocator gives
    requests from 1 to 10 MiB a 20 MiB segment; mapped on demand, the request itself,
    rounded to the granule."""
    small, granule = 1 << 20, _GRANULE
    if expandable:
        return (requested + granule - 1) // granule * granule
    if requested <= small:
        return granule
    if pytorch and requested < 10 * small:
        return 20 * small
    return (requested + granule - 1) // granule * granule


# ---------------------------------------------------------------------------------------
# Traces, replayed by the engine in this process (vramkit.replay).
# ---------------------------------------------------------------------------------------

def _replay(path: str, source: str, capacity: int | None, settings: dict | None = None):
    """One replay of the trace with the smallest capacity searched: (its result, the first
    OOM's report or ""). The pools run at the library's defaults with only ``settings``
    changed (vramkit.replay reads no environment): the doctor compares the sources at their
    defaults, and says which change it tries."""
    from ._replaying import replay
    from ._core import VramError

    try:
        result = replay(path, source=source, capacity=capacity, min_capacity=True,
                        settings=settings)
    except VramError as error:
        raise DoctorInputError(str(error)) from None
    return result, result.get("first_oom_report") or ""


# Fixed segments alone: every block in a cuMemAlloc segment (the settings that keep every
# tensor shareable by CUDA IPC).
_FIXED_ALONE = {"VRAMKIT_LARGE_BLOCKS": "fixed", "VRAMKIT_VIRTUAL_THRESHOLD": "1"}


def _from_trace(path: str, capacity: int | None, estimate_fn, origin: str) -> Diagnosis:
    # The default settings are the cuda source's (sim models it, large blocks in virtual
    # ranges); fixed segments alone are what large blocks fixed with threshold 1 give.
    default, default_err = _replay(path, "sim", capacity)
    fixed, _ = _replay(path, "sim", capacity, _FIXED_ALONE)
    vmm, _ = _replay(path, "sim:vmm", capacity)
    peak_live = default["peak_live_bytes"]
    need_default = default.get("min_capacity_bytes")
    need_fixed, need_vmm = fixed.get("min_capacity_bytes"), vmm.get("min_capacity_bytes")
    numbers = {"peak_live": peak_live, "capacity": capacity,
               "peak_reserved": default["peak_reserved_bytes"],
               "min_capacity_default": need_default, "min_capacity_fixed": need_fixed,
               "min_capacity_vmm": need_vmm, "ooms_default": default["ooms"],
               "ooms_fixed": fixed["ooms"], "ooms_vmm": vmm["ooms"]}
    notes = []
    where = f"trace {default['trace']} ({default['ops']} ops)"
    if capacity is None:
        summary = (f"no capacity given: the trace needs {_size(need_default)} on the default "
                   f"settings, {_size(need_fixed)} on fixed segments alone and "
                   f"{_size(need_vmm)} on the vmm source (peak live {_size(peak_live)}); "
                   f"pass capacity= (--capacity) to diagnose it under a cap")
        return Diagnosis(None, summary, where, numbers, [], [], [], notes)
    first = _CAUSE.search(default_err)
    if first:
        notes.append(f"the first allocation that failed on the default settings, as the pool "
                     f"reported it: {first.group(1)}: {first.group(2)}")
    if default["ooms"] == 0:
        summary = (f"it replays with no out-of-memory under {_size(capacity)} on the default "
                   f"settings (peak reserved {_size(default['peak_reserved_bytes'])}, peak "
                   f"live {_size(peak_live)})")
        if fixed["ooms"]:
            summary += (f"; on fixed segments alone (VRAMKIT_LARGE_BLOCKS=fixed "
                        f"VRAMKIT_VIRTUAL_THRESHOLD=1) "
                        f"{fixed['ooms']} allocations fail: it needs {_size(need_fixed)} there")
        return Diagnosis(None, summary, where, numbers, [], [], [], notes)
    if peak_live > capacity:
        shortfall = peak_live - capacity
        summary = (f"peak live memory {_size(peak_live)} is more than the capacity "
                   f"{_size(capacity)}: live memory itself is too much, by {_size(shortfall)} "
                   f"({default['ooms']} allocations failed on the default settings, "
                   f"{vmm['ooms']} on vmm)")
        fixes = _live_fixes(shortfall, estimate_fn, notes)
        return Diagnosis("live", summary, where, numbers, fixes, [], [], notes)
    early, _ = _replay(path, "sim", capacity, {"VRAMKIT_VIRTUAL_THRESHOLD": "0"})
    tight, _ = _replay(path, "sim", capacity,
                       {"VRAMKIT_LARGE_BLOCKS": "fixed", "VRAMKIT_TIGHT_THRESHOLD": "0"})
    need_early, need_tight = early.get("min_capacity_bytes"), tight.get("min_capacity_bytes")
    numbers.update(min_capacity_virtual_early=need_early, ooms_virtual_early=early["ooms"],
                   min_capacity_tight=need_tight, ooms_tight=tight["ooms"],
                   peak_reserved_vmm=vmm["peak_reserved_bytes"])
    summary = (f"peak live memory {_size(peak_live)} fits the capacity {_size(capacity)}, but "
               f"on the default settings {default['ooms']} allocations failed: the trace "
               f"needs {_size(need_default)} there, the free memory is not in pieces large "
               f"enough")

    def gain(need):
        return need_default - need if need_default is not None and need is not None else None

    def outcome(run, need):
        fits = "no OOM" if run["ooms"] == 0 else f"{run['ooms']} OOMs"
        return f"under {_size(capacity)}: {fits}, and it needs {_size(need)}"

    fixes = [
        Fix(f"the vmm source (VRAMKIT_SOURCE=vmm): replayed on sim:vmm {outcome(vmm, need_vmm)}, "
            f"peak reserved {_size(vmm['peak_reserved_bytes'])}", gain(need_vmm)),
        Fix(f"VRAMKIT_VIRTUAL_THRESHOLD=0 (large blocks mapped granule by granule, where "
            f"live blocks are, from the start): replayed {outcome(early, need_early)}",
            gain(need_early)),
        Fix(f"VRAMKIT_LARGE_BLOCKS=fixed VRAMKIT_TIGHT_THRESHOLD=0 (fixed segments of their "
            f"own size for large requests): replayed {outcome(tight, need_tight)}",
            gain(need_tight)),
        Fix("vramkit.empty_cache() between phases of the run (the OOM path already gives back "
            "every wholly free segment)", None),
    ]
    return Diagnosis("fragmentation", summary, where, numbers, _rank(fixes), [], [], notes)


# ---------------------------------------------------------------------------------------
# The entry points.
# ---------------------------------------------------------------------------------------

def _from_path(path: str, capacity: int | None, estimate_fn) -> Diagnosis:
    from .plot import _read
    from .plot._snapshot import check

    try:
        raw = _read.read_bytes(path)
    except _read.PlotInputError as error:
        raise DoctorInputError(str(error)) from None
    head = raw[:1 << 16].decode("utf-8", "replace")
    if raw.startswith(_read.TRACE_MAGIC):
        return _from_trace(path, capacity, estimate_fn, path)
    if "vramkit: out of memory" in head and raw[:1] != b"\x80":
        return _from_report(raw.decode("utf-8", "replace"), estimate_fn, path)
    try:
        kind = _read.kind_of(path, raw)
        if kind == "log":
            raise DoctorInputError(f"{path}: a MemoryLogger log, not a snapshot or a trace "
                                   f"(vramkit plot draws it)")
        snap = check(path, _read.load_snapshot_object(path, raw, kind))
    except _read.PlotInputError as error:
        raise DoctorInputError(str(error)) from None
    return _from_snapshot(snap, capacity, estimate_fn, path)


def diagnose(source, *, capacity: int | str | None = None,
             estimate_fn: Callable[[str], int] | None = None, model=None) -> Diagnosis:
    """Why an allocation ran out of memory, and what to do about it (see the module's text).

    source: a vramkit OutOfMemoryError (or an exception carrying vramkit's report), the
    report text, or the path of a snapshot pickle, a trace or a saved report. capacity:
    bytes or a size string ("16G"): the cap a trace is replayed under, or a snapshot's
    device capacity. estimate_fn(variant) -> bytes: the predicted peak of the step under
    "baseline" and each of LIVE_VARIANTS; the fixes of a `live` cause are then ranked by
    the saving each predicts. model: a torch.nn.Module whose parameters are counted.
    Raises DoctorInputError for what cannot be read."""
    if isinstance(capacity, str):
        from . import _core

        capacity = _core.parse_size(capacity, False)[0]
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                 or capacity <= 0):
        raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
    if isinstance(source, BaseException):
        text = getattr(source, "report", None) or str(source)
        result = _from_report(text, estimate_fn, type(source).__name__)
        _add_live_call_sites(result)
    elif isinstance(source, str) and "out of memory" in source and (
            "\n" in source or not os.path.exists(source)):
        result = _from_report(source, estimate_fn, "the report")
    elif isinstance(source, (str, os.PathLike)):
        result = _from_path(os.fspath(source), capacity, estimate_fn)
    else:
        raise TypeError(f"diagnose() takes an OutOfMemoryError, a report or a path, not "
                        f"{type(source).__name__}")
    if model is not None:
        result.numbers.update(_model_numbers(model))
    return result


def _add_live_call_sites(result: Diagnosis) -> None:
    """Right after an OOM in this process, the pool's blocks are the ones that failed it:
    their call sites, when memory history recorded stacks."""
    try:
        from .history import snapshot

        snap = snapshot(result.numbers.get("device", 0))
    except Exception:  # no pool, no history: the report alone is the diagnosis
        return
    from .plot._history import call_site

    sites: dict[str, int] = {}
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            site = call_site(block["frames"]) if block["state"] != "inactive" else ""
            if site:
                sites[site] = sites.get(site, 0) + block["size"]
    result.call_sites = sorted(sites.items(), key=lambda kv: -kv[1])


def main(args: list[str]) -> int:
    """`vramkit doctor SNAPSHOT_OR_TRACE [--capacity SIZE] [--json]`; the exit status."""
    import sys

    from . import _core
    from .cli import EXIT_OK, input_error, usage_error

    paths, capacity, as_json = [], None, False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            print(USAGE)
            return EXIT_OK
        if arg == "--json":
            as_json = True
        elif arg == "--capacity" or arg.startswith("--capacity="):
            _, eq, value = arg.partition("=")
            if not eq:
                if i + 1 >= len(args):
                    return usage_error("doctor", "--capacity needs a size")
                i += 1
                value = args[i]
            try:
                capacity = _core.parse_size(value, False)[0]
            except Exception:
                return usage_error("doctor", f"--capacity: cannot read '{value}' as a size such "
                                             f"as '16G'")
            if capacity <= 0:
                return usage_error("doctor", "--capacity must be more than 0")
        elif arg.startswith("-") and arg != "-":
            return usage_error("doctor", f"unknown option '{arg}'")
        else:
            paths.append(arg)
        i += 1
    if len(paths) != 1:
        return usage_error("doctor", "give one snapshot or trace" if not paths
                           else f"one file at a time, not {len(paths)}")
    try:
        result = diagnose(paths[0], capacity=capacity)
    except DoctorInputError as error:
        return input_error("doctor", error)
    print(json.dumps(result.to_dict(), indent=2) if as_json else result)
    return EXIT_OK
