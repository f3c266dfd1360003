"""Reserved memory over time for a trace: the trace is run through the engine on a fresh
sim pool and the pool's reserved bytes are read after every op.

A trace records only what was asked for, so what the allocator would reserve is found by
asking it. The replay runs in a child process (`python -m vramkit.plot._replay`) because the
pools are process-wide: a caller of vramkit.plot.plot() who has its own pools must not find
them configured or filled by a picture. The parent sends the ops on stdin as int64 triples
(size, or -1 for a free; block number; stream) and reads back (op number, reserved) pairs
wherever reserved changed; it starts the child first and collects it after the layout, so
the two overlap.
"""

from __future__ import annotations

import array
import os
import subprocess
import sys

GIB = 1 << 30


class Replay:
    """A replay under way; result() waits and gives (steps, note): steps [(time, bytes)], or
    None with a note saying why reserved is unknown."""

    def __init__(self, history):
        self._times = [t for t, _, _ in history.events]
        self._child = None
        largest = max((block.size for block in history.blocks), default=0)
        if largest >= 1 << 63:
            # More than the int64 the child reads, and than any device holds.
            self._error = (f"a block of {largest} bytes is larger than any device, so the "
                           f"trace was not replayed")
            return
        numbers = {}
        ops = array.array("q")
        for t, block, is_alloc in history.events:
            key = id(block)
            if is_alloc:
                numbers[key] = len(numbers)
                ops.extend((block.size, numbers[key], block.stream & 0x7FFFFFFF))
            else:
                ops.extend((-1, numbers[key], block.stream & 0x7FFFFFFF))
        capacity = max(80 * GIB, 4 * history.peak_allocated + GIB)
        env = dict(os.environ, VRAMKIT_SOURCE="sim", VRAMKIT_SIM_CAPACITY=str(capacity))
        for name in ("VRAMKIT_LIMIT", "VRAMKIT_PREALLOCATE"):
            env.pop(name, None)
        self._data = ops.tobytes()
        try:
            self._child = subprocess.Popen([sys.executable, "-m", "vramkit.plot._replay"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, env=env)
        except OSError as error:
            self._error = f"the replay could not start ({error})"

    def result(self):
        if self._child is None:
            return None, f"reserved is unknown: {self._error}"
        try:
            out, err = self._child.communicate(self._data, timeout=120)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.communicate()
            return None, "reserved is unknown: the replay on sim took over 2 minutes"
        if self._child.returncode != 0:
            lines = err.decode("utf-8", "replace").strip().splitlines()
            why = lines[-1] if lines else f"exit status {self._child.returncode}"
            return None, f"reserved is unknown: the replay on sim failed: {why}"
        pairs = array.array("q")
        pairs.frombytes(out)
        times = self._times
        steps = [(0.0, 0)]
        for i in range(0, len(pairs) - 1, 2):
            steps.append((times[pairs[i]], pairs[i + 1]))
        return steps, ""


def _worker():
    import vramkit

    ops = array.array("q")
    ops.frombytes(sys.stdin.buffer.read())
    vramkit.configure(0, source="sim")
    empty = vramkit.empty
    info = vramkit._core.mem_get_info
    live = {}
    out = array.array("q")
    last = 0
    for i in range(0, len(ops), 3):
        size, number, stream = ops[i], ops[i + 1], ops[i + 2]
        if size >= 0:
            live[number] = empty(size, 0, stream)
        else:
            live.pop(number).free()
        free, total = info(0)
        reserved = total - free
        if reserved != last:
            out.extend((i // 3, reserved))
            last = reserved
    # The free figure of the sim device is its capacity less what the pool holds; check that
    # reading once against the pool's own count, so a change there cannot go unnoticed.
    if last != vramkit.memory_reserved(0):
        sys.exit(f"the sim device's free memory ({total - last} reserved) disagrees with the "
                 f"pool's reserved bytes ({vramkit.memory_reserved(0)})")
    sys.stdout.buffer.write(out.tobytes())


if __name__ == "__main__":
    _worker()
