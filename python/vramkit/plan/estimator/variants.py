"""What to change: the same step under other settings, and checkpointing planned to a cap.

Each variant is a change made to the fake twins of the step's objects (never to the
user's) or to the way the step is called: autocast around it, weights in bf16,
activation checkpointing of the model's repeated blocks (all, or every k-th), 8-bit
optimizer states, a smaller batch. :func:`advise` estimates each and ranks them;
:func:`plan_checkpointing` finds the fewest blocks to checkpoint for a step to fit, as
module names the user hands to :func:`apply_checkpointing` on the real model.

The compute each variant adds is counted, not timed: the floating-point operations of
the step by PyTorch's FLOP formulas (``torch.utils.flop_counter``), counted in the same
recording as its memory, against the step as written. Recomputing checkpointed blocks
shows there; what autocast gains in speed depends on the card and is not claimed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import textwrap
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint


# ---------------------------------------------------------------------------------------
# Blocks to checkpoint.
# ---------------------------------------------------------------------------------------

_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def repeated_blocks(model: torch.nn.Module) -> list[str]:
    """The names of the model's repeated blocks, in order: the module class with two or
    more instances that holds the most parameters in all (GPT2Block, LlamaDecoderLayer,
    ViTLayer, a ResNet's bottleneck layers), leaving out containers and leaf layers."""
    by_class: dict[type, list[tuple[str, torch.nn.Module]]] = collections.defaultdict(list)
    for name, module in model.named_modules():
        if not name or isinstance(module, _CONTAINERS) or not list(module.children()):
            continue
        by_class[type(module)].append((name, module))
    best, best_params = [], 0
    for instances in by_class.values():
        if len(instances) < 2:
            continue
        # Outermost instances only: a block class nested in itself counts once.
        names = [n for n, _ in instances]
        outer = [(n, m) for n, m in instances
                 if not any(n != o and n.startswith(o + ".") for o in names)]
        params = sum(p.numel() for _, m in outer for p in m.parameters())
        if params > best_params:
            best, best_params = [n for n, _ in outer], params
    return best


def apply_checkpointing(model: torch.nn.Module, names) -> list[str]:
    """Recompute the blocks ``names`` (module names, as :func:`plan_checkpointing` gives)
    in backward instead of keeping their activations: each block's forward runs under
    ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``. Returns the names done.

    A model with a key-value cache turned on in its configuration (transformers' decoders
    keep ``config.use_cache`` on by default, in training too) has it turned off, as
    transformers' own gradient checkpointing does: a checkpointed block recomputed in
    backward would append its keys and values to the cache a second time."""
    modules = dict(model.named_modules())
    done = []
    for name in names:
        if name not in modules:
            raise KeyError(f"apply_checkpointing(): the model has no module {name!r}")
        module = modules[name]
        if getattr(module, "_vramkit_checkpointed", False):
            continue
        inner = module.forward

        @functools.wraps(inner)
        def forward(*args, _inner=inner, **kwargs):
            if not torch.is_grad_enabled():
                return _inner(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(_inner, *args, use_reentrant=False,
                                                     **kwargs)

        module.forward = forward
        module._vramkit_checkpointed = True
        done.append(name)
    config = getattr(model, "config", None)
    if done and getattr(config, "use_cache", False) is True:
        config.use_cache = False
    return done


def _spread(names: list[str], count: int) -> list[str]:
    """``count`` of ``names``, spread evenly (every k-th when count divides them)."""
    if count <= 0:
        return []
    if count >= len(names):
        return list(names)
    step = len(names) / count
    return [names[int(i * step)] for i in range(count)]


# ---------------------------------------------------------------------------------------
# Variants.
# ---------------------------------------------------------------------------------------

class Adam8bitStates(torch.optim.Optimizer):
    """AdamW with 8-bit moments, for estimates only: it allocates what bitsandbytes'
    blockwise 8-bit AdamW keeps (its optimizer.py as of 2025): two one-byte moments per
    parameter and an fp32 scale per block of 256 of each, two fp32 moments for a
    parameter of fewer than 4096 elements (its ``min_8bit_size``), and the two 256-entry
    fp32 quantization maps every 8-bit state shares, made once on the device. It updates
    the parameters in place, as the fused kernel does; the values mean nothing."""

    BLOCK = 256
    MIN_8BIT_SIZE = 4096
    QMAP_ENTRIES = 256

    def __init__(self, params, lr=1e-3, **_ignored):
        super().__init__(params, dict(lr=lr))
        self._qmaps = None

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(state, p)
                p.add_(p.grad, alpha=-group["lr"])
        return None

    def _init_state(self, state, p):
        if p.numel() < self.MIN_8BIT_SIZE:
            state["state1"] = torch.zeros_like(p, dtype=torch.float32)
            state["state2"] = torch.zeros_like(p, dtype=torch.float32)
            return
        if self._qmaps is None:
            self._qmaps = [torch.zeros(self.QMAP_ENTRIES, dtype=torch.float32,
                                       device=p.device) for _ in range(2)]
        state["qmap1"], state["qmap2"] = self._qmaps  # shared, as bitsandbytes shares them
        blocks = -(-p.numel() // self.BLOCK)
        for moment in ("state1", "state2"):
            state[moment] = torch.zeros_like(p, dtype=torch.uint8)
            state[moment + "_absmax"] = torch.zeros(blocks, dtype=torch.float32,
                                                    device=p.device)


@dataclass
class Variant:
    """A change to the step: ``name`` as the table shows it, and what it does."""

    name: str
    autocast: torch.dtype | None = None
    weights: torch.dtype | None = None
    checkpoint_every: int | None = None       # every k-th repeated block; 1 = all
    checkpoint_names: list | None = None      # or these blocks
    eight_bit_states: bool = False
    batch: int | None = None                  # with make_batch
    # The step has no autocast of its own, so the change adds one (as_it_changes says).
    adds_autocast: bool = True

    def wrap(self, step_fn):
        if self.autocast is None:
            return step_fn

        def step(*args, **kwargs):
            # A step with autocast of its own keeps its regions, in this dtype; one without
            # runs under autocast everywhere but in its backward passes.
            with autocast_dtype(self.autocast), (
                    autocast_outside_backward(self.autocast) if self.adds_autocast
                    else contextlib.nullcontext()):
                return step_fn(*args, **kwargs)
        return step

    def transform(self, values: list) -> list:
        """Apply the change to the fake objects the step takes (in order: modules are
        changed in place, optimizers rebuilt over the changed parameters)."""
        out = list(values)
        modules = [v for v in out if isinstance(v, torch.nn.Module)]
        for m in modules:
            if self.weights is not None:
                for p in m.parameters():
                    p.data = p.data.to(self.weights)
            names = self.checkpoint_names
            if names is None and self.checkpoint_every:
                blocks = repeated_blocks(m)
                names = blocks[::self.checkpoint_every]
            if names:
                apply_checkpointing(m, [n for n in names if n in dict(m.named_modules())])
        for i, v in enumerate(out):
            if isinstance(v, torch.optim.Optimizer) and (self.eight_bit_states
                                                         or self.weights is not None):
                params = [p for g in v.param_groups for p in g["params"]]
                if self.eight_bit_states:
                    out[i] = Adam8bitStates(params, lr=v.defaults.get("lr", 1e-3))
                else:
                    defaults = {k: val for k, val in v.defaults.items()
                                if k in ("lr", "betas", "eps", "weight_decay", "momentum")}
                    out[i] = type(v)(params, **defaults)
        return out


@contextlib.contextmanager
def autocast_dtype(dtype: torch.dtype):
    """Every ``torch.autocast("cuda", ...)`` made in its length runs in ``dtype``."""
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__

    def init(self, device_type, *args, **kwargs):
        if device_type == "cuda":
            if args:
                args = (dtype, *args[1:])
            else:
                kwargs = dict(kwargs, dtype=dtype)
        original(self, device_type, *args, **kwargs)

    autocast.__init__ = init
    try:
        yield
    finally:
        autocast.__init__ = original


@contextlib.contextmanager
def autocast_outside_backward(dtype: torch.dtype):
    """CUDA autocast in ``dtype`` over its length, left for each backward pass and entered
    again after it: what a user writes who adds autocast to a step, a region around the
    forward pass and the loss. Leaving the region ends its cache of cast weights, as the
    end of a ``with torch.autocast(...)`` block does; a region around the whole step
    would keep every weight's 16-bit copy through backward and the optimizer's step."""
    region = torch.autocast("cuda", dtype=dtype)
    backward = torch.autograd.backward

    def outside(*args, **kwargs):
        region.__exit__(None, None, None)
        try:
            return backward(*args, **kwargs)
        finally:
            region.__enter__()

    region.__enter__()
    torch.autograd.backward = outside
    try:
        yield
    finally:
        torch.autograd.backward = backward
        region.__exit__(None, None, None)


@contextlib.contextmanager
def autocast_seen(dtypes: set):
    """Adds to ``dtypes`` the dtype of each autocast the code in its length enables (the
    CPU stand-in's, which stands for CUDA's, included)."""
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__enter__

    def enter(self):
        if getattr(self, "_enabled", False):
            dtypes.add(self.fast_dtype)
        return original(self)

    autocast.__enter__ = enter
    try:
        yield
    finally:
        autocast.__enter__ = original


def as_it_changes(variant: Variant, autocast: set, weights: set) -> Variant | None:
    """``variant`` as a change to a step that already runs under the autocast dtypes
    ``autocast`` with weights of the dtypes ``weights``: the parts that would not change
    the step's memory are dropped, and None if nothing is left. Autocast is dropped from
    a step that autocasts already: bf16 and fp16 are two bytes an element alike, so
    trading one for the other moves numerics, not memory, and would cost the table a
    recording for a row that saves nothing."""
    same_weights = variant.weights is not None and weights == {variant.weights}
    changed = dataclasses.replace(
        variant, autocast=None if autocast else variant.autocast,
        weights=None if same_weights else variant.weights, adds_autocast=not autocast)
    if changed.autocast is None and changed.weights is None and not (
            changed.checkpoint_every or changed.checkpoint_names
            or changed.eight_bit_states or changed.batch):
        return None
    if variant.autocast is not None and changed.autocast is None:
        changed.name = variant.name.replace(f"{_short(variant.autocast)} autocast + ", "")
    return changed


def _short(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def standard_variants(blocks: int) -> list[Variant]:
    """The changes the guide suggests, in the order the table lists them."""
    out = [Variant("as written"),
           Variant("bf16 autocast", autocast=torch.bfloat16),
           Variant("fp16 autocast", autocast=torch.float16),
           Variant("bf16 weights and optimizer state", weights=torch.bfloat16),
           Variant("8-bit optimizer states", eight_bit_states=True)]
    if blocks:
        out.append(Variant(f"checkpointing all {blocks} blocks", checkpoint_every=1))
        if blocks >= 4:
            out.append(Variant("checkpointing every 2nd block", checkpoint_every=2))
        out.append(Variant("bf16 autocast + checkpointing all blocks",
                           autocast=torch.bfloat16, checkpoint_every=1))
    return out


@dataclass
class AdviceRow:
    variant: str
    peak_allocated: int | None   # None (and the note says why): not estimated
    peak_reserved: int | None
    torch_peak_reserved: int | None
    fits: bool | None
    saves: int | None           # bytes of peak reserved saved against the step as written
    extra_compute: float | None  # FLOPs over the step as written, minus 1 (0.3 = +30%)
    note: str = ""


def key(variant: Variant) -> tuple:
    """What a variant changes, its name left out: two with one key are one change."""
    fields = dataclasses.asdict(variant)
    fields.pop("name")
    return tuple(sorted((k, str(v)) for k, v in fields.items()))


@dataclass
class Advice:
    rows: list = field(default_factory=list)
    device_memory: int | None = None
    min_device_memory: int | None = None

    def __str__(self) -> str:
        # A saving that rounds to nothing prints as 0.00, never -0.00.
        gib = lambda n: f"{n / (1 << 30):.2f}".replace("-0.00", "0.00")  # noqa: E731
        head = "fits" if self.device_memory else ""
        lines = [f"{'what':<44}{'peak alloc':>11}{'vramkit':>9}{'PyTorch':>9}"
                 f"{'saves':>8}{'compute':>9}  {head}",
                 f"{'':<44}{'GiB':>11}{'GiB':>9}{'GiB':>9}{'GiB':>8}"]
        reasons = []
        for r in self.rows:
            if r.peak_reserved is None:
                # A reason is given whole, under the table, rather than cut to a column.
                reasons.append(textwrap.fill(f"{r.variant}: {r.note}", 88,
                                             subsequent_indent="    ",
                                             break_long_words=False,
                                             break_on_hyphens=False))
                lines.append(f"{r.variant:<44}{'-':>11}{'-':>9}{'-':>9}{'-':>8}{'-':>9}  "
                             f"not estimated (below)")
                continue
            compute = "-" if r.extra_compute is None else f"{100 * r.extra_compute:+.0f}%"
            fits = {True: "yes", False: "no", None: ""}[r.fits]
            lines.append(f"{r.variant:<44}{gib(r.peak_allocated):>11}{gib(r.peak_reserved):>9}"
                         f"{gib(r.torch_peak_reserved):>9}{gib(r.saves):>8}{compute:>9}  "
                         f"{fits}{('  ' + r.note) if r.note else ''}")
        if self.min_device_memory:
            cards = [c for c in _CARDS if c << 30 >= self.min_device_memory]
            lines.append(f"as written it needs a card of {gib(self.min_device_memory)} GiB"
                         + (f" (the smallest common size: {cards[0]} GB class)" if cards
                            else ""))
        if reasons:
            lines.append("not estimated:")
            lines.extend("  " + reason for reason in reasons)
        return "\n".join(lines)


# Common card sizes in GiB of memory the allocator can use, roughly: 24, 40, 48, 80, 94,
# 141 (as sold: RTX 4090, A100 40GB, L40S, A100/H100 80GB, H100 NVL, H200).
_CARDS = (24, 40, 48, 80, 94, 141)
