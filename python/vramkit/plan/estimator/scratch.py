"""Scratch buffers that ATen ops allocate and free inside themselves, beyond convolutions.

Many CUDA kernels behind PyTorch's ops ask the caching allocator for scratch memory inside
the call and give it back before they return: a reduction's staging buffer and its
accumulation buffer (ATen/native/cuda/Reduce.cuh), a layer norm backward's partial
gradients of the weight and bias, batch norm's staging data, CUB's temporary storage
behind sorts and scans (ATen/cuda/cub.cuh) (not the fused attention kernels': see
SCRATCH_OPS),
a copy of an input a kernel needs contiguous. Under fake tensors no kernel runs, so a
recorded step has none of these blocks; on an H200 (PyTorch 2.11) ViT-B/16's steps reached
148 MiB in one layer norm backward, and its predicted peaks were 1% to 3% low without them.

The model is the one of cuDNN's convolution workspaces (workspaces.py): each call of an op
of :data:`SCRATCH_OPS` gets its scratch: the blocks a measurement on the device saw,
each where the op made it among its outputs (_transients.py), or, where only bytes are
known, one allocation of that size right after its outputs and at once its free. The
size is found by the call's signature (:class:`OpCall`: the op's overload, each tensor
argument's dtype, shape, strides and alignment, the other arguments
that choose the kernel), in this order:

1. on a machine with the GPU: measured there, once per signature, by running the op on
   real tensors of the same layout, every byte zero (:func:`build_tensor`, so an index is
   always in range), with :func:`vramkit.estimator.workspaces.measure_transient`, the
   convolutions' measuring path; kept for the process and on disk (``op-scratch/`` beside
   the convolutions' cache, per device name, PyTorch version and cuDNN version);
2. else, for the ops whose scratch follows from ATen's source alone (_derived_scratch.py),
   derived from the call's shapes and dtypes: on a machine without a GPU, for the CPU
   stand-in, and on a GPU for a call it could not measure (no memory to spare, a refusal
   in isolation, the time budget spent), with that card's multiprocessors;
3. else 0, and the estimate's notes say, in one note, for how many of the step's op
   signatures scratch buffers were not modelled. There is no table for a machine without
   a GPU yet: bench/cudnn_workspace_probe.py records these ops' sizes in real steps and
   in isolation, from which one could be fitted.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

from . import workspaces as _ws
from ._transients import as_transient, is_transient

LABEL = "op scratch"
CACHE_FORMAT = "vramkit-op-scratch/1"
CACHE_FOLDER = "op-scratch"

# The share of what the device could still give (free memory and the allocator's unused
# cache) that an op's inputs and outputs may take for it to be measured: the rest is left
# for the scratch itself, and a user's model already on the GPU is never pushed out.
MEMORY_SHARE = 0.5

# Seconds of measuring one estimate may spend on these ops before the remaining new
# signatures count 0 (a ViT or GPT-2 step has tens of signatures, a few ms each; this
# only bounds a step with thousands of distinct shapes).
TIME_BUDGET_S = 10.0

# The ops (by overload name, as the recorder sees them) whose CUDA kernels allocate
# scratch memory through PyTorch's caching allocator, by why. Ops that make new outputs
# (the batch norms also update running statistics: their own copies, when measured). Not
# the fused optimizers nor the _foreach ops: they pass their tensor lists in kernel
# arguments (MultiTensorApply.cuh and fused_adam_utils.cuh allocate nothing), and
# measuring one would copy every parameter of the model. _foreach_norm's per-chunk buffer
# (a few hundred KiB for a whole model's gradients) is left out for that second reason.
SCRATCH_OPS = {
    # Layer norm backward: partial sums of the weight's and bias's gradients over blocks
    # of rows (fp32), and a contiguous copy of the output gradient when it is not.
    "native_layer_norm.default": "normalization",
    "native_layer_norm_backward.default": "normalization",
    "_fused_rms_norm.default": "normalization",
    "_fused_rms_norm_backward.default": "normalization",
    "native_group_norm.default": "normalization",
    "native_group_norm_backward.default": "normalization",
    # Batch norm: Welford staging data across blocks, channels-last reductions.
    "native_batch_norm.default": "normalization",
    "native_batch_norm_backward.default": "normalization",
    "cudnn_batch_norm.default": "normalization",
    "cudnn_batch_norm_backward.default": "normalization",
    "_native_batch_norm_legit.default": "normalization",
    "_native_batch_norm_legit.no_stats": "normalization",
    "_native_batch_norm_legit_no_training.default": "normalization",
    "_batch_norm_with_update.default": "normalization",
    "_batch_norm_no_update.default": "normalization",
    "batch_norm_backward.default": "normalization",
    # Reductions (Reduce.cuh): a global staging buffer and semaphores when one output is
    # reduced by several blocks, an fp32 accumulation buffer for 16-bit outputs split
    # over 32-bit index ranges.
    "sum.dim_IntList": "reduction",
    "sum.default": "reduction",
    "mean.dim": "reduction",
    "mean.default": "reduction",
    "amax.default": "reduction",
    "amin.default": "reduction",
    "max.dim": "reduction",
    "min.dim": "reduction",
    "max.default": "reduction",
    "min.default": "reduction",
    "argmax.default": "reduction",
    "argmin.default": "reduction",
    "prod.dim_int": "reduction",
    "prod.default": "reduction",
    "var.correction": "reduction",
    "std.correction": "reduction",
    "var_mean.correction": "reduction",
    "std_mean.correction": "reduction",
    "linalg_vector_norm.default": "reduction",
    "norm.ScalarOpt_dim": "reduction",
    "logsumexp.default": "reduction",
    "any.dim": "reduction",
    "all.dim": "reduction",
    "any.dims": "reduction",
    "all.dims": "reduction",
    # CUB's temporary storage (cub.cuh), allocated through the caching allocator.
    "cumsum.default": "scan or sort",
    "cumprod.default": "scan or sort",
    "sort.default": "scan or sort",
    "sort.stable": "scan or sort",
    "topk.default": "scan or sort",
    # Not the fused attention kernels (_scaled_dot_product_*_attention and their
    # backwards, up to 75 MiB of scratch on ViT-B/16's step): their backwards take the
    # forward's random-number state (philox seed and offset tensors) and its logsumexp,
    # and rebuilt from zeros those crashed the process on an H200 (efficient attention's
    # backward with dropout, a segmentation fault, 2026-12-01). A measurement must never
    # put the user's process at risk, so their scratch is left out and named in the notes.
    # Softmax and the parts of cross entropy: contiguous copies, and the losses' reductions.
    "_softmax.default": "softmax or loss",
    # The softmax of PyTorch's composite attention: the mask of -inf scores and the rows
    # masked whole, after its output (a compiled-in function, not the decomposition).
    "_safe_softmax.default": "softmax or loss",
    "_log_softmax.default": "softmax or loss",
    "_softmax_backward_data.default": "softmax or loss",
    "_log_softmax_backward_data.default": "softmax or loss",
    "nll_loss_forward.default": "softmax or loss",
    "nll_loss_backward.default": "softmax or loss",
    "nll_loss2d_forward.default": "softmax or loss",
    "nll_loss2d_backward.default": "softmax or loss",
    # Embedding backward: the indices sorted (CUB), segment offsets and partial sums.
    "embedding_dense_backward.default": "embedding",
    "_embedding_bag_dense_backward.default": "embedding",  # the same kernel, for bags
}

# Float arguments that choose the kernel rather than only enter its arithmetic: dropout
# (another kernel path, with its random state) and attention's scale. Every other float
# (eps, momentum) is left out of the signature: it changes no allocation.
_KERNEL_FLOATS = frozenset({"dropout_p", "scale"})
# Ops whose kernel follows torch.backends.cudnn.enabled (cuDNN's batch norm or ATen's).
_CUDNN_CHOOSES = frozenset(name for name, kind in SCRATCH_OPS.items()
                           if kind == "normalization" and "batch_norm" in name)
# Kernels look at a pointer's alignment (vectorised loads), never at where in its storage a
# view starts: an offset counts only modulo this many bytes.
_ALIGNMENT = 256

_OPS = None


def scratch_ops() -> dict:
    """The ops of SCRATCH_OPS this PyTorch has, as OpOverloads, to their overload names."""
    global _OPS
    if _OPS is None:
        import torch
        ops = {}
        for name in SCRATCH_OPS:
            base, overload = name.rsplit(".", 1)
            packet = getattr(torch.ops.aten, base, None)
            op = getattr(packet, overload, None) if packet is not None else None
            if op is not None:
                ops[op] = name
        _OPS = ops
    return _OPS


# ---------------------------------------------------------------------------------------
# Signatures and inputs.
# ---------------------------------------------------------------------------------------

class _Unsupported(Exception):
    """An argument the model cannot rebuild (a sparse or quantized tensor, a symbol)."""


@dataclass(frozen=True)
class TensorSpec:
    """What an op sees of a tensor argument: dtype, shape, strides, where its view starts
    (modulo the alignment that matters), and its device's type."""

    dtype: object        # torch.dtype
    shape: tuple
    stride: tuple
    offset: int          # elements, below _ALIGNMENT bytes
    device_type: str

    @classmethod
    def of(cls, t) -> "TensorSpec":
        import torch
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise _Unsupported(f"a {t.layout} tensor")
        try:
            shape = tuple(int(v) for v in t.shape)
            stride = tuple(int(v) for v in t.stride())
            offset = int(t.storage_offset())
        except (TypeError, ValueError, RuntimeError) as error:
            raise _Unsupported(f"symbolic sizes ({error})") from None
        # A dimension of size 1 is never stepped along: its stride means nothing to a
        # kernel (nor to is_contiguous), so it takes the contiguous one, one key for all.
        canonical = _contiguous_strides(shape)
        stride = tuple(c if size == 1 else s
                       for size, s, c in zip(shape, stride, canonical))
        itemsize = t.dtype.itemsize
        offset = (offset * itemsize) % _ALIGNMENT // itemsize
        return cls(t.dtype, shape, stride, offset, t.device.type)

    def elements(self) -> int:
        """The storage the view spans, from its start: what build_tensor allocates."""
        if any(size == 0 for size in self.shape):
            return self.offset
        return self.offset + 1 + sum((size - 1) * stride
                                     for size, stride in zip(self.shape, self.stride))

    def nbytes(self) -> int:
        return self.elements() * self.dtype.itemsize

    def dense(self) -> bool:
        """Contiguous from its storage's start: what a kernel takes without a copy."""
        return self.stride == _contiguous_strides(self.shape) and not self.offset

    def is_contiguous(self) -> bool:
        """Tensor.is_contiguous() as ATen decides it (what ``contiguous()`` copies when
        false): a dimension of one element may have any stride, a tensor of none is
        contiguous, and where the view starts does not matter."""
        if not math.prod(self.shape):
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1:
                if stride != expected:
                    return False
                expected *= size
        return True

    def text(self, main_device_type: str) -> str:
        """dtype[shape], then @strides if not contiguous, +offset if not 0, /device if
        not the op's (a CPU scalar beside CUDA tensors, say)."""
        out = f"{str(self.dtype).replace('torch.', '')}[{','.join(map(str, self.shape))}]"
        if self.stride != _contiguous_strides(self.shape):
            out += "@" + ",".join(map(str, self.stride))
        if self.offset:
            out += f"+{self.offset}"
        if self.device_type != main_device_type:
            out += f"/{self.device_type}"
        return out


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def build_tensor(spec: TensorSpec, device):
    """A real tensor of the spec's dtype, shape, strides and alignment, every byte zero:
    integer and bool tensors are zeros (an index of 0 is always in range, where a random
    one could fail a device-side assertion and lose the user's CUDA context), and floats
    are zeros too (no draw from the user's random generators, a memset)."""
    import torch
    itemsize = spec.dtype.itemsize
    # Zeroed bytes viewed as the dtype: one path for every dtype, float8 and bool included.
    storage = torch.zeros(spec.elements() * itemsize, dtype=torch.uint8, device=device)
    return storage.view(spec.dtype).as_strided(spec.shape, spec.stride, spec.offset)


def _spec_tree(value):
    """The argument with each tensor (in lists too) made a TensorSpec."""
    import torch
    if isinstance(value, torch.Tensor):
        return TensorSpec.of(value)
    if isinstance(value, list):
        return [_spec_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_spec_tree(v) for v in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        try:
            return {torch.SymInt: int, torch.SymFloat: float,
                    torch.SymBool: bool}[type(value)](value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise _Unsupported(f"a symbolic argument ({error})") from None
    return value


def _build_tree(value, device):
    """The argument rebuilt: each TensorSpec a zero tensor on ``device`` if the call had it
    on that kind of device (CUDA, for the device measured on), else where the call had it
    (a CPU scalar stays on the CPU)."""
    import torch
    if isinstance(value, TensorSpec):
        where = device if value.device_type == device.type else \
            torch.device(value.device_type)
        return build_tensor(value, where)
    if isinstance(value, list):
        return [_build_tree(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_build_tree(v, device) for v in value)
    return value


def _specs(value):
    if isinstance(value, TensorSpec):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _specs(v)


def _key_text(value, main_device_type: str) -> str | None:
    """An argument as the signature shows it; None for one left out (a float that only
    enters the arithmetic)."""
    import torch
    if isinstance(value, TensorSpec):
        return value.text(main_device_type)
    if value is None or isinstance(value, (bool, int, str)):
        return str(value)
    if isinstance(value, float):
        return None
    if isinstance(value, (torch.dtype, torch.memory_format, torch.layout, torch.device)):
        return str(value).replace("torch.", "")
    if isinstance(value, (list, tuple)):
        parts = [_key_text(v, main_device_type) for v in value]
        if any(p is None for p in parts):
            return None  # a list of values (of learning rates, say)
        return "[" + ",".join(parts) + "]"
    return type(value).__name__


@dataclass(frozen=True)
class OpCall:
    """One call of an op of SCRATCH_OPS, as a template: the op, its arguments with each
    tensor a TensorSpec (nothing of the step's tensors is kept), and its signature key."""

    op: str                  # the overload's name, "native_layer_norm_backward.default"
    func: object             # the OpOverload
    args: tuple
    kwargs: dict
    key: str
    main_device_type: str    # the op's device: its first tensor not on the CPU, if any
    bound: dict = field(default_factory=dict)  # the arguments by the schema's names,
                                               # defaults filled in

    def tensors(self):
        for value in (*self.args, *self.kwargs.values()):
            yield from _specs(value)

    def input_bytes(self) -> int:
        """Bytes of the inputs build() makes on the measuring device."""
        return sum(s.nbytes() for s in self.tensors() if s.device_type == self.main_device_type)

    def build(self, device) -> tuple:
        """(args, kwargs) of real tensors on ``device`` (CPU tensors of the call stay on the
        CPU), every byte zero; the other arguments as the call had them."""
        args = _build_tree(self.args, device)
        kwargs = {k: _build_tree(v, device) for k, v in self.kwargs.items()}
        return args, kwargs

    def runner(self, device):
        """The call on real inputs (built now): a function of no arguments."""
        args, kwargs = self.build(device)
        return lambda: self.func(*args, **kwargs)


def _flags(op: str) -> str:
    """The global settings that choose this op's kernel, as the key's last fields."""
    import torch
    fields = []
    if op in _CUDNN_CHOOSES:
        fields.append(f"cudnn={int(bool(torch.backends.cudnn.enabled))}")
    if torch.are_deterministic_algorithms_enabled():
        fields.append("deterministic=1")
    return " ".join(fields)


def call_of(func, args, kwargs, device_type: str | None = None) -> OpCall | None:
    """The OpCall of one dispatched op; None for an op not in SCRATCH_OPS, one with no
    tensor on device_type (when given), or one with an argument it cannot rebuild."""
    op = scratch_ops().get(func)
    if op is None:
        return None
    try:
        spec_args = _spec_tree(tuple(args))
        spec_kwargs = {k: _spec_tree(v) for k, v in (kwargs or {}).items()}
        bound = {name: _spec_tree(v)
                 for name, v in _ws._bound(func, args, kwargs or {}).items()}
    except _Unsupported:
        return None
    specs = [s for v in bound.values() for s in _specs(v)]
    if not specs:
        return None
    main = next((s.device_type for s in specs if s.device_type != "cpu"), "cpu")
    if device_type is not None and not any(s.device_type == device_type for s in specs):
        return None  # host work (a step counter's), not the device's memory
    fields = [op]
    # In the schema's order, whether the call passed an argument by position, by name or
    # left it to its default: one key for one signature.
    for name in (a.name for a in func._schema.arguments if a.name in bound):
        value = bound[name]
        if isinstance(value, float) and name in _KERNEL_FLOATS:
            text = repr(value)
        else:
            text = _key_text(value, main)
        if text is not None:
            fields.append(f"{name}={text}")
    flags = _flags(op)
    if flags:
        fields.append(flags)
    return OpCall(op, func, spec_args, spec_kwargs, " ".join(fields), main, bound)


# ---------------------------------------------------------------------------------------
# Scratch that follows from the kernel's source, for machines without the GPU.
# ---------------------------------------------------------------------------------------

def derived_size(call: OpCall, multiprocessors: int | None = None):
    """The call's transient on a CUDA device (of ``multiprocessors``; default the H100's
    and H200's) where _derived_scratch.DERIVED_OPS knows it (0: no block), else None (the
    CPU stand-in's tensors stand for CUDA tensors: their device is not asked)."""
    from ._derived_scratch import derived_size as derive
    return derive(call, multiprocessors)


# ---------------------------------------------------------------------------------------
# Measuring on the device.
# ---------------------------------------------------------------------------------------

def measure_op(call: OpCall, device, reader=None, out_bytes: int = 0, blocks=False):
    """The scratch one call of the op allocates and frees inside itself, measured on the
    device as a convolution's workspace is (workspaces.measure_transient): the op runs on
    real inputs of the call's layout, every byte zero, once to warm up and once measured,
    and the scratch is the peak during the second call less what the allocator holds
    before and after it. None when the inputs and ``out_bytes`` of outputs would take more
    than MEMORY_SHARE of what the device could still give, or the device runs out; the
    op's own errors reach the caller."""
    reader = reader or _ws.allocator_reader()
    available = getattr(reader, "available", None)
    if available is not None:
        room = available(device)
        if call.input_bytes() + out_bytes > MEMORY_SHARE * room:
            return None
    if os.environ.get("VRAMKIT_DEBUG_SCRATCH"):
        print("vramkit scratch: measuring", call.key, file=sys.stderr, flush=True)
    return _ws.measure_transient(lambda: call.runner(device), device, reader, blocks=blocks)


def _out_bytes(out) -> int:
    import torch
    from torch.utils._pytree import tree_leaves
    total = 0
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor):
            try:
                total += t.untyped_storage().nbytes()
            except (NotImplementedError, RuntimeError):
                pass
    return total


def _read_cache(path: str) -> dict:
    import json
    import os
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        entries = data["entries"] if data.get("format") == CACHE_FORMAT else None
        if not isinstance(entries, dict) or not all(
                isinstance(k, str) and is_transient(v) for k, v in entries.items()):
            raise ValueError(f"not a {CACHE_FORMAT} file")
        return {k: as_transient(v) for k, v in entries.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, AttributeError) as error:
        warnings.warn(f"vramkit.estimate: {path}, the cache of measured op scratch "
                      f"buffers, is ignored and will be rewritten: {error}",
                      RuntimeWarning, stacklevel=3)
        return {}


def _by_name(by_overload: Counter) -> Counter:
    """Counts by overload ("sum.dim_IntList", "sum.default") as counts by op ("sum"), as
    the notes name them."""
    named = Counter()
    for op, n in by_overload.items():
        named[op.split(".")[0]] += n
    return named


# ---------------------------------------------------------------------------------------
# The model the recorder calls.
# ---------------------------------------------------------------------------------------

class OpScratchModel(_ws.DeviceMeasuredSizes):
    """The recorder's hook for the ops of SCRATCH_OPS: one transient block per call with
    scratch, after the op's outputs. ``device``: the real device to measure on (None:
    nothing to measure on, and every signature counts 0); ``device_type``: count only
    calls with a tensor there."""

    _what = "op scratch buffers"

    def __init__(self, device=None, *, device_type: str | None = None, reader=None,
                 time_budget_s: float = TIME_BUDGET_S):
        super().__init__(device, device_type, reader, CACHE_FOLDER)
        self.time_budget_s = time_budget_s
        self._spent_s = 0.0

    def watched_ops(self):
        """The ops whose calls :meth:`hook` looks at."""
        return scratch_ops().keys()

    def hook(self, recorder, func, args, kwargs, out) -> None:
        if func not in scratch_ops():
            return  # the common case, first: most ops are not on the list
        call = call_of(func, args, kwargs, self.device_type)
        if call is None:
            return
        transient = self.size_of(call, out)
        if transient:
            recorder.allocate_transients(transient, call.op, LABEL, "workspaces")

    def size_of(self, call: OpCall, out=None):
        """The call's transient (_transients.py), measured on the device or 0."""
        size = self._size.get(call.key)
        if size is not None:
            return size
        if self.device is None:
            size = derived_size(call)
            how = "none" if size is None else "derived"
            size = size or 0
        else:
            size, how = self._from_device(call, out)
            if how in ("budget", "no_memory", "failed"):
                # Not measured here: what ATen's host code says, on this card, beats 0.
                derived = derived_size(call, self._multiprocessors())
                if derived is not None:
                    size, how = derived, "derived"
                    self._failed.pop(call.key, None)
        self._size[call.key], self._how[call.key] = size, how
        return size

    def _multiprocessors(self) -> int | None:
        """The measuring card's multiprocessors (None: not a CUDA device)."""
        import torch
        if getattr(self.device, "type", self.device) != "cuda":
            return None
        try:
            return torch.cuda.get_device_properties(self.device).multi_processor_count
        except (RuntimeError, AssertionError, ValueError):
            return None

    def _read_kept(self, path: str) -> dict:
        return _read_cache(path)

    def _save_kept(self, path: str, entries: dict) -> None:
        _ws.write_json_atomic(path, {
            "format": CACHE_FORMAT,
            "about": "scratch bytes that ATen ops allocate and free inside themselves, by "
                     "signature (vramkit.estimator.scratch.OpCall.key), measured by "
                     "vramkit.estimate on this kind of device",
            "measured_on": self._identity, "entries": dict(sorted(entries.items()))})

    def _from_device(self, call: OpCall, out) -> tuple:
        measured = self._kept_measurements()
        if call.key in measured:
            return measured[call.key], "cached"
        if self._spent_s > self.time_budget_s:
            return 0, "budget"
        reader = self._reader_here()
        self._before_measuring(reader)
        start = time.perf_counter()
        try:
            size = measure_op(call, self.device, reader, _out_bytes(out), blocks=True)
        except Exception as error:  # noqa: BLE001 - counted, and said in the notes
            # An op the real kernels refuse in isolation (an unsupported configuration,
            # an argument rebuilt wrong) is no reason to give no estimate: it counts 0.
            self._failed[call.key] = (f"{call.op}: {type(error).__name__}: "
                                      f"{str(error).splitlines()[0][:200]}")
            return 0, "failed"
        finally:
            self._spent_s += time.perf_counter() - start
        if size is None:
            return 0, "no_memory"
        self._measured[call.key] = size
        self._measured_new = True
        return size, "measured"

    def by_op(self, how: str | None = None) -> Counter:
        """How many of the step's signatures each op has (those sized ``how``, if given)."""
        return Counter(key.split(" ", 1)[0] for key, way in self._how.items()
                       if how is None or way == how)

    def notes(self) -> list:
        if not self._how:
            return []
        counts = self.counts()
        total = len(self._how)
        notes = self._on_device_note("op scratch buffers (layer norm, reductions, softmax, "
                                     "losses; not fused attention's)", "op signatures")
        if counts["no_memory"]:
            notes.append(f"the GPU lacked the memory to measure the scratch buffers of "
                         f"{counts['no_memory']} op signatures: they count 0")
        if counts["failed"]:
            notes.append(f"the scratch buffers of {counts['failed']} op signatures could "
                         f"not be measured on this GPU (the first: "
                         f"{next(iter(self._failed.values()))}): they count 0")
        if counts["budget"]:
            notes.append(f"measuring op scratch buffers took over {self.time_budget_s:g} s: "
                         f"{counts['budget']} op signatures left unmeasured count 0")
        if counts["derived"]:
            ops = ", ".join(sorted(_by_name(self.by_op("derived"))))
            notes.append(f"the scratch buffers of {counts['derived']} op signatures ({ops}) "
                         f"follow from ATen's CUDA kernels and were derived from their shapes")
        if counts["none"]:
            ops = ", ".join(f"{name} {n}" for name, n in
                            sorted(_by_name(self.by_op("none")).items(),
                                   key=lambda kv: (-kv[1], kv[0])))
            notes.append(f"scratch buffers that ops allocate and free inside themselves "
                         f"were not modelled for {counts['none']} of the step's {total} op "
                         f"signatures ({ops}): they are measured on a GPU, and there is "
                         f"none here, so the predicted peaks may be low by them (on an "
                         f"H200 one layer norm backward of ViT-B/16 in fp16 at batch 128 "
                         f"took 148 MiB)")
        return notes
