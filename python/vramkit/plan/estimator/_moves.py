"""Moving a model between devices and dtypes while it is made of fake tensors.

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
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor


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
