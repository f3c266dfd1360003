"""Outputs for the ops whose fake kernel refuses a call that CUDA's kernel runs.

PyTorch checks a call under fake tensors with the op's meta function, and a few meta
functions are stricter than the CUDA kernels they describe. There a real step runs and
its estimate would fail, so for the ops in ``OPS`` the recorder asks here first for the
output CUDA's kernel would make; None where the call is one the fake kernel takes (or
one CUDA's refuses too), and the fake kernel runs as usual.

- ``aten._grouped_mm`` (mixture-of-experts layers: transformers' Mixtral, Qwen-MoE,
  OLMoE): the meta function accepts bfloat16 only, the dtype of the fast kernel; CUDA
  runs every other dtype through its fallback, one matrix product per group written into
  one output. That output is all it allocates: the result's shape, in the operands'
  dtype, each row padded to 16 bytes as the CUDA kernels lay it out.
- ``aten._pin_memory`` (``batch.pin_memory().to("cuda", non_blocking=True)``, the
  data loader's idiom written into a step): fake tensors have no kernel for it at all.
  Pinned memory is host memory, which the estimate does not count: the tensor itself
  stands for its pinned copy, so the copy to the GPU that follows is counted as it is
  without pinning (and, on the CPU stand-in, where the host tensor stands for the GPU's,
  nothing is counted twice).
"""

from __future__ import annotations

import torch

_ROW_ALIGNMENT_BYTES = 16


def _grouped_mm_output(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if bias is not None or not isinstance(mat_a, torch.Tensor) \
            or not isinstance(mat_b, torch.Tensor) or mat_a.dtype == torch.bfloat16:
        return None  # what the fake kernel takes, or refuses for another reason
    if mat_a.dim() not in (2, 3) or mat_b.dim() not in (2, 3):
        return None
    if mat_a.dim() == 2 or mat_b.dim() == 2:
        if offs is None:
            return None
        groups = offs.size(0)
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        shape = [groups, mat_a.size(0), mat_b.size(1)]  # a weight's gradient per group
    elif mat_a.dim() == 2:
        shape = [mat_a.size(0), mat_b.size(-1)]          # tokens through their experts
    elif mat_b.dim() == 2:
        shape = [mat_a.size(1), mat_b.size(1)]
    else:
        shape = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    dtype = out_dtype or mat_a.dtype
    per_row = _ROW_ALIGNMENT_BYTES // dtype.itemsize
    row = -(-shape[-1] // per_row) * per_row
    stride = [shape[1] * row, row, 1] if len(shape) == 3 else [row, 1]
    return torch.empty_strided(shape, stride, dtype=dtype, device=mat_a.device)


def _pinned(tensor, device=None):
    return torch.ops.aten.alias.default(tensor)


_STAND_INS = {
    torch.ops.aten._grouped_mm.default: _grouped_mm_output,
    torch.ops.aten._pin_memory.default: _pinned,
}
OPS = frozenset(_STAND_INS)


def stand_in(func, args, kwargs):
    """The output CUDA's kernel makes for ``func(*args, **kwargs)``, made on the fake mode
    below the caller's; None where this module does not cover the call."""
    make = _STAND_INS.get(func)
    return None if make is None else make(*args, **(kwargs or {}))
