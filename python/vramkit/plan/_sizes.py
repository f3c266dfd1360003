"""A size a caller gives (a card's memory, a cap, a replay's capacity) as bytes, checked
once for every part of the package that takes one: an int above 0 or a string such as
'24G', up to the largest device the engine models. Needs only the engine, not PyTorch.
"""

from __future__ import annotations

from .. import _core


def checked_size(value, what: str) -> int | None:
    """A size as bytes (None stays None): an int above 0 or a string like '24G', up to
    the largest device vramkit models. TypeError or ValueError that names ``what``
    otherwise (the command line passes its option's name, a function its argument's)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be a size in bytes or a string like '24G', not "
                        f"{type(value).__name__}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{what} must be positive, not {value}")
        nbytes = value
    else:
        try:
            nbytes, fraction = _core.parse_size(value)
        except ValueError as error:
            raise ValueError(f"{what}: {error}") from None
        if fraction or nbytes <= 0:
            raise ValueError(f"{what} must be a size above 0 like '24G', not {value!r}")
    if nbytes > _core.SIM_MAX_CAPACITY:
        # Checked before the step runs: past it the replay cannot model the device (and an
        # int past 64 bits would wrap to a small cap on its way to the engine).
        raise ValueError(f"{what} of {nbytes:,} bytes is more than the largest device "
                         f"vramkit models ({_core.SIM_MAX_CAPACITY >> 40} TiB)")
    return nbytes
