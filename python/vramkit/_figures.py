"""How vramkit writes figures in text: byte counts in binary units and counts with their noun.

The doctor, the leak report and the memory logger print sizes to different precisions but
by one rule, the engine's (src/obs/stats.c): the unit is that of the figure as printed, so a
value that rounds to 1024 of a unit is shown as 1 of the next ("1.0 GiB", never "1024.0
MiB"). Kept here once so that the three cannot drift apart.
"""

from __future__ import annotations

import math

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def binary_size(value, decimals: int = 1, up: bool = False, units=UNITS) -> str:
    """``value`` bytes in the largest of ``units`` it fills once rounded to ``decimals``
    digits (plain bytes have none). up: rounded up rather than to the nearest, for an
    amount a user sets as read (a limit to raise to), which rounded down would fall short."""
    scale = 10 ** decimals

    def printed(x: float) -> float:
        return math.ceil(x * scale) / scale if up else round(x, decimals)

    v, unit = float(abs(value)), 0
    while unit < len(units) - 1 and (printed(v) if unit else v) >= 1024:
        v /= 1024
        unit += 1
    sign = "-" if value < 0 else ""
    if not unit:
        return f"{sign}{abs(value):.0f} B"
    return f"{sign}{printed(v):.{decimals}f} {units[unit]}"


def counted(n: int, noun: str) -> str:
    """A count with its noun, singular for one: "1 step", "3 records"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
