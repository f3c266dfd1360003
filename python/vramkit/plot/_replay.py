"""Reserved memory over time for a trace: the trace is run through the engine on a private
sim pool and the pool's reserved bytes are read after every op.

A trace records only what was asked for, so what the allocator would reserve is found by
asking it. The replay runs in this process on a pool of its own (vramkit._core.
replay_reserved, through vram_pool_create), never on the process-wide default pools, so a
caller of vramkit.plot.plot() who has its own pools does not find them configured or
filled by a picture; and it reads no VRAMKIT_* setting, so the picture is the engine's
defaults on a device large enough for the trace.
"""

from __future__ import annotations

import array

GIB = 1 << 30


def _stream_numbers(streams) -> dict:
    """The number each trace stream is replayed as. A trace's stream is any unsigned 64-bit
    number and the replay's ops are int64: a stream under 2**31 keeps its number (0 is the
    default stream, as in `vramkit replay`), and each larger one takes the next number no
    stream of the trace holds, so that distinct streams stay distinct (the pool tells
    streams apart by equality)."""
    numbers = {s: s for s in streams if s < 1 << 31}
    spare = max(numbers, default=-1) + 1
    for s in sorted(streams - numbers.keys()):
        numbers[s], spare = spare, spare + 1
    return numbers


class Replay:
    """A trace's reserved bytes; result() gives (steps, note): steps [(time, bytes)], or
    None with a note saying why reserved is unknown."""

    def __init__(self, history):
        self._times = [t for t, _, _ in history.events]
        self._error = None
        self._pairs = None
        largest = max((block.size for block in history.blocks), default=0)
        if largest >= 1 << 63:
            # More than the int64 the replay reads, and than any device holds.
            self._error = (f"a block of {largest} bytes is larger than any device, so the "
                           f"trace was not replayed")
            return
        numbers = {}
        streams = _stream_numbers({block.stream for _, block, _ in history.events})
        ops = array.array("q")
        for t, block, is_alloc in history.events:
            key = id(block)
            stream = streams[block.stream]
            if is_alloc:
                numbers[key] = len(numbers)
                ops.extend((block.size, numbers[key], stream))
            else:
                ops.extend((-1, numbers[key], stream))
        capacity = max(80 * GIB, 4 * history.peak_allocated + GIB)
        self._ops, self._capacity, self._blocks = ops.tobytes(), capacity, len(numbers)

    def result(self):
        if self._error is not None:
            return None, f"reserved is unknown: {self._error}"
        from .. import _core

        try:
            out = _core.replay_reserved(self._ops, self._capacity, self._blocks)
        except _core.VramError as error:
            return None, f"reserved is unknown: the replay on sim failed: {error}"
        pairs = array.array("q")
        pairs.frombytes(out)
        times = self._times
        steps = [(0.0, 0)]
        for i in range(0, len(pairs) - 1, 2):
            steps.append((times[pairs[i]], pairs[i + 1]))
        return steps, ""
