"""The values of the small tensors a step or its build() computes from known values alone.

Fake tensors have no values, so reading one (``.item()``, ``.tolist()``, ``if t:``,
``nonzero()``) fails. Many models read values that do not depend on any weight or input:
timm's ConvNeXt, Swin and others build their drop-path rates with
``torch.linspace(0, rate, depth).split(depths)`` and ``.tolist()`` in ``__init__``; a
drop-path draws a per-sample mask and asks whether it is all ones. Those values can be
computed exactly, and cheaply.

:class:`KnownValues` is a dispatch mode just above the fake mode (while a step is
recorded, the recorder calls it from its own dispatch instead of stacking it as a second
mode: ``StorageRecorder.values``). An operation whose tensor arguments all have known
values (or that takes no tensor, as ``linspace`` and ``rand`` do), and whose outputs are
small, is run a second time on real CPU tensors, and each fake output remembers its real
twin. Reading the value of a fake tensor with a real twin gives the twin's; an operation
whose output shape depends on values (``nonzero``, a boolean mask) gives a fake tensor
of the shape the real one has. A value that depends on weights or inputs stays unknown,
and reading it fails with the reason: the weights and the batch the step is given count as
unknown, whatever their size.

Three reads of unknown values are answered, each counted for the estimate's notes, because a
training step makes them without their deciding what it allocates:

- checks that a value is finite (``torch.isnan(loss)``, ``isinf``, ``isfinite``, which
  PyTorch decomposes into ``x == x`` and ``abs(x) != inf``; ``clip_grad_norm_``'s
  ``error_if_nonfinite``): values computed from the weights and the batch are taken as
  finite numbers, as in a healthy step, and what those checks compute follows from that;
- the test of a check that can only raise (an ``if`` whose block ends by raising, an
  ``assert``: a label past the vocabulary, an index out of range), answered as passed
  (:mod:`._checks`);
- a number read with ``.item()`` by the user's own code (outside PyTorch, vramkit and
  installed packages), as a loss is read to be logged or correct predictions counted: it
  reads as an :class:`UnknownValue`, a float of 0.0 that can be printed, summed and
  stored, but that refuses to be compared, tested or made an int: a step that decides
  on the value (``if loss.item() > 10``) or sizes or indexes with it (``x[:n]``) is
  refused as before, naming its line. An integer read gives a float too, and one that is
  not a number, so that no size, index or count can take it unnoticed (Python takes an
  int, or a subclass of one, as a size without asking; ``torch.arange(0.0)`` is empty,
  ``torch.arange(nan)`` an error). An installed package's integer read is answered so
  too (torchvision's FCOS counts its matched anchors with ``.item()`` to divide its loss
  by); its floating-point reads stay refused. Yes/no tests of a tensor (``if loss:``) and
  ``float(t)`` (which Python turns into a plain float, losing what the value is) are
  refused at once. ``max()`` and ``min()`` of numbers and one such unknown value (a
  count, or a tensor of one: ``max(1, num_foreground)``) give the unknown value: which of
  them is larger is not decided, and what is made of it stays unknown.

One more is answered where a library asks it: an assignment of a cost matrix computed from
the weights and the batch (SciPy's ``linear_sum_assignment``, which DETR-style detectors'
Hungarian matchers call on the matrix moved to the host) pairs as many rows and columns as
the matrix's smaller side, whichever they are; it is answered as the first rows to the first
columns, and what follows takes the memory it takes for any pairing.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensor)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from . import _checks, _selections

# The most elements an output may have for its values to be computed: drop-path rates,
# masks per sample and index lists, never activations or weights.
MOST_ELEMENTS = 1 << 16

_aten = torch.ops.aten
_DEVICE_OF = torch.ops.prim.device.default

# What a finiteness check of a finite value gives, by op: isnan and the isinf family say
# no; ``x == x`` says yes and ``x != x`` no (PyTorch's isfinite and nan checks compare a
# tensor with itself); comparing with an infinity says "not equal".
_NOT_NAN_OR_INF = {_aten.isnan.default: False, _aten.isinf.default: False,
                   _aten.isposinf.default: False, _aten.isneginf.default: False}
_SELF_COMPARED = {_aten.eq.Tensor: True, _aten.ne.Tensor: False}
_INF_COMPARED = {_aten.eq.Scalar: False, _aten.ne.Scalar: True}


# The code whose yes/no tensors computed from unknown values decide how long to run,
# not what to make: a text generator's "which sequences drew an end-of-sequence token?"
# and "which tokens are padding?". Taken as all "no" (a known value: no token of the
# batch or of the output is padding or an end), the generation runs to its
# max_new_tokens: the longest it can run, and the most memory it can take.
_GENERATION_LOOPS = (os.sep + os.path.join("transformers", "generation") + os.sep,)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_VRAMKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


# The code whose reads of unknown values scale an update, never size an allocation: an
# optimizer's step (Adafactor's relative step size from each weight's norm) and the
# gradient scaler's check for infinities (fp16 autocast). Read as zero: no infinity
# found, the step taken; the value of the update does not matter to memory.
_OPTIMIZER_CODE = tuple(os.path.join(_TORCH, *parts) for parts in (
    ("optim", ""), ("amp", "grad_scaler.py")))


# An optimizer whose reads decide what it allocates: LBFGS evaluates the closure and keeps
# history pairs (each a copy of the parameters) as long as the loss and gradients say.
_DECIDING_OPTIMIZERS = (os.path.join(_TORCH, "optim", "lbfgs.py"),)


def _read_by_an_optimizer() -> bool:
    """Whether an optimizer's step or the gradient scaler is reading the value (and not
    one of _DECIDING_OPTIMIZERS)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_DECIDING_OPTIMIZERS):
            return False
        if frame.f_code.co_filename.startswith(_OPTIMIZER_CODE):
            return True
        frame = frame.f_back
    return False


_INSTALLED = ("site-packages", "dist-packages")
# Code typed rather than kept in a file is the user's too: the interpreter's prompt, `python
# -c` and exec(), and IPython's cells (Jupyter's are files in a temporary folder).
_TYPED = ("<stdin>", "<string>", "<ipython-input-")


def _innermost_outside():
    """The innermost frame of the code that asked, outside PyTorch, vramkit and the code
    they generate (named "<...>"; typed code, _TYPED, is the user's); None if none."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_TYPED) or not (
                path.startswith(_TORCH) or path.startswith(_VRAMKIT) or path.startswith("<")):
            return frame
        frame = frame.f_back
    return None


# PyTorch's own code whose raise-only checks validate values a step gives it:
# torch.distributions' validate_args (a scale that must be positive, a sample in the
# support), on by default.
_VALIDATING = (_TORCH + "distributions" + os.sep,)


def _raise_only_check():
    """The frame whose raise-only check is testing a truth value, and the answer that
    passes it ((frame, None) if none is): the innermost frame outside PyTorch and vramkit,
    or, below it, one of PyTorch's own validating code (_VALIDATING)."""
    outside = _innermost_outside()
    frame = sys._getframe(2)
    while frame is not None and frame is not outside:
        if frame.f_code.co_filename.startswith(_VALIDATING):
            answer = _checks.passing_answer(frame)
            if answer is not None:
                return frame, answer
        frame = frame.f_back
    return outside, _checks.passing_answer(outside)


def _site(frame) -> str:
    """A frame's "file:line" (the file's name alone); "" for none."""
    return "" if frame is None else \
        f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _users_own_code() -> str:
    """Where the code that asked is the user's own (not an installed package's), its
    "file:line"; "" otherwise."""
    frame = _innermost_outside()
    if frame is None:
        return ""
    path = frame.f_code.co_filename
    if path.startswith(_TYPED):
        return f"{path}:{frame.f_lineno}"
    if any(part in path for part in _INSTALLED):
        return ""
    return _site(frame)


class ValueDecided(RuntimeError):
    """The step decided on an :class:`UnknownValue`: fake tensors have no values."""


class UnknownValue(float):
    """A number (a float or an int) the step read from the weights or the batch, which
    the estimate cannot know: 0.0 to print, sum or store (nan for an int: a count
    must fail where it would size something), and what arithmetic makes of it stays
    unknown; comparing it, testing it or making an int of it raises ValueDecided, since
    that could decide what the step allocates."""

    def __new__(cls, site: str, stand_in: float = 0.0):
        value = super().__new__(cls, stand_in)
        value.site = site
        return value

    def _decided(self, *_args):
        raise ValueDecided(
            f"aten._local_scalar_dense.default: the step read a value computed from the "
            f"weights or the batch at {self.site} and then decided on it (a comparison, "
            f"a test or an int); fake tensors have no values")

    __bool__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _decided
    __int__ = __index__ = __floor__ = __ceil__ = __trunc__ = _decided
    __hash__ = float.__hash__

    def __round__(self, ndigits=None):
        # round(loss, 4) for a log stays a float; round(loss) is an int.
        return self._decided() if ndigits is None else self._unknown()

    def _unknown(self, *args):
        # A count's nan goes into what is computed from it.
        counted = math.isnan(self) or any(isinstance(a, float) and math.isnan(a) for a in args)
        return UnknownValue(self.site, math.nan if counted else 0.0)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _unknown
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = _unknown
    __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = __abs__ = _unknown


def _finite_answer(func, args):
    """What ``func`` gives on the finite values of ``args[0]`` when it is a finiteness
    check (True or False for every element), else None."""
    x = args[0] if args else None
    if not isinstance(x, FakeTensor) or not x.is_floating_point():
        return None
    if func in _NOT_NAN_OR_INF:
        return _NOT_NAN_OR_INF[func]
    if func in _SELF_COMPARED and len(args) > 1 and args[1] is x:
        return _SELF_COMPARED[func]
    if func in _INF_COMPARED and len(args) > 1 and isinstance(args[1], float) \
            and math.isinf(args[1]):
        return _INF_COMPARED[func]
    return None


def _made_by_a_generation_loop() -> bool:
    """Whether the code that asked is a generation loop's."""
    frame = _innermost_outside()
    return frame is not None and any(loop in frame.f_code.co_filename
                                     for loop in _GENERATION_LOOPS)


@functools.lru_cache(maxsize=None)  # asked of every op a step runs: once per op
def _writes(func) -> list[int]:
    """The positions of the arguments ``func`` writes to (in-place and out= ops)."""
    return [i for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


class KnownValues(TorchDispatchMode):
    """Real twins of the small fake tensors computed from known values alone."""

    def __init__(self):
        super().__init__()
        self.real = WeakIdKeyDictionary()  # fake tensor -> real CPU tensor
        self.stand_ins = 0  # yes/no tensors of a generation loop taken as all "no"
        self.optimizer_reads = 0  # values an optimizer's step read, taken as zero
        self.finite_checks = 0  # finiteness checks of unknown values, taken as finite
        # Tests of unknown values in checks that only raise (_checks), taken as passed.
        self.raise_only_checks = 0
        self.first_raise_only_check = ""  # where the first was ("file:line")
        self.logged_reads = 0  # numbers read with .item(), answered: UnknownValue
        self.first_logged_read = ""  # where the first of them was read ("file:line")
        self.first_count_read = ""  # where the first integer of them was read
        self.assignments = 0  # cost matrices "assigned" (assignments_answered)
        self.first_assignment = ""  # where the first was asked for ("file:line")
        self.extremes_left = 0  # max()/min() left unknown (extremes_left_unknown)
        self.first_extreme_left = ""  # where the first was ("file:line")
        # Selections by unknown values taken at their largest (_selections), and where
        # the first was made ("file:line").
        self.selections_at_largest = 0
        self.first_selection_at_largest = ""
        self.nonzero_bounds = _selections.NonzeroBounds()
        self.distinct_bounds = _selections.DistinctBounds(self.real)
        # Set by python_reads_answered's Tensor.item around its read; the site of the read
        # it answered with a stand-in, for the UnknownValue it returns.
        self.reading_for_python = False
        self.stood_in_at = ""

    @contextlib.contextmanager
    def python_reads_answered(self):
        """In its length ``t.item()`` (and ``f"{t:.3f}"`` of a 0-dim tensor, which reads it)
        of a value the user's code cannot have (see the module's note) gives an
        :class:`UnknownValue` instead of failing."""
        original = torch.Tensor.item

        def item(t):
            self.reading_for_python = True
            try:
                value = original(t)
            finally:
                self.reading_for_python = False
            if self.stood_in_at:
                site, self.stood_in_at = self.stood_in_at, ""
                return UnknownValue(site, 0.0 if t.dtype.is_floating_point else math.nan)
            return value

        # A real 0-dim tensor formats as its value (f"{loss:.3f}"); a fake one, a subclass,
        # has no such path in PyTorch and refuses the format: it formats as its read.
        original_format = torch.Tensor.__format__

        def format_(t, spec):
            if isinstance(t, FakeTensor) and t.dim() == 0 and spec:
                return format(t.item(), spec)
            return original_format(t, spec)

        torch.Tensor.item, torch.Tensor.__format__ = item, format_
        try:
            yield
        finally:
            torch.Tensor.item, torch.Tensor.__format__ = original, original_format

    @contextlib.contextmanager
    def extremes_left_unknown(self):
        """In its length ``max()`` and ``min()`` of plain numbers and one value the
        estimate cannot know (an :class:`UnknownValue`, or a fake tensor of one element
        with no real twin) return that value, as the module's note says; any other call
        is Python's own."""
        import builtins
        original_max, original_min = builtins.max, builtins.min
        real = self.real

        def unknown_among(values):
            unknown = [v for v in values if isinstance(v, UnknownValue) or (
                isinstance(v, FakeTensor) and v.numel() == 1 and v not in real)]
            plain = all(isinstance(v, (int, float)) or v is unknown[0] for v in values) \
                if len(unknown) == 1 else False
            return unknown[0] if plain else None

        def extreme(original):
            def pick(*values, **options):
                if len(values) > 1 and not options:
                    unknown = unknown_among(values)
                    if unknown is not None:
                        self.extremes_left += 1
                        self.first_extreme_left = self.first_extreme_left or \
                            _site(_innermost_outside())
                        return unknown
                return original(*values, **options)
            return pick

        builtins.max, builtins.min = extreme(original_max), extreme(original_min)
        try:
            yield
        finally:
            builtins.max, builtins.min = original_max, original_min

    @contextlib.contextmanager
    def assignments_answered(self):
        """In its length SciPy's ``linear_sum_assignment`` of a fake cost matrix answers as
        the module's note says, wherever a module loaded before bound it by name (``from
        scipy.optimize import linear_sum_assignment``); a real matrix gets SciPy's own
        answer. Nothing is done where SciPy is not loaded."""
        optimize = sys.modules.get("scipy.optimize")
        original = getattr(optimize, "linear_sum_assignment", None)
        if original is None:
            yield
            return
        import numpy

        def linear_sum_assignment(cost_matrix, maximize=False):
            if not (isinstance(cost_matrix, FakeTensor) and cost_matrix.dim() == 2):
                return original(cost_matrix, maximize)
            self.assignments += 1
            self.first_assignment = self.first_assignment or _site(_innermost_outside())
            pairs = min(cost_matrix.shape)
            return numpy.arange(pairs), numpy.arange(pairs)

        # Each module's own dictionary, not getattr: a lazy module (transformers') would
        # import on a getattr.
        bound = [m for m in list(sys.modules.values())
                 if getattr(m, "__dict__", {}).get("linear_sum_assignment") is original]
        for module in bound:
            module.linear_sum_assignment = linear_sum_assignment
        try:
            yield
        finally:
            for module in bound:
                module.linear_sum_assignment = original

    @contextlib.contextmanager
    def known_values_not_traced(self):
        """In its length a library's check whether a tensor is being traced answers no for
        a fake tensor whose value is known, as it would for the real tensor. transformers'
        ``is_tracing`` counts every fake tensor as traced, so that under fake tensors it
        keeps the attention masks it drops in a real step (an all-ones padding mask it
        made itself, or positions from ``arange``, whose values it would read): the
        model then gives scaled_dot_product_attention a mask, and PyTorch's fused kernels
        a bias of batch x length x length elements per layer that the real step never
        makes. A tensor whose value is unknown (the user's own mask) is still counted as
        traced: the mask is kept, as transformers keeps it."""
        module = sys.modules.get("transformers.utils.import_utils")
        original = getattr(module, "is_fake_tensor", None)
        if not callable(original):
            yield
            return
        real = self.real

        def is_fake_tensor(x):
            return original(x) and not (isinstance(x, FakeTensor) and x in real)

        module.is_fake_tensor = is_fake_tensor
        try:
            yield
        finally:
            module.is_fake_tensor = original

    def forget(self, tensors) -> None:
        """Treat ``tensors`` as values unknown: weights and the batch stand for ones the
        estimate cannot know (a real run's trained weights, its data), so what is read
        from them is refused, however small they are."""
        for t in tensors:
            self.real.pop(t, None)

    def assume_where_unknown(self, tensors, value) -> int:
        """Answer reads of each of ``tensors`` whose values are unknown as if every
        element were ``value``; returns how many that was."""
        unknown = [t for t in tensors if t not in self.real]
        with _disable_current_modes():
            for t in unknown:
                self.real[t] = torch.full(tuple(t.shape), value, dtype=t.dtype)
        return len(unknown)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _DEVICE_OF:  # ``t.device``: asked thousands of times, no value in it
            return func(*args, **kwargs)
        if func is _aten._local_scalar_dense.default and args[0] in self.real:
            with _disable_current_modes():
                return self.real[args[0]].item()
        if func is _aten._local_scalar_dense.default and _read_by_an_optimizer():
            self.optimizer_reads += 1
            if args[0].dtype == torch.bool:
                return False
            return 0.0 if args[0].dtype.is_floating_point else 0
        if func is _aten._local_scalar_dense.default and args[0].dtype == torch.bool:
            frame, answer = _raise_only_check()
            if answer is not None:
                self.raise_only_checks += 1
                self.first_raise_only_check = self.first_raise_only_check or _site(frame)
                return answer
        if func is _aten._local_scalar_dense.default and self.reading_for_python \
                and args[0].dtype != torch.bool and not args[0].dtype.is_complex:
            site = _users_own_code()
            if not site and not args[0].dtype.is_floating_point:
                site = _site(_innermost_outside())
            if site:
                self.logged_reads += 1
                self.first_logged_read = self.first_logged_read or site
                if not args[0].dtype.is_floating_point:
                    self.first_count_read = self.first_count_read or site
                self.stood_in_at = site
                return 0.0
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            real = self._run_real(func, args, kwargs)
            if real is not None:
                return tree_map(lambda r: self._fake_of(r, args), real)
            selected = _selections.at_their_largest(func, args, kwargs, self.real,
                                                    self.nonzero_bounds, self.distinct_bounds)
            if selected is None:
                raise
            out, at_largest = selected
            self.distinct_bounds.follow(func, args, kwargs, out)
            if not at_largest:
                return out
            self.selections_at_largest += 1
            self.first_selection_at_largest = self.first_selection_at_largest or \
                _site(_innermost_outside())
            return out
        self._follow(func, args, kwargs, out)
        self.nonzero_bounds.follow(func, args, kwargs, out)
        self.distinct_bounds.follow(func, args, kwargs, out)
        return out

    def _reals(self, args, kwargs):
        """The arguments with each tensor replaced by its real twin; None if one has none.
        A real tensor among them (allowed alongside fake ones) is its own twin."""
        leaves, spec = tree_flatten((args, kwargs))
        swapped = []
        for leaf in leaves:
            if isinstance(leaf, FakeTensor):
                leaf = self.real.get(leaf)
                if leaf is None:
                    return None
            elif isinstance(leaf, torch.device) and leaf.type != "cpu":
                leaf = torch.device("cpu")
            swapped.append(leaf)
        real_args, real_kwargs = tree_unflatten(swapped, spec)
        if "device" in real_kwargs:
            real_kwargs["device"] = torch.device("cpu")
        return real_args, real_kwargs

    def knows_any(self, values) -> bool:
        """Whether any fake tensor among ``values`` (lists and tuples looked into) has a
        real twin whose value an op could change."""
        for value in values:
            if isinstance(value, FakeTensor):
                if value in self.real:
                    return True
            elif isinstance(value, (list, tuple)) and self.knows_any(value):
                return True
        return False

    def _known(self, values) -> bool:
        """Whether every fake tensor among ``values`` (lists and tuples looked into) has
        a real twin: most ops of a step take weights or activations, whose values are
        unknown, and this says so before the arguments are flattened."""
        for value in values:
            if isinstance(value, FakeTensor):
                if value not in self.real:
                    return False
            elif isinstance(value, (list, tuple)) and not self._known(value):
                return False
        return True

    def _run_real(self, func, args, kwargs):
        if not (self._known(args) and self._known(kwargs.values())):
            return None
        reals = self._reals(args, kwargs)
        if reals is None:
            return None
        fakes = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if _writes(func) and any(not isinstance(a, FakeTensor) for a in fakes):
            return None  # it would write to the user's real tensor
        try:
            with _disable_current_modes(), torch.no_grad():
                return func(*reals[0], **reals[1])
        except Exception:  # noqa: BLE001 - a value not computed stays unknown
            return None

    def _follow(self, func, args, kwargs, out) -> None:
        if isinstance(out, torch.Tensor):  # most ops: one tensor, flattened for nothing
            outs = [out]
        else:
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        small = all(o.numel() <= MOST_ELEMENTS for o in outs)
        real = self._run_real(func, args, kwargs) if small else None
        if real is None and small and isinstance(out, torch.Tensor) \
                and out.dtype == torch.bool:
            answer = _finite_answer(func, args)
            if answer is not None:
                with _disable_current_modes():  # a real tensor, not the fake mode's
                    real = torch.full(out.shape, answer, dtype=torch.bool)
                self.finite_checks += 1
        if real is None and small and outs and all(o.dtype == torch.bool for o in outs) \
                and not _writes(func) and _made_by_a_generation_loop():
            with _disable_current_modes():  # real tensors, not the fake mode's
                real = tuple(torch.zeros(o.shape, dtype=torch.bool) for o in outs)
            real = real[0] if len(real) == 1 and isinstance(out, torch.Tensor) else real
            self.stand_ins += 1
        if real is None:
            # What the op wrote to no longer has the values its twin holds.
            for i in _writes(func):
                if i < len(args) and isinstance(args[i], torch.Tensor):
                    self.real.pop(args[i], None)
            for value in kwargs.values():
                if isinstance(value, torch.Tensor) and value in self.real and _writes(func):
                    self.real.pop(value, None)
            return
        reals = [r for r in tree_flatten(real)[0] if isinstance(r, torch.Tensor)]
        if len(reals) != len(outs):
            return
        for fake, twin in zip(outs, reals):
            if isinstance(fake, FakeTensor) and twin.shape == fake.shape:
                self.real[fake] = twin

    def _fake_of(self, real, args):
        """A fake tensor of the real one's shape and dtype, on the device of the op's
        first fake argument, remembering the real one as its twin."""
        if not isinstance(real, torch.Tensor):
            return real
        first = next(a for a in tree_flatten(args)[0] if isinstance(a, FakeTensor))
        fake = _selections.fake_like(first, real.shape, real.dtype, real.stride())
        self.real[fake] = real
        return fake
