"""From a recorded step to reserved memory: the engine's policy and PyTorch's, on a model.

The recording is written as a vramkit trace and replayed in this process by the engine
(vramkit.replay, the loop of ``vramkit replay``) on the engine's host model of the chosen
source (``sim`` or ``sim:vmm``), a simulated device of the chosen size run by the engine's
own placement code, so the reserved figure is what vramkit would hold, not a formula. The
same events go through :mod:`.torch_caching`, a model of PyTorch's caching allocator
(default and expandable segments), for users who keep PyTorch's.
"""

from __future__ import annotations

from ... import _core
from .. import _replaying
from . import torch_caching


def check_source(source: str) -> None:
    """A source the estimate can model: any the engine names, but auto (which the caller
    resolves first)."""
    names = [name for name in _core.source_names() if name != "auto"]
    if source not in names:
        raise ValueError(f"estimate(): source must be one of {', '.join(names)}, "
                         f"not {source!r}")


def write_trace(events, path: str, comment: str) -> int:
    """Write ``events`` (("a", id, size, stream), ("f", id, stream)) as a trace whose
    times are the ops' numbers, through the package's one trace writer."""
    from ...observe.history import write_trace as write

    timed = (event + (t,) for t, event in enumerate(events))
    return write(path, timed, comment)


def vramkit_replay(trace: str, source: str, capacity: int | None,
                   min_capacity: bool = False) -> dict:
    """One replay of the trace on the simulated device, in this process (vramkit.replay);
    the keys of ``vramkit replay --json``."""
    check_source(source)
    # The user's placement settings count (they change what fits); sizes, limits and the
    # source are this call's: vramkit.replay's one rule. The engine picks the host model.
    settings = _replaying.placement_settings()
    return _replaying.replay(trace, source=source, capacity=capacity,
                             min_capacity=min_capacity, settings=settings, host_model=True)


def torch_replay(events, expandable: bool, capacity: int | None) -> dict:
    return torch_caching.replay(events, expandable_segments=expandable, capacity=capacity)
