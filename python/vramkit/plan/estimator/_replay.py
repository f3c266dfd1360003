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
from ..._shown import ShownText, shown
from .. import _replaying
from . import torch_caching


def check_source(source: str, named: str = "estimate(): source") -> None:
    """A source the estimate can model: any the engine names, but auto (which the caller
    resolves first). ``named`` is where the value came from (the argument, or the
    environment variable), for the message, which shows the value escaped once."""
    names = [name for name in _core.source_names() if name != "auto"]
    if source not in names:
        raise ValueError(ShownText(f"{named} must be one of {', '.join(names)}, "
                                   f"not '{shown(source)}'"))


def write_trace(events, path: str, comment: str) -> int:
    """Write ``events`` (("a", id, size, stream), ("f", id, stream)) as a trace whose
    times are the ops' numbers, through the package's one trace writer."""
    from ...observe.history import write_trace as write

    timed = (event + (t,) for t, event in enumerate(events))
    return write(path, timed, comment)


def vramkit_replay(trace: str, source: str, capacity: int | None,
                   min_capacity: bool = False, device: int | None = None) -> dict:
    """One replay of the trace on the simulated device, in this process (vramkit.replay);
    the keys of ``vramkit replay --json``. ``device``: the simulated device's size where
    there is no cap (else the engine's default)."""
    check_source(source)
    # The user's placement settings count (they change what fits); sizes, limits and the
    # source are this call's: vramkit.replay's one rule. The engine picks the host model.
    settings = _replaying.placement_settings()
    if device is not None:
        settings["VRAMKIT_SIM_CAPACITY"] = str(device)
    return _replaying.replay(trace, source=source, capacity=capacity,
                             min_capacity=min_capacity, settings=settings, host_model=True)


def vramkit_replay_uncapped(trace: str, source: str, peak_live: int,
                            min_capacity: bool = False) -> dict:
    """The replay with no cap: on the engine's default simulated device where the step's
    ``peak_live`` bytes fit it, else on one twice that, doubled until the step runs
    without running out of memory, as on a card large enough for it. A step larger than
    any device the engine models (_core.SIM_MAX_CAPACITY) cannot be estimated."""
    from ._step import LargerThanAnyDevice

    device = None if peak_live <= _core.SIM_DEFAULT_CAPACITY else 2 * peak_live
    while True:
        if device is not None and device > _core.SIM_MAX_CAPACITY:
            raise LargerThanAnyDevice(
                f"estimate(): the step holds {peak_live:,} bytes at its peak, more than the "
                f"largest device vramkit models ({_core.SIM_MAX_CAPACITY:,} bytes): it fits "
                f"no card; a smaller model, batch or sequence might")
        result = vramkit_replay(trace, source, None, min_capacity, device)
        if not result.get("ooms"):
            return result
        device = 2 * (device or peak_live)


def torch_replay(events, expandable: bool, capacity: int | None) -> dict:
    return torch_caching.replay(events, expandable_segments=expandable, capacity=capacity)
