"""Plan before you run: a training step's peak memory, predicted without a GPU.

:func:`estimate` runs the user's step on PyTorch's fake tensors (shapes, no memory),
records every storage the step creates and frees, in order (parameters, gradients,
optimizer state, autocast copies, activations, temporaries), adds what fake tensors
cannot see (cuBLAS workspaces, modelled from measurement on an H200; cuDNN's convolution
workspaces, measured on the GPU where there is one, else taken from a table of H200 and
H100 measurements: workspaces.py; other ops' scratch buffers, measured on the GPU where
there is one: scratch.py), and replays the result on a simulated device under
vramkit's placement policy and under a model of PyTorch's caching allocator. The answer:
peak allocated, peak reserved under each allocator, whether it fits a given card, the
smallest card it fits, a breakdown by category at the peak and the call sites that hold
the most there. The trace is kept for ``vramkit replay`` and ``vramkit plot``.
"""

from __future__ import annotations

import collections
import inspect
import os
import tempfile
from dataclasses import dataclass, field

from ..._shown import shown
from .._sizes import checked_size

# cuBLAS keeps one workspace per handle, and PyTorch gives each thread that runs a matrix
# product its own handle: the thread that runs forward and autograd's thread that runs
# backward. PyTorch allocates the workspace through its caching allocator, so it counts in
# memory_allocated. Measured on an H200, PyTorch 2.11, CUDA 13.0 (bench/estimate_check.py,
# "workspace" line): the first product on a thread adds 32 MiB to memory_allocated.
CUBLAS_WORKSPACE_BYTES = 32 << 20
# The ops that take a cuBLAS handle. A convolution does not (cuDNN's): in real steps of
# convnets the first workspace comes at the first linear layer, not at the stem.
_MATMUL_OPS = frozenset(("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear",
                         "_scaled_mm", "_addmm_activation"))
# In the allocator's history of real steps (GPT-2, ResNet-50, ConvNeXt, a UNet; H100 and
# H200, PyTorch 2.11) a 1 MiB block comes right after the first cuBLAS workspace and stays
# to the end. Every first product there adds a bias in its epilogue (cuBLASLt's path), and
# a product without one adds the 32 MiB alone (bench/estimate_check.py's "workspace"
# line): read as cuBLASLt's workspace, made at the first such product.
CUBLASLT_WORKSPACE_BYTES = 1 << 20
_BIAS_EPILOGUE_PREFIXES = ("addmm.", "_addmm_activation.")  # op names, overload after the dot

# What the CUDA context and the driver take from the card before the first allocation,
# so that a card of N bytes leaves N minus this to the allocator. Measured on an H200
# (bench/estimate_check.py, "context" line): the memory NVML counts for a process that
# has initialised CUDA and allocated nothing, 518 MiB.
CUDA_CONTEXT_BYTES = 543_162_368


@dataclass
class Estimate:
    """What :func:`estimate` predicts for one step. Sizes in bytes."""

    peak_allocated: int              # what vramkit (and expandable segments) count: each
                                     # block at its request rounded to 512 bytes
    peak_reserved: int               # vramkit on the chosen source
    torch_peak_reserved: int         # PyTorch's caching allocator, default settings
    torch_expandable_peak_reserved: int
    # What torch.cuda.max_memory_allocated() reports under PyTorch's allocator: its large
    # pool leaves a remainder of up to 1 MiB unsplit inside the block it hands out, and
    # counts it as allocated (a 19.5 MiB request in a 20 MiB segment counts 20 MiB).
    torch_peak_allocated: int
    torch_expandable_peak_allocated: int
    device_memory: int | None        # the card asked about, if any
    fits: bool | None                # vramkit, on that card
    torch_fits: bool | None
    torch_expandable_fits: bool | None
    min_device_memory: int           # the smallest card vramkit runs the step on
    breakdown: dict                  # category -> bytes live at the peak
    top_sites: list                  # [(site, bytes, count)] live at the peak, largest first
    source: str
    emulated: bool                   # True: no GPU here, a CPU stood in for it
    trace: str                       # the recorded step as a vramkit trace (kept until the
                                     # process exits unless estimate() got trace_path)
    fake_ops: int
    notes: list = field(default_factory=list)
    capped: bool = False             # device_memory is an allocator cap (memory_limit),
                                     # not a card that the CUDA context shares
    flops: int = 0                   # floating-point operations of one step (PyTorch's
                                     # FLOP formulas: matrix products, convolutions,
                                     # attention), recomputation included
    bound: str | None = None         # which the fit was decided under: "card" or "cap"
                                     # (given both, the one leaving the allocator less)

    def __str__(self) -> str:
        return format_estimate(self)


_scratch: list[str] = []


def _scratch_dir() -> str:
    """Where the traces of estimates not given a trace_path go: one folder per process,
    removed when it exits, so that a search over many estimates leaves nothing behind."""
    if not _scratch:
        import atexit
        import shutil
        path = tempfile.mkdtemp(prefix="vramkit-estimates-")
        atexit.register(shutil.rmtree, path, True)
        _scratch.append(path)
    return _scratch[0]


def trace_is_kept(e: "Estimate") -> bool:
    """Whether ``e.trace`` outlives this process (estimate() was given trace_path)."""
    return not (_scratch and e.trace.startswith(_scratch[0] + os.sep))


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 30):.2f} GiB"


def format_estimate(e: Estimate) -> str:
    verdict = {True: "fits", False: "does not fit", None: ""}
    lines = ["vramkit estimate" + (" (no GPU here: a CPU stood in for it)" if e.emulated
                                   else "")]
    lines.append(f"  peak allocated            {_gib(e.peak_allocated)}"
                 f"   (PyTorch's allocator counts {_gib(e.torch_peak_allocated)})")
    card = (f" under a cap of {_gib(e.device_memory)}" if e.capped
            else f" on a card of {_gib(e.device_memory)}") if e.device_memory else ""
    lines.append(f"  peak reserved, vramkit    {_gib(e.peak_reserved)} ({e.source})"
                 + (f"   {verdict[e.fits]}{card}" if e.device_memory else ""))
    lines.append(f"  peak reserved, PyTorch    {_gib(e.torch_peak_reserved)}"
                 + (f"   {verdict[e.torch_fits]}{card}" if e.device_memory else ""))
    lines.append(f"    with expandable_segments {_gib(e.torch_expandable_peak_reserved)}"
                 + (f"   {verdict[e.torch_expandable_fits]}{card}" if e.device_memory
                    else ""))
    lines.append(f"  smallest card (vramkit)   {_gib(e.min_device_memory)}")
    lines.append("  at the peak:")
    for category, nbytes in sorted(e.breakdown.items(), key=lambda kv: -kv[1]):
        if nbytes:
            lines.append(f"    {category:<22}{_gib(nbytes):>12}")
    if e.top_sites:
        lines.append("  largest call sites at the peak:")
        for site, nbytes, count in e.top_sites[:5]:
            lines.append(f"    {_gib(nbytes):>10}  {count:>5} blocks  {shown(site)}")
    for note in e.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  trace: {shown(e.trace)}" + ("" if trace_is_kept(e) else
                 " (removed at exit: trace_path, or --trace, keeps it)"))
    return "\n".join(lines)


# The libraries whose workspaces estimate(model_workspaces=...) can model: cuBLAS's,
# cuDNN's convolutions', and "scratch", the scratch buffers other ATen ops allocate and
# free inside themselves (layer norm, reductions, softmax, losses: scratch.py).
WORKSPACE_LIBRARIES = ("cublas", "cudnn", "scratch")


def _workspace_libraries(value) -> frozenset:
    """model_workspaces as the set of libraries it names: True all, False none, or one
    name or several of WORKSPACE_LIBRARIES."""
    if value is True:
        return frozenset(WORKSPACE_LIBRARIES)
    if value is False or value is None:
        return frozenset()
    names = (value,) if isinstance(value, str) else value
    try:
        chosen = frozenset(names)
    except TypeError:
        chosen = None
    if chosen is None or not chosen <= set(WORKSPACE_LIBRARIES):
        raise ValueError(f"estimate(): model_workspaces must be True, False, or names "
                         f"among {WORKSPACE_LIBRARIES}, not {value!r}")
    return chosen


def _workspace_model(enabled: bool):
    """The cuBLAS workspaces: one per thread that runs a matrix product, and cuBLASLt's
    on the first product with a bias epilogue, each kept to the end and allocated after
    the product's output, where PyTorch allocates them."""
    if not enabled:
        return None
    cublas_threads: set = set()
    lt_threads: set = set()

    def hook(recorder, op_name: str, args, thread) -> None:
        # Called for every op: once a thread has its cuBLAS workspace, only a product with
        # a bias can add anything, which one prefix test tells.
        if thread in lt_threads:
            return
        if thread in cublas_threads:
            if not op_name.startswith(_BIAS_EPILOGUE_PREFIXES):
                return
        elif op_name.split(".")[0] in _MATMUL_OPS:
            cublas_threads.add(thread)
            recorder.allocate_modelled(CUBLAS_WORKSPACE_BYTES, "cuBLAS workspace",
                                       "workspaces")
        else:
            return
        bias = args[0] if args else None
        if op_name.startswith(_BIAS_EPILOGUE_PREFIXES) and getattr(bias, "ndim", 0) == 1:
            lt_threads.add(thread)
            recorder.allocate_modelled(CUBLASLT_WORKSPACE_BYTES, "cuBLASLt workspace",
                                       "workspaces")

    return hook


def _after_outputs(models_: list):
    """The recorder's after-outputs hook (None for no model): an op goes to the hooks of
    the models that watch it (a convolution to cuDNN's, a layer norm to the scratch
    model's), in turn; the rest, most of a step's ops, cost one lookup."""
    if not models_:
        return None
    watched: dict = {}
    for model in models_:
        for op in model.watched_ops():
            watched.setdefault(op, []).append(model.hook)

    def hook(recorder, func, args, kwargs, out) -> None:
        for h in watched.get(func, ()):
            h(recorder, func, args, kwargs, out)

    return hook


def _count(caller: str, name: str, value) -> int:
    """``value`` if it is an int of at least 1, else the ValueError that names it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{caller}(): {name} must be a positive int, not {value!r}")
    return value


def _size(value, what: str) -> int | None:
    try:
        return checked_size(value, what)
    except (TypeError, ValueError) as error:
        raise type(error)(f"estimate(): {error}") from None


def tighter_bound(device_memory=None, memory_limit=None):
    """Which question a fit answers: ("card", card bytes, None) for a card, of which the
    CUDA context takes its share first; ("cap", None, cap bytes) for an allocator cap,
    which the context is not counted against; given both, the one that leaves the
    allocator less; (None, None, None) for neither."""
    card = _size(device_memory, "device_memory")
    limit = _size(memory_limit, "memory_limit")
    if card is not None and limit is not None:
        if limit < card - CUDA_CONTEXT_BYTES:
            card = None
        else:
            limit = None
    if card is not None:
        return "card", card, None
    return ("cap" if limit is not None else None), None, limit


def bound_words(bound: str, device_memory, memory_limit) -> str:
    """Which of a card and a cap, both given, decided the fit, and why, in words."""
    card = _size(device_memory, "device_memory")
    left = max(card - CUDA_CONTEXT_BYTES, 0)
    cap = _size(memory_limit, "memory_limit")
    if bound == "cap":
        return (f"the allocator cap ({_gib(cap)}) is the tighter bound: the card of "
                f"{_gib(card)} leaves the allocator {_gib(left)} after the CUDA context")
    return (f"the card ({_gib(card)}, which leaves the allocator {_gib(left)} after the "
            f"CUDA context) is the tighter bound: the allocator cap is {_gib(cap)}")


def estimate(step_fn, *args, device_memory=None, source: str | None = None,
             steps: int = 2, trace_path: str | None = None, device="cuda",
             build=None, emulate: bool | None = None, memory_limit=None,
             variant=None, model_workspaces=True, **kwargs) -> Estimate:
    """Predict the memory of ``steps`` calls of ``step_fn(*args, **kwargs)`` on a GPU.

    ``args``/``kwargs`` are what the step takes, built as usual (a model on the CPU or
    on the ``meta`` device, its optimizer, a batch): the step runs on fake twins of them
    on the GPU (or, on a machine without one, on a CPU standing in for it), and nothing
    real is touched. Alternatively ``build`` is a function, run under the fake tensors,
    that returns the first arguments (model, optimizer, batch), which avoids building a
    large model for real. ``device_memory`` (bytes or "80G") is the card to check the fit
    on; ``source`` the vramkit source to model ("cuda" by default, or "vmm").
    ``memory_limit`` checks the fit under an allocator limit instead (VRAMKIT_LIMIT,
    ``set_per_process_memory_fraction``), which the CUDA context does not count against;
    given both, the fit is decided under the one that leaves the allocator less
    (``Estimate.bound`` says which, and a note why).
    ``emulate=True`` runs the CPU stand-in even where a GPU is present (to compare).
    ``variant`` (a :class:`vramkit.estimator.variants.Variant`) estimates the step with
    one change made to it: autocast, bf16 weights, checkpointing, 8-bit states.
    ``model_workspaces`` adds the library workspaces fake tensors cannot see: True (the
    default) all of them, False none, or "cublas", "cudnn" or "scratch" (or several in a
    tuple) only those. cuDNN's convolution workspaces are measured on the GPU where the
    estimate runs with one (which resets its peak memory statistics), else taken from
    the table of H200 and H100 measurements (vramkit.estimator.workspaces); the scratch
    buffers of other ops (layer norm, reductions, softmax, losses; not fused attention's:
    vramkit.estimator.scratch) are measured on the GPU too; without one, those that
    follow from ATen's source alone (softmaxes, sums, means and vector norms, group and
    layer norms: vramkit.estimator._derived_scratch) are derived, the rest count 0.
    The notes say which, and what was not modelled."""
    from . import _replay, _step

    if not callable(step_fn):
        raise TypeError("estimate(): step_fn must be callable")
    if emulate is not None and not isinstance(emulate, bool):
        # "no" would read as true: which target ran must be what was asked.
        raise TypeError(f"estimate(): emulate must be True, False or None, not {emulate!r}")
    if inspect.isgeneratorfunction(step_fn) or inspect.iscoroutinefunction(step_fn) or \
            inspect.isasyncgenfunction(step_fn):
        # Calling one runs none of its body: the estimate would be of a step doing nothing.
        raise TypeError("estimate(): step_fn is a generator or async function, whose call "
                        "runs nothing: give a function that runs the step when called")
    if build is not None and not callable(build):
        raise TypeError(f"estimate(): build must be a function that returns the step's "
                        f"first arguments, not {type(build).__name__}")
    _count("estimate", "steps", steps)
    if variant is not None:
        from .variants import Variant
        if not isinstance(variant, Variant):
            raise TypeError(f"estimate(): variant must be a vramkit.estimator.variants."
                            f"Variant, not {type(variant).__name__}")
    bound, card, limit = tighter_bound(device_memory, memory_limit)
    source = checked_source(source)
    libraries = _workspace_libraries(model_workspaces)
    target = _step.choose_target(device, emulate)
    models_ = _workspace_models(target, libraries)
    try:
        recording, _recorder = _step.record_step(
            step_fn, args, kwargs, target=target, steps=steps, build=build,
            workspace_hook=_workspace_model("cublas" in libraries), variant=variant,
            after_outputs_hook=_after_outputs(models_))
    finally:
        for model in models_:
            model.finish()
    if recording.peak_allocated == 0:
        raise _step.UntraceableStep("estimate(): the step allocated nothing on the GPU: "
                                    "are its model and batch on a CUDA device?")
    events = list(recording.events())
    trace_path = _written_trace(events, trace_path)
    usable = limit if card is None else max(card - CUDA_CONTEXT_BYTES, 0)
    ours = _replay.vramkit_replay_uncapped(trace_path, source, recording.peak_allocated,
                                           min_capacity=True)
    native = _replay.torch_replay(events, False, None)
    expandable = _replay.torch_replay(events, True, None)

    fits_ours, fits_native, fits_expandable = _fits(events, trace_path, source, usable)
    breakdown, top = _at_peak(recording)
    notes = _notes(recording, target, models_)
    if device_memory is not None and memory_limit is not None:
        notes.append(bound_words(bound, device_memory, memory_limit))
    return Estimate(
        peak_allocated=recording.peak_allocated,
        peak_reserved=int(ours["peak_reserved_bytes"]),
        torch_peak_reserved=native["peak_reserved"],
        torch_expandable_peak_reserved=expandable["peak_reserved"],
        torch_peak_allocated=native["peak_allocated"],
        torch_expandable_peak_allocated=expandable["peak_allocated"],
        device_memory=card if limit is None else limit, fits=fits_ours,
        torch_fits=fits_native, torch_expandable_fits=fits_expandable,
        # No smallest capacity only where the capped host model runs out under the peak
        # the uncapped replay reserved: that peak is the answer then.
        min_device_memory=int(ours.get("min_capacity_bytes") or ours["peak_reserved_bytes"])
        + CUDA_CONTEXT_BYTES,
        breakdown={c: breakdown.get(c, 0) for c in _record_categories()},
        top_sites=top, source=source, emulated=target.emulated, trace=trace_path,
        fake_ops=recording.fake_ops, notes=notes, capped=limit is not None, bound=bound,
        flops=recording.flops)


def checked_source(source: str | None) -> str:
    """The vramkit source to model: the argument, else VRAMKIT_SOURCE, else cuda."""
    from . import _replay

    named = "estimate(): source"
    if not source:
        source, named = os.environ.get("VRAMKIT_SOURCE") or "cuda", "VRAMKIT_SOURCE"
    source = "cuda" if source == "auto" else source
    _replay.check_source(source, named)
    return source


def _workspace_models(target, libraries) -> list:
    """The models of what cuDNN's convolutions and other ops allocate inside themselves."""
    # The CPU stand-in (no GPU, or emulate=True) sizes convolutions from the table and
    # other ops' scratch not at all, as a machine without a GPU must; fake CUDA tensors
    # measure both on that GPU.
    on_device = None if target.emulated else target.device
    device_type = None if target.emulated else "cuda"
    models_ = []
    if "cudnn" in libraries:
        from .workspaces import ConvWorkspaceModel
        models_.append(ConvWorkspaceModel(on_device, device_type=device_type))
    if "scratch" in libraries:
        from . import scratch
        models_.append(scratch.OpScratchModel(on_device, device_type=device_type))
    return models_


def _written_trace(events: list, trace_path: str | None) -> str:
    """The recorded step as a vramkit trace at trace_path, or in a scratch file."""
    from . import _replay

    if trace_path is None:
        fd, trace_path = tempfile.mkstemp(prefix="estimate-", suffix=".trace.gz",
                                          dir=_scratch_dir())
        os.close(fd)
    _replay.write_trace(events, trace_path, "recorded by vramkit.estimate under fake "
                                            "tensors; times are op numbers")
    return trace_path


def _fits(events, trace_path: str, source: str, usable: int | None) -> tuple:
    """Whether the step fits ``usable`` bytes under vramkit, PyTorch's allocator and
    expandable segments (Nones without a card or cap). Under a cap an allocator frees
    its cache and retries before it fails, so what fits is decided by replaying under
    the cap, not by comparing the uncapped peak with it."""
    from . import _replay
    if usable is None:
        return None, None, None
    if usable <= 0:  # a card the CUDA context fills: a replay capped at 0 has no cap
        return False, False, False
    capped = _replay.vramkit_replay(trace_path, source, usable)
    return (capped.get("ooms", 1) == 0,
            _replay.torch_replay(events, False, usable)["ooms"] == 0,
            _replay.torch_replay(events, True, usable)["ooms"] == 0)


def _at_peak(recording) -> tuple:
    """The bytes of each category live at the peak, and the ten call sites holding the
    most there as (site, bytes, blocks)."""
    breakdown = collections.Counter()
    sites: dict[str, list[int]] = {}
    for bid in recording.live_at_peak:
        block = recording.blocks[bid]
        breakdown[block.role] += block.size
        entry = sites.setdefault(block.site, [0, 0])
        entry[0] += block.size
        entry[1] += 1
    top = sorted(((s, b, c) for s, (b, c) in sites.items()), key=lambda x: -x[1])[:10]
    return breakdown, top


def _notes(recording, target, models_) -> list[str]:
    """What the estimate says about how it was made: the CPU stand-in, the workspace
    models, and the values it took rather than knew."""
    from . import _cuda_calls, _step

    notes = []
    if target.emulated:
        notes.append("no GPU here: the step ran on CPU kernels standing in for CUDA's; "
                     "on a machine with a GPU the estimate uses CUDA's own")
    answered = dict(recording.cuda_calls_answered)
    if answered.pop(_cuda_calls.ASKED_AVAILABLE, 0):
        notes.append("the step's code asked torch.cuda.is_available(), which is False "
                     "here: what it chose for a machine without a GPU was estimated (a "
                     "library such as accelerate turns fp16 mixed precision off without "
                     "CUDA); estimate on a machine with a GPU for the path it takes there")
    if answered:
        calls = ", ".join(f"{name} ({count})" for name, count in sorted(answered.items()))
        notes.append(f"the step's torch.cuda calls were answered as one H200 would answer "
                     f"them, with nothing run on a device: {calls}")
    for model in models_:
        notes.extend(model.notes())
    if recording.objects_left_unwalked:
        notes.append(f"the objects the step was given hold more than the estimate looks "
                     f"into ({_step._MOST_OBJECTS_LOOKED_INTO:,} objects inside plain "
                     f"objects): tensors held further in were not counted; give the step "
                     f"what it needs directly, or in a list or dict, which are walked whole")
    if recording.compiled_ran_eager:
        notes.append("the step's torch.compile'd code ran as eager PyTorch under the "
                     "estimate (Dynamo compiled no graph on its fake tensors): the figures "
                     "are the eager step's; Inductor's fused kernels may keep fewer "
                     "intermediates, so the compiled step may hold less")
    if recording.dense_attention_scores:
        notes.append(f"FlexAttention was counted as the fused kernel torch.compile makes "
                     f"of it (its output and fp32 statistics of each query row); called "
                     f"without torch.compile, PyTorch computes it densely, and each call "
                     f"holds at least its fp32 scores, up to "
                     f"{recording.dense_attention_scores / (1 << 20):,.1f} MiB here, while "
                     f"it runs")
    if recording.generation_stand_ins:
        notes.append("a generation loop's checks of which sequences drew an end-of-"
                     "sequence token (or hold padding) were taken as none: the estimate "
                     "is for generating every new token asked for, the longest run")
    if recording.optimizer_reads:
        notes.append(f"the optimizer's step read {recording.optimizer_reads} values of the "
                     f"weights or gradients (Adafactor's step size, the gradient scaler's "
                     f"check for infinities): taken as zero, which changes what the update "
                     f"computes, not what it allocates")
    if recording.step_counts_assumed:
        notes.append(f"the optimizer's state came with {recording.step_counts_assumed} "
                     f"step counts whose values the estimate cannot read (loaded from a "
                     f"file): taken as one step done, which changes what the update "
                     f"computes, not what it allocates")
    if recording.finite_checks:
        notes.append(f"{recording.finite_checks} checks of whether values computed from "
                     f"the weights or the batch are finite (isnan, isinf, isfinite) were "
                     f"answered as for finite values, the path of a healthy step")
    if recording.raise_only_checks:
        notes.append(f"{recording.raise_only_checks} checks that raise an error on a bad "
                     f"value (the first at {recording.first_raise_only_check}: a label past "
                     f"the vocabulary, an index out of range) were taken as passed, the "
                     f"path of a valid step")
    if recording.logged_reads:
        notes.append(f"the step read {recording.logged_reads} values computed from the "
                     f"weights or the batch (the first at {recording.first_logged_read}, a "
                     f"loss logged with .item() or a count of correct predictions, say): "
                     f"they print as 0.0 (counts as nan); the step decided nothing on them "
                     f"and sized nothing by them (either would have stopped the estimate)")
    if recording.extremes_left:
        notes.append(f"{recording.extremes_left} max() or min() of numbers and a value the "
                     f"estimate cannot know (the first at {recording.first_extreme_left}: "
                     f"a loss divided by max(1, a count), say) gave that value, left "
                     f"unknown rather than deciding which is larger")
    if recording.assignments:
        notes.append(f"{recording.assignments} assignments of cost matrices computed from the "
                     f"weights and the batch (SciPy's linear_sum_assignment, the first at "
                     f"{recording.first_assignment}: a Hungarian matcher) were answered as "
                     f"the first rows to the first columns: an assignment pairs as many as "
                     f"the matrix's smaller side whichever pairs it picks, and what follows "
                     f"takes the same memory")
    if recording.selections_at_largest:
        notes.append(f"{recording.selections_at_largest} selections whose size depends on "
                     f"values the estimate cannot know (the first at "
                     f"{recording.first_selection_at_largest}: a boolean mask, nonzero(), "
                     f"masked_select(), unique()) were taken at their largest, every "
                     f"element kept or distinct, or as many as a mask built from zeros "
                     f"had marked: the estimate is the most the step can take; a mask "
                     f"that keeps fewer takes less")
    return notes


def __getattr__(name):
    if name == "UntraceableStep":
        from ._step import UntraceableStep
        return UntraceableStep
    raise AttributeError(f"module 'vramkit.estimator' has no attribute {name!r}")


def _record_categories():
    from ._record import CATEGORIES
    return CATEGORIES


def advise(step_fn, *args, build=None, device_memory=None, memory_limit=None,
           make_batch=None, batch: int | None = None, variants=None, source=None,
           processes: int | None = None, **kwargs):
    """The step as written and under each change the guide suggests (bf16 or fp16
    autocast, bf16 weights and states, 8-bit optimizer states, activation checkpointing
    of all or every 2nd repeated block, and with ``make_batch(n)`` and ``batch`` smaller
    batches): predicted peaks, what each saves, whether it fits, and the compute it adds
    (FLOPs counted on fake tensors), most saving first. A change the step already makes
    (bf16 autocast on a step under bf16 autocast) is left out, and so is autocast in the
    other dtype, which holds the same memory. A change that cannot be estimated is listed
    with the reason. Returns an :class:`Advice`, printable as a table.

    The rows are estimated side by side in ``processes`` forked processes (by default one
    per free core, at most one per row and eight in all; 1: in this process alone). The
    table is the same either way; no process forks once this one has initialized CUDA."""
    from . import _forked, _what_if

    if variants is not None and not variants:
        raise ValueError("advise(): variants is empty: give the step as written first")
    if batch is not None:
        _count("advise", "batch", batch)
    if make_batch is not None and not callable(make_batch):
        raise TypeError(f"advise(): make_batch must be a function of the batch size, not "
                        f"{type(make_batch).__name__}")
    # An estimate's own options (WhatIf takes device and emulate); the rest are the step's.
    common = dict(device_memory=device_memory, memory_limit=memory_limit, source=source,
                  model_workspaces=kwargs.pop("model_workspaces", True))
    table = _what_if.WhatIf(estimate, step_fn, args, kwargs, build=build, common=common,
                            variants=variants, make_batch=make_batch, batch=batch)
    # The scratch folder is made before forking, so the children's traces go where this
    # process removes them at its exit.
    _scratch_dir()
    _agreement, rows = _forked.computed(
        table.share, _forked.processes_for(processes, table.rows_at_most()))
    return table.advice(rows)


@dataclass
class CheckpointPlan:
    """The fewest repeated blocks to checkpoint for the step to fit: ``names`` for
    :func:`vramkit.estimator.variants.apply_checkpointing` on the real model, and the
    estimate of the planned step that verifies it."""

    names: list
    blocks: int
    estimate: Estimate
    fits: bool

    def __str__(self) -> str:
        if not self.names:
            verdict = "fits without checkpointing" if self.fits else "does not fit"
            return f"checkpoint plan: the step {verdict}"
        head = (f"checkpoint plan: {len(self.names)} of {self.blocks} blocks"
                + ("" if self.fits else " (all of them, and it still does not fit)"))
        return head + "\n  " + "\n  ".join(self.names) + \
            f"\n  planned step: peak reserved {_gib(self.estimate.peak_reserved)}"


def plan_checkpointing(step_fn, *args, build=None, device_memory=None,
                       memory_limit=None, **kwargs) -> CheckpointPlan:
    """Given a card or a limit, the fewest of the model's repeated blocks (spread evenly)
    to checkpoint so that the step fits under vramkit, by a search on the estimate."""
    from . import _step, _what_if, variants as _variants

    if device_memory is None and memory_limit is None:
        raise ValueError("plan_checkpointing(): give device_memory or memory_limit")
    target = _step.choose_target(kwargs.pop("device", "cuda"), kwargs.pop("emulate", None))
    blocks: list[str] = []  # the model's repeated blocks, seen by the first estimate
    cache: dict[int, Estimate] = {}

    def planned(k: int) -> Estimate:
        if k not in cache:
            v = _variants.Variant(f"checkpointing {k} blocks",
                                  checkpoint_names=_variants._spread(blocks, k))
            cache[k] = estimate(step_fn, *args, build=build, device_memory=device_memory,
                                memory_limit=memory_limit, variant=v,
                                emulate=target.emulated, **kwargs)
        return cache[k]

    with _step.built_objects_seen(
            lambda values: blocks.extend(_what_if.model_facts(values)["blocks"])):
        planned(0)  # no block checkpointed, whichever the model has
    if planned(0).fits or not blocks:
        return CheckpointPlan([], len(blocks), planned(0), bool(planned(0).fits))
    if not planned(len(blocks)).fits:
        return CheckpointPlan(list(blocks), len(blocks), planned(len(blocks)), False)
    low, high = 0, len(blocks)  # planned(low) does not fit, planned(high) does
    while high - low > 1:
        mid = (low + high) // 2
        if planned(mid).fits:
            high = mid
        else:
            low = mid
    return CheckpointPlan(_variants._spread(blocks, high), len(blocks), planned(high), True)


def doctor_estimates(step_fn, *args, build=None, make_batch=None, batch: int | None = None,
                     **kwargs):
    """The ``estimate_fn`` of :func:`vramkit.diagnose` for this step: the predicted peak
    reserved of the step as written ("baseline"), at half the batch ("half_batch", needs
    ``make_batch(n)`` and ``batch``), under bf16 autocast ("bf16_autocast") and with all
    repeated blocks checkpointed ("checkpointing"), so that the doctor ranks its fixes by
    what they would save on this very step. Estimates are made on first use, once each."""
    from . import variants as _variants

    plans = {
        "baseline": dict(build=build),
        "bf16_autocast": dict(build=build,
                              variant=_variants.Variant("bf16", autocast=_bf16())),
        "checkpointing": dict(build=build,
                              variant=_variants.Variant("ckpt", checkpoint_every=1)),
    }
    if make_batch is not None and batch:
        plans["half_batch"] = dict(build=lambda: make_batch(max(1, batch // 2)))
    cache: dict[str, int] = {}

    def estimate_fn(name: str) -> int:
        if name not in plans:
            raise KeyError(f"no estimate for {name!r}: "
                           + ("give make_batch and batch" if name == "half_batch"
                              else f"known: {sorted(plans)}"))
        if name not in cache:
            use_args = () if name == "half_batch" else args
            cache[name] = estimate(step_fn, *use_args, **plans[name], **kwargs).peak_reserved
        return cache[name]

    return estimate_fn


def _bf16():
    import torch
    return torch.bfloat16


_FIT_OF = {"vramkit": "fits", "torch": "torch_fits", "torch-expandable": "torch_expandable_fits"}


def find_max_batch(step_fn, make_batch, device_memory=None, mode: str = "predict", *,
                   memory_limit=None, allocator: str = "vramkit", start: int = 1,
                   most: int = 4096, **estimate_kwargs) -> int:
    """The largest batch size whose step fits. ``make_batch(n)`` returns the arguments of
    ``step_fn`` for batch size ``n`` (model, optimizer and batch, say).

    ``mode="predict"``: a search on :func:`estimate` (seconds on a CPU, no GPU needed)
    for the card ``device_memory`` or the limit ``memory_limit`` (given both, the one
    that leaves the allocator less: :func:`tighter_bound`), under ``allocator``
    ("vramkit", "torch" or "torch-expandable"). ``mode="measure"``: real steps on the GPU,
    starting from the prediction, recovering from each out-of-memory error (as
    accelerate's ``find_executable_batch_size`` and Lightning's batch size finder do), so
    it needs few real tries. Returns 0 if not even ``start`` fits, and ``most`` if it
    fits (larger batches are not tried)."""
    if mode not in ("predict", "measure"):
        raise ValueError(f"find_max_batch(): mode must be 'predict' or 'measure', not {mode!r}")
    if allocator not in _FIT_OF:
        raise ValueError(f"find_max_batch(): allocator must be one of {sorted(_FIT_OF)}, "
                         f"not {allocator!r}")
    if device_memory is None and memory_limit is None:
        raise ValueError("find_max_batch(): give device_memory or memory_limit")
    if not callable(make_batch):
        raise TypeError(f"find_max_batch(): make_batch must be a function of the batch "
                        f"size, not {type(make_batch).__name__}")
    if _count("find_max_batch", "start", start) > _count("find_max_batch", "most", most):
        raise ValueError(f"find_max_batch(): start ({start}) is above most ({most})")

    cache: dict[int, Estimate] = {}

    def estimated(n: int) -> Estimate:
        if n not in cache:
            cache[n] = estimate(step_fn, build=lambda: make_batch(n),
                                device_memory=device_memory, memory_limit=memory_limit,
                                **estimate_kwargs)
        return cache[n]

    best = predict_largest(estimated, _FIT_OF[allocator], start, most)
    if mode == "predict":
        return best
    from . import _measure
    # A card of device_memory leaves the allocator that less the CUDA context, as the
    # prediction assumed; on the real card that is the cap the measurement runs under.
    _, card, limit = tighter_bound(device_memory, memory_limit)
    cap = limit if limit is not None else card - CUDA_CONTEXT_BYTES
    return _measure.largest_batch(step_fn, make_batch, best or start, cap, most)


def predict_largest(estimated, fit_attribute: str, start: int = 1, most: int = 4096) -> int:
    """The largest batch whose estimate fits. Memory grows about linearly with the batch,
    so the estimates at ``start`` and ``start + 1`` give a first guess; the search from
    there needs a handful of estimates instead of a doubling from 1."""
    first = estimated(start)
    if not getattr(first, fit_attribute):
        return 0
    second = estimated(start + 1)
    per_sample = second.peak_reserved - first.peak_reserved
    guess = start
    room = (first.device_memory or 0) - first.peak_reserved
    if per_sample > 0 and room > 0:
        guess = max(start, min(most, start + int(room // per_sample)))
    return _largest(lambda n: bool(getattr(estimated(n), fit_attribute)), start, most, guess)


def _largest(fits, start: int, most: int, guess: int | None = None) -> int:
    """The largest n in [start, most] with fits(n), for a monotone fits: galloping from
    ``guess`` (steps of 1, 2, 4... away from it) to bracket the answer, then bisection."""
    guess = min(max(guess or start, start), most)
    if fits(guess):
        low, step = guess, 1
        while True:
            high = min(low + step, most)
            if high == low:
                return low
            if not fits(high):
                break
            low, step = high, step * 2
    else:
        high, step = guess, 1
        while True:
            low = max(high - step, start)
            if fits(low):
                break
            if low == start:
                return 0
            high, step = low, step * 2
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low
