"""vramkit.Pool: a memory pool as an object, private or a device's default pool.

``vramkit.Pool(source="sim", capacity="8G", limit="4G")`` makes a private pool of its own,
with its own statistics, limit, cache, history and snapshot, beside the process-wide
default pools (one per device), which :func:`default_pool` gives as instances of the same
class. The options are those of the ``VRAMKIT_*`` variables, by their lower-case names
without the prefix (``capacity`` standing for ``sim_capacity``), and the engine reads their
values as it reads the variables: this module only names them.

A private pool reads no environment. Each ``DeviceBuffer`` it gives keeps it alive, so
``del pool`` while buffers are live frees nothing early; ``close()`` destroys it at once and
refuses with ``BusyError`` (the pool staying open) while any block is live, as RMM's and
CuPy's pools never free memory under a live buffer. On a default pool, which belongs to the
process, ``close()`` does nothing.
"""

from __future__ import annotations

import difflib
import sys

from . import _core
from ._shown import shown

# Option names that differ from their variable's: the sim device's capacity is the option a
# private sim pool is most often made for.
_ALIASES = {"capacity": "VRAMKIT_SIM_CAPACITY"}


def _pool_options() -> dict[str, str]:
    """Option name -> VRAMKIT_* variable, from the engine's table of variables."""
    names = {name[len("VRAMKIT_"):].lower(): name
             for name, _help, pool_option in _core.env_variables() if pool_option}
    names.update(_ALIASES)
    return names


def _options_whose_help_says(words: str) -> set[str]:
    """The pool options whose help (the engine's table) says `words`."""
    return {name for name, text, pool_option in _core.env_variables()
            if pool_option and words in text}


def _takes_percentages() -> set[str]:
    """The variables whose sizes may be a share of the device, as their help says."""
    return _options_whose_help_says("percentage")


def _switches() -> set[str]:
    """The on/off variables (give_back), whose help spells the engine's words for off."""
    return _options_whose_help_says("off, false or no")


def _config_error(message: str):
    return _core.error(_core.VRAM_EENV, message)


def _option_text(name: str, value, percentages: bool, switch: bool) -> str:
    """A value as the variable's text; the engine, not Python, says whether it is right. A
    float given for a size that takes percentages is a fraction of the device (0.5: "50%"),
    as in set_limit(); a bool is an on/off switch's value (give_back=False)."""
    if isinstance(value, str):
        if "\x00" in value:  # the engine reads C strings: the rest would be dropped unseen
            raise _config_error(f"Pool(): {name} holds a NUL character: "
                                f"'{shown(value[:60])}'")
        return value
    if isinstance(value, bool):
        if switch:
            return "on" if value else "off"
        raise TypeError(f"{name} must be a str, int or float, not bool")
    if isinstance(value, float) and percentages and 0.0 < value <= 1.0:
        return f"{value * 100:.10g}%"
    if isinstance(value, float) and percentages and value > 1.0:
        # A float is a fraction of the device; 2.0 was two bytes.
        raise _config_error(f"Pool(): {name} as a float is a fraction of the device, from "
                            f"0 to 1, not {value!r}: give bytes as an int or a size such "
                            f"as '2G'")
    if isinstance(value, (int, float)):
        return repr(value)
    raise TypeError(f"{name} must be a str, int or float, not {type(value).__name__}")


def _overrides(options: dict) -> dict:
    """{VRAMKIT_* name: (option, text)} of Pool()'s keyword options."""
    known, percentages, switches = _pool_options(), _takes_percentages(), _switches()
    out = {}
    for name, value in options.items():
        if value is None:
            continue  # the engine's default
        variable = known.get(name)
        if variable is None:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise _config_error(f"Pool(): unknown option {name!r}{hint}; the options are "
                                f"{', '.join(sorted(known))}")
        if variable in out:
            raise _config_error(f"Pool(): {out[variable][0]} and {name} are one option "
                                f"({variable}): give one")
        out[variable] = (name, _option_text(name, value, variable in percentages,
                                            variable in switches))
    return out


def _pkg():
    return sys.modules[__package__]


class Pool(_core.Pool):
    """A memory pool: ``Pool(source="sim", capacity="8G", limit="4G", device=0, **options)``
    makes a private one; :func:`default_pool` gives a device's default pool.

    Options (each None: the engine's default; no environment is read): source ("auto",
    "sim", "sim:vmm", "cuda", "vmm", "managed"), capacity (the sim device's size, "8G"),
    limit, preallocate (bytes, a size, a percentage such as "50%" or a fraction such as
    0.5), release_threshold,
    tight_threshold, virtual_threshold, large_blocks, and the give-back group's: give_back
    (True, or False to keep its cache when a neighbour on the device runs out),
    give_back_timeout (milliseconds it waits for its neighbours, 0 to 10000), group_limit
    and soft_limit (sizes as limit), no_split (True: each buffer a segment of its own,
    never split): the VRAMKIT_* variables' names and values. A bad name or value raises
    ConfigError naming the option.
    """

    _recording = None  # what record_memory_history() started on a private pool

    def __init__(self, source: str | None = "auto", capacity=None, limit=None, device=0,
                 **options) -> None:
        options = {"source": source, "capacity": capacity, "limit": limit, **options}
        super().__init__(_pkg()._device(device), _overrides(options))

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except _core.BusyError:
            # Buffers still live (a traceback's frames may hold them): the pool goes with
            # the last of them, and the exception in flight is the one to see.
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        kind = "default" if self.is_default else "closed" if self.closed else "private"
        return f"<vramkit.Pool {kind} device={self.device} source={self.source}>"

    def set_limit(self, limit, fraction: float = 0.0) -> None:
        """Hard limit on the memory the pool reserves: bytes (int), a size ("1G"), a
        percentage ("50%") or a fraction (0.5) of the device; 0 removes it."""
        if isinstance(limit, int) and not isinstance(limit, bool):
            super().set_limit(limit, fraction)
            return
        super().set_limit(*_pkg()._limit_args(limit))

    def memory_stats(self) -> dict:
        """The flat dict of vramkit.memory_stats(), for this pool."""
        return _pkg()._flat_stats(self.stats(), self.split_stats())

    def memory_allocated(self) -> int:
        """Bytes held by live blocks of this pool."""
        return self.stats()["allocated_bytes"][0]

    def memory_reserved(self) -> int:
        """Bytes this pool holds from its source, cached or in use."""
        return self.stats()["reserved_bytes"][0]

    # -- history and snapshots, in the format of vramkit.snapshot() -----------------------

    def record_memory_history(self, enabled: str | None = "all", stacks: str | None = "python",
                              max_entries: int | None = None) -> None:
        """vramkit.record_memory_history() for this pool alone."""
        from .observe import history

        if self.is_default:
            kwargs = {} if max_entries is None else {"max_entries": max_entries}
            history.record_memory_history(enabled, stacks, device=self.device, **kwargs)
            return
        if max_entries is None:
            max_entries = history.DEFAULT_MAX_ENTRIES
        history.check_recording_args(enabled, stacks, max_entries)
        if enabled is None:
            if self._recording is not None and self._recording.on:
                self.history_stop()
                self._recording.on = False
            return
        ring = history.ring_size(enabled, max_entries)
        self.history_start(ring, stacks is not None)
        # As the default pools' recordings: the blocks live at the start, which marks the
        # start in the history with a snapshot event.
        baseline = history.live_blocks_of(*self.snapshot_records()) if enabled == "all" else []
        self._recording = history._Recording(enabled, stacks, max_entries, baseline)

    def annotate(self, name: str) -> None:
        """vramkit.annotate() in this pool's history."""
        from .observe import history

        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if self.is_default:
            history.annotate(name, self.device)
        elif self._recording is None:
            raise _core.error(_core.VRAM_EINVAL, "Pool.annotate(): this pool records no "
                              "history; call record_memory_history() first")
        else:
            self.history_annotate(history._new_annotation(name))

    def snapshot(self) -> dict:
        """The dict of vramkit.snapshot() (torch.cuda.memory._snapshot()) for this pool."""
        from .observe import history

        if self.is_default:
            return history.snapshot(self.device)
        rec = self._recording
        segs, blocks = self.snapshot_records()
        raw = history.raw_records(segs, blocks, self.history_read()
                                  if rec is not None and rec.enabled == "all" else None)
        recordings = {self.device: rec} if rec is not None else {}
        return history.assemble_snapshot({self.device: raw}, recordings, [self.source])

    def dump_snapshot(self, path="dump_snapshot.pickle") -> None:
        """snapshot() as vramkit.dump_snapshot() writes it: a pickle PyTorch's viewer and
        `vramkit plot` read."""
        import pickle

        with open(path, "wb") as f:
            pickle.dump(self.snapshot(), f, protocol=4)

    def memory_history(self) -> list[dict]:
        """The recorded events as trace entries, as vramkit.memory_history()."""
        from .observe import history

        if self.is_default:
            return history.memory_history(self.device)
        if self._recording is None or self._recording.enabled != "all":
            raise _core.error(_core.VRAM_EINVAL, "Pool.memory_history(): this pool records "
                              "no events; call record_memory_history(enabled='all') first")
        raw, _ = self.history_read()
        return history.trace_entries(raw)


    def save_trace(self, path) -> int:
        """The recorded history as a vramkit trace, as vramkit.save_trace() writes a
        device's: `vramkit replay` and vramkit.replay() read it. Returns the ops written."""
        from .observe import history

        if self.is_default:
            return history.save_trace(path, self.device)
        if self._recording is None or self._recording.enabled != "all":
            raise _core.error(_core.VRAM_EINVAL, "Pool.save_trace(): this pool records no "
                              "events; call record_memory_history(enabled='all') first")
        raw, dropped = self.history_read()
        events = list(history._EVENT.iter_unpack(raw))
        ops = history.recorded_ops(events, dropped, self._recording.baseline, "this pool")
        return history.write_trace(path, ops, f"recorded by vramkit.Pool.save_trace "
                                              f"({self.source} source)")


_default_pools: dict[int, Pool] = {}


def default_pool(device=None) -> Pool:
    """The default pool of a device (None: device 0) as a Pool: the one that
    vramkit.empty(), vramkit.memory_stats() and PyTorch's hooks use. The process owns it:
    its close() does nothing."""
    d = _pkg()._device(device)
    pool = _default_pools.get(d)
    if pool is None:
        pool = _default_pools.setdefault(d, Pool._of_default(d))
    return pool
