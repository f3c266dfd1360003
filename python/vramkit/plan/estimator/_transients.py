"""The blocks an op allocates and frees inside itself, as the models give them to the recorder.

A transient is written one of two ways:

- bytes (an int): one block, allocated after the op's outputs and freed at once. The
  table shipped for machines without a GPU, and measurements where the allocator's history
  could not be read, give this;
- a sequence (a tuple of ints), where a measurement saw each block: a positive number
  allocates that many bytes, ``-k`` frees the k-th block the sequence allocated, and
  ``0`` (OUTPUT) is where the op made its next output. A column sum's staging buffer and
  its 512-byte semaphore are two blocks, freed in the order the kernel frees them;
  written as one block of their sum, they fill holes neither would, and the allocators'
  figures part from the real step's. Where the outputs are marked, the recorder puts each
  block where the op made it among its outputs (a layer norm copies a strided input
  before it makes its output; a convolution's backward takes the workspace of the input's
  gradient before it makes the weight's gradient): blocks placed after every output
  leave other holes, in which the real step's later blocks do not land.

Sequences come from the allocator's own history (PyTorch's ``_record_memory_history``,
which vramkit's backend serves too), recorded around the one measured call when nothing
else records; a user's recording is never touched, and the call is then measured in bytes.
"""

from __future__ import annotations

import contextlib

# A sequence's step for "the op made its next output here".
OUTPUT = 0

# What the caches of measured transients are named by: sequences with their outputs
# marked (2) are kept apart from the sequences measured before (1), which had none.
SEQUENCE_VERSION = 2

# The most steps a sequence read from a cache file may have: far above what one op makes,
# low enough that a damaged file cannot make the recorder allocate without end.
MAX_STEPS = 4096

# Ring size for the measured call's recording: a call that allocates more blocks than
# this is measured in bytes instead.
_RECORDED_ENTRIES = 16384


def _rounded(size: int) -> int:
    return (size + 511) // 512 * 512


def transient_bytes(transient) -> int:
    """The most the transient holds at once, in the allocator's 512-byte units."""
    if isinstance(transient, int):
        return transient
    sizes, live, peak = [], 0, 0
    for step in transient:
        if step > 0:
            sizes.append(_rounded(step))
            live += sizes[-1]
            peak = max(peak, live)
        elif step < 0:
            live -= sizes[-step - 1]
    return peak


def outputs_marked(transient) -> int:
    """How many of the op's outputs the transient places (its OUTPUT steps)."""
    return 0 if isinstance(transient, int) else sum(1 for step in transient
                                                    if step == OUTPUT)


def is_transient(value) -> bool:
    """Whether ``value`` (read from a cache file) is a transient: bytes >= 0, or a
    sequence in which every block is allocated once and freed once, after it was made
    (outputs marked anywhere)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if not isinstance(value, (list, tuple)) or len(value) > MAX_STEPS:
        return False
    made, freed = 0, set()
    for step in value:
        if isinstance(step, bool) or not isinstance(step, int):
            return False
        if step == OUTPUT:
            continue
        if step > 0:
            made += 1
        elif -step > made or -step in freed:
            return False
        else:
            freed.add(-step)
    return made == len(freed)


def as_transient(value):
    """A transient read from JSON (where a sequence is a list) as the models keep it."""
    return value if isinstance(value, int) else tuple(value)


def sequence_of(entries) -> tuple:
    """The transient sequence of the blocks a recorded call both allocated and freed
    (PyTorch's device trace entries, oldest first), with an OUTPUT step where it made each
    block still live at the end (its outputs); blocks made before it are left out."""
    events, open_at, freed_by = [], {}, {}
    for entry in entries:
        action = entry.get("action")
        if action == "alloc":
            open_at[entry["addr"]] = len(events)
            events.append(int(entry["size"]))
        elif action == "free_requested" and entry["addr"] in open_at:
            freed_by[len(events)] = open_at.pop(entry["addr"])
            events.append(None)
    kept = set(freed_by.values())
    number, steps = {}, []
    for i, size in enumerate(events):
        if size is not None and i in kept:
            number[i] = len(number) + 1
            steps.append(size)
        elif size is not None:
            steps.append(OUTPUT)
        else:
            steps.append(-number[freed_by[i]])
    if not number:
        return ()  # nothing transient: the outputs alone change nothing
    return tuple(steps)


class Recorded:
    """What :func:`blocks_recorded` saw: ``steps``, the transient sequence, once read."""
    steps: tuple | None = None


@contextlib.contextmanager
def blocks_recorded(device):
    """Record the blocks made on ``device`` inside the ``with`` body through PyTorch's
    memory history; yields a :class:`Recorded`, or None where history cannot be used (a
    recording already running, no CUDA device, or no history to read)."""
    import torch
    try:
        busy = device.type != "cuda" or torch._C._cuda_isHistoryEnabled()
    except (AttributeError, RuntimeError):
        busy = True
    if busy:
        yield None
        return
    seen = Recorded()
    memory = torch.cuda.memory
    memory._record_memory_history(enabled="all", context=None, stacks="python",
                                  max_entries=_RECORDED_ENTRIES)
    try:
        yield seen
        traces = memory._snapshot()["device_traces"]
        index = device.index if device.index is not None else torch.cuda.current_device()
        trace = traces[index] if index < len(traces) else []
        if len(trace) < _RECORDED_ENTRIES:  # a full ring may have lost the first blocks
            seen.steps = sequence_of(trace)
    finally:
        memory._record_memory_history(enabled=None)
