"""A Hugging Face ``transformers.TrainerCallback`` that logs memory at each optimizer step
through vramkit.MemoryLogger and prints the summary when training ends.

    from vramkit.integrations.hf import MemoryCallback
    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[MemoryCallback("memory.jsonl", every=10)])

The step of a record is the Trainer's global_step; epoch is added to each record. Each
process of a distributed run logs its own device to its own file (memory.rank1.jsonl, ...).
Importing this module imports transformers.
"""

from __future__ import annotations

import os

from transformers import TrainerCallback

from ...observe.logger import MemoryLogger
from . import log_path

__all__ = ["MemoryCallback"]


class MemoryCallback(TrainerCallback):
    """path_or_callback, every and the keywords are MemoryLogger's; the device is the
    Trainer's (args.device) unless device= is given."""

    def __init__(self, path_or_callback="vramkit_memory.jsonl", every: int = 1, device=None,
                 **logger_options):
        self.target = path_or_callback
        self.every = every
        self.device = device
        self.options = logger_options
        self.logger: MemoryLogger | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        device = self.device
        if device is None:
            device = args.device if getattr(args.device, "type", None) == "cuda" else 0
        target = self.target
        if isinstance(target, (str, os.PathLike)):  # a path, not an open file: one per rank
            target = log_path(os.fspath(target), args.process_index, args.world_size)
        self.logger = MemoryLogger(target, every=self.every, device=device, **self.options)

    def on_step_end(self, args, state, control, **kwargs):
        if self.logger is not None:
            self.logger.step(state.global_step, epoch=state.epoch)

    def on_train_end(self, args, state, control, **kwargs):
        if self.logger is not None:
            self.logger.close()
