"""Run a training step under PyTorch's fake tensors and record every storage it makes.

A fake tensor has a shape, a dtype and a device but no memory, so a step run on them costs
CPU time only. The recorder is a dispatch mode above the fake mode: it sees the output of
every ATen operation, and each storage it has not seen before is an allocation of the
size PyTorch's caching allocator would give it (rounded up to 512 bytes, what
``torch.cuda.memory_allocated`` counts). A weak reference to the storage turns its death
into the matching free, in the order the real step would free it, because CPython frees
a storage the moment its last tensor goes. One exception: autocast's cache of cast weights
is a hash table keyed by address, and clearing it frees the copies in an order that differs
from run to run (on the GPU as here); the recorder writes those frees in the order their
blocks were made, so that the same step gives the same trace, and the same estimate, every
time.

Autograd sums the gradients that reach one tensor from several places (a residual
connection's two branches) in its input buffer: in place, into the first gradient, when
the buffer holds its last reference and neither is a tensor subclass, else into a new
tensor. Fake tensors are subclasses, so under them every sum makes a new block that the
real step does not; the recorder gives such a sum the first gradient's block instead when
that gradient dies as the sum is stored (the buffer held its last reference), as the real
step's in-place sum keeps it (Note [Gradients summed in place] in
docs/performance.md).

What an op allocates and frees inside itself, fake tensors do not show; the estimator's
hooks add what it knows of (a cuBLAS workspace kept from a thread's first matrix product,
a cuDNN convolution's workspaces, an op's scratch), each block where the measurement saw
the op make it among its outputs, or after them where only its bytes are known.

Each block carries what the estimate reports about it: the phase that made it (before
the step, forward, backward, optimizer), the role it turns out to have (parameter,
gradient, optimizer state, input, activation kept for backward, autocast copy of a
weight), and its call site: the innermost frame of the Python code that made it, outside
PyTorch and vramkit (a user's build() line, their step's line, a model library's), taken
when build() makes it for blocks that exist before the step. Where no such frame exists
(`vramkit estimate --model` builds and runs the step itself) the site says in words what
the block is: a vramkit file is never named, since it is no code the user can change.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field

import torch
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils import flop_counter
from torch.utils.weak import WeakIdKeyDictionary

from . import _fake_gaps
from ._transients import OUTPUT, outputs_marked

# Set while the CPU stand-in makes a tensor that a GPU machine makes in host memory (a
# scalar from torch.tensor() with no device: an optimizer's step counter): not counted.
MAKING_HOST_TENSOR = contextvars.ContextVar("vramkit_making_host_tensor", default=False)
# Where the CPU stand-in runs: the running recording's storages that a GPU machine holds in
# host memory (its StorageRecorder's), for the stand-in to mark and look up; and whether
# build() is running, where a tensor made with ``device="cpu"`` is the host's.
HOST_STORAGES = contextvars.ContextVar("vramkit_host_storages", default=None)
BUILDING = contextvars.ContextVar("vramkit_building", default=False)

_DEVICE_OF = torch.ops.prim.device.default


def storage_of(t: torch.Tensor):
    """``t``'s storage; None for a sparse or otherwise storage-less tensor."""
    try:
        return t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return None

_ADD = torch.ops.aten.add.Tensor
# The thread a CUDA step's backward runs on, as the cuBLAS workspaces model names threads.
_BACKWARD_THREAD = "autograd's device thread"

# Ops whose CUDA kernel makes its outputs in another order than it returns them, by the
# position of each output in the order made: dropout's kernel (ATen/native/cuda/
# Dropout.cu) makes the one-byte mask before the dropped values. The order decides where
# each block lands in the pool.
_CUDA_OUTPUT_ORDER = {torch.ops.aten.native_dropout.default: (1, 0)}


def _in_place_foreach_ops() -> frozenset:
    """The overloads of ATen's in-place multi-tensor ops (``_foreach_add_.Scalar``...):
    each writes into its first list and returns nothing."""
    found = set()
    names = {name.split("::", 1)[1].split(".", 1)[0]
             for name in torch._C._dispatch_get_all_op_names()
             if name.startswith("aten::_foreach_")}
    names = {name for name in names if name.endswith("_")}
    for name in names:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if not op._schema.returns and op._schema.is_mutable:
                found.add(op)
    return frozenset(found)


_IN_PLACE_FOREACH = _in_place_foreach_ops()

# PyTorch's caching allocator hands out blocks in multiples of 512 bytes (kMinBlockSize).
BLOCK_ROUNDING = 512

CATEGORIES = ("parameters", "gradients", "optimizer state", "inputs", "activations",
              "autocast copies", "workspaces", "temporaries")


def grouped_attention_flops(func, args) -> int:
    """The FLOPs of a fused attention op (forward or backward) whose keys and values have
    fewer heads than its queries (grouped-query attention), which PyTorch's formulas
    refuse: counted per query head, as the kernel uses them. 0 for any other op."""
    name = str(getattr(func, "_overloadpacket", func))
    if "scaled_dot_product" not in name:
        return 0
    if name.endswith("_backward"):
        grad_out, query, key, value = args[:4]
        return flop_counter.sdpa_backward_flop_count(tuple(grad_out.shape),
                                                     *per_query_head(query, key, value))
    query, key, value = args[:3]
    return flop_counter.sdpa_flop_count(*per_query_head(query, key, value))


def per_query_head(query, key, value) -> tuple:
    """The shapes the fused kernels compute on, as PyTorch's FLOP formulas take them:
    keys and values of grouped queries count once per query head, as they are used."""
    heads = query.shape[:2]
    return (tuple(query.shape), (*heads, *key.shape[2:]), (*heads, *value.shape[2:]))


def _counted(formula, *shapes) -> int:
    """A FLOP formula's count, 0 where it refuses the shapes: a FLOP count must never fail
    the memory estimate it rides along with."""
    try:
        return formula(*shapes)
    except AssertionError:
        return 0


def rounded(nbytes: int) -> int:
    """The block size PyTorch's allocator gives a request of ``nbytes``."""
    return max(BLOCK_ROUNDING, -(-nbytes // BLOCK_ROUNDING) * BLOCK_ROUNDING)


@dataclass
class Block:
    size: int          # rounded, as memory_allocated() counts it
    requested: int     # the storage's own size
    phase: str         # "setup", "forward", "backward", "optimizer"
    op: str            # the ATen operation that made it
    site: str          # file:line:function of the code that made it
    role: str = ""     # set once known: a category of CATEGORIES
    freed: bool = False


@dataclass
class Recording:
    """The ops of one recorded run: ("a", id, size) and ("f", id), and the blocks."""

    ops: list = field(default_factory=list)
    blocks: dict = field(default_factory=dict)
    peak_allocated: int = 0
    peak_op: int = 0               # index in ops just after the peak was reached
    live_at_peak: tuple = ()       # block ids live at the peak
    fake_ops: int = 0              # ATen operations run
    # Yes/no tensors of a generation loop computed from unknown values, taken as all "no"
    # (no end-of-sequence token drawn): the step generated all its new tokens.
    generation_stand_ins: int = 0
    # The step's torch.cuda calls the CPU stand-in answered, by name (_cuda_calls).
    cuda_calls_answered: dict = field(default_factory=dict)
    optimizer_reads: int = 0       # values an optimizer's step read, taken as zero
    step_counts_assumed: int = 0   # step counts of a loaded optimizer state, taken as 1
    finite_checks: int = 0         # finiteness checks of unknown values, taken as finite
    raise_only_checks: int = 0     # tests in checks that only raise, taken as passed
    first_raise_only_check: str = ""  # where the first of them was ("file:line")
    logged_reads: int = 0          # numbers read with .item(), answered (UnknownValue)
    first_logged_read: str = ""    # where the first of them was read ("file:line")
    selections_at_largest: int = 0  # value-dependent selections taken at their largest
    first_selection_at_largest: str = ""  # where the first of them was ("file:line")
    assignments: int = 0  # cost matrices assigned first rows to first columns (_values)
    first_assignment: str = ""  # where the first was asked for ("file:line")
    extremes_left: int = 0  # max()/min() of numbers and an unknown value: the unknown
    first_extreme_left: str = ""  # where the first was ("file:line")
    flops: int = 0                 # floating-point operations of the last step recorded
    compiled_ran_eager: bool = False  # a torch.compile'd step or module, Dynamo compiled none
    dense_attention_scores: int = 0  # bytes: the most fp32 scores one FlexAttention call holds
    objects_left_unwalked: bool = False  # plain objects held more than _held looks into

    def events(self):
        """The ops as ``vramkit replay`` trace events on stream 0."""
        for op in self.ops:
            yield (op[0], op[1], op[2], 0) if op[0] == "a" else ("f", op[1], 0)


# The steps `vramkit estimate --model` runs are the user's code there: not folded.
_MODELS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models.py")
# Frames further out than the command line's are its plumbing (the `vramkit` script):
# a walk that reaches it has found no code of the user's.
_COMMAND_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "command.py")

# A block whose making no frame of the user's shows, in words, by its role.
_ROLE_WORDS = {"parameters": "parameters (model construction)",
               "inputs": "the batch (made before the step)",
               "gradients": "gradients (the backward pass)",
               "optimizer state": "optimizer state (the optimizer's step)",
               "activations": "activations (the forward pass)",
               "autocast copies": "autocast copies of the weights (the forward pass)"}


def _site_name(path: str, line: int, function: str) -> str:
    """A call site as a user reads it: an installed package's file from its package folder
    (transformers/activations.py:66:forward, not the whole site-packages path), and a line of
    the step `vramkit estimate --model` writes for the user by what it does there."""
    if path == _MODELS_FILE:
        import linecache
        return f"the training step: {linecache.getline(path, line).strip() or function}"
    marker = os.sep + "site-packages" + os.sep
    if marker in path:
        path = path[path.rindex(marker) + len(marker):]
    return f"{path}:{line}:{function}"


def _folded_prefixes() -> tuple[str, ...]:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, here + os.sep)


def caller_site(folded: tuple[str, ...], depth: int) -> str:
    """The innermost frame, from ``depth`` frames up, outside PyTorch and vramkit (the
    models `vramkit estimate --model` writes count as the user's), as a call site; ""
    where there is none: the walk reached vramkit's command line, or the stack's top."""
    frame = sys._getframe(depth + 1)
    while frame is not None:
        path = frame.f_code.co_filename
        if path == _COMMAND_FILE:
            return ""
        if path == _MODELS_FILE or not (path.startswith(folded) or path.startswith("<")):
            return _site_name(path, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return ""


def in_words(block: "Block") -> str:
    """What a block that no user's frame made is, for the list of call sites."""
    return _ROLE_WORDS.get(block.role, f"{block.role or 'temporaries'} ({block.phase})")


class CreationSites(TorchDispatchMode):
    """While build() runs: the call site that made each storage (the user's line that
    constructs the model or moves it to the GPU), for the blocks the recorder takes
    from the built objects when the step starts; and which storages hold weights or
    copies of them (an EMA copy of the weights kept in a list is the model's weights
    again, not the batch)."""

    supports_higher_order_operators = True  # its hook is the same for them

    def __init__(self):
        super().__init__()
        self.sites = WeakIdKeyDictionary()  # storage -> call site ("" for none)
        self._weights = WeakIdKeyDictionary()  # storage -> True: a parameter's, or a copy
        self._folded = _folded_prefixes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # The shapes of the weights the op reads: an output of one of them is a copy of a
        # weight (clone, .to(), empty_like), not something computed from the weights
        # (a teacher's logits kept as targets).
        weight_shapes = set()
        for a in tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor):
                storage = storage_of(a)
                if isinstance(a, torch.nn.Parameter) and storage is not None:
                    self._weights[storage] = True
                if storage is not None and storage in self._weights:
                    weight_shapes.add(tuple(a.shape))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = storage_of(t)
                if storage is not None and storage not in self.sites:
                    self.sites[storage] = caller_site(self._folded, 1)
                    if tuple(t.shape) in weight_shapes:
                        self._weights[storage] = True
        return out

    def holds_weights(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage is a parameter's or a copy of one made in build()."""
        storage = storage_of(t)
        return storage is not None and storage in self._weights


class StorageRecorder(TorchDispatchMode):
    """The dispatch mode that turns storages into allocations and frees.

    ``phase`` is set by the caller around the step (setup, then the step's phases, which
    the recorder tells apart itself: an op inside a backward graph task is backward, and
    the optimizer hooks of :func:`optimizer_phase` mark the optimizer's)."""

    def __init__(self):
        super().__init__()
        self.recording = Recording()
        self.phase = "setup"
        self._ids = WeakIdKeyDictionary()   # storage -> block id
        self._refs: dict[int, weakref.ref] = {}
        self._live: dict[int, int] = {}      # block id -> size
        self._allocated = 0
        self._next_id = 0
        # Backward runs on autograd's threads; reentrant because a storage can die (and its
        # weak reference call back into _freed) while this thread is inside track().
        self._lock = threading.RLock()
        self._folded = _folded_prefixes()
        self.backward_starts: list[int] = []  # op index where each backward began
        self._in_backward = False
        self.device_type: str | None = None  # count only storages on this device type
        # Called with (recorder, op name, args, thread id) once an op's outputs are
        # recorded: a library workspace made at a thread's first call (cuBLAS's) goes there.
        self.workspace_hook = None
        # Called with (recorder, func, args, kwargs, out) once an op's outputs are
        # recorded: what the op allocates and frees inside itself after making them (a
        # cuDNN convolution's workspace) goes there, before the next op.
        self.after_outputs_hook = None
        # The mode that knows small tensors' values (_values.KnownValues), run inside this
        # one's dispatch rather than entered as a mode of its own: each mode on the stack
        # costs every op a round trip from PyTorch's dispatcher into Python, and a step
        # runs thousands of ops. None: the op goes straight to the mode below.
        self.values = None
        self.op_phase = "setup"              # the phase of the op being dispatched
        # Where build() made each storage (CreationSites.sites), for blocks that exist
        # before the step; None: no build() of the user's ran (`vramkit estimate
        # --model` builds its own), and those blocks are named in words.
        self.creation_sites: WeakIdKeyDictionary | None = None
        # Storages the CPU stand-in made that a GPU machine holds in host memory.
        self.host_storages = WeakIdKeyDictionary()
        # The floating-point operations of each step begun (record_step appends one per
        # step), counted here by PyTorch's FLOP formulas rather than under its
        # FlopCounterMode, which decomposes ops and so changes what checkpointing keeps:
        # one recording gives both the memory and the compute.
        self.step_flops: list[int] = []
        self._flop_formulas = flop_counter.flop_registry
        # Frees held back while a burst whose order is arbitrary runs (unordered_frees).
        self._held_frees: list[int] | None = None
        # A sum of two gradients just made in backward, as autograd's input buffer makes
        # it (_SumOfGradients), until the next op: taken in place if the first gradient
        # dies before then.
        self._sum_of_gradients: _SumOfGradients | None = None
        # The op being dispatched: where its outputs' allocations sit in the recording,
        # for transients that mark their place among them (allocate_transients).
        self._outputs: _OpOutputs | None = None

    # -- the dispatch hook ------------------------------------------------------------

    # Higher-order operators (FlexAttention's forward and backward) come here too, whole:
    # their fake kernels make what the compiled kernel makes.
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, HigherOrderOperator):
            return self._higher_order(func, args, kwargs)
        if func is _DEVICE_OF:
            # ``t.device``, asked of fake tensors more often than every other op together:
            # it allocates nothing, computes nothing and has no value to follow. A fake
            # tensor outside a fake kernel answers with the device it stands for, as its
            # own handler would, without another trip through the fake mode's dispatch.
            t = args[0] if len(args) == 1 and not kwargs else None
            if isinstance(t, FakeTensor) and not t.fake_mode.in_kernel_invocation:
                return t.fake_device
            return func(*args, **(kwargs or {}))
        # A fake kernel stricter than CUDA's is not asked (it logs its refusal as an
        # error before raising): _fake_gaps makes what CUDA's kernel makes instead.
        self._sum_of_gradients = None
        if func in _IN_PLACE_FOREACH and not torch.is_grad_enabled() \
                and (self.values is None or not self.values.knows_any(args)):
            # An optimizer's in-place update of every parameter: it allocates nothing and
            # returns nothing, and the values it writes are unknown; the fake kernel
            # would only hash the metadata of every tensor of the lists.
            self.recording.fake_ops += 1
            return None
        out = _fake_gaps.stand_in(func, args, kwargs) if func in _fake_gaps.OPS else None
        if out is None:
            out = (self.values.__torch_dispatch__(func, types, args, kwargs)
                   if self.values is not None else func(*args, **(kwargs or {})))
        phase = self._dispatched()
        if self.step_flops:
            formula = self._flop_formulas.get(getattr(func, "_overloadpacket", None))
            if formula is not None:
                try:
                    flops = formula(*args, **(kwargs or {}), out_val=out)
                except AssertionError:
                    # PyTorch's attention formulas want one key head per query head; a
                    # FLOP count must never fail the memory estimate it rides along with.
                    flops = grouped_attention_flops(func, args)
                self.step_flops[-1] += flops
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        # A weight cast by autocast: the copy of a parameter made in forward.
        cast_of_weight = (func is torch.ops.aten._to_copy.default and phase == "forward"
                          and args and isinstance(args[0], torch.Tensor)
                          and self._role_of(args[0]) == "parameters")
        peak = self._peak_state()
        first_output = len(self.recording.ops)
        allocated_before = self._allocated
        # Most ops return one tensor: it is tracked without flattening the output.
        outputs = (out,) if isinstance(out, torch.Tensor) else tree_leaves(out)
        order = _CUDA_OUTPUT_ORDER.get(func)
        if order is not None and len(outputs) == len(order):
            outputs = [outputs[i] for i in order]
        for t in outputs:
            if isinstance(t, torch.Tensor):
                self.track(t, phase, name, cast_of_weight)
        self._outputs = _OpOutputs(first_output, len(self.recording.ops), first_output,
                                   allocated_before, peak)
        if func is _ADD and self._in_backward:
            self._sum_of_gradients = self._summed_gradients(args, kwargs, out, peak)
        if self.workspace_hook is not None:
            # A CUDA step's backward runs on autograd's thread for the device, and with it
            # its products on a cuBLAS handle (and workspace) of their own; the CPU
            # stand-in's backward runs on the caller's thread: named apart either way.
            self.workspace_hook(self, name, args,
                                _BACKWARD_THREAD if self._in_backward else threading.get_ident())
        if self.after_outputs_hook is not None:
            self.after_outputs_hook(self, func, args, kwargs or {}, out)
        return out

    def _dispatched(self) -> str:
        """Counts the op just run and returns its phase: backward inside a backward graph
        task (noting the op where each backward pass begins), else the caller's."""
        phase = self.phase
        in_backward = phase != "setup" and torch._C._current_graph_task_id() != -1
        if in_backward:
            phase = "backward"
            if not self._in_backward:
                self.backward_starts.append(len(self.recording.ops))
        self._in_backward = in_backward
        self.op_phase = phase
        self.recording.fake_ops += 1
        return phase

    def _higher_order(self, func, args, kwargs):
        """A higher-order operator: its outputs are the step's allocations, as an op's;
        it has no schema, library workspace or measured scratch, and its outputs' values
        are unknown. FlexAttention's FLOPs are counted as dense attention's (PyTorch has
        no formula for it; a block mask skips some)."""
        self._sum_of_gradients = None
        out = func(*args, **(kwargs or {}))
        phase = self._dispatched()
        name = func.name()
        if name == "flex_attention":
            query, key, value = args[:3]
            batch, heads, queries, _ = query.shape
            self.recording.dense_attention_scores = max(
                self.recording.dense_attention_scores,
                batch * heads * queries * key.shape[-2] * 4)
            if self.step_flops:
                self.step_flops[-1] += _counted(flop_counter.sdpa_flop_count,
                                                *per_query_head(query, key, value))
        elif name == "flex_attention_backward" and self.step_flops:
            query, key, value, _out, _logsumexp, grad_out = args[:6]
            self.step_flops[-1] += _counted(flop_counter.sdpa_backward_flop_count,
                                            tuple(grad_out.shape),
                                            *per_query_head(query, key, value))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t, phase, name)
        return out

    def _role_of(self, t: torch.Tensor) -> str:
        bid = self.block_of(t)
        return self.recording.blocks[bid].role if bid is not None else ""

    # -- storages ------------------------------------------------------------------------

    def track(self, t: torch.Tensor, phase: str, op: str,
              cast_of_weight: bool = False) -> int | None:
        """Record ``t``'s storage if it is new; returns its block id (None if empty)."""
        if self.device_type is not None and t.device.type != self.device_type:
            return None  # host memory (an optimizer's step counter, say)
        storage = storage_of(t)
        if storage is None:
            return None  # a sparse or otherwise storage-less tensor: nothing to count
        if self.device_type is None and (MAKING_HOST_TENSOR.get()
                                         or storage in self.host_storages):
            self.host_storages[storage] = True  # the same, made by the CPU stand-in (_emulate)
            return None
        with self._lock:
            bid = self._ids.get(storage)
            if bid is not None:
                return bid
            nbytes = storage.nbytes()
            if nbytes == 0:
                return None
            bid = self._next_id
            self._next_id += 1
            self._ids[storage] = bid
            self._refs[bid] = weakref.ref(storage, lambda _ref, bid=bid: self._freed(bid))
            if phase != "setup":
                site = caller_site(self._folded, 1)
            elif self.creation_sites is not None and storage in self.creation_sites:
                site = self.creation_sites[storage]
            else:
                site = ""  # made before the estimate (a model passed in): in words
            block = Block(rounded(nbytes), nbytes, phase, op, site)
            if cast_of_weight:
                block.role = "autocast copies?"  # one if backward still holds it
            self._allocate(bid, block)
            return bid

    def allocate_modelled(self, size: int, op: str, role: str) -> int:
        """An allocation fake tensors cannot see (a library workspace), kept to the end."""
        with self._lock:
            bid = self._next_id
            self._next_id += 1
            self._allocate(bid, Block(rounded(size), size, self.phase, op, op, role))
            return bid

    def allocate_transients(self, transient, op: str, site: str, role: str) -> None:
        """Allocations an op makes and frees inside itself (a library workspace, a
        kernel's scratch), as a model gives them (_transients.py): bytes, one block freed
        at once, or a measured sequence of blocks, each allocated and freed in its place.
        Each counts toward the peak at the point it is made."""
        steps = (transient, -1) if isinstance(transient, int) else transient
        with self._lock:
            outputs = self._outputs
            marked = outputs_marked(transient)
            if marked and outputs is not None and marked <= outputs.end - outputs.cursor:
                self._place_among_outputs(steps, outputs, op, site, role)
                return
            made = []
            for step in steps:
                if step > 0:
                    made.append(self._next_id)
                    self._next_id += 1
                    self._allocate(made[-1], Block(rounded(step), step, self.op_phase, op,
                                                   site, role))
                elif step < 0:
                    self._freed(made[-step - 1])

    def _place_among_outputs(self, steps, outputs: _OpOutputs, op: str, site: str,
                             role: str) -> None:
        """A measured transient whose outputs are marked, written among the op's output
        allocations where the real op made each block: a block before the outputs it
        preceded. The peak is then counted again over what the op wrote."""
        rec = self.recording
        made = []
        for step in steps:
            if step == OUTPUT:
                outputs.cursor += 1  # the op's next output is already in its place
                continue
            if step > 0:
                bid = self._next_id
                self._next_id += 1
                made.append(bid)
                rec.blocks[bid] = Block(rounded(step), step, self.op_phase, op, site, role)
                event = ("a", bid, rec.blocks[bid].size)
            else:
                rec.blocks[made[-step - 1]].freed = True
                event = ("f", made[-step - 1])
            rec.ops.insert(outputs.cursor, event)
            outputs.cursor += 1
            outputs.end += 1
        self._recount_peak_from(outputs)

    def _recount_peak_from(self, outputs: _OpOutputs) -> None:
        """The peak over the op's part of the recording, counted again from what was
        allocated before its outputs (every block of a transient is freed inside it, so
        the totals after the op are as they were)."""
        rec = self.recording
        tail = rec.ops[outputs.first:]
        made_here = {op[1] for op in tail if op[0] == "a"}
        freed_here = {op[1] for op in tail if op[0] == "f"}
        live = {bid: None for bid in self._live if bid not in made_here}
        live.update((bid, None) for bid in freed_here - made_here)
        rec.peak_allocated, rec.peak_op, rec.live_at_peak = outputs.peak
        total = outputs.allocated_before
        for index, op in enumerate(tail, outputs.first):
            if op[0] == "a":
                total += op[2]
                live[op[1]] = None
                if total > rec.peak_allocated:
                    rec.peak_allocated, rec.peak_op = total, index + 1
                    rec.live_at_peak = tuple(live)
            else:
                total -= rec.blocks[op[1]].size
                live.pop(op[1], None)

    def _allocate(self, bid: int, block: Block) -> None:
        rec = self.recording
        rec.blocks[bid] = block
        rec.ops.append(("a", bid, block.size))
        self._live[bid] = block.size
        self._allocated += block.size
        if self._allocated > rec.peak_allocated:
            rec.peak_allocated = self._allocated
            rec.peak_op = len(rec.ops)
            rec.live_at_peak = tuple(self._live)

    def _freed(self, bid: int) -> None:
        with self._lock:
            pending = self._sum_of_gradients
            if pending is not None and pending.first == bid:
                self._sum_of_gradients = None
                if self._sum_taken_in_place(pending):
                    return
            size = self._live.pop(bid, None)
            if size is None:
                return
            self._allocated -= size
            self._refs.pop(bid, None)
            self.recording.blocks[bid].freed = True
            if self._held_frees is not None:
                self._held_frees.append(bid)
            else:
                self.recording.ops.append(("f", bid))

    # -- gradients summed in place ------------------------------------------------------

    def _peak_state(self) -> tuple:
        rec = self.recording
        return rec.peak_allocated, rec.peak_op, rec.live_at_peak

    def _summed_gradients(self, args, kwargs, out, peak) -> _SumOfGradients | None:
        """``first + second`` as autograd's input buffer sums two gradients of one tensor
        (same shape and dtype, no alpha, grad mode off, the first dense and not a view):
        the candidate for an in-place sum. None for any other add. A view shares its
        storage with its base, which it keeps alive: the buffer never holds the storage's
        last reference, and the real step sums into a new tensor."""
        if kwargs or torch.is_grad_enabled() or len(args) != 2 \
                or not isinstance(out, torch.Tensor):
            return None
        first, second = args
        if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)) \
                or first.layout is not torch.strided or second.layout is not torch.strided:
            return None  # sparse gradients are summed by other rules
        if first.shape != second.shape or first.dtype != second.dtype \
                or out.shape != first.shape or out.dtype != first.dtype \
                or first._is_view() or not _non_overlapping_and_dense(first):
            return None
        first_bid, out_bid = self.block_of(first), self.block_of(out)
        if first_bid is None or out_bid is None or first_bid == out_bid:
            return None
        blocks = self.recording.blocks
        if blocks[first_bid].size != blocks[out_bid].size:
            return None
        return _SumOfGradients(first_bid, out_bid, weakref.ref(out.untyped_storage()), peak)

    def _sum_taken_in_place(self, pending: _SumOfGradients) -> bool:
        """The first gradient died as its sum was stored: the buffer held its last
        reference, and the real step summed into it. The sum's block is undone and the
        sum's storage takes over the first gradient's block. False (nothing changed)
        where the recording has moved on past the sum's allocation."""
        rec = self.recording
        storage = pending.out_storage()
        if storage is None:
            return False
        index = len(rec.ops) - 1
        while index >= 0 and rec.ops[index][0] != "a":
            index -= 1
        if index < 0 or rec.ops[index][1] != pending.out:
            return False
        del rec.ops[index]
        del rec.blocks[pending.out]
        self._allocated -= self._live.pop(pending.out)
        del self._refs[pending.out]  # its weak reference goes, and its callback with it
        self._ids[storage] = pending.first
        self._refs[pending.first] = weakref.ref(
            storage, lambda _ref, bid=pending.first: self._freed(bid))
        if rec.peak_op > index:  # the sum's block made the peak: it never existed
            rec.peak_allocated, rec.peak_op, rec.live_at_peak = pending.peak
        return True

    @contextlib.contextmanager
    def unordered_frees(self):
        """Within it, the frees of blocks are written in the order the blocks were made
        (their ids), not in the order they came: for a burst of frees whose order the
        program leaves to chance (autocast clearing its cache). Nothing is allocated
        within such a burst, so every total the recording keeps is the same."""
        with self._lock:
            outer = self._held_frees
            self._held_frees = [] if outer is None else outer
        try:
            yield
        finally:
            if outer is None:
                with self._lock:
                    held, self._held_frees = self._held_frees, None
                    self.recording.ops.extend(("f", bid) for bid in sorted(held))

    def block_of(self, t: torch.Tensor) -> int | None:
        storage = storage_of(t)
        return None if storage is None else self._ids.get(storage)

    def set_role(self, t: torch.Tensor, role: str, phase: str = "setup") -> None:
        """Give ``t``'s block a role, recording it first if it predates the recorder."""
        bid = self.block_of(t)
        if bid is None:
            bid = self.track(t, phase, "(existing)")
        if bid is not None:
            self.recording.blocks[bid].role = role

    @property
    def allocated(self) -> int:
        return self._allocated


@dataclass
class _OpOutputs:
    """Where the op being recorded wrote its outputs' allocations: ops[first:end], the
    next output not yet passed by a marked transient at cursor; and the allocated total
    and peak before them."""

    first: int
    end: int
    cursor: int
    allocated_before: int
    peak: tuple


@dataclass
class _SumOfGradients:
    """A new block made by summing two gradients, and what undoing it needs."""

    first: int          # the first gradient's block: the in-place sum's target
    out: int            # the block the sum made
    out_storage: weakref.ref
    peak: tuple         # the recording's peak before the sum's block was made


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a range of its storage exactly, in some order of its
    dimensions (contiguous, channels-last, a transpose of either): what an in-place sum
    into it needs."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda dim: dim[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def add_flops(count: int) -> None:
    """Count ``count`` floating-point operations to the step the recorder on the mode
    stack is recording: what a stand-in for a GPU kernel (the CPU's fused attention)
    computes without running the ops PyTorch's FLOP formulas count."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, StorageRecorder) and mode.step_flops:
            mode.step_flops[-1] += count


def classify(recording: Recording, recorder: StorageRecorder) -> None:
    """Settle every block's category from what the run showed about it: a block made in
    forward and still live when the next backward began is kept for backward (an
    activation, or an autocast copy of a weight); everything else unnamed is temporary."""
    starts = recorder.backward_starts
    allocated_at: dict[int, int] = {}
    kept_for_backward: set[int] = set()
    live: set[int] = set()
    next_start = 0
    for index, op in enumerate(recording.ops):
        while next_start < len(starts) and starts[next_start] == index:
            kept_for_backward.update(live)
            live.clear()  # a block counts for the first backward after it only
            next_start += 1
        if op[0] == "a":
            allocated_at[op[1]] = index
            if recording.blocks[op[1]].phase == "forward":
                live.add(op[1])
        else:
            live.discard(op[1])
    for bid, block in recording.blocks.items():
        if block.role in CATEGORIES:
            continue
        if block.role == "autocast copies?":
            block.role = "autocast copies" if bid in kept_for_backward else "temporaries"
        elif block.phase == "forward" and bid in kept_for_backward:
            block.role = "activations"
        else:
            block.role = "temporaries"
    for block in recording.blocks.values():
        if not block.site:
            block.site = in_words(block)
