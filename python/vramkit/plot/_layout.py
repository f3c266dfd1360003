"""The timeline's geometry: which allocations are drawn as bands of their own, where each
band sits over time, and what is merged into the one band of small and short-lived blocks.

Time is cut into WIDTH buckets, one column each. An allocation gets its own band when it is
at least a pixel tall (the peak over ROWS) and outlives a bucket; a band covers the buckets
from its start's to before its end's, so every band drawn in a bucket is live at the
bucket's end. Bands are stacked oldest at the bottom, compacted at every bucket (a band
only moves down, when an older one is freed), so their stack is the bytes of the bands
live then, with no gaps; a band's bottom edge is kept as the (bucket, offset) points where
it moved.

Everything else goes into one merged band on top, and that band is what keeps the column
true: the merged blocks' most at once inside a bucket and the bands at its end need not
coexist (temporaries freed before a big block starts), so stacking one on the other would
draw more than was ever live. The merged band is drawn as its most at once, cut to what
the most live at once in the bucket (all blocks, as the engine counts allocated) leaves
above the bands; the column's top is then at most the bucket's peak allocated, which is at
most its peak reserved, the line drawn above. The hover keeps the uncut most.

This bounds the page however long the history is: at most MAX_BANDS bands and POINT_BUDGET
points; past the budget the number of bands is halved until it fits, and the page says how
many allocations were merged.
"""

from __future__ import annotations

from bisect import bisect_left

WIDTH = 1000
ROWS = 500
MAX_BANDS = 4000
POINT_BUDGET = 150_000


class Layout:
    """bands: (block, first bucket, end bucket, [bucket, bottom, ...]) in stacking order;
    per bucket, in bytes: big_top (the bands' stack), small_max and small_count (the merged
    blocks' most at once and how many), small_top (the merged band's drawn top, see the
    module note) and reserved (None if unknown)."""

    def __init__(self):
        self.width = WIDTH
        self.bands = []
        self.big_top = []
        self.small_max = []
        self.small_count = []
        self.small_top = []
        self.merged = 0
        self.reserved = None
        self.ooms = []


class _OverBudget(Exception):
    pass


def bucketer(history, width=WIDTH):
    """The function from a time to its bucket."""
    scale = width / history.end_time
    last = width - 1

    def bucket(t):
        k = int(t * scale)
        return k if k < last else last

    return bucket


def reserved_per_bucket(history, width=WIDTH):
    """The most reserved inside each bucket, or None where reserved is unknown."""
    if history.reserved is None:
        return None
    return _steps_max(history.reserved, bucketer(history, width), width)


def layout(history, width=WIDTH, max_bands=MAX_BANDS, point_budget=POINT_BUDGET):
    bucket = bucketer(history, width)
    blocks = history.blocks
    first = [bucket(b.start) for b in blocks]
    ends = [width if b.end is None else bucket(b.end) for b in blocks]
    pixel = history.peak_allocated / ROWS
    candidates = [i for i, b in enumerate(blocks) if b.size >= pixel and ends[i] > first[i]
                  and b.size > 0]
    if len(candidates) > max_bands:
        candidates = _largest(candidates, blocks, first, ends, max_bands)
    while True:
        try:
            bands, big_top = _stack(blocks, candidates, first, ends, width, point_budget)
            break
        except _OverBudget:
            candidates = _largest(candidates, blocks, first, ends, len(candidates) // 2)
    out = Layout()
    out.width = width
    out.bands = bands
    out.big_top = big_top
    big = {id(blocks[i]) for i in candidates}
    out.merged = len(blocks) - len(big)
    out.small_max, out.small_count, live_max = _small(history.events, big, bucket, width)
    out.small_top = [top + max(0, min(small, live - top))
                     for top, small, live in zip(big_top, out.small_max, live_max)]
    out.reserved = reserved_per_bucket(history, width)
    out.ooms = [(bucket(t), text) for t, text in history.ooms]
    return out


def _largest(candidates, blocks, first, ends, count):
    """The count candidates with the most area (bytes times buckets), in block order."""
    ranked = sorted(candidates, key=lambda i: blocks[i].size * (ends[i] - first[i]),
                    reverse=True)
    return sorted(ranked[:count])


def _stack(blocks, candidates, first, ends, width, point_budget):
    order = sorted(candidates, key=lambda i: (first[i], i))
    sizes = [blocks[i].size for i in order]
    points = [[] for _ in order]
    starting: dict[int, list[int]] = {}
    ending: dict[int, list[int]] = {}
    for rank, i in enumerate(order):
        starting.setdefault(first[i], []).append(rank)
        if ends[i] < width:
            ending.setdefault(ends[i], []).append(rank)
    live: list[int] = []      # ranks, ascending: the stacking order
    bottoms: list[int] = []   # the bottom offset of each live band
    top = 0
    used = 0
    big_top = [0] * width
    for k in range(width):
        gone = ending.get(k)
        if gone:
            dead = set(gone)
            cut = min(bisect_left(live, rank) for rank in gone)
            survivors = [rank for rank in live[cut:] if rank not in dead]
            del live[cut:]
            del bottoms[cut:]
            y = bottoms[-1] + sizes[live[-1]] if live else 0
            for rank in survivors:
                live.append(rank)
                bottoms.append(y)
                points[rank] += (k, y)
                y += sizes[rank]
            used += len(survivors)
            top = y
            if used > point_budget:
                raise _OverBudget
        for rank in starting.get(k, ()):
            live.append(rank)
            bottoms.append(top)
            points[rank] += (k, top)
            top += sizes[rank]
        big_top[k] = top
    bands = [(blocks[i], first[i], ends[i], points[rank]) for rank, i in enumerate(order)]
    return bands, big_top


def _small(events, big, bucket, width):
    """Per bucket: the most bytes of merged blocks live at once, how many were live, and
    the most bytes of all blocks live at once (the value carried in at its start counts)."""
    most = [0] * width
    count = [0] * width
    most_all = [0] * width
    live = live_count = live_all = 0
    k_now = 0
    for t, block, is_alloc in events:
        k = bucket(t)
        if k > k_now:
            for j in range(k_now + 1, k + 1):
                most[j] = live
                count[j] = live_count
                most_all[j] = live_all
            k_now = k
        live_all += block.size if is_alloc else -block.size
        if live_all > most_all[k_now]:
            most_all[k_now] = live_all
        if id(block) in big:
            continue
        if is_alloc:
            live += block.size
            live_count += 1
            count[k_now] += 1
            if live > most[k_now]:
                most[k_now] = live
        else:
            live -= block.size
            live_count -= 1
    for j in range(k_now + 1, width):
        most[j] = live
        count[j] = live_count
        most_all[j] = live_all
    return most, count, most_all


def _steps_max(steps, bucket, width):
    """The highest value of a step series inside each bucket."""
    out = [0] * width
    value = 0
    k_now = 0
    for t, v in steps:
        k = bucket(t)
        if k > k_now:
            for j in range(k_now + 1, k + 1):
                out[j] = value
            k_now = k
        value = v
        if v > out[k_now]:
            out[k_now] = v
    for j in range(k_now + 1, width):
        out[j] = value
    return out
