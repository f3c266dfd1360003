"""The torch.cuda calls a step makes besides its tensors, answered for the CPU stand-in.

A training step calls more of torch.cuda than its tensors do: ``torch.cuda.synchronize()``
around a timer, ``reset_peak_memory_stats()`` before it logs memory, the device's name or
capability to choose a dtype or a kernel, ``set_device`` and ``with torch.cuda.device(i)``,
streams and events. On a machine without a driver each of those raises, so the estimate
of a step that runs on any GPU failed there. For the length of an estimate on the CPU
stand-in (``_emulate.emulated_cuda``) they answer as device 0, an H200 (the card whose
measurements the estimator's tables hold), would:

- synchronizing, resetting memory statistics, setting the device and entering a device
  context do nothing: the stand-in runs every operation in order, on one device;
- the device's name, capability, properties and free memory are the H200's (free: all of
  it, since the stand-in holds no real memory); its random generator's state, saved and
  restored around a step's random ops, is a state of CUDA's size that restoring ignores,
  and a ``torch.Generator(device="cuda")`` is a CPU generator;
- streams and events are stand-ins whose waits and queries return at once and whose timings
  are zero: the stand-in has one stream. ``tensor.record_stream(stream)`` takes them (and
  does nothing, as a use on the one stream would).

What stays the machine's own: ``is_available()`` and ``device_count()`` (libraries cache
them, and a step that asks them is choosing where to run, which a stand-in cannot decide
for it), and the memory figures (``memory_allocated()`` and the like), which read the real
allocator, not the estimate. Where code outside PyTorch asks ``is_available()`` (a library
choosing its path: accelerate turns fp16 mixed precision off without CUDA), the count of
such questions comes back with the answered calls, for a note. Nothing here runs on a
machine with a GPU: there the step runs on fake CUDA tensors against the real driver.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from types import SimpleNamespace

import torch

from ._record import _folded_prefixes

# The calls answered so far in the estimate running now (answered_on_cpu), by name.
_answered: Counter | None = None


def _count(name: str) -> None:
    if _answered is not None:
        _answered[name] += 1


# The card the stand-in answers for (an H200 as PyTorch 2.11 reports it).
CARD = SimpleNamespace(name="NVIDIA H200", major=9, minor=0,
                       total_memory=143771 * (1 << 20), multi_processor_count=132,
                       is_integrated=False, is_multi_gpu_board=False)


class _Event:
    """torch.cuda.Event on one in-order device: recorded work is done at once."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        _count("Event")

    def record(self, stream=None):
        return None

    def wait(self, stream=None):
        return None

    def query(self):
        return True

    def synchronize(self):
        return None

    def elapsed_time(self, end_event):
        return 0.0


class _Stream:
    """torch.cuda.Stream on one in-order device: every wait returns at once."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("cuda", 0)
        self.priority = priority
        _count("Stream")

    def wait_stream(self, stream):
        return None

    def wait_event(self, event):
        return None

    def record_event(self, event=None):
        return event if event is not None else _Event()

    def query(self):
        return True

    def synchronize(self):
        return None

    def __eq__(self, other):
        return isinstance(other, _Stream)

    def __hash__(self):
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_THE_STREAM = _Stream()


class _Device:
    """``with torch.cuda.device(i)``: one device, nothing to switch."""

    def __init__(self, device=None):
        self.idx = 0
        _count("device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _nothing(*args, **kwargs):
    return None


# CUDA's generator state as get_rng_state() gives it: a host tensor of 16 bytes (the
# seed and the Philox offset). Made once, outside any estimate: a host tensor is no part
# of the step's device memory, which one made under the stand-in would count as.
_RNG_STATE = torch.zeros(16, dtype=torch.uint8)


_ANSWERS = {
    "synchronize": _nothing,
    "set_device": _nothing,
    "reset_peak_memory_stats": _nothing,
    "reset_max_memory_allocated": _nothing,
    "reset_max_memory_cached": _nothing,
    "reset_accumulated_memory_stats": _nothing,
    "current_device": lambda: 0,
    "get_device_name": lambda device=None: CARD.name,
    "get_device_capability": lambda device=None: (CARD.major, CARD.minor),
    "get_device_properties": lambda device=None: CARD,
    "mem_get_info": lambda device=None: (CARD.total_memory, CARD.total_memory),
    "is_bf16_supported": lambda including_emulation=True: True,
    "current_stream": lambda device=None: _THE_STREAM,
    "default_stream": lambda device=None: _THE_STREAM,
    "get_rng_state": lambda device="cuda": _RNG_STATE,
    "set_rng_state": lambda new_state, device="cuda": None,
    "get_rng_state_all": lambda: [_RNG_STATE],
    "set_rng_state_all": lambda new_states: None,
    "Stream": _Stream,
    "stream": lambda stream=None: contextlib.nullcontext(stream),
    "Event": _Event,
    "device": _Device,
}


def _counted(name, answer):
    def counted(*args, **kwargs):
        _count(name)
        return answer(*args, **kwargs)
    return counted


# The key under which answered_on_cpu counts is_available() asked outside PyTorch (and
# answered with the machine's own False).
ASKED_AVAILABLE = "is_available"
_MACHINERY = _folded_prefixes()  # PyTorch's folder and vramkit's


def _asked_by_a_library(original):
    def is_available():
        caller = os.path.abspath(sys._getframe(1).f_code.co_filename)
        if not caller.startswith(_MACHINERY):
            _count(ASKED_AVAILABLE)
        return original()
    return is_available


_GENERATOR = torch.Generator


class _GeneratorKind(type(_GENERATOR)):
    def __instancecheck__(cls, value):
        return isinstance(value, _GENERATOR)  # the generators made before it are too


class _Generator(_GENERATOR, metaclass=_GeneratorKind):
    """``torch.Generator(device="cuda")``: the CPU's generator, which the stand-in's
    random ops take (a generator holds no device memory)."""

    def __new__(cls, device="cpu"):
        where = torch.device(device)
        if where.type == "cuda":
            _count("Generator")
            return _GENERATOR("cpu")
        return _GENERATOR(device)


def _recorded_on(original):
    """``Tensor.record_stream`` that takes the answered streams: PyTorch's parses only its
    own. On one in-order device a block's use on a stream changes nothing."""
    def record_stream(tensor, stream):
        if isinstance(stream, _Stream):
            _count("record_stream")
            return None
        return original(tensor, stream)
    return record_stream


@contextlib.contextmanager
def answered_on_cpu():
    """The torch.cuda calls of ``_ANSWERS`` answered as described above, for its length;
    and a ``GradScaler("cuda")`` made in it is enabled, as on the GPU (PyTorch disables one
    made where CUDA is not available, with a warning the step's user would misread).
    Yields a Counter of the calls answered, by name, for the estimate's notes."""
    global _answered
    amp_common = torch.cuda.amp.common
    originals = {name: getattr(torch.cuda, name) for name in _ANSWERS}
    record_stream = torch.Tensor.record_stream
    is_available = torch.cuda.is_available
    unavailable = amp_common.amp_definitely_not_available
    outer, _answered = _answered, Counter()
    try:
        for name, answer in _ANSWERS.items():
            # The classes stay classes (isinstance checks); they count what they make.
            setattr(torch.cuda, name, answer if isinstance(answer, type)
                    else _counted(name, answer))
        amp_common.amp_definitely_not_available = lambda: False
        torch.Tensor.record_stream = _recorded_on(record_stream)
        torch.Generator = _Generator
        torch.cuda.is_available = _asked_by_a_library(is_available)
        yield _answered
    finally:
        for name, original in originals.items():
            setattr(torch.cuda, name, original)
        amp_common.amp_definitely_not_available = unavailable
        torch.Tensor.record_stream = record_stream
        torch.Generator = _GENERATOR
        torch.cuda.is_available = is_available
        _answered = outer
