"""Selections whose size depends on values the estimate cannot know, taken at their largest.

A boolean mask over the batch or the loss (``logits[labels != -100]``, ``x[keep]``,
``torch.where(mask)``, ``masked_select``) or ``unique()`` of the labels makes a tensor
whose length depends on values: fake tensors refuse it (``DynamicOutputShapeException``).
Each of these ops keeps at most every element of what it selects from, so its output has
a largest shape, known from the shapes alone: every element kept (``nonzero``,
``masked_select``, a boolean index, the boxes non-maximum suppression keeps), every
element distinct (``unique``) or, for CTC's alphas, the longest target its targets can
hold. The estimate takes that shape, the most memory the op and what follows it can take,
and its notes say so; an answer with no bound (``bincount``, whose length is the largest
label; ``repeat_interleave`` by counts) stays refused, and so does ``unique()`` of more
than :data:`UNIQUE_AT_MOST` elements.

A mask made from zeros by writing at known counts of positions keeps at most that many
(:class:`NonzeroBounds`): a sampler that marks 128 positives and 384 negatives of 2,000
proposals in two masks and selects by their union selects at most 512, not 2,000.

A tensor whose values were drawn from few values holds at most that many distinct ones
(:class:`DistinctBounds`): a detector's level of each proposal, filled with one level per
feature map and then picked by the scores' top-k, has at most as many distinct values as
there are levels, and batched non-maximum suppression loops over them: five passes, not
one per box.

A boolean index is given to ``aten.index`` as it is on a GPU: each mask becomes the
positions it keeps, one long index per masked dimension (CUDA computes them with
``nonzero`` inside the op), here as many as the mask's bound allows: its elements, or
what was marked in it.
"""

from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

_aten = torch.ops.aten
_MASK_DTYPES = (torch.bool, torch.uint8)

_UNIQUE = (_aten._unique2.default, _aten.unique_consecutive.default, _aten.unique_dim.default,
           _aten.unique_dim_consecutive.default)
# The most elements whose distinct values are taken as all distinct. Code loops over
# distinct values (a loss per class, batched non-maximum suppression per level), and
# each pass runs on fake tensors: labels and box levels stay well below this, while the
# distinct values of a segmentation map's pixels would make a loop that never ends.
UNIQUE_AT_MOST = 1 << 16


def _unique_flat(t, return_inverse, return_counts, distinct):
    """Shapes of ``_unique2`` and ``unique_consecutive`` without ``dim``: the values, the
    inverse (the input's shape, or empty if not asked for), the counts (or empty)."""
    n = distinct.most(t)
    return (((n,), t.dtype), (tuple(t.shape) if return_inverse else (0,), torch.int64),
            ((n,) if return_counts else (0,), torch.int64))


def _unique_along(t, dim):
    """Shapes of ``unique_dim`` and ``unique_dim_consecutive``: every slice along ``dim``
    distinct; PyTorch makes the inverse and the counts whether asked for or not."""
    length = t.shape[dim]
    return ((tuple(t.shape), t.dtype), ((length,), torch.int64), ((length,), torch.int64))


_ZEROS = {_aten.zeros.default, _aten.zeros_like.default, _aten.new_zeros.default}
_FILLED = {_aten.full.default: 1, _aten.full_like.default: 1, _aten.new_full.default: 2}
_ZEROED_IN_PLACE = {_aten.zero_.default, _aten.fill_.Scalar}
_WRITTEN_AT = {_aten.index_put_.default, _aten.index_put.default,
               _aten._index_put_impl_.default}
_UNION = {_aten.bitwise_or.Tensor, _aten.logical_or.default}
_INTERSECTION = {_aten.bitwise_and.Tensor, _aten.logical_and.default}
_COPIES = {_aten._to_copy.default, _aten.clone.default}
_FOLLOWED = _ZEROS | set(_FILLED) | _ZEROED_IN_PLACE | _WRITTEN_AT | _UNION | \
    _INTERSECTION | _COPIES


def _version(t):
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor keeps no version
        return None


class NonzeroBounds:
    """At most how many elements of a tensor are nonzero, where the ops that made it say
    so: zeros, then writes at a known count of positions (``mask[idx] = 1``), unions and
    intersections of such masks and their copies.

    A bound is kept with the tensor's version counter, which every in-place write bumps
    (through any view of the storage): a tensor written by anything this does not follow
    has a version its bound no longer matches, and counts as unbounded. PyTorch bumps the
    counter after the op returns, so an in-place op's bound is kept for the version it
    will have."""

    def __init__(self):
        self._most = WeakIdKeyDictionary()  # fake tensor -> (most nonzero, its version)

    def most(self, t) -> int:
        """At most how many elements of ``t`` are nonzero: its bound, or all of them."""
        kept = self._most.get(t)
        if kept is not None and kept[1] == _version(t):
            return min(kept[0], t.numel())
        return t.numel()

    def _keep(self, t, most: int, in_place: bool) -> None:
        version = _version(t)
        if isinstance(t, FakeTensor) and version is not None and most < t.numel():
            self._most[t] = (most, version + 1 if in_place else version)

    def follow(self, func, args, kwargs, out) -> None:
        """Note the bound of what ``func`` made or wrote, if it makes one."""
        if func not in _FOLLOWED:
            return
        if func in _ZEROS:
            self._keep(out, 0, False)
        elif func in _FILLED:
            fill = args[_FILLED[func]] if len(args) > _FILLED[func] else None
            if fill == 0:
                self._keep(out, 0, False)
        elif func in _ZEROED_IN_PLACE:
            if func is _aten.zero_.default or args[1] == 0:
                self._keep(args[0], 0, True)
        elif func in _WRITTEN_AT:
            target = args[0]
            written = _positions_written(target, args[1])
            if written is not None:
                self._keep(out, self.most(target) + written, func is not _aten.index_put.default)
        elif func in _UNION:
            self._keep(out, self.most(args[0]) + self.most(args[1]), False)
        elif func in _INTERSECTION:
            self._keep(out, min(self.most(args[0]), self.most(args[1])), False)
        elif func in _COPIES and isinstance(out, torch.Tensor) and out.shape == args[0].shape:
            self._keep(out, self.most(args[0]), False)


def _positions_written(target, indices):
    """How many elements of ``target`` an ``index_put`` by ``indices`` writes at most:
    the broadcast count of its long indices times the dimensions they leave whole; None
    for a boolean index (whose count is a selection's) or indices it cannot read."""
    shapes, whole = [], 1
    for dim, size in enumerate(target.shape):
        index = indices[dim] if dim < len(indices) else None
        if index is None:
            whole *= size
        elif not isinstance(index, torch.Tensor) or index.dtype in _MASK_DTYPES:
            return None
        else:
            shapes.append(index.shape)
    if not shapes:
        return None
    return math.prod(torch.broadcast_shapes(*shapes)) * whole


# Ops each of whose outputs holds only values of their first argument (views, copies,
# selections by position, reorderings), and those that join several (cat and stack: the
# values of each of their tensors; where: of its two choices).
_KEEPS_VALUES = {
    _aten.index.Tensor, _aten.index_select.default, _aten.gather.default, _aten.take.default,
    _aten.masked_select.default, _aten.expand.default, _aten.view.default,
    _aten._unsafe_view.default, _aten.reshape.default, _aten._reshape_alias.default,
    _aten.clone.default, _aten._to_copy.default, _aten.alias.default, _aten.detach.default,
    _aten.lift_fresh.default, _aten.lift_fresh_copy.default, _aten.slice.Tensor,
    _aten.select.int, _aten.permute.default, _aten.t.default, _aten.transpose.int,
    _aten.squeeze.default, _aten.squeeze.dim, _aten.squeeze.dims, _aten.unsqueeze.default,
    _aten.flatten.using_ints, _aten.narrow.default, _aten.repeat.default, _aten.flip.default,
    _aten.roll.default, _aten.unbind.int, _aten.split.Tensor, _aten.split_with_sizes.default,
    _aten.sort.default, _aten.sort.stable, _aten.topk.default, _aten.max.dim, _aten.min.dim,
    _aten._unique2.default, _aten.unique_consecutive.default}
_JOINS_VALUES = {_aten.cat.default, _aten.stack.default}
_SPLITS = {_aten.unbind.int, _aten.split.Tensor, _aten.split_with_sizes.default}
_ONE_VALUE = {_aten.full.default, _aten.full_like.default, _aten.new_full.default,
              _aten.zeros.default, _aten.zeros_like.default, _aten.new_zeros.default,
              _aten.ones.default, _aten.ones_like.default, _aten.new_ones.default}


class DistinctBounds:
    """At most how many distinct values a tensor holds, where the ops that made it say
    so: a tensor of known values holds what its real twin holds, a filled one one value,
    and views, copies, selections by position and reorderings of it no more than it;
    cat, stack and where join their inputs' counts. Kept with the tensor's version
    counter, as :class:`NonzeroBounds` keeps its bounds: a tensor written in place since
    holds values this did not follow."""

    def __init__(self, known):
        self._known = known  # fake tensor -> real twin (KnownValues.real)
        self._most = WeakIdKeyDictionary()  # fake tensor -> (most distinct, its version)

    def most(self, t) -> int:
        """At most how many distinct values ``t`` holds: its bound, or its elements (two
        at most for booleans)."""
        most = min(t.numel(), 2) if t.dtype == torch.bool else t.numel()
        kept = self._most.get(t)
        if kept is not None and kept[1] == _version(t):
            return min(kept[0], most)
        real = self._known.get(t)
        if real is not None and most > 1:
            with _disable_current_modes():
                return int(torch.unique(real).numel())
        return most

    def _of(self, value) -> int | None:
        """The bound of one of an op's value arguments: a scalar is one value; None for
        what is neither a tensor nor a number."""
        if isinstance(value, torch.Tensor):
            return self.most(value)
        return 1 if isinstance(value, (bool, int, float)) else None

    def follow(self, func, args, kwargs, out) -> None:
        """Note the bound of what ``func`` made, if it makes one smaller than its size."""
        if func in _KEEPS_VALUES:
            source = args[0] if args else kwargs.get("self")
            # Most sources are activations, of no bound: done in two lookups.
            if not isinstance(source, torch.Tensor) or (
                    source not in self._most and source not in self._known):
                return
        elif func not in _JOINS_VALUES and func is not _aten.where.self \
                and func not in _ONE_VALUE:
            return
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if func not in _SPLITS:
            outs = outs[:1]
        # A tensor with a real twin has its count from the twin.
        outs = [o for o in outs if isinstance(o, FakeTensor) and o.numel() > 1 and
                o not in self._known and _version(o) is not None]
        if not outs:
            return
        if func in _KEEPS_VALUES:
            most = self.most(source)
        elif func in _JOINS_VALUES:
            most = sum(self.most(t) for t in args[0])
        elif func is _aten.where.self:
            choices = [self._of(v) for v in args[1:3]]
            most = None if None in choices else sum(choices)
        else:
            most = 1
        for o in outs:
            if most is not None and most < o.numel():
                self._most[o] = (most, _version(o))


def _largest_shapes(func, args, kwargs, known, bounds, distinct):
    """The (shape, dtype) of each output of ``func`` at its largest and whether that is a
    bound (True) or what it selects (False: a mask whose values are ``known``), or None
    if ``func`` is not a selection with a bound. A mask with ``bounds`` keeps at most
    what they say; ``unique`` keeps at most the ``distinct`` values its input holds."""
    def arg(i, name, default=None):
        return args[i] if len(args) > i else kwargs.get(name, default)

    t = args[0] if args else kwargs.get("self")
    if not isinstance(t, torch.Tensor):
        return None
    if func is _aten.nonzero.default:
        return (((bounds.most(t), t.dim()), torch.int64),), True
    if func is _aten.masked_select.default:
        mask = arg(1, "mask")
        shape = torch.broadcast_shapes(t.shape, mask.shape)
        real = known.get(mask)
        if real is not None:
            with _disable_current_modes():
                return (((int(real.expand(shape).count_nonzero()),), t.dtype),), False
        spread = math.prod(shape) // mask.numel() if mask.numel() else 0
        return (((bounds.most(mask) * spread,), t.dtype),), True
    if func in _UNIQUE and distinct.most(t) > UNIQUE_AT_MOST:
        return None
    if func is _aten._unique2.default:
        return _unique_flat(t, arg(2, "return_inverse", False), arg(3, "return_counts", False),
                            distinct), True
    if func is _aten.unique_consecutive.default:
        dim = arg(3, "dim")
        if dim is not None:
            return _unique_along(t, dim), True
        return _unique_flat(t, arg(1, "return_inverse", False), arg(2, "return_counts", False),
                            distinct), True
    if func in (_aten.unique_dim.default, _aten.unique_dim_consecutive.default):
        return _unique_along(t, arg(1, "dim")), True
    if func is _aten._ctc_loss.Tensor and t.dim() == 3:
        return _ctc_shapes(t, arg(1, "targets")), True
    if str(func) == "torchvision.nms.default":  # the boxes kept: at most all of them
        return (((t.shape[0],), torch.int64),), True
    return None


def _ctc_shapes(log_probs, targets):
    """CTC's loss per sequence and its alphas, batch x time x (2 x longest target + 1):
    the longest target is at most a row of padded targets, or all of concatenated ones
    (transformers' CTC heads select the labels that are not padding)."""
    time, batch = log_probs.shape[0], log_probs.shape[1]
    longest = targets.shape[1] if targets.dim() == 2 else targets.numel()
    return (((batch,), log_probs.dtype), ((batch, time, 2 * longest + 1), log_probs.dtype))


def fake_like(like: FakeTensor, shape, dtype, stride=None) -> FakeTensor:
    """A fake tensor of ``shape``, ``dtype`` (and ``stride``) in ``like``'s mode and on its
    device, made without an op the estimate would record."""
    with _disable_current_modes():
        meta = (torch.empty(shape, dtype=dtype, device="meta") if stride is None else
                torch.empty_strided(shape, stride, dtype=dtype, device="meta"))
    mode = like.fake_mode
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, like.device)


def _positions(mask: FakeTensor, known, bounds) -> tuple[list, bool]:
    """The long indices ``mask`` stands for, one per dimension it covers, and whether
    they were taken at their largest: a mask whose values are ``known`` gives the
    positions it keeps, with their values (added to ``known``); another, as many
    positions as its ``bounds`` allow."""
    real = known.get(mask)
    if real is None:
        rows = bounds.most(mask)
        return [fake_like(mask, (rows,), torch.int64) for _ in range(mask.dim())], True
    with _disable_current_modes():
        reals = real.nonzero().unbind(1)
    fakes = [fake_like(mask, tuple(r.shape), torch.int64) for r in reals]
    for fake, r in zip(fakes, reals):
        known[fake] = r
    return fakes, False


def _index_by_positions(func, args, kwargs, known, bounds):
    """``aten.index`` with each boolean mask among its indices replaced by the positions
    it keeps, and whether any was taken at its largest; None if it has no such mask (or
    only a 0-dim one, which keeps no dimension's positions)."""
    t = args[0]
    indices = args[1] if len(args) > 1 else kwargs.get("indices")
    if indices is None:
        return None
    replaced, masked, largest = [], False, False
    for index in indices:
        if isinstance(index, FakeTensor) and index.dtype in _MASK_DTYPES:
            if index.dim() == 0:
                return None
            positions, at_largest = _positions(index, known, bounds)
            replaced.extend(positions)
            masked, largest = True, largest or at_largest
        else:
            replaced.append(index)
    if not masked:
        return None
    return func(t, replaced), largest


def at_their_largest(func, args, kwargs, known, bounds, distinct):
    """What ``func`` makes when its selection keeps every element it can, and whether a
    value the estimate cannot know was taken so: fake tensors of the largest shapes, on
    the device of its first fake argument; None if ``func`` is not a selection with a
    bound on its size (the caller then refuses it as before). ``known`` maps fake tensors
    to their real twins (:class:`._values.KnownValues`): a mask among them selects what
    it selects; ``bounds`` (:class:`NonzeroBounds`) says how much others can keep, and
    ``distinct`` (:class:`DistinctBounds`) how many values ``unique`` can find."""
    if func is _aten.index.Tensor:
        return _index_by_positions(func, args, kwargs, known, bounds)
    largest = _largest_shapes(func, args, kwargs, known, bounds, distinct)
    first = next((a for a in args if isinstance(a, FakeTensor)), None)
    if largest is None or first is None:
        return None
    shapes, at_largest = largest
    outs = tuple(fake_like(first, shape, dtype) for shape, dtype in shapes)
    return (outs[0] if len(outs) == 1 else outs), at_largest
