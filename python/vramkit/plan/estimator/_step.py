"""Run the user's training step on fake tensors, with the recorder watching.

The user hands over what their step takes, built as usual (a model on the CPU or on the
``meta`` device, its optimizer, a batch): each module, optimizer and tensor among the
arguments is given a fake twin on the target device, sharing structure but no memory, and
the step runs on the twins. The real objects are never touched.

The recording starts with what exists before the step (parameters, buffers, the inputs),
as the real program has them allocated before its first step; then ``steps`` steps run
(two by default: the first creates the optimizer's state, the second runs with it, which
is where a training loop's steady peak is).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import itertools
import logging
import os
import sys
import traceback
import types
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from . import _emulate, _selections
from ._moves import checkpoints_loaded_on_cpu, fake_module_copies, fake_module_moves
from ._record import (_MODELS_FILE, BUILDING, HOST_STORAGES, CreationSites, Recording,
                      StorageRecorder, _folded_prefixes, classify)
from ._values import _DECIDING_OPTIMIZERS, KnownValues
from .workspaces import WorkspaceTableError


class UntraceableStep(RuntimeError):
    """The step did something fake tensors cannot follow; the message says what and how to
    work around it. ``in_build`` is true when ``build()`` raised, before any step ran."""

    in_build = False


class LargerThanAnyDevice(UntraceableStep):
    """The step holds more at its peak than the largest device the engine models: it fits
    no card, and no figures can be given for it."""


class _ExplainedHere(logging.Filter):
    """Drops the fake-tensor module's logs of an exception (its ``log.exception`` calls,
    each with a whole traceback on stderr): the exception itself reaches the caller,
    explained in one message by UntraceableStep, so the log would only say it twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


@contextlib.contextmanager
def _fake_tensor_errors_explained_here():
    log = logging.getLogger("torch._subclasses.fake_tensor")
    quiet = _ExplainedHere()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


@dataclass
class Target:
    """Where the fake step runs: ``device`` for its tensors, ``emulated`` when a CPU
    stands for the GPU (no CUDA driver on this machine)."""

    device: torch.device
    emulated: bool


def choose_target(device: str | torch.device = "cuda", emulate: bool | None = None) -> Target:
    """Fake CUDA tensors where a GPU is present, else (or if ``emulate``) a CPU for it."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:  # PyTorch's words for a name it cannot parse
        raise ValueError(f"estimate(): device must be a CUDA device such as 'cuda' or "
                         f"'cuda:1', not {device!r} ({error})") from None
    if device.type != "cuda":
        raise ValueError(f"estimate(): device must be a CUDA device, not {device}")
    if not emulate and torch.cuda.is_available():
        return Target(torch.device("cuda", device.index or 0), False)
    return Target(torch.device("cpu"), True)


class _Twins:
    """Fake twins of the user's objects, made once each (a parameter shared by two modules
    stays shared)."""

    def __init__(self, mode: FakeTensorMode, target: Target):
        self.mode = mode
        self.target = target
        self.memo: dict[int, object] = {}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        twin = self.memo.get(id(t))
        if twin is None:
            fake = self.mode.from_tensor(t.detach())
            with self.mode:
                fake = fake.to(self.target.device)
            if isinstance(t, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=t.requires_grad)
            elif t.requires_grad:
                fake.requires_grad_(True)
            twin = self.memo[id(t)] = fake
        return twin

    def module(self, m: torch.nn.Module) -> torch.nn.Module:
        memo = {id(t): self.tensor(t) for t in (*m.parameters(), *m.buffers())}
        return self._copy(m, memo)

    def _copy(self, obj, memo: dict):
        """A deep copy of ``obj`` over the twins in ``memo``; an optimizer it holds (a
        module whose step is its own method keeps one) is twinned as one, so that the
        step's optimizer is the twin the estimator watches."""
        for value in vars(obj).values():
            if isinstance(value, torch.optim.Optimizer):
                memo[id(value)] = self.any(value)
        twin = copy.deepcopy(obj, {**self.memo, **memo})
        self.memo[id(obj)] = twin
        return twin

    def owner(self, step_fn):
        """``step_fn`` bound to the twin of what it belongs to, when it is a module or a
        method of an object holding modules (``estimate(trainer.train_step, batch)``):
        the step then runs on fake twins, never on the real model. The twin is returned
        too (None for a plain function), so that its modules and optimizers are watched."""
        if isinstance(step_fn, torch.nn.Module):
            twin = self.any(step_fn)
            return twin, twin
        owner = getattr(step_fn, "__self__", None)
        if not inspect.ismethod(step_fn) or owner is None or isinstance(owner, type) \
                or not hasattr(owner, "__dict__") or not (
                    isinstance(owner, torch.nn.Module)
                    or _held(vars(owner).values(), (torch.nn.Module, torch.Tensor),
                             into_objects=False)):
            return step_fn, None
        if isinstance(owner, torch.nn.Module):
            twin = self.any(owner)
        else:
            memo = {id(v): self.any(v) for v in vars(owner).values()
                    if isinstance(v, (torch.nn.Module, torch.Tensor))}
            twin = self._copy(owner, memo)
        return types.MethodType(step_fn.__func__, twin), twin

    def optimizer(self, opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
        groups = []
        for group in opt.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [self.tensor(p) for p in group["params"]]
            groups.append(g)
        # The defaults hold every hyperparameter, some of which the class's constructor
        # sets itself (AdamW's decoupled_weight_decay): pass only what it accepts.
        accepted = inspect.signature(type(opt).__init__).parameters
        twin = type(opt)(groups, **{k: v for k, v in opt.defaults.items()
                                    if k in accepted and k != "params"})
        if hasattr(opt.step, "_wrapped_by_lr_sched"):
            _watched_as_by_a_scheduler(twin)
        self.memo[id(opt)] = twin
        return twin

    def any(self, value):
        if id(value) in self.memo:
            return self.memo[id(value)]
        if isinstance(value, torch.nn.Module):
            return self.module(value)
        if isinstance(value, torch.optim.Optimizer):
            return self.optimizer(value)
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.any(v) for v in value)
        if isinstance(value, dict):
            return {k: self.any(v) for k, v in value.items()}
        return self.holder(value)

    def holder(self, value):
        """A twin of an object that holds the step's modules, optimizers or tensors, or
        that a step changes as it trains (an LR scheduler holds the optimizer and sets its
        learning rate, a GradScaler keeps its scale): a deep copy over their twins, so
        that the step changes the twins, never the user's objects. Anything else, or an
        object that cannot be copied, is passed as it is."""
        held = _held(vars(value).values(), (torch.nn.Module, torch.optim.Optimizer,
                                            torch.Tensor), into_objects=False) \
            if hasattr(value, "__dict__") else []
        if not held and not isinstance(value, _CHANGED_BY_A_STEP):
            return value
        memo = {id(v): self.any(v) for v in held}
        try:
            twin = copy.deepcopy(value, {**self.memo, **memo})
        except Exception:  # noqa: BLE001 - a lock, a file: the object as it is, as before
            return value
        self.memo[id(value)] = twin
        return twin


def _watched_as_by_a_scheduler(opt: torch.optim.Optimizer) -> None:
    """Mark ``opt``'s steps as an LR scheduler made over it does (PyTorch's attribute
    names), so that the scheduler's twin, which holds this twin, sees the optimizer step
    first and does not warn that its step was replaced."""
    step = opt.step

    @functools.wraps(step)
    def stepped(*args, **kwargs):
        opt._opt_called = True
        return step(*args, **kwargs)

    stepped._wrapped_by_lr_sched = True
    opt.step = stepped


# Objects a training step changes that may hold no tensor yet (a GradScaler makes its
# scale at its first use).
_CHANGED_BY_A_STEP = (torch.optim.lr_scheduler.LRScheduler,
                      torch.optim.lr_scheduler.ReduceLROnPlateau, torch.amp.GradScaler)


def _compiled_among(values, step_fn) -> bool:
    """Whether the step, or a module among its objects, is ``torch.compile``'d (Dynamo's
    wrappers; Dynamo not imported: nothing is)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    return wrapper is not None and (bool(_held(values, wrapper, into_objects=False)) or hasattr(
        inspect.unwrap(step_fn), "_torchdynamo_orig_callable"))


def _graphs_compiled() -> int:
    """How many graphs Dynamo has compiled in this process (0 if it was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils.counters["stats"]["unique_graphs"] if utils is not None else 0


# How many objects _held visits inside plain objects, and how many attributes deep: an EMA
# copy or a teacher kept in a SimpleNamespace or a class of the user's is a few attributes
# down, and a dataset of a million samples held beside them is not walked.
_MOST_OBJECTS_LOOKED_INTO = 100_000
_DEEPEST_ATTRIBUTE = 4
_NOT_LOOKED_INTO = (type, types.ModuleType, types.FunctionType, types.MethodType,
                    types.BuiltinFunctionType, functools.partial, torch.device, torch.dtype)


def _held(values, kind, left_unwalked: list | None = None, into_objects: bool = True) -> list:
    """The objects of type ``kind`` the step's objects hold, each once: those among
    ``values`` and in their lists, tuples, sets and dicts, and (``into_objects``) in the
    attributes of plain objects among them (an ``AcceleratedOptimizer``'s optimizer, a
    ``SimpleNamespace`` holding an EMA copy of the weights, a trainer class) the fake ones,
    which build() made or the estimate twinned: held by the program before its first
    step, they are its memory whether or not the step touches them. Real objects there (a
    CPU dataset inside a data loader given as it is) are the host's. Where the objects
    hold more than _MOST_OBJECTS_LOOKED_INTO, True is put in ``left_unwalked``."""
    found, seen, budget = {}, set(), [_MOST_OBJECTS_LOOKED_INTO]

    def look(v, depth: int, inside_object: bool) -> None:
        if id(v) in seen or (inside_object and budget[0] <= 0):
            return
        seen.add(id(v))
        budget[0] -= inside_object  # lists, tuples and dicts outside objects: walked whole
        if isinstance(v, kind):
            if not inside_object or _is_fake(v):
                found[id(v)] = v
            if not isinstance(v, torch.optim.Optimizer):
                return  # an optimizer may wrap the one whose step runs (accelerate's)
        if isinstance(v, (torch.Tensor, torch.nn.Module)):
            return  # what these hold is found through them (parameters, buffers)
        if isinstance(v, (list, tuple, set, frozenset)):
            children = v
        elif isinstance(v, dict):
            children = v.values()
        elif into_objects and depth < _DEEPEST_ATTRIBUTE and hasattr(v, "__dict__") \
                and not isinstance(v, _NOT_LOOKED_INTO):
            children, inside_object = vars(v).values(), True
            depth += 1
        else:
            return
        for child in list(children):
            if inside_object and budget[0] <= 0:
                break
            look(child, depth, inside_object)

    for value in values:
        look(value, 0, False)
    if budget[0] <= 0 and left_unwalked is not None:
        left_unwalked.append(True)
    return list(found.values())


def _is_fake(value) -> bool:
    """Whether ``value`` is a fake tensor, or a module or optimizer over fake tensors."""
    if isinstance(value, torch.Tensor):
        return isinstance(value, FakeTensor)
    if isinstance(value, torch.nn.Module):
        first = next(itertools.chain(value.parameters(), value.buffers()), None)
        return first is None or isinstance(first, FakeTensor)
    if isinstance(value, torch.optim.Optimizer):
        groups = getattr(value, "param_groups", None) or [{}]
        first = next(iter(groups[0].get("params", ())), None)
        return isinstance(first, FakeTensor)
    return False


def _stepping(optimizers) -> list:
    """The optimizers whose ``step`` runs, with PyTorch's hooks: a wrapper that subclasses
    torch.optim.Optimizer without its constructor (accelerate's AcceleratedOptimizer) is
    left for the optimizer it wraps, which _held found beside it."""
    return [opt for opt in optimizers if hasattr(opt, "_optimizer_step_pre_hooks")]


# Called with the fake objects a recording's step takes, as soon as they exist (see
# built_objects_seen); None: nobody asked.
_built_seen = contextvars.ContextVar("vramkit_estimate_built_seen", default=None)


@contextlib.contextmanager
def built_objects_seen(callback):
    """Within it, each recording calls ``callback(objects)`` with the fake objects its
    step takes (the model, optimizer and batch build() made, or the twins of those passed
    in), before any variant changes them: what a caller wants to know of the model (its
    repeated blocks, its weights' dtype) without building it a second time."""
    token = _built_seen.set(callback)
    try:
        yield
    finally:
        _built_seen.reset(token)


def record_step(step_fn, args, kwargs, *, target: Target, steps: int = 2,
                workspace_hook=None, build=None, variant=None,
                around_step=None, after_outputs_hook=None) -> tuple[Recording, StorageRecorder]:
    """Run ``steps`` calls of ``step_fn`` on fake twins of ``args``/``kwargs`` (or on what
    ``build()`` returns, made under the fake mode) and return the recording. ``variant``
    (variants.Variant) changes the twins and the call first; ``around_step`` is a context
    entered around the steps (a FLOP counter). ``workspace_hook`` and
    ``after_outputs_hook`` are the recorder's (StorageRecorder says when each is called)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    known = KnownValues()  # from build() on: drop-path rates made there are read later
    recorder = StorageRecorder()
    recorder.workspace_hook = workspace_hook
    recorder.after_outputs_hook = after_outputs_hook
    recorder.device_type = None if target.emulated else "cuda"
    with on_target(target, recorder) as answered, _fake_tensor_errors_explained_here():
        # What exists before the step is recorded from the objects themselves below, as
        # the real program holds it before its first step (building leaves nothing else).
        twins = _Twins(mode, target)
        sites = None
        if build is not None:
            sites = _creation_sites(build)
            recorder.creation_sites = sites.sites if sites is not None else None
            # The CPU stand-in is itself the CPU's device context: another would name the
            # CPU in every call, where a tensor named to the CPU is the host's.
            default_device = (contextlib.nullcontext() if target.emulated
                              else torch.device(target.device))
            with mode, known, sites or contextlib.nullcontext(), \
                    known.known_values_not_traced(), default_device:
                building = BUILDING.set(True)
                try:
                    built = build()
                except Exception as error:  # noqa: BLE001 - explained, then re-raised
                    refused = UntraceableStep("build(): " + _explain(error))
                    refused.in_build = True
                    raise refused from error
                finally:
                    BUILDING.reset(building)
            args = (*built, *args) if isinstance(built, tuple) else (built, *args)
        else:
            args = twins.any(tuple(args))
            kwargs = twins.any(dict(kwargs))
        step_fn, owner = twins.owner(step_fn)
        seen = _built_seen.get()
        if seen is not None:
            seen(args)
        if variant is not None:
            with mode:
                args = tuple(variant.transform(list(args)))
            step_fn = variant.wrap(step_fn)
        values = (*args, *kwargs.values())
        if owner is not None:
            values += (owner, *vars(owner).values())
        # What exists before the step, found once for what follows (no code of the user's
        # runs in between); the walk after the steps finds gradients on what is held then.
        unwalked: list = []
        modules, tensors = _held(values, torch.nn.Module), _held(values, torch.Tensor, unwalked)
        held_optimizers = _held(values, torch.optim.Optimizer)
        state_ids = _optimizer_state_ids(held_optimizers)
        known.forget(p for m in modules for p in m.parameters())
        # An optimizer's state made in build() (a resumed one's) keeps its values: its step
        # count is what the optimizer's arithmetic reads, and build() said what it is.
        known.forget(t for t in tensors if id(t) not in state_ids)
        # A step count loaded with the state (torch.load under the fake mode) has no value
        # the estimate knows; read as 0, the update's bias corrections (1 - beta ** step)
        # divide by zero. Taken as one step done, as in any resumed run.
        recorder.recording.step_counts_assumed = known.assume_where_unknown(
            _step_counts(held_optimizers), 1)
        recorder.values = known  # run inside the recorder's dispatch, not as a mode
        graphs = _graphs_compiled()
        with mode, recorder, _autocast_cache_cleared_in_order(recorder), \
                known.python_reads_answered(), known.known_values_not_traced(), \
                known.assignments_answered(), known.extremes_left_unknown(), \
                (around_step or contextlib.nullcontext()):
            for m in modules:
                for p in m.parameters():
                    recorder.set_role(p, "parameters")
                for b in m.buffers():
                    recorder.set_role(b, "parameters")
            for t in tensors:
                if recorder.block_of(t) is None or not recorder.recording.blocks[
                        recorder.block_of(t)].role:
                    recorder.set_role(t, _held_role(t, state_ids, sites))
            optimizers = _stepping(held_optimizers)
            for opt in optimizers:
                _as_on_the_gpu(opt)
            hooks = _phase_hooks(recorder, optimizers)
            try:
                for _ in range(steps):
                    recorder.phase = "forward"
                    recorder.step_flops.append(0)
                    try:
                        step_fn(*args, **kwargs)
                    except WorkspaceTableError:
                        raise  # the estimator's own data, not the step, is at fault
                    except Exception as error:  # noqa: BLE001 - explained, then re-raised
                        raise UntraceableStep(_explain(error, known.first_count_read)) \
                            from error
            finally:
                for h in hooks:
                    h.remove()
            for m in _held(values, torch.nn.Module):
                for p in m.parameters():
                    if p.grad is not None:
                        recorder.set_role(p.grad, "gradients")
            recorder.phase = "done"
        recorder.recording.objects_left_unwalked = bool(unwalked)
        recorder.recording.compiled_ran_eager = (
            _compiled_among(values, step_fn) and _graphs_compiled() == graphs)
    recorder.recording.cuda_calls_answered = dict(answered)
    recorder.recording.generation_stand_ins = known.stand_ins
    recorder.recording.optimizer_reads = known.optimizer_reads
    recorder.recording.finite_checks = known.finite_checks
    recorder.recording.raise_only_checks = known.raise_only_checks
    recorder.recording.first_raise_only_check = known.first_raise_only_check
    recorder.recording.logged_reads = known.logged_reads
    recorder.recording.first_logged_read = known.first_logged_read
    recorder.recording.selections_at_largest = known.selections_at_largest
    recorder.recording.assignments = known.assignments
    recorder.recording.first_assignment = known.first_assignment
    recorder.recording.extremes_left = known.extremes_left
    recorder.recording.first_extreme_left = known.first_extreme_left
    recorder.recording.first_selection_at_largest = known.first_selection_at_largest
    recorder.recording.flops = recorder.step_flops[-1] if recorder.step_flops else 0
    classify(recorder.recording, recorder)
    return recorder.recording, recorder


@contextlib.contextmanager
def _autocast_cache_cleared_in_order(recorder: StorageRecorder):
    """Autocast's cache of cast weights frees its copies, when a region ends, in the order
    of a hash table keyed by address, which changes from run to run; the recorder is told
    to write that burst in a fixed order (StorageRecorder.unordered_frees)."""
    clear = torch.clear_autocast_cache

    def cleared():
        with recorder.unordered_frees():
            clear()

    torch.clear_autocast_cache = cleared
    try:
        yield
    finally:
        torch.clear_autocast_cache = clear


def _held_role(t: torch.Tensor, optimizer_states: set, sites: CreationSites | None) -> str:
    """The role of a tensor the step's objects hold that no module holds as a parameter
    or buffer: an optimizer's state (made before the step: a resumed optimizer's), a copy
    of the weights build() made (an EMA kept in a list or a plain object), else what the
    step is given to work on."""
    if id(t) in optimizer_states:
        return "optimizer state"
    if sites is not None and sites.holds_weights(t):
        return "parameters"
    return "inputs"


def _optimizer_state_ids(optimizers: list) -> set:
    """The ids of the tensors in the optimizers' per-parameter state."""
    return {id(v) for per_param in _per_param_states(optimizers) for v in per_param.values()
            if isinstance(v, torch.Tensor)}


def _step_counts(optimizers: list) -> list:
    """The optimizers' per-parameter step counts held as tensors, each once."""
    found = {}
    for per_param in _per_param_states(optimizers):
        count = per_param.get("step")
        if isinstance(count, torch.Tensor):
            found[id(count)] = count
    return list(found.values())


def _per_param_states(optimizers: list):
    for opt in optimizers:
        state = getattr(opt, "state", None)
        for per_param in (state.values() if isinstance(state, dict) else ()):
            if isinstance(per_param, dict):
                yield per_param


def _creation_sites(build) -> CreationSites | None:
    """The mode that notes where a user's build() makes each storage; None for the
    builds of `vramkit estimate --model` (models.py), whose blocks are named in words."""
    code = getattr(build, "__code__", None)
    if code is not None and code.co_filename == _MODELS_FILE:
        return None
    return CreationSites()


@contextlib.contextmanager
def on_target(target: Target, recorder: StorageRecorder):
    """What a step and its build() run under besides the fake mode: the CPU standing in
    for CUDA where there is no GPU (with the recorder's storages of host memory), moves
    of fake modules (.to("cuda"), .half()) and loads of checkpoints onto CUDA (read on
    the CPU, moved under the fake mode). Yields the torch.cuda calls the stand-in
    answered, by name (none on a GPU)."""
    emulation = _emulate.emulated_cuda() if target.emulated else contextlib.nullcontext({})
    host = HOST_STORAGES.set(recorder.host_storages if target.emulated else None)
    try:
        with emulation as answered, fake_module_moves(), fake_module_copies(), \
                checkpoints_loaded_on_cpu():
            yield answered
    finally:
        HOST_STORAGES.reset(host)


def _as_on_the_gpu(opt: torch.optim.Optimizer) -> None:
    """On the GPU a group of plain CUDA tensors takes the multi-tensor ("foreach")
    implementation by default, whose temporaries are the size of all the group's
    parameters (AdamW's square roots of the second moments, say); fake tensors are not
    plain tensors, so PyTorch would pick the per-tensor loop for them, whose temporaries
    are one parameter's size. The GPU's default is made explicit on the fake optimizer,
    for the optimizers that have that default (_defaults_to_foreach)."""
    if not _defaults_to_foreach(opt):
        return
    for group in opt.param_groups:
        if "foreach" in group and group["foreach"] is None \
                and not group.get("differentiable", False) and not group.get("fused"):
            group["foreach"] = True


def _defaults_to_foreach(opt: torch.optim.Optimizer) -> bool:
    """Whether the optimizer, given ``foreach=None``, takes the multi-tensor path for plain
    CUDA tensors. PyTorch's optimizers that do so ask torch.optim's defaulting rule
    (``_default_to_fused_or_foreach``) in their ``step``'s module; Adafactor's ``step``
    does not, and runs its per-tensor loop on the GPU too. Decided by the ``step`` of the
    first torch.optim class in the optimizer's hierarchy (a user's subclass may override
    ``step`` and call it), else by the optimizer's own ``step``."""
    steps = [inspect.unwrap(cls.__dict__["step"]) for cls in type(opt).__mro__
             if "step" in cls.__dict__ and cls is not torch.optim.Optimizer]
    steps = [f for f in steps if callable(f) and hasattr(f, "__globals__")]
    ours = [f for f in steps if f.__module__.startswith("torch.optim.")] or steps[:1]
    return bool(ours) and "_default_to_fused_or_foreach" in ours[0].__globals__


def _phase_hooks(recorder: StorageRecorder, optimizers) -> list:
    """Mark the optimizer's phase, its gradients when it starts and its state when it ends."""

    def before(opt, _args, _kwargs):
        recorder.phase = "optimizer"
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    recorder.set_role(p.grad, "gradients", "backward")

    def after(opt, _args, _kwargs):
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    recorder.set_role(value, "optimizer state", "optimizer")
        recorder.phase = "after optimizer"

    handles = []
    for opt in optimizers:
        handles.append(opt.register_step_pre_hook(before))
        handles.append(opt.register_step_post_hook(after))
    return handles


# What fake tensors cannot do, as PyTorch says it (in each of its spellings), and what to do
# instead.
_WORKAROUNDS = (
    (("datadependent", "data-dependent"), "the step reads a tensor's values (.item(), "
     ".tolist(), a Python if on a tensor): compute that value outside the step, "
     "or give the step a fixed value for the estimate"),
    (("local_scalar_dense",), "the step reads a tensor's value (.item(), float(t), a Python "
     "if on a tensor): pass the value in instead, or give the step a fixed value"),
    (("dynamicoutputshape",), "the size of what the operation makes depends on values the "
     "estimate cannot know and has no bound it could take instead (bincount(), "
     "repeat_interleave() by counts, unique() of more than "
     f"{_selections.UNIQUE_AT_MOST:,} elements; a boolean mask, nonzero() and a smaller "
     "unique() are taken at their largest): give the step a fixed size for the estimate, "
     "e.g. an index of the count you expect"),
    (("item()",), "the step reads a tensor's values with .item(): pass the value in instead"),
    (("no fake impl",), "an operation has no fake (meta) kernel, e.g. a custom CUDA "
     "extension: register one with torch.library.register_fake, or estimate the rest of "
     "the step without it"),
    (("meta kernel",), "an operation has no meta kernel: register one with "
     "torch.library.register_fake, or leave it out of the estimated step"),
    (("data is not allocated yet",), "an operation reads a tensor's memory on the host, "
     "which a fake tensor does not have (a C++ extension may): leave that operation out "
     "of the estimated step"),
    (("numpy() is not supported for tensor subclasses",), "the step hands a tensor's values "
     "to NumPy (.numpy(), np.asarray(), or a library that does), values the estimate does "
     "not have: compute them outside the step, or give the step fixed values for the "
     "estimate"),
)

# PyTorch's words for what it refuses a tensor subclass (a fake tensor) alone: raised from
# the C++ of a method such as Tensor.numpy(), they name one of fake tensors' limits
# whichever frame is innermost.
_SUBCLASSES_ONLY = ("not supported for tensor subclasses",)

# PyTorch's code and vramkit's: frames of neither are the user's (or a model library's).
_MACHINERY = _folded_prefixes()


def _where(error: BaseException) -> str:
    """The innermost frame of the failing call outside PyTorch and vramkit: the line of the
    user's (or the model library's) code that asked for what fake tensors cannot give."""
    found = ""
    for frame in traceback.extract_tb(error.__traceback__):
        if not os.path.abspath(frame.filename).startswith(_MACHINERY):
            found = f" at {frame.filename}:{frame.lineno} in {frame.name}"
    return found


def _words(text: str, most: int = 300) -> str:
    """``text`` to at most about ``most`` characters, cut between words, never in one."""
    if len(text) <= most:
        return text
    return text[:most].rsplit(" ", 1)[0] + " ..."


def _raised_by_fake_tensors(error: BaseException) -> bool:
    """Whether PyTorch or the estimator raised ``error`` (its innermost frame is theirs):
    only then do its words name one of fake tensors' limits, not a message of the step's
    own."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(_MACHINERY)


def _first_sentence(error: Exception) -> str:
    """The error's first non-empty line, and the next one where the first ends by
    announcing it (transformers': "You can install it with pip:" then the command)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


# What to do about torch.optim.LBFGS (_values._DECIDING_OPTIMIZERS), which reads the loss
# and the gradients to decide how often it evaluates the closure and how many history
# pairs it keeps.
_LBFGS_ADVICE = ("torch.optim.LBFGS decides from the loss and the gradients how many times "
                 "it evaluates the closure and how many history pairs it keeps, values the "
                 "estimate does not have: estimate the step with another optimizer and add "
                 "LBFGS's state: two copies of the parameters per history pair it keeps (up to "
                 "history_size pairs), and a few more")


# What to do about DistributedDataParallel, whose constructor compares the parameters'
# shapes across processes by reading their memory, which a fake tensor does not have.
_DDP_FILE = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "nn", "parallel",
                         "distributed.py")
_DDP_ADVICE = ("DistributedDataParallel reads the parameters' memory when it wraps the model "
               "(it compares them across processes), which fake tensors do not have: "
               "estimate the model without its DDP wrapper and add DDP's gradient buckets, "
               "about the gradients' size once more (nothing with "
               "gradient_as_bucket_view=True)")


# What to do about nn.LSTM, nn.GRU and nn.RNN, which run a whole sequence through cuDNN on
# CUDA: the kernel keeps a reserve for the backward, sized by cuDNN, which PyTorch's fake
# kernel counts as nothing (and fails on weights not in one flat buffer, as fake tensors'
# are); the CPU stand-in's own kernels keep other tensors altogether.
_RNN_FILE = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "nn", "modules",
                         "rnn.py")
# What says it was cuDNN's kernel: the fake kernel's refusal of the weights, a backward with
# no fake kernel, or the stand-in's refusal (_emulate.CudaOnCpu). nn.LSTMCell and the like,
# in the same file, run other kernels.
_RNN_WORDS = ("weight_buf", "_cudnn_rnn", _emulate.CUDNN_RECURRENT_REFUSAL)
_RNN_ADVICE = ("nn.LSTM, nn.GRU and nn.RNN run through cuDNN on CUDA, whose reserve for the "
               "backward and workspace the estimate does not model: estimate the step "
               "without them, and measure one such layer on the GPU "
               "(torch.cuda.max_memory_allocated() over one step)")


def _explain(error: Exception, count_read_at: str = "") -> str:
    """Why the step could not be estimated, and what to do; ``count_read_at`` is where the
    step (its code or a library's) read an integer from the weights or the batch, if it
    did."""
    files = [os.path.abspath(frame.filename)
             for frame in traceback.extract_tb(error.__traceback__)]
    for advice, found in ((_LBFGS_ADVICE, any(f.startswith(_DECIDING_OPTIMIZERS) for f in files)),
                          (_DDP_ADVICE, _DDP_FILE in files),
                          (_RNN_ADVICE, _RNN_FILE in files and
                           any(word in str(error) for word in _RNN_WORDS))):
        if found:
            return (f"the step could not run on fake tensors ({_words(type(error).__name__)}"
                    f"{_where(error)}); {advice}. No estimate is given rather than a "
                    f"wrong one.")
    message = _first_sentence(error)
    first = _words(f"{type(error).__name__}: {message.strip()}" if message
                   else type(error).__name__) + _where(error)
    text = f"{type(error).__name__}: {error}"
    for needles, advice in _WORKAROUNDS:
        if any(n in text.lower() for n in needles) and (
                _raised_by_fake_tensors(error) or any(w in text for w in _SUBCLASSES_ONLY)):
            return (f"the step could not run on fake tensors ({first}); {advice}. "
                    f"No estimate is given rather than one that leaves this out.")
    if isinstance(error, ImportError):
        return (f"the step needs a package this Python cannot import ({first}): install "
                f"it, or leave out what needs it. No estimate is given.")
    # Not one of fake tensors' known limits: the step's own error (shapes, settings) raises
    # the same way on a GPU, and the estimate cannot tell the two apart for certain.
    counted = (f" The step read an integer from the weights or the batch at {count_read_at} "
               f"(.item()), which the estimate does not have: it stands in as nan, so a size "
               f"or an index made from it fails; give the step a fixed value for the "
               f"estimate." if count_read_at else "")
    return (f"the step raised an error under the estimate's fake tensors ({first}). If it "
            f"runs as written on a GPU, the operation named there needs a real device or "
            f"real values; if not, it is the step's own error: its shapes, settings or "
            f"inputs.{counted} No estimate is given rather than one that leaves it out.")
