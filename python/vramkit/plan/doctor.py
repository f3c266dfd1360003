"""The OOM doctor: why an allocation failed, in one screen, with numbers, and the fixes
ranked by what each is predicted to gain.

``vramkit.diagnose(source)`` names the cause the C engine chose when the request failed
(vram_oom_info_t, src/obs/stats.c, which says the rules), one of CAUSES:

- ``live``: live memory plus the request is more than the cap (the limit, else the
  device). The largest live call sites come from the snapshot's block frames where it has
  them, the parameter count from ``model=`` where given.
- ``fragmentation``: the memory is there (cached free, plus what the pool may still
  reserve) but no free block is large enough; ``granularity``: the same, but not in whole
  segments the pool maps.
- ``others``: live memory and the request would fit the device, but other processes hold
  the difference (NVML's and the published records' pids, from the engine's figures).
- ``limit``: a limit or memory fraction refused it while the device had room.
- ``preallocate``: the pool's up-front reservation (VRAMKIT_PREALLOCATE) did not fit.

The doctor reads the engine's figures, never the report's text. The source may be:

- a ``vramkit.OutOfMemoryError`` (its ``.oom_info``), an exception carrying vramkit's
  report (``torch.OutOfMemoryError`` under vramkit.torch: this process's pool's figures),
  or the figures themselves (the dict of ``vramkit.last_oom_info()``);
- a snapshot pickle, vramkit's (``vramkit.dump_snapshot``) or PyTorch's
  (``torch.cuda.memory._dump_snapshot``): segments with their blocks, and ``device_traces``
  whose ``oom`` entries carry the request's size and ``device_free``; its figures are
  classified by the engine's rules (``_core.oom_classify``), and since a snapshot does not
  say the device's capacity, ``capacity=`` gives it;
- a vramkit trace (format v1): with ``capacity=`` it is replayed in process by the engine
  (``vramkit.replay``) under that cap on the default settings, on fixed segments alone,
  on ``sim:vmm``, with ``VRAMKIT_VIRTUAL_THRESHOLD=0`` and with tight fixed segments, each
  with its smallest fitting capacity searched. Only the settings on which the run fits are
  listed as fixes; where none does, the smallest capacity that fits is the fix.

``vramkit doctor SNAPSHOT_OR_TRACE [--capacity SIZE] [--json]`` prints the same after the
fact (:func:`main`).
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from .._figures import binary_size
from .._shown import shown

__all__ = ["CAUSES", "Diagnosis", "DoctorInputError", "Fix", "LIVE_VARIANTS", "diagnose"]

# The engine's causes (vram_oom_cause, src/obs/stats.c), every one of them.
CAUSES = ("live", "fragmentation", "others", "limit", "granularity", "preallocate",
          "group_limit")

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
        lines += _wrap(f"cause: {self.cause or 'none'}: {self.summary}", width,
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
            figures = [f"{name} {_size(n[key])}" for name, key in row
                       if key in n and (n[key] is not None or key == "limit")]
            if figures:
                lines.append("  " + ", ".join(figures))
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
                lines += _wrap(f"{i}. {fix.text}{gain}", width, initial_indent="  ",
                               subsequent_indent="     ")
        for note in self.notes[:3]:
            lines += _wrap(f"note: {note}", width, subsequent_indent="  ")
        # File names, call sites and process names come from the file diagnosed: each line
        # as vramkit shows foreign text, so that none garbles a terminal or forges a line.
        return "\n".join(shown(line) for line in lines)


# A figure and its unit ("0 B", "6.1 MiB"), which a wrapped line keeps together.
_FIGURE_AND_UNIT = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|PiB|EiB)\b")


def _wrap(text: str, width: int, **indents) -> list[str]:
    """textwrap.wrap, never breaking a line between a figure and its unit (a note read
    "... 0" on one line and "B cached free" on the next)."""
    if "\u00a0" in text:  # foreign text holding the glue: wrapped as it is
        return textwrap.wrap(text, width, **indents)
    glued = _FIGURE_AND_UNIT.sub("\\1\u00a0\\2", text)
    return [line.replace("\u00a0", " ") for line in textwrap.wrap(glued, width, **indents)]


# ---------------------------------------------------------------------------------------
# Sizes.
# ---------------------------------------------------------------------------------------
def _size(value, up: bool = False) -> str:
    """Bytes with one decimal, as the C report's headline writes them. up: rounded up, for
    an amount a fix needs (a limit to raise to), which the user sets as read: rounded down
    it would fall short and the same OOM would come back."""
    return "none" if value is None else binary_size(value, 1, up=up)


# ---------------------------------------------------------------------------------------
# The fixes of each cause.
# ---------------------------------------------------------------------------------------

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
    need = f" (live memory must shrink by {_size(shortfall, up=True)})" if shortfall else ""
    fixes = [Fix(text + (need if i == 0 else ""), savings[name])
             for i, (name, text) in enumerate(LIVE_VARIANTS)]
    return _rank(fixes)


def _fragmentation_fixes(source: str | None, cached_free: int | None,
                         preallocated: int | None = None) -> list[Fix]:
    """What serves a request the pool has room for but not in one piece. From a report or a
    snapshot the vmm source's gain is the cached free memory it could use (physical memory
    is mapped where it is needed, so free pieces no longer have to be adjacent); a trace
    replaces these with measured numbers. A preallocated pool is one region, mapped whole
    on every source: no source or placement setting moves its holes."""
    if preallocated:
        return [Fix(f"leave VRAMKIT_PREALLOCATE unset (it holds {_size(preallocated)} as one "
                    "region, which keeps its holes on every source): the pool then grows on "
                    "demand and gives back or remaps what fragments; or preallocate more",
                    cached_free or None)]
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
        text += f" by {_size(raise_by, up=True)}"
    if target:
        text += f" to at least {_size(target, up=True)}"
        if total:
            text += (f", or the fraction (set_per_process_memory_fraction) to "
                     f"{min(1.0, math.ceil(target / total * 1000) / 1000):.3f}")
    return Fix(text, raise_by)


def _model_numbers(model) -> dict:
    """Parameter count and bytes of a model (anything with .parameters())."""
    count = size = 0
    for p in model.parameters():
        count += p.numel()
        size += p.numel() * p.element_size()
    return {"parameters": count, "parameter_bytes": size}


# ---------------------------------------------------------------------------------------
# The engine's figures of an OOM (vram_oom_info_t, as _core.oom_info gives them).
# ---------------------------------------------------------------------------------------

def _summary(cause: str, n: dict) -> str:
    """One sentence with the figures that chose the cause. n holds the Diagnosis numbers:
    from the engine's struct, or read from a snapshot (whose limit is unknown: None)."""
    rq, alloc, cap = n.get("requested") or 0, n.get("allocated") or 0, n.get("device_total")
    needed, free, cached = alloc + rq, n.get("device_free") or 0, n.get("cached_free") or 0
    limit, reserved = n.get("limit"), n.get("reserved") or 0
    if cause == "preallocate":
        bound = (f"the device's capacity of {_size(cap)}" if cap is not None and rq > cap else
                 f"the limit of {_size(limit)}" if limit and rq > limit else
                 f"the {_size(free)} free on the device (other processes hold the rest)")
        return f"the preallocation of {_size(rq)} is more than {bound}"
    if cause == "group_limit":
        return (f"every vramkit process on this device together may reserve "
                f"{_size(n.get('group_limit'))} (VRAMKIT_GROUP_LIMIT, or a pool's group_limit); "
                f"they reserve {_size(n.get('group_reserved'))}, and the request of {_size(rq)} "
                f"would pass it")
    if cause == "granularity":
        g, room = n.get("granularity") or 1, n.get("may_reserve") or 0
        return (f"the pool maps memory in whole segments of {_size(g)}: of the {_size(room)} "
                f"it may still reserve, {_size(room - room % g)} can be mapped, which with the "
                f"{_size(cached)} cached free is less than the request of {_size(rq)}")
    if cause == "fragmentation":
        room = n.get("may_reserve", free)
        return (f"{_size(cached)} is cached free and {_size(room)} more may be reserved, "
                f"against a request of {_size(rq)}, but the largest free block is "
                f"{_size(n.get('largest_free_block'))}: the room is there, not in one piece "
                f"(live memory plus the request, {_size(needed)}, would fit)")
    if cause == "limit":
        if limit is None:
            return (f"the device had {_size(free)} free, enough for the request of {_size(rq)} "
                    f"in a segment of its own, yet it failed: a limit or memory fraction "
                    f"refused it (the snapshot does not record which; reserved is "
                    f"{_size(reserved)})")
        return (f"the limit of {_size(limit)} refused it: reserved {_size(reserved)} plus the "
                f"request {_size(rq)} is more, while the device has {_size(free)} free")
    if cause == "others":
        return (f"other processes hold {_size(n.get('others_bytes'))} of the device's "
                f"{_size(cap)}: free on the device {_size(free)} plus cached free "
                f"{_size(cached)} cannot serve the request {_size(rq)}, though live memory and "
                f"the request ({_size(needed)}) would fit on the device alone")
    if n.get("max_request"):
        return f"the request alone ({_size(rq)}) is more than the device can hold"
    if cap is None:
        return (f"live memory {_size(alloc)} plus the request {_size(rq)} is {_size(needed)}, "
                f"more than reserved {_size(reserved)} plus the {_size(free)} free on the device")
    bound = (f"the device's {_size(cap)}" if needed > cap or not limit else
             f"the limit of {_size(limit)}, and the device has only {_size(free)} free besides")
    return (f"live memory {_size(alloc)} plus the request {_size(rq)} is {_size(needed)}, more "
            f"than {bound}: live memory itself is too much")


# The struct's figures as the Diagnosis names them.
_INFO_NUMBERS = (("device", "device"), ("requested", "requested"), ("allocated", "allocated"),
                 ("reserved", "reserved"), ("cached_free", "cached_free"),
                 ("largest_free_block", "largest_free_block"), ("device_total", "capacity"),
                 ("device_free", "device_free"), ("limit", "limit"),
                 ("granularity", "granularity"), ("may_reserve", "may_reserve"),
                 ("max_request", "max_request"), ("raise_limit_by", "raise_limit_by"),
                 ("others_bytes", "others_used"), ("shortfall", "shortfall"),
                 ("group_limit", "group_limit"), ("group_reserved", "group_reserved"),
                 ("preallocated", "preallocated"))


def _setting_fixes(cause: str, n: dict) -> list[Fix]:
    """The fixes of the causes a setting of the pool's own makes: a preallocation, and a
    request no whole segment can place."""
    if cause == "group_limit":
        over = (n.get("group_reserved") or 0) + n["requested"] - (n.get("group_limit") or 0)
        return [Fix(f"raise the group limit (VRAMKIT_GROUP_LIMIT, or the pool's group_limit) "
                    f"by {_size(over, up=True)}, or let the neighbours on the "
                    f"device give their idle cache back (VRAMKIT_GIVE_BACK, on by default)",
                    over or None)]
    if cause == "preallocate":
        cap = min(n["limit"] or n["device_total"], n["device_total"])
        can = min(cap, n["device_free"])
        return [Fix(f"lower VRAMKIT_PREALLOCATE to what the device can give ({_size(can)} "
                    f"now), or leave it unset to grow on demand", None)]
    g = n.get("granularity") or 1
    mappable = n["may_reserve"] - n["may_reserve"] % g
    missing = max(0, n["requested"] - n["cached_free"] - mappable)
    more = -(-missing // g) * g
    return [Fix(f"raise the limit (VRAMKIT_LIMIT) or the device's memory by "
                f"{_size(more, up=True)}: "
                f"the pool maps whole segments of {_size(g)}", more or None)]


# The one fix of a request larger than the device (the engine's max_request).
_PAST_THE_DEVICE = Fix("check how the request's size is computed: no setting serves a request "
                       "larger than the device", None)


def _from_info(info: dict, estimate_fn, origin: str) -> Diagnosis:
    """The diagnosis of the engine's own figures and cause of an OOM."""
    cause = info.get("cause")
    if cause not in CAUSES:
        raise DoctorInputError(f"{origin}: the OOM's cause {cause!r} is not one the doctor "
                               f"knows ({', '.join(CAUSES)})")
    numbers = {key: info.get(field) for key, field in _INFO_NUMBERS}
    processes = sorted(({k: p.get(k) for k in ("pid", "name", "bytes", "cached_free")
                         if k in p} for p in info.get("neighbours") or []),
                       key=lambda p: -(p.get("bytes") or 0))
    notes: list[str] = []
    if cause == "fragmentation":
        fixes = _fragmentation_fixes(info.get("source"), numbers["cached_free"],
                                     numbers.get("preallocated"))
    elif cause == "limit":
        fixes = [_limit_fix(numbers["raise_limit_by"] or None, numbers["reserved"],
                            numbers["requested"], numbers["limit"], numbers["device_total"])]
    elif cause == "live" and numbers["max_request"]:
        fixes = [_PAST_THE_DEVICE]
    elif cause == "live":
        fixes = _live_fixes(numbers["shortfall"] or None, estimate_fn, notes)
    elif cause == "others":
        fixes = _others_fixes(processes, numbers)
    else:
        fixes = _setting_fixes(cause, numbers)
    device, source = numbers["device"], info.get("source")
    return Diagnosis(cause, _summary(cause, numbers), f"out of memory on device {device} "
                     f"({source} source), {_size(numbers['requested'])} asked", numbers,
                     _rank(fixes), [], processes, notes)


def _info_of_exception(error: BaseException) -> dict:
    """The engine's figures of the OOM an exception reports: its own (.oom_info, which
    vramkit's OutOfMemoryError carries), else, for one carrying vramkit's report (PyTorch's,
    under vramkit.torch), those this process's pool kept at its last OOM."""
    info = getattr(error, "oom_info", None)
    if info:
        return info
    if "vramkit: out of memory" in (getattr(error, "report", None) or str(error)):
        from .. import last_oom_info

        info = last_oom_info()
        if info:
            return info
    raise DoctorInputError(f"{type(error).__name__}: not a vramkit out-of-memory report (no "
                           f"figures: vramkit's OutOfMemoryError carries them as .oom_info)")


def _others_fixes(processes: list[dict], numbers: dict) -> list[Fix]:
    """Each neighbour's memory as the fix of stopping or moving it, and a vramkit
    neighbour's cached free memory as what its empty_cache would give back."""
    fixes = []
    for p in processes:
        name = f" ({p['name']})" if p.get("name") else ""
        if p.get("cached_free"):
            fixes.append(Fix(f"pid {p['pid']}{name} runs vramkit: its empty_cache() gives back "
                             f"{_size(p['cached_free'])} it holds unused", p["cached_free"]))
        fixes.append(Fix(f"stop pid {p['pid']}{name} or move it to another GPU", p.get("bytes")))
    if not processes:
        fixes.append(Fix("find what else holds the GPU (nvidia-smi, vramkit top) and stop it or "
                         "give this job another GPU", numbers.get("others_bytes")))
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


# The states of a snapshot's blocks, as PyTorch's snapshot writes them.
_BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


def _device_blocks(snap, device: int, origin: str):
    """The device's figures in a checked snapshot: reserved, allocated, cached free, the
    largest free block, bytes by live call site, whether any block had frames, and whether
    its segments are expandable (mapped where needed)."""
    from ..plot._history import SiteCache

    call_site = SiteCache()
    reserved = allocated = cached = largest = 0
    sites: dict[str, int] = {}
    framed = expandable = False
    for i, seg in enumerate(snap["segments"]):
        if not isinstance(seg, dict) or not isinstance(seg.get("blocks", []), list):
            raise DoctorInputError(f"{origin}: segments[{i}] is not a segment with a block list")
        if seg.get("device", 0) != device:
            continue
        # A figure summed over a segment or block that lacks its size (or a block its
        # state) would be printed as if complete: every snapshot PyTorch or vramkit
        # writes has them, so one without them is refused, not read as zero.
        if "total_size" not in seg:
            raise DoctorInputError(f"{origin}: segments[{i}] has no 'total_size': its "
                                   f"reserved bytes are unknown")
        reserved += seg["total_size"]
        expandable = expandable or bool(seg.get("is_expandable"))
        held = 0
        for j, block in enumerate(seg.get("blocks", [])):
            if not isinstance(block, dict):
                raise DoctorInputError(f"{origin}: segments[{i}].blocks[{j}] is not a dict")
            missing = [key for key in ("size", "state") if key not in block]
            if missing:
                raise DoctorInputError(f"{origin}: segments[{i}].blocks[{j}] has no "
                                       f"{' and no '.join(repr(k) for k in missing)}: "
                                       f"what it holds is unknown")
            size = block["size"]
            state = block["state"]
            if state not in _BLOCK_STATES:
                raise DoctorInputError(f"{origin}: segments[{i}].blocks[{j}] is in state "
                                       f"'{str(state)[:40]}', none PyTorch writes "
                                       f"({', '.join(_BLOCK_STATES)}): what it holds is "
                                       f"unknown")
            held += size
            if held > seg["total_size"]:
                raise DoctorInputError(f"{origin}: segments[{i}]'s blocks hold more than its "
                                       f"total_size of {seg['total_size']:,} bytes: its "
                                       f"figures contradict each other")
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
    return reserved, allocated, cached, largest, sites, framed, expandable


def _from_snapshot(snap, capacity: int | None, estimate_fn, origin: str) -> Diagnosis:
    oom = _last_oom(snap)
    missing = [key for key in ("size", "device_free") if oom and key not in oom[1]]
    if missing:  # as a segment without its size: a cause read from zeros would be false
        raise DoctorInputError(f"{origin}: the out-of-memory entry of device_traces[{oom[0]}] "
                               f"has no {' and no '.join(repr(k) for k in missing)}: what "
                               f"was asked and what was free are unknown")
    devices = {s.get("device", 0) for s in snap["segments"] if isinstance(s, dict)}
    device = oom[0] if oom else (min(devices) if devices else 0)
    reserved, allocated, cached, largest, sites, framed, expandable = \
        _device_blocks(snap, device, origin)
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
    free_at_oom = oom[1]["device_free"] if oom else 0
    if capacity is not None and capacity < reserved + free_at_oom:
        # A report that set the two side by side would print figures that cannot both be.
        held = f"reserved {_size(reserved)}" + (
            f" and free on device {_size(free_at_oom)} together" if oom else "")
        raise ValueError(f"capacity {_size(capacity)} is less than the snapshot's {held}: "
                         f"it is not this device's")
    if oom is None:
        notes.append("the snapshot's trace records no out-of-memory; record_memory_history("
                     "enabled='all') before the failure keeps it")
        return Diagnosis(None, "no out-of-memory in the snapshot: these are its figures",
                         f"snapshot of device {device}", numbers, [], call_sites, [], notes)
    entry = oom[1]
    requested, device_free = entry["size"], entry["device_free"]
    if requested <= 0:
        raise DoctorInputError(f"{origin}: the out-of-memory entry of device_traces[{oom[0]}] "
                               f"asks {requested} bytes: no allocator fails a request of "
                               f"nothing, so it records no real failure")
    numbers.update(requested=requested, device_free=device_free)
    if _changed_after(snap, oom[0], entry):
        notes.append("memory was allocated or freed after the OOM: the blocks are those of "
                     "the moment of the snapshot, not of the failure")
    fixes: list[Fix] = []
    # The snapshot does not record a limit, so the rules differ from the engine's in one
    # place: the device having room for the whole request in one piece (and no held memory
    # that could serve it) is what shows a limit refused it, as the pool would otherwise
    # have taken a new segment. The rest is the engine's rule (vram_oom_classify).
    from .. import _core

    # As the pool's own check has it, the most one request may be is the device: past it,
    # the engine's cause is live memory with max_request set, which no setting serves.
    max_request = capacity if capacity is not None and requested > capacity else 0
    engine = _core.oom_classify(dict(numbers, capacity=capacity or 0, limit=None,
                                     max_request=max_request))
    numbers.update(others_bytes=engine["others_used"] if capacity else None,
                   may_reserve=engine["may_reserve"], max_request=max_request or None)
    if largest < requested <= cached:
        cause = "fragmentation"
    elif device_free >= _segment_for(requested, expandable, "vramkit_version" not in settings):
        cause = "limit"
    else:
        cause = engine["cause"]
    if cause == "fragmentation":
        fixes = _fragmentation_fixes(source, cached)
    elif cause == "limit":
        fixes = [_limit_fix(None, reserved, requested, None, capacity)]
    elif cause == "others":
        fixes = _others_fixes([], numbers)
    elif max_request:
        fixes = [_PAST_THE_DEVICE]
    else:
        shortfall = engine["shortfall"]
        if capacity is None:
            notes.insert(0, "the snapshot does not record the device's capacity: pass "
                            "capacity= (--capacity) to tell live memory from other processes")
            shortfall = allocated + requested - reserved - device_free
        fixes = _live_fixes(shortfall, estimate_fn, notes)
    return Diagnosis(cause, _summary(cause, numbers), f"snapshot of device {device}: out of "
                     f"memory, {_size(requested)} asked", numbers, _rank(fixes), call_sites, [],
                     notes)


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
# The entry points.
# ---------------------------------------------------------------------------------------

# A report's text is for people; the doctor reads the figures the engine keeps with it.
_REPORT_TEXT = ("{}: an out-of-memory report's text, which the doctor does not parse: pass the "
                "OutOfMemoryError (its .oom_info), vramkit.last_oom_info(), a snapshot "
                "or a trace")


def _from_path(path: str, capacity: int | None, estimate_fn) -> Diagnosis:
    from ..plot import _read
    from ..plot._snapshot import check

    try:
        raw = _read.read_bytes(path)
    except _read.PlotInputError as error:
        raise DoctorInputError(*error.args) from None  # shown text stays so
    head = raw[:1 << 16].decode("utf-8", "replace")
    if raw.startswith(_read.TRACE_MAGIC):
        from ._doctor_trace import from_trace

        return from_trace(path, capacity, estimate_fn)
    if "vramkit: out of memory" in head and raw[:1] != b"\x80":
        raise DoctorInputError(_REPORT_TEXT.format(path))
    try:
        kind = _read.kind_of(path, raw)
        if kind == "log":
            raise DoctorInputError(f"{path}: a MemoryLogger log, not a snapshot or a trace "
                                   f"(vramkit plot draws it)")
        snap = check(path, _read.load_snapshot_object(path, raw, kind))
    except _read.PlotInputError as error:
        raise DoctorInputError(*error.args) from None  # shown text stays so
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
    Raises DoctorInputError for what cannot be read, ValueError for a capacity that is not
    a positive size or that a snapshot shows cannot be its device's."""
    from .. import _core

    if isinstance(capacity, str):
        capacity = _core.parse_size(capacity, False)[0]
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                 or capacity <= 0):
        raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
    if capacity is not None and capacity > _core.SIM_MAX_CAPACITY:
        raise ValueError(f"{capacity:,} bytes is more than the largest device vramkit "
                         f"models ({_core.SIM_MAX_CAPACITY >> 40} TiB)")
    if isinstance(source, BaseException):
        result = _from_info(_info_of_exception(source), estimate_fn, type(source).__name__)
        _add_live_call_sites(result)
    elif isinstance(source, dict):
        result = _from_info(source, estimate_fn, "the OOM's figures")
    elif isinstance(source, str) and "out of memory" in source and (
            "\n" in source or not os.path.exists(source)):
        raise DoctorInputError(_REPORT_TEXT.format("the report"))
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
        from ..observe.history import snapshot

        snap = snapshot(result.numbers.get("device", 0))
    except Exception:  # no pool, no history: the report alone is the diagnosis
        return
    from ..plot._history import call_site

    sites: dict[str, int] = {}
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            site = call_site(block["frames"]) if block["state"] != "inactive" else ""
            if site:
                sites[site] = sites.get(site, 0) + block["size"]
    result.call_sites = sorted(sites.items(), key=lambda kv: -kv[1])
