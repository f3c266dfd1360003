"""The OOM doctor on a trace (vramkit.doctor): the trace replayed in this process by the
engine (vramkit.replay) under the capacity on the default settings and on the settings a fix
would change, each with its smallest fitting capacity searched, so that every fix listed is
one on which the run fits, with what it gains measured rather than guessed.
"""

from __future__ import annotations

from .. import _core
from .._figures import counted
from .doctor import Diagnosis, DoctorInputError, Fix, _live_fixes, _rank, _size


def _mib(value: int | None) -> str:
    """A capacity in MiB, the unit the replay's search finds it to (1.5 GiB hides the
    difference between one that fits and one that does not)."""
    return "none" if value is None else f"{value / (1 << 20):.1f} MiB"


def _need(value: int | None, peak_live: int) -> str:
    """A smallest fitting capacity the replay searched for; where it found none, how far
    the search went at least: four times peak live, or the most any device holds where
    that is less (`vramkit replay --min-capacity`'s "> 4x live" and "> sim max")."""
    if value is not None:
        return _size(value)
    if peak_live > _core.SIM_MAX_CAPACITY // 4:
        return f"more than any device holds (none up to {_size(_core.SIM_MAX_CAPACITY)} fits)"
    return f"more than 4 times its peak live (none up to {_size(4 * peak_live)} fits)"


def _replay(path: str, source: str, capacity: int | None, settings: dict | None = None):
    """One replay of the trace with the smallest capacity searched: its result (with
    first_oom, the engine's figures of its first OOM). The pools run at the library's
    defaults with only ``settings`` changed (vramkit.replay reads no environment): the
    doctor compares the sources at their defaults, and says which change it tries."""
    from ._replaying import replay
    from .._core import VramError
    from .._shown import trace_message

    try:
        return replay(path, source=source, capacity=capacity, min_capacity=True,
                      settings=settings)
    except VramError as error:
        raise DoctorInputError(trace_message(path, str(error))) from None


# Fixed segments alone: every block in a cuMemAlloc segment (the settings that keep every
# tensor shareable by CUDA IPC).
_FIXED_ALONE = {"VRAMKIT_LARGE_BLOCKS": "fixed", "VRAMKIT_VIRTUAL_THRESHOLD": "1"}

# The settings a fragmenting trace is replayed on, each a fix if the run fits there: (the
# fix's text, what it does, the key of its numbers, source, settings).
_TRIED = (
    ("the vmm source (VRAMKIT_SOURCE=vmm)", "physical memory mapped where it is needed",
     "vmm", "sim:vmm", None),
    ("VRAMKIT_VIRTUAL_THRESHOLD=0", "large blocks mapped granule by granule, where live "
     "blocks are, from the start", "virtual_early", "sim", {"VRAMKIT_VIRTUAL_THRESHOLD": "0"}),
    ("VRAMKIT_LARGE_BLOCKS=fixed VRAMKIT_TIGHT_THRESHOLD=0", "fixed segments of their own size "
     "for large requests", "tight", "sim",
     {"VRAMKIT_LARGE_BLOCKS": "fixed", "VRAMKIT_TIGHT_THRESHOLD": "0"}),
)


def _first_oom_note(run: dict) -> list[str]:
    """The engine's figures of the first OOM on the default settings, as a note."""
    first = run.get("first_oom")
    if not first:
        return []
    return [f"the first allocation that failed on the default settings: {first['cause']}, "
            f"{_size(first['requested'])} asked with {_size(first['allocated'])} live, "
            f"{_size(first['cached_free'])} cached free, largest free block "
            f"{_size(first['largest_free_block'])}"]


def _fragmenting_trace(path: str, capacity: int, default: dict, runs: dict, numbers: dict,
                       notes: list[str]) -> tuple[str, list[Fix]]:
    """Summary and fixes of a trace whose live memory fits the capacity: the settings of
    _TRIED replayed under it, and only those on which it fits listed as fixes, each with
    what it gains in needed capacity; where none fits, the smallest capacity that does."""
    need_default = default.get("min_capacity_bytes")
    peak_live = numbers["peak_live"]
    for text, what, key, source, settings in _TRIED:
        run = runs[key] = runs.get(key) or _replay(path, source, capacity, settings)
        numbers.update({f"min_capacity_{key}": run.get("min_capacity_bytes"),
                        f"ooms_{key}": run["ooms"]})
    numbers["peak_reserved_vmm"] = runs["vmm"]["peak_reserved_bytes"]
    summary = (f"peak live memory {_size(numbers['peak_live'])} fits the capacity "
               f"{_size(capacity)}, but on the default settings "
               f"{counted(default['ooms'], 'allocation')} failed: the trace needs "
               f"{_need(need_default, peak_live)} there, the free memory is not in pieces "
               f"large enough")
    fixes = []
    for text, what, key, _, _ in _TRIED:
        run, need = runs[key], runs[key].get("min_capacity_bytes")
        if run["ooms"] == 0:
            gain = need_default - need if need_default is not None and need is not None else None
            fixes.append(Fix(f"{text} ({what}): replayed under {_mib(capacity)} with no OOM, "
                             f"peak reserved {_mib(run['peak_reserved_bytes'])}; it needs "
                             f"{_mib(need)}", gain))
    notes.append("vramkit.empty_cache() between phases of the run may help too; the replay "
                 "does not model it (the OOM path already gives back every wholly free "
                 "segment)")
    if fixes:
        return summary, _rank(fixes)
    # The default settings first: on a tie, the capacity alone is the change.
    needs = [(need_default, "the default settings")] + [
        (runs[key].get("min_capacity_bytes"), text) for text, _, key, _, _ in _TRIED]
    needs = [n for n in needs if n[0] is not None]
    failing = ", ".join(f"{runs[key]['ooms']} on {key.replace('_', ' ')}" for _, _, key, _, _
                        in _TRIED)
    summary += (f"; no setting tried fits under it (out-of-memory failures: {failing})")
    if needs:
        least, where = min(needs, key=lambda n: n[0])
        numbers["min_capacity_fits"] = least
        fixes = [Fix(f"more memory: no setting fits {_mib(capacity)}; the smallest capacity "
                     f"that fits is {_mib(least)}, with {where} (the replay's search), "
                     f"{_mib(least - capacity)} more", None)]
    return summary, fixes


def from_trace(path: str, capacity: int | None, estimate_fn) -> Diagnosis:
    """The diagnosis of a trace under a capacity (doctor's module text says how)."""
    # The default settings are the cuda source's (sim models it, large blocks in virtual
    # ranges); fixed segments alone are what large blocks fixed with threshold 1 give.
    default = _replay(path, "sim", capacity)
    fixed = _replay(path, "sim", capacity, _FIXED_ALONE)
    vmm = _replay(path, "sim:vmm", capacity)
    peak_live = default["peak_live_bytes"]
    need_default = default.get("min_capacity_bytes")
    need_fixed = fixed.get("min_capacity_bytes")
    numbers = {"peak_live": peak_live, "capacity": capacity,
               "peak_reserved": default["peak_reserved_bytes"],
               "min_capacity_default": need_default, "min_capacity_fixed": need_fixed,
               "min_capacity_vmm": vmm.get("min_capacity_bytes"),
               "ooms_default": default["ooms"], "ooms_fixed": fixed["ooms"],
               "ooms_vmm": vmm["ooms"]}
    notes = _first_oom_note(default)
    where = f"trace {default['trace']} ({counted(default['ops'], 'op')})"
    if capacity is None:
        summary = (f"no capacity given: the trace needs {_need(need_default, peak_live)} on "
                   f"the default settings, {_need(need_fixed, peak_live)} on fixed segments "
                   f"alone and {_need(numbers['min_capacity_vmm'], peak_live)} on the vmm "
                   f"source (peak live {_size(peak_live)}); pass capacity= (--capacity) to "
                   f"diagnose it under a cap")
        return Diagnosis(None, summary, where, numbers, [], [], [], notes)
    if default["ooms"] == 0:
        summary = (f"it replays with no out-of-memory under {_size(capacity)} on the default "
                   f"settings (peak reserved {_size(default['peak_reserved_bytes'])}, peak "
                   f"live {_size(peak_live)})")
        if fixed["ooms"]:
            summary += (f"; on fixed segments alone (VRAMKIT_LARGE_BLOCKS=fixed "
                        f"VRAMKIT_VIRTUAL_THRESHOLD=1) "
                        f"{counted(fixed['ooms'], 'allocation')} "
                        f"fail{'s' if fixed['ooms'] == 1 else ''}: it needs "
                        f"{_need(need_fixed, peak_live)} there")
        return Diagnosis(None, summary, where, numbers, [], [], [], notes)
    if peak_live > capacity:
        shortfall = peak_live - capacity
        summary = (f"peak live memory {_size(peak_live)} is more than the capacity "
                   f"{_size(capacity)}: live memory itself is too much, by {_size(shortfall)} "
                   f"({counted(default['ooms'], 'allocation')} failed on the default settings, "
                   f"{vmm['ooms']} on vmm)")
        fixes = _live_fixes(shortfall, estimate_fn, notes)
        return Diagnosis("live", summary, where, numbers, fixes, [], [], notes)
    summary, fixes = _fragmenting_trace(path, capacity, default, {"vmm": vmm}, numbers, notes)
    return Diagnosis("fragmentation", summary, where, numbers, fixes, [], [], notes)
