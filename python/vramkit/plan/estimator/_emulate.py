"""The step of a CUDA program, estimated on a machine without a GPU.

PyTorch's fake tensors can stand for CUDA tensors on a machine without a driver for the
forward pass, but its autograd engine asks the driver about CUDA streams before it runs a
backward pass, and fails (PyTorch 2.11). Without a GPU the estimator therefore runs the
step on fake *CPU* tensors and makes the CPU behave, for memory, as the GPU would:

- device arguments that name CUDA (``device="cuda"``, ``.cuda()``, ``.to("cuda:0")``)
  name the CPU instead, so the user's step runs unchanged, and the step's other torch.cuda
  calls (synchronize, device queries, streams, events) answer as one H200 would
  (_cuda_calls);
- ``torch.autocast("cuda", ...)`` becomes CPU autocast with the same dtype;
- ``scaled_dot_product_attention`` allocates what the GPU's fused kernels allocate (flash
  or memory-efficient attention: an output and a log-sum-exp per row, never the
  sequence-by-sequence score matrix that the CPU's fallback materialises; a learned
  mask's gradient at the scores' shape), or, where the GPU too takes no fused kernel (a
  mask or an input whose last dimension is not contiguous, grouped queries in fp32,
  kernels the program turned off with ``sdpa_kernel``), what CUDA's composite attention
  keeps (in fp32, as it computes for 16-bit inputs); dropout keeps the GPU's one-byte
  mask rather than the CPU's noise tensor; both also where torch's own Python functions
  call them (nn.MultiheadAttention's);
- the operations CUDA autocast runs in fp32 (layer norm, softmax, exp, log...) run in
  fp32 under the CPU's autocast too, and the one CPU autocast runs in fp32 that CUDA's
  leaves to its parts (cross entropy: CUDA keeps its log-softmax in the lower precision
  and an fp32 copy for the loss) meets autocast part by part, as on CUDA;
- an optimizer made with ``capturable=True`` (its step counters on the device, for CUDA
  graphs) takes the stand-in's CPU tensors as it takes CUDA's; a scalar made by
  ``torch.tensor()`` with no device (any other optimizer's step counter) is host memory on
  a GPU machine, and is not counted; nor is a tensor build() makes with ``device="cpu"``
  (a dataset held on the host), which a move to CUDA copies, as on a GPU.

What stays different: kernels that choose their own workspaces (cuDNN's convolutions,
whose workspaces come from the table of H200 and H100 measurements instead:
workspaces.py), and any other operation whose CPU kernel keeps different tensors than
its CUDA one. The estimate says in its notes that it ran this way. On a machine with a
GPU none of this is used: the step runs on fake CUDA tensors with the GPU's own kernels.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.utils import flop_counter
from torch.utils._device import DeviceContext

from . import _cuda_calls
from ._record import (BUILDING, HOST_STORAGES, MAKING_HOST_TENSOR, add_flops, per_query_head,
                      storage_of)

_TENSOR_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type}
_LOWER = (torch.float16, torch.bfloat16)

# The softmax PyTorch's composite attention takes since 2.5 (rows masked whole give
# zeros); before, the plain one.
_SAFE_SOFTMAX = getattr(torch.ops.aten, "_safe_softmax", None)


def _device_type(device) -> str | None:
    """The type a device argument names ("cuda", "cpu"), None for anything else."""
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        return device.split(":")[0]
    return None


def _is_cuda(device) -> bool:
    return _device_type(device) == "cuda"


def _on_cpu(value):
    return torch.device("cpu") if _is_cuda(value) else value


def _on_the_device(moved, host):
    """A tensor moved to CUDA: if the move made no copy of a host tensor (to the CPU, the
    stand-in's device, from the CPU), the copy the GPU's move makes."""
    if host is not None and isinstance(moved, torch.Tensor):
        storage = storage_of(moved)
        if storage is not None and storage in host:
            return moved.clone()
    return moved


class CudaOnCpu(DeviceContext):
    """Maps every CUDA device argument to the CPU and steers attention to a fused kernel.

    It is a device context (the mode ``with torch.device(...)`` enters) because that is
    the one function mode activation checkpointing carries into its recomputation during
    backward; any other mode would be gone there."""

    def __init__(self):
        super().__init__("cpu")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        asked = kwargs.get("device")
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(asked)
        host = HOST_STORAGES.get()
        if host is not None and func not in _TENSOR_MOVES and _device_type(asked) == "cpu" \
                and BUILDING.get():
            # What build() makes on the CPU by name (a dataset held on the host) stays
            # there on a GPU machine. Only in build(): in the step, ``device=x.device``
            # names the stand-in's CPU for a tensor that is on the GPU there.
            out = func(*args, **kwargs)
            storage = storage_of(out) if isinstance(out, torch.Tensor) else None
            if storage is not None:
                host[storage] = True
            return out
        if func is torch.tensor and "device" not in kwargs and _scalar(*args, **kwargs):
            # On a GPU machine a scalar made with no device is a host tensor (the step
            # counter of an optimizer that is neither capturable nor fused).
            token = MAKING_HOST_TENSOR.set(True)
            try:
                return func(*args, **kwargs)
            finally:
                MAKING_HOST_TENSOR.reset(token)
        if func is torch.Tensor.cuda:
            kwargs.pop("device", None)
            moved = args[0].to("cpu", **{k: v for k, v in kwargs.items()
                                          if k in ("non_blocking", "memory_format")})
            return _on_the_device(moved, host)
        if func in _TENSOR_MOVES and (len(args) > 1 or asked is not None):
            to_cuda = _is_cuda(asked) or any(_is_cuda(a) for a in args[1:])
            args = (args[0], *(_on_cpu(a) for a in args[1:]))
            moved = func(*args, **kwargs)
            return _on_the_device(moved, host) if to_cuda else moved
        if func in _CUDNN_RECURRENT:
            # What cuDNN keeps for these is not modelled, and the CPU's kernels keep other
            # tensors: the estimate refuses them on both paths (_step._RNN_ADVICE).
            raise NotImplementedError(f"{func.__name__}: {CUDNN_RECURRENT_REFUSAL}")
        if func is _DROPOUT:
            return _cuda_dropout(*args, **kwargs)
        if func is _ATTENTION:
            return _cuda_attention(*args, **kwargs)
        return func(*args, **kwargs)


# The functions the stand-in replaces, as torch.nn.functional has them. A function mode sees
# a call only from outside a Python function of torch's that takes part in the protocol:
# F.multi_head_attention_forward (nn.MultiheadAttention, nn.TransformerEncoderLayer)
# calls attention and dropout by their module's global names, with the mode set aside.
# So the stand-in catches them twice over: in the mode, for callers holding the
# originals, and as torch.nn.functional's names while it runs (functional_on_cuda).
_DROPOUT = F.dropout
_ATTENTION = F.scaled_dot_product_attention
# The recurrent layers' whole-sequence functions, which CUDA runs through cuDNN, and the
# words of the stand-in's refusal of them, by which _step knows it.
CUDNN_RECURRENT_REFUSAL = "cuDNN's recurrent kernel"
_CUDNN_RECURRENT = frozenset(getattr(torch._VF, name)
                             for name in ("lstm", "gru", "rnn_tanh", "rnn_relu"))


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    """On a GPU dropout is one fused kernel that keeps a one-byte mask for backward; the
    CPU's keeps a noise tensor of the input's dtype (four bytes in fp32)."""
    if _training_dropout(input, p, training, inplace):
        return torch.ops.aten.native_dropout(input, p, True)[0]
    return _DROPOUT(input, p, training, inplace)


def _cuda_attention(*args, **kwargs):
    fused = _fused_attention(*args, **kwargs)
    return fused if fused is not None else _ATTENTION(*args, **kwargs)


@contextlib.contextmanager
def functional_on_cuda():
    """torch.nn.functional's dropout and attention as the GPU's, for the calls the mode
    cannot see (above). A name something else has replaced already (a program's own
    wrapper) is left to it: the wrapper's call of torch's function meets the mode."""
    ours = {"dropout": (_DROPOUT, _cuda_dropout),
            "scaled_dot_product_attention": (_ATTENTION, _cuda_attention)}
    replaced = [name for name, (original, _) in ours.items() if getattr(F, name) is original]
    for name in replaced:
        setattr(F, name, ours[name][1])
    try:
        yield
    finally:
        for name in replaced:
            setattr(F, name, ours[name][0])


def _scalar(data=None, *args, **kwargs) -> bool:
    return isinstance(data, (bool, int, float, complex)) or (
        isinstance(data, torch.Tensor) and data.dim() == 0)


def _training_dropout(input, p=0.5, training=True, inplace=False):
    return training and not inplace and 0.0 < p < 1.0 and input.is_floating_point()


def _fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False):
    """What the GPU's attention allocates: a fused kernel's, or CUDA's composite where the
    GPU takes no fused kernel; None where the CPU's own call stands (an explicit mask with
    a batch of heads the kernels refuse)."""
    if query.dim() != 4 or query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    if attn_mask is not None and attn_mask.dtype == torch.bool and attn_mask.dim() != 4:
        return None
    # Under autocast the kernel is chosen for the inputs cast to the autocast dtype.
    computed_in = (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                   else query.dtype)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # PyTorch's attention first turns a boolean mask into an additive one in the
        # (autocast) query's dtype, where(mask, 0, -inf) of the mask's shape, which the
        # kernel then takes and keeps like any other (the dispatch of 2.11's CPU call shows
        # the same code: two scalars and a where).
        attn_mask = torch.where(attn_mask, torch.zeros((), dtype=computed_in),
                                torch.full((), -math.inf, dtype=computed_in))
    learned = attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled()
    # Every fused kernel needs each input's last dimension contiguous: heads permuted out
    # of a convolution's channels (a UNet's attention) take the composite one.
    strided = any(t.stride(-1) != 1 and t.size(-1) != 1 for t in (query, key, value))
    kernel = _cuda_attention_kernel(computed_in, attn_mask, learned,
                                    enable_gqa and key.size(-3) != query.size(-3), strided)
    if kernel == "composite":
        return _composite_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                    scale, enable_gqa)
    if attn_mask is not None and attn_mask.is_floating_point():
        # The kernel takes an additive mask expanded to the scores' shape and keeps it for
        # its backward, which reads it again; a learned one's gradient autograd sums back
        # through the expansion, after the kernel's backward has let go.
        if torch.is_autocast_enabled("cpu"):
            attn_mask = attn_mask.to(computed_in)  # as CUDA casts it
        scores = query.shape[:-1] + key.shape[-2:-1]
        return _FusedAttention.apply(*_cast(query, key, value, computed_in), kernel,
                                     attn_mask.expand(scores), learned)
    return _FusedAttention.apply(*_cast(query, key, value, computed_in), kernel)


def _cuda_attention_kernel(computed_in, attn_mask, learned: bool, grouped: bool,
                           strided: bool = False) -> str:
    """The kernel CUDA's scaled_dot_product_attention takes, in PyTorch's order on the
    cards it is estimated for, among those the program left enabled
    (``torch.nn.attention.sdpa_kernel``, ``torch.backends.cuda.enable_*_sdp``): "cudnn",
    "flash", "efficient" or "composite". ``strided``: an input's last dimension is not
    contiguous, which no fused kernel takes. Raises as PyTorch does where none of the
    enabled ones takes the call."""
    cuda = torch.backends.cuda
    if not strided and (attn_mask is None or attn_mask.stride(-1) == 1):
        # Fused kernels need the mask's last dimension contiguous (a learned bias permuted
        # from an embedding lookup, as T5's relative positions are in some versions of
        # transformers, is not). cuDNN's kernel and flash attention take 16-bit inputs
        # only, cuDNN's no mask that needs a gradient, flash's no mask at all; the
        # memory-efficient kernel takes any dtype and mask but no grouped queries: fp32
        # with grouped queries, as transformers' decoders call it in fp32 with no padding
        # mask, takes none.
        sixteen = computed_in in _LOWER
        if sixteen and cuda.cudnn_sdp_enabled() and not learned:
            return "cudnn"
        if sixteen and cuda.flash_sdp_enabled() and attn_mask is None:
            return "flash"
        if cuda.mem_efficient_sdp_enabled() and not grouped:
            return "efficient"
    if cuda.math_sdp_enabled():
        return "composite"
    raise RuntimeError("scaled_dot_product_attention: No available kernel. Aborting "
                       "execution. (None of the attention kernels the program left "
                       "enabled takes these inputs on CUDA.)")


def _cast(query, key, value, dtype):
    """The inputs as CUDA's autocast gives them to the kernel: copies in ``dtype`` (no copy
    where they are in it already)."""
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))


def _composite_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                         enable_gqa):
    """What CUDA's composite attention (``_scaled_dot_product_attention_math``) allocates
    and keeps, in its order. Under autocast its inputs are first cast to the autocast
    dtype, as the attention's autocast policy casts them; the kernel then runs outside
    autocast, computing in fp32 where its inputs are 16-bit (PyTorch's default: query,
    keys and values converted to fp32), with the query scaled by the root of the scale, a
    causal mask made as an additive one of the query's dtype (from a lower triangle of
    booleans), keys and values repeated for grouped queries, the keys scaled too, the
    scores, the mask added out of place, their softmax (the "safe" one, which gives rows
    masked whole zeros), the GPU's dropout (a one-byte mask), then the weights copied to
    the inputs' dtype (returned beside the output, which its caller drops) and the product
    with the values cast back to that dtype. Each intermediate is given up as soon as the
    next is made, as the C++ reassigns one variable; Python's names would keep them to the
    end."""
    if torch.is_autocast_enabled("cpu"):  # CUDA autocast, as the stand-in runs it
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value, attn_mask = (
            t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            for t in (query, key, value, attn_mask))
    with torch.autocast("cpu", enabled=False):
        origin = query.dtype
        if origin in _LOWER:
            query, key, value = query.float(), key.float(), value.float()
        factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.size(-1)))
        query = query * factor
        if is_causal:
            lower = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool,
                               device=query.device).tril()
            attn_mask = torch.where(lower.logical_not(), -math.inf,
                                    torch.zeros((), dtype=query.dtype, device=query.device))
            del lower
        if enable_gqa and key.size(-3) != query.size(-3):
            groups = query.size(-3) // key.size(-3)
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        weights = query @ (key.transpose(-2, -1) * factor)
        if attn_mask is not None:
            weights = weights + attn_mask
        weights = _SAFE_SOFTMAX(weights, -1) if _SAFE_SOFTMAX else torch.softmax(weights, -1)
        if dropout_p > 0.0:
            weights = torch.ops.aten.native_dropout(weights, dropout_p, True)[0]
        returned_weights = weights.to(origin)  # noqa: F841 - made, then dropped by the caller
        return (weights @ value).to(origin)


class _FusedAttention(torch.autograd.Function):
    """A memory model of CUDA's fused attention kernels (`kernel`: flash attention,
    whose memory stands for cuDNN's too, or the memory-efficient one), as PyTorch 2.11
    calls them. Forward makes the output and one fp32 log-sum-exp per query row (rounded
    up to 32 rows for the memory-efficient kernel) and keeps both with the inputs;
    backward makes the three gradients, an fp32 row sum of output times its gradient,
    and for 16-bit inputs an fp32 accumulator the size of the query (the GPU host's
    estimates of both kernels make it). Keys and values with fewer heads (grouped
    queries) are handled by the kernels without repeating them; their gradients are
    computed for every query head and then summed. An additive mask is taken expanded to
    the scores' shape and kept for backward; one that requires grad (a learned bias: the
    memory-efficient kernel takes it) gets its gradient at that full shape, batch x heads
    x rows x keys (a boolean mask reaches it turned into an additive one). The values are
    fake, so only the shapes and dtypes of what is made matter."""

    @staticmethod
    def forward(ctx, query, key, value, kernel, mask=None, learned=False):
        batch, heads, rows, _ = query.shape
        padded = -(-rows // 32) * 32 if kernel == "efficient" else rows
        # The kernels write the output as (batch, rows, heads, dim) and return it
        # transposed, so merging the heads afterwards is a view, not a copy.
        out = torch.empty(batch, rows, heads, value.shape[-1], dtype=query.dtype,
                          device=query.device).transpose(1, 2)
        logsumexp = torch.empty(batch, heads, padded, dtype=torch.float32,
                                device=query.device)
        ctx.save_for_backward(query, key, value, out, logsumexp,
                              *(() if mask is None else (mask,)))
        ctx.mask_dtype = mask.dtype if learned else None
        add_flops(flop_counter.sdpa_flop_count(*per_query_head(query, key, value)))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, logsumexp = ctx.saved_tensors[:5]
        add_flops(flop_counter.sdpa_backward_flop_count(
            grad_out.shape, *per_query_head(query, key, value)))
        row_sums = torch.empty_like(logsumexp)  # noqa: F841 - allocated as the kernel does
        if query.dtype != torch.float32:
            accumulator = torch.empty(query.shape, dtype=torch.float32,  # noqa: F841
                                      device=query.device)
        grad_query = torch.empty_like(query)
        if key.size(-3) != query.size(-3):
            wide = query.shape[:-1] + key.shape[-1:]
            grad_key = torch.empty(wide, dtype=key.dtype, device=key.device)
            grad_value = torch.empty(query.shape[:-1] + value.shape[-1:], dtype=value.dtype,
                                     device=value.device)
            groups = query.size(-3) // key.size(-3)
            grad_key = grad_key.unflatten(-3, (key.size(-3), groups)).sum(-3)
            grad_value = grad_value.unflatten(-3, (value.size(-3), groups)).sum(-3)
        else:
            grad_key = torch.empty_like(key)
            grad_value = torch.empty_like(value)
        grad_mask = None
        if ctx.mask_dtype is not None:  # rows of keys padded to 16 elements, as it pads
            keys = key.size(-2)
            grad_mask = torch.empty(query.shape[:-1] + (-(-keys // 16) * 16,),
                                    dtype=ctx.mask_dtype, device=query.device)[..., :keys]
        return grad_query, grad_key, grad_value, None, grad_mask, None


@contextlib.contextmanager
def cuda_autocast_on_cpu():
    """``torch.autocast("cuda", dtype)`` (and ``torch.cuda.amp.autocast``) as CPU autocast."""
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__

    def init(self, device_type, *args, **kwargs):
        original(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    autocast.__init__ = init
    try:
        yield
    finally:
        autocast.__init__ = original


# What CUDA autocast runs in fp32 that CPU autocast leaves in the lower precision (ATen's
# autocast_mode.h, its fp32 list; the losses and cdist of that list CPU autocast runs in
# fp32 too): the input is cast to fp32, so the output, and what backward keeps of it, is
# fp32. An upsampling's fp32 output makes the skip connection a UNet concatenates to it
# fp32 too, and the group norm and the additions after it.
_CUDA_FP32_OPS = (
    "layer_norm", "native_layer_norm", "group_norm", "exp", "expm1", "log", "log10",
    "log2", "log1p", "reciprocal", "rsqrt", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "softplus", "logsumexp",
    "renorm", "dist", "pdist", "cosine_similarity", "frobenius_norm.dim", "nuclear_norm",
    "nuclear_norm.dim", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
# ... and the ones it runs with an fp32 output dtype instead of casting the input.
_CUDA_FP32_OUTPUT_OPS = ("softmax.int", "softmax.Dimname", "log_softmax.int",
                         "log_softmax.Dimname", "cumsum", "cumsum.dimname", "cumprod",
                         "cumprod.dimname", "sum", "sum.dim_IntList", "sum.dim_DimnameList",
                         "prod", "linalg_vector_norm", "linalg_matrix_norm",
                         "linalg_matrix_norm.str_ord")
# ... and what CPU autocast runs in fp32 but CUDA autocast does not list: there each part
# meets autocast on its own (cross entropy's log-softmax keeps the input's dtype, its
# nll_loss casts to fp32), which keeps other tensors for backward than one fp32 cast.
_CUDA_UNLISTED_OPS = ("cross_entropy_loss",)
# The promote lists differ too (ATen's autocast_mode.cpp): CPU autocast casts the inputs of
# a concatenation to the widest dtype first, a copy of each narrower one, where CUDA's
# lists none of these and the kernel promotes as it writes (a UNet's skip connection, a
# 16-bit activation beside an fp32 upsampling, gets no copy on a GPU)...
_CPU_ONLY_PROMOTE_OPS = ("cat", "stack", "index_copy", "index_copy.dimname")
# ... and CUDA autocast casts the inputs of these to the widest floating dtype among them,
# which CPU autocast leaves to the kernel's own promotion.
_CUDA_PROMOTE_OPS = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot",
                     "grid_sampler", "index_put", "tensordot", "scatter_add")


def _without_cpu_autocast(op, args, kwargs):
    guard = torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))
    with guard:
        return op(*args, **kwargs)


def _fp32_inputs(op):
    def kernel(*args, **kwargs):
        cast = [a.to(torch.float32) if isinstance(a, torch.Tensor) and a.dtype in _LOWER
                else a for a in args]
        return _without_cpu_autocast(op, cast, kwargs)
    return kernel


def _fp32_output(op):
    # A dtype the caller gave (by keyword, or by position where the schema has it there:
    # softmax's and log_softmax's) stands, as under CUDA autocast.
    at = next((i for i, a in enumerate(op._schema.arguments)
               if a.name == "dtype" and not a.kwarg_only), None)

    def kernel(*args, **kwargs):
        first = args[0] if args else None
        given = kwargs.get("dtype") is not None or \
            (at is not None and len(args) > at and args[at] is not None)
        if isinstance(first, torch.Tensor) and first.dtype in _LOWER and not given:
            if at is not None and len(args) > at:
                args = (*args[:at], torch.float32, *args[at + 1:])
            else:
                kwargs = dict(kwargs, dtype=torch.float32)
        return _without_cpu_autocast(op, args, kwargs)
    return kernel


def _as_cuda_leaves_it(op):
    def kernel(*args, **kwargs):
        return _without_cpu_autocast(op, args, kwargs)
    return kernel


def _eligible(t) -> bool:
    # What autocast casts: a floating tensor, but not fp64 (ATen's is_eligible).
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _promoted(op):
    """CUDA autocast's promote policy: every eligible tensor argument (in lists too) cast
    to the widest of the autocast dtype and theirs, then the op outside autocast."""
    def kernel(*args, **kwargs):
        widest = torch.get_autocast_dtype("cpu")
        for a in (*args, *kwargs.values()):
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if _eligible(t):
                    widest = torch.promote_types(widest, t.dtype)

        def cast(a):
            if isinstance(a, (list, tuple)):
                return type(a)(cast(x) for x in a)
            return a.to(widest) if _eligible(a) and a.dtype != widest else a
        return _without_cpu_autocast(op, cast(args), {k: cast(v) for k, v in kwargs.items()})
    return kernel


def _by_parts(op):
    def kernel(*args, **kwargs):
        return op.decompose(*args, **kwargs)  # its parts dispatch under autocast
    return kernel


@contextlib.contextmanager
def cuda_autocast_lists_on_cpu():
    """CPU autocast, for the length of one estimate, with CUDA's fp32 operations."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name in _CUDA_FP32_OPS:
                lib.impl(name, _fp32_inputs(_overload(name)), "AutocastCPU")
            for name in _CUDA_FP32_OUTPUT_OPS:
                lib.impl(name, _fp32_output(_overload(name)), "AutocastCPU")
            for name in _CUDA_UNLISTED_OPS:
                lib.impl(name, _by_parts(_overload(name)), "AutocastCPU")
            for name in _CPU_ONLY_PROMOTE_OPS:
                lib.impl(name, _as_cuda_leaves_it(_overload(name)), "AutocastCPU")
            for name in _CUDA_PROMOTE_OPS:
                lib.impl(name, _promoted(_overload(name)), "AutocastCPU")
        yield
    finally:
        lib._destroy()


def _overload(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


@contextlib.contextmanager
def capturable_optimizers_on_cpu():
    """torch.optim's capturable implementations refuse parameters on a device outside
    their list; each optimizer module holds its own reference to the function that gives
    the list, so each is given one that lists the CPU too."""
    name = "_get_capturable_supported_devices"
    holders = [m for key, m in list(sys.modules.items())
               if key.startswith("torch.optim") and callable(getattr(m, name, None))]
    originals = [getattr(m, name) for m in holders]
    for module, original in zip(holders, originals):
        setattr(module, name, lambda *a, _original=original, **k: [*_original(*a, **k), "cpu"])
    try:
        yield
    finally:
        for module, original in zip(holders, originals):
            setattr(module, name, original)


@contextlib.contextmanager
def flex_attention_backward_on_cpu():
    """FlexAttention refuses inputs that require grad on the CPU (it has no CPU backward
    kernel); the stand-in's CPU tensors stand for CUDA's, where it has one, and under the
    estimate the fake kernels answer for both."""
    try:  # the step may import it only when it runs (a millisecond, with torch loaded)
        import torch.nn.attention.flex_attention as module
    except ImportError:  # a PyTorch before FlexAttention
        module = None
    original = getattr(module, "_validate_device", None)
    if original is None:
        yield
        return
    module._validate_device = lambda query, key, value: None
    try:
        yield
    finally:
        module._validate_device = original


@contextlib.contextmanager
def emulated_cuda():
    """Everything above, for the length of one estimate; yields the Counter of the
    step's torch.cuda calls answered (_cuda_calls)."""
    with cuda_autocast_on_cpu(), cuda_autocast_lists_on_cpu(), capturable_optimizers_on_cpu(), \
            flex_attention_backward_on_cpu(), functional_on_cuda(), \
            _cuda_calls.answered_on_cpu() as answered, CudaOnCpu():
        yield answered
