"""The rows of advise()'s what-if table: the step as written, then each change estimated.

The step as written is estimated first: its recording says which autocast the step runs
and, from the model it builds, the repeated blocks and the weights' dtypes that the
changes need, so that a change the step already makes is left out. The other rows are
independent of each other; _forked computes them in several processes where it can, and
:class:`WhatIf` is what each process runs: the step as written, then its share.
"""

from __future__ import annotations

from . import _step, variants as _variants

# A model with this many repeated blocks gets every change standard_variants() has.
_BLOCKS_FOR_EVERY_CHANGE = 4


class WhatIf:
    def __init__(self, estimate, step_fn, args, kwargs, *, build, common: dict, variants,
                 make_batch, batch):
        self._estimate = estimate
        self._step_fn, self._args, self._kwargs = step_fn, args, dict(kwargs)
        self._build, self._common = build, dict(common)
        self._device = self._kwargs.pop("device", "cuda")
        self._emulate = self._kwargs.pop("emulate", None)
        self._variants, self._make_batch, self._batch = variants, make_batch, batch
        self._first = variants[0] if variants is not None else _variants.Variant("as written")
        self.base = None
        self._jobs: list = []

    def rows_at_most(self) -> int:
        listed = (self._variants if self._variants is not None
                  else _variants.standard_variants(_BLOCKS_FOR_EVERY_CHANGE))
        changes = len(listed) - 1  # less the step as written
        return changes + len(self._smaller_batches())

    def _smaller_batches(self) -> list[int]:
        if self._make_batch is None or not self._batch:
            return []
        b = self._batch
        return sorted({max(1, b // 2), max(1, b // 4)} - {b}, reverse=True)

    def share(self, share: int, of: int):
        """The step as written, then the rows ``i % of == share`` (see _forked.computed)."""
        self._estimate_as_written()
        agreement = (self.base.emulated, self.base.peak_allocated, self.base.peak_reserved,
                     self.base.torch_peak_reserved, self.base.flops,
                     [_variants.key(v) if v is not None else n for v, n in self._jobs])
        return agreement, self.redo(share, of), self.redo

    def redo(self, share: int, of: int) -> dict:
        return {i: self._row(i) for i in range(len(self._jobs)) if i % of == share}

    def _estimate_as_written(self) -> None:
        target = _step.choose_target(self._device, self._emulate)
        self._common["emulate"] = target.emulated
        model_seen, autocast = {}, set()
        with _variants.autocast_seen(autocast), _step.built_objects_seen(
                lambda values: model_seen.update(model_facts(values))):
            self.base = self._estimate(self._step_fn, *self._args, build=self._build,
                                       variant=self._first, **self._common, **self._kwargs)
        blocks, weights = model_seen.get("blocks", []), model_seen.get("weights", set())
        chosen = (self._variants if self._variants is not None
                  else _variants.standard_variants(len(blocks)))[1:]
        done = {_variants.key(self._first)}
        self._jobs = []
        for v in chosen:
            v = _variants.as_it_changes(v, autocast, weights)
            if v is None or _variants.key(v) in done:
                continue
            done.add(_variants.key(v))
            self._jobs.append((v, None))
        self._jobs.extend((None, n) for n in self._smaller_batches())

    def _row(self, i: int):
        variant, n = self._jobs[i]
        base = self.base
        if variant is None:
            e = self._estimate(self._step_fn, build=lambda: self._make_batch(n),
                               **self._common, **self._kwargs)
            return _variants.AdviceRow(
                f"batch {n} instead of {self._batch}", e.peak_allocated, e.peak_reserved,
                e.torch_peak_reserved, e.fits, base.peak_reserved - e.peak_reserved,
                None, "same compute per sample")
        try:
            e = self._estimate(self._step_fn, *self._args, build=self._build,
                               variant=variant, **self._common, **self._kwargs)
        except _step.UntraceableStep as error:
            return _variants.AdviceRow(variant.name, None, None, None, None, None, None,
                                       str(error))
        return _variants.AdviceRow(
            variant.name, e.peak_allocated, e.peak_reserved, e.torch_peak_reserved, e.fits,
            base.peak_reserved - e.peak_reserved,
            (e.flops / base.flops - 1.0) if base.flops else None)

    def advice(self, results: dict) -> _variants.Advice:
        """The table: the step as written, then the rows, most saving first."""
        base = self.base
        head = _variants.AdviceRow(self._first.name, base.peak_allocated, base.peak_reserved,
                                   base.torch_peak_reserved, base.fits, 0,
                                   0.0 if base.flops else None)
        rest = sorted((results[i] for i in range(len(self._jobs))),
                      key=lambda r: (r.saves is None, -(r.saves or 0)))
        return _variants.Advice([head] + rest, base.device_memory, base.min_device_memory)


def model_facts(values) -> dict:
    """What advise() and plan_checkpointing() need of the first model among a step's
    objects: its repeated blocks and the dtypes of its floating-point weights (none
    without a model)."""
    import torch

    model = next((v for v in values if isinstance(v, torch.nn.Module)), None)
    if model is None:
        return {"blocks": [], "weights": set()}
    return {"blocks": _variants.repeated_blocks(model),
            "weights": {p.dtype for p in model.parameters() if p.is_floating_point()}}
