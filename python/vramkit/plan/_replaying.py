"""vramkit.replay(): a trace replayed by the engine in this process, with the figures of
``vramkit replay --json`` (the library's vram_replay_run, through _core).

One rule says which settings a replay runs under, for every caller (the estimator, the
doctor, scripts): the replay reads no environment at all. Its pool is the library's
defaults on ``source``, with ``capacity`` as both limit and sim capacity, and then the
``settings`` given, ``{"VRAMKIT_LARGE_BLOCKS": "fixed", ...}``, names as the environment
spells them. A caller that wants the user's own placement to count (what fits depends on
it) passes :func:`placement_settings`, the user's ``VRAMKIT_*`` placement variables; sizes,
limits, preallocation and the source are never taken from the environment, since they are
the question a replay asks. On a host model its pools are the process's own (the engine's
``private_pools``): never a sim device other processes share (``VRAMKIT_SIM_SHARED``), no
leak report, no record published for ``vramkit top``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping

from .. import _core
from ._sizes import checked_size

# The most passes one replay times, as the command's --repeat takes them.
MOST_REPEATS = 1000
# The most ops a trace may be allowed: the engine counts them in a signed 64-bit integer.
_MOST_OPS = (1 << 63) - 1

# The pool settings that change where blocks go, and so what fits, without changing the
# device or its cap: the ones a replay may take from the user's environment.
PLACEMENT_SETTINGS = ("VRAMKIT_TIGHT_THRESHOLD", "VRAMKIT_VIRTUAL_THRESHOLD",
                      "VRAMKIT_LARGE_BLOCKS")


def placement_settings(environ=None) -> dict:
    """The user's placement variables (PLACEMENT_SETTINGS) that are set in ``environ``
    (default os.environ), for ``replay(settings=...)``."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in PLACEMENT_SETTINGS if name in environ}


def replay(path, source: str = "sim", capacity: int | None = None,
           min_capacity: bool = False, repeat: int = 1, settings: dict | None = None,
           max_ops: int | None = None, host_model: bool = False) -> dict:
    """Replay the trace at ``path`` on pools of its own (never the process-wide ones).

    Returns a dict with the keys of ``vramkit replay --json`` (trace, source, ops,
    peak_live_bytes, peak_reserved_bytes, reserved_over_live, ns_per_op, ooms,
    skipped_frees, repeat, device_calls; capacity_bytes with a capacity; min_capacity_bytes,
    min_capacity_over_live and min_capacity_source with min_capacity) and
    first_oom_report, the pool's report of the first out-of-memory, and first_oom, its
    figures and cause as ``_core.oom_info`` gives them (each None without one).
    ns_per_op and reserved_over_live are None where no op ran (a pool whose
    preallocation did not fit the capacity is never made: one out-of-memory, nothing
    timed); reserved_over_live is None too where ops ran out of memory, whose bytes the
    trace's peak live counts but the pool never held.
    ``capacity`` is None (no cap) or a size above 0 (bytes, or a string such as '24G');
    ``repeat`` from 1 to MOST_REPEATS; ``max_ops`` None (the engine's default bound) or 1
    or more; anything else raises ValueError or TypeError naming the argument.
    Out-of-memory is a figure, not an error. A path that names no file raises
    FileNotFoundError, a folder IsADirectoryError, a file that cannot be read or
    decompressed OSError; a malformed record or a bad setting raises vramkit.VramError
    (ConfigError for a bad value). See the module's note for ``settings``.
    ``host_model=True`` replays on the engine's host model of ``source`` (sim for cuda and
    managed, sim:vmm for vmm: what a machine without a GPU can measure of them).
    """
    capacity = checked_size(capacity, "replay(): capacity")
    for name, value, most in (("repeat", repeat, MOST_REPEATS),
                              ("max_ops", 1 if max_ops is None else max_ops, _MOST_OPS)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"replay(): {name} must be a whole number from 1 to {most:,}, "
                             f"not {value!r}")
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"replay(): settings must be a mapping of VRAMKIT_* names to values, "
                        f"not {type(settings).__name__}")
    path = os.fspath(path)
    # What Python's own readers raise for a path that names no file or a folder (os.stat,
    # not open(): a named pipe would wait for its writer, and the engine opens it itself).
    if stat.S_ISDIR(os.stat(path).st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    pairs = tuple((str(k), str(v)) for k, v in (settings or {}).items())
    return _core.replay(path, source=source, capacity=capacity or 0,
                        min_capacity=bool(min_capacity), repeat=repeat, settings=pairs,
                        max_ops=-1 if max_ops is None else max_ops,
                        host_model=bool(host_model))
