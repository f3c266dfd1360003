"""The step of a CUDA program, estimated on a machine without a GPU.

PyTorch's fake tensors can stand for CUDA tensors on a machine without a driver for the
forward pass, but its autograd engine asks the driver about CUDA streams before it runs a
backward pass, and fails (PyTorch 2.11). Without a GPU the estimator therefore runs the
step on fake *CPU* tensors and makes the CPU behave, for memory, as the GPU would:

- device arguments that name CUDA (``device="cuda"``, ``.cuda()``, ``.to("cuda:0")``)
  name the CPU instead, so the user's step runs unchanged;
- ``torch.autocast("cuda", ...)`` becomes CPU autocast with the same dtype;
- ``scaled_dot_product_attention`` takes the fused kernel the GPU would take (flash or
  memory-efficient attention: an output and a log-sum-exp per row, never the
  sequence-by-sequence score matrix that the CPU's fallback materialises).

What stays different is named in the estimate's notes: CPU autocast casts a few
operations CUDA autocast leaves alone and the other way round, and cuBLAS workspaces are
modelled, not seen. On a machine with a GPU none of this is used: the step runs on fake
CUDA tensors with the GPU's own kernels.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_TENSOR_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type}


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


def _on_cpu(value):
    return torch.device("cpu") if _is_cuda(value) else value


class CudaOnCpu(TorchFunctionMode):
    """Maps every CUDA device argument to the CPU and steers attention to a fused kernel."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            kwargs.pop("device", None)
            return args[0].to("cpu", **{k: v for k, v in kwargs.items()
                                         if k in ("non_blocking", "memory_format")})
        if func in _TENSOR_MOVES and len(args) > 1:
            args = (args[0], *(_on_cpu(a) for a in args[1:]))
        if func is F.scaled_dot_product_attention:
            fused = _fused_attention(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False):
    """The CPU's flash kernel, which keeps what the GPU's fused kernels keep; None where
    the GPU too would fall back (an explicit mask on a shape the fused kernels refuse)."""
    if query.dim() != 4 or query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    if enable_gqa and key.size(-3) != query.size(-3):
        repeat = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    out, _logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return out


class Emulation:
    """What the stand-in saw: whether the step used autocast, whose CPU lists differ."""

    autocast_used = False


@contextlib.contextmanager
def cuda_autocast_on_cpu(seen: Emulation):
    """``torch.autocast("cuda", dtype)`` (and ``torch.cuda.amp.autocast``) as CPU autocast."""
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__

    def init(self, device_type, *args, **kwargs):
        if device_type == "cuda" and kwargs.get("enabled", True):
            seen.autocast_used = True
        original(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    autocast.__init__ = init
    try:
        yield
    finally:
        autocast.__init__ = original


@contextlib.contextmanager
def emulated_cuda(seen: Emulation):
    """Everything above, for the length of one estimate."""
    with cuda_autocast_on_cpu(seen), CudaOnCpu():
        yield
