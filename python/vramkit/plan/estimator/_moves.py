"""Moving and copying a model while it is made of fake tensors.

``module.to("cuda")``, ``.cuda()``, ``.half()``, ``.to(torch.bfloat16)``: PyTorch's
``Module._apply`` swaps each fake parameter with its converted twin
(``torch.utils.swap_tensors``), and the swap refuses any tensor that something holds a
weak reference to. The fake mode's own memo of the tensors it made holds one to every
parameter built under it (PyTorch 2.11), so every move of a model built under the
estimator failed with "_apply(): Couldn't swap Linear.weight".

While a step is estimated, a swap between two fake tensors that the weak references
refuse is done as ``param.data = converted`` instead, as ``Module._apply`` does for
ordinary tensors: the parameter keeps its identity (an optimizer made after the move
holds the same objects), and takes the converted tensor's storage, dtype and device.
Any other swap goes to PyTorch's own.

``copy.deepcopy(model)`` (an EMA or teacher copy made in ``build()``) failed on a model
with a BatchNorm: its ``num_batches_tracked``, made from a Python number, is a fake tensor
holding its value in a real CPU storage, and ``Tensor.__deepcopy__`` copied that storage
into a fake tensor's (PyTorch 2.11 refuses storages of two devices). While a step is
estimated a fake leaf tensor is deep-copied as PyTorch copies a tensor with no storage of
its own: a clone of it (a block of its size, as the real copy takes), with its
``requires_grad``, its gradient and its own attributes copied.

``torch.load(..., map_location="cuda")`` in ``build()`` (a resumed optimizer's state, a
checkpoint's weights, a saved batch) restores each storage with the storage's own
``.cuda()``, which the fake mode does not reach: the checkpoint would be put on the GPU
for real, as tensors the fake mode takes in only later (on a machine without a GPU, as
fake CUDA tensors beside the CPU stand-in's). While a step is estimated such a load reads
onto the CPU and then moves each tensor it loaded to the device it named, under the fake
mode: a device copy, as the real program's load makes. A load with no location puts
each tensor back on the device it was saved from: those saved from CUDA are read onto the
meta device (the fake mode reads no data) and moved to the device the same way.
"""

from __future__ import annotations

import contextlib
import copy
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_map_only

from ._emulate import _is_cuda


def _swap_fake(original, t1, t2) -> None:
    if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)) or not (
            weakref.getweakrefs(t1) or weakref.getweakrefs(t2)):
        original(t1, t2)
        return
    with torch.no_grad():
        t1.data = t2
    # A fake tensor keeps the device it reports in a Python attribute of its own, which
    # assigning .data does not carry over.
    t1.fake_device = t2.fake_device


@contextlib.contextmanager
def fake_module_moves():
    """For its length, modules of fake tensors move and change dtype as real ones do."""
    original = torch.utils.swap_tensors

    def swap(t1, t2):
        _swap_fake(original, t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def _deepcopy_fake(original, tensor, memo):
    if not isinstance(tensor, FakeTensor) or not tensor.is_leaf:
        return original(tensor, memo)   # PyTorch's own, and its refusal of a non-leaf
    if id(tensor) in memo:
        return memo[id(tensor)]
    with torch.no_grad():
        new = tensor.clone()
    new.requires_grad_(tensor.requires_grad)
    memo[id(tensor)] = new
    if tensor.grad is not None:
        new.grad = copy.deepcopy(tensor.grad, memo)
    for name, value in vars(tensor).items():   # the user's attributes, not the fake's own
        if name not in vars(new):
            setattr(new, name, copy.deepcopy(value, memo))
    return new


@contextlib.contextmanager
def fake_module_copies():
    """For its length, fake tensors (and modules of them) deep-copy as real ones do."""
    original = torch.Tensor.__deepcopy__

    def deepcopy(self, memo):
        return _deepcopy_fake(original, self, memo)

    torch.Tensor.__deepcopy__ = deepcopy
    try:
        yield
    finally:
        torch.Tensor.__deepcopy__ = original


class _CudaOnMeta(dict):
    """A ``map_location`` that reads what was saved from a CUDA device onto the meta
    device (under the fake mode, no data is read either way) and remembers which
    device that was, so that the tensors can then be moved there under the fake mode; a
    dict, since PyTorch refuses a function as the location of a load under fake tensors."""

    def __init__(self):
        super().__init__()
        self.devices = set()

    def get(self, location, default=None):
        if _is_cuda(location):
            self.devices.add(location)
            return "meta"
        return location if default is None else default

    def back_on_the_device(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            return t
        device = next(iter(self.devices)) if len(self.devices) == 1 else "cuda"
        return t.to(device)


@contextlib.contextmanager
def checkpoints_loaded_on_cpu():
    """``torch.load`` with a location naming a CUDA device, or none with tensors saved
    from one, loads onto the CPU and moves them to that device (see above); other
    locations are left as given."""
    original = torch.load

    def load(f, map_location=None, *args, **kwargs):
        if _is_cuda(map_location):
            loaded = original(f, "cpu", *args, **kwargs)
            return tree_map_only(torch.Tensor, lambda t: t.to(map_location), loaded)
        if map_location is not None:
            return original(f, map_location, *args, **kwargs)
        saved_from_cuda = _CudaOnMeta()
        loaded = original(f, saved_from_cuda, *args, **kwargs)
        return tree_map_only(torch.Tensor, saved_from_cuda.back_on_the_device, loaded)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original
